"""Effects, intervals, equivalence and multiplicity for the claims (paper §4's protocol; their power and
sample sizes are `power`'s).

The item is the unit of every test: per-call numbers are averaged per item first, and a random
control's seeds are averaged per item into one control. Each function states its source:

- `paired_difference_ci`: Newcombe (1998, Stat. Med. 17:2635), method 10: the difference of two
  paired proportions from the Wilson intervals of each margin and the phi correlation of the 2x2
  (its positive part shrunk by n/2, as Newcombe and Altman et al.'s "Statistics with confidence" do).
- `tango_statistic` / `tango_tost` / `tango_interval`: Tango's (1998, Stat. Med. 17:891) score test of
  p_first - p_second = delta0 on paired binary outcomes (the restricted maximum-likelihood variance), its
  two one-sided tests for equivalence and the interval that inverts it: a t-test on 0/1 differences
  reads zero variance (no discordant item) as certainty, Tango's statistic does not.
- `sign_flip`: the paired permutation test of a mean difference (each item's difference keeps or
  flips its sign under H0), `scipy.stats.permutation_test`; exact when 2^n is within the draws.
- `bootstrap_ci`: percentile bootstrap over items of a statistic of per-item values.
- `unvarying_p` / `unvarying_interval`: per-item values that all equal one number, which a t-test cannot
  read (zero spread), by Markov's inequality on values of known bound: n items at c when the mean is at
  the null has probability at most a share to the n-th power.
- `tost_p`: two one-sided tests (Schuirmann 1987) by inverting a family of intervals: the smallest
  alpha whose (1 - 2 alpha) interval lies inside (-margin, +margin).
- `holm`: Holm's (1979) step-down adjustment over one family of p-values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

from bcr_core.analysis.statistics.binary import wilson_ci

ALPHA = 0.05
POWER = 0.80


# ------------------------------------------------------------------ paired proportions
def paired_difference_ci(both: int, first_only: int, second_only: int, neither: int, level: float = 0.95):
    """Newcombe's method 10 interval for p_first - p_second on n paired binary outcomes."""
    n = both + first_only + second_only + neither
    if n == 0:
        raise ValueError("a paired interval needs at least one item")
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    l1, u1 = wilson_ci(both + first_only, n, level)
    l2, u2 = wilson_ci(both + second_only, n, level)
    margins = (both + first_only) * (second_only + neither) * (both + second_only) * (first_only + neither)
    excess = both * neither - first_only * second_only  # Newcombe's phi: a positive excess loses n/2
    excess = max(excess - n / 2, 0.0) if excess > 0 else excess
    phi = excess / math.sqrt(margins) if margins else 0.0
    d = p1 - p2
    lo = d - math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    hi = d + math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return max(lo, -1.0), min(hi, 1.0)


def tango_statistic(first_only, second_only, n: int, delta0: float):
    """Tango's score statistic for H0: p_first - p_second = delta0 over n pairs (standard normal under H0;
    it falls as delta0 grows). At delta0 = 0 it is McNemar's (b - c) / sqrt(b + c). Counts may be arrays."""
    b, c = np.asarray(first_only, float), np.asarray(second_only, float)
    a2 = 2 * n
    b2 = -b - c + (2 * n - b + c) * delta0
    c2 = -c * delta0 * (1 - delta0)
    p21 = (np.sqrt(np.maximum(b2 * b2 - 4 * a2 * c2, 0.0)) - b2) / (2 * a2)  # the restricted MLE of P(second only)
    variance = n * (2 * p21 + delta0 * (1 - delta0))
    numerator = b - c - n * delta0
    z = np.divide(numerator, np.sqrt(variance), out=np.zeros_like(numerator), where=variance > 0)
    return float(z) if z.ndim == 0 else z


def tango_tost(first_only, second_only, n: int, margin: float):
    """TOST p of p_first - p_second within ±margin: the larger of Tango's one-sided p at -margin and +margin."""
    low = stats.norm.sf(tango_statistic(first_only, second_only, n, -margin))  # H0: difference <= -margin
    high = stats.norm.cdf(tango_statistic(first_only, second_only, n, margin))  # H0: difference >= +margin
    p = np.maximum(low, high)
    return float(p) if p.ndim == 0 else p


def tango_interval(first_only: int, second_only: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The interval of differences delta0 Tango's two-sided test at 1 - level does not reject."""
    from scipy.optimize import brentq

    z, tol = stats.norm.ppf(0.5 + level / 2), 1e-9

    def statistic_minus(delta0: float, target: float) -> float:
        """Tango's statistic at difference `delta0`, less `target`: zero at a bound of the interval."""
        return tango_statistic(first_only, second_only, n, delta0) - target

    estimate = (first_only - second_only) / n
    lo = -1.0 if estimate == -1 else brentq(statistic_minus, -1 + tol, 1 - tol, args=(z,), xtol=tol)
    hi = 1.0 if estimate == 1 else brentq(statistic_minus, -1 + tol, 1 - tol, args=(-z,), xtol=tol)
    return lo, hi


def table_of(first, second) -> tuple[int, int, int, int]:
    """(both, first only, second only, neither) of two paired boolean vectors."""
    a, b = np.asarray(first, bool), np.asarray(second, bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes must have equal length, got {a.size} and {b.size}")
    return int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum()), int((~a & ~b).sum())


# ------------------------------------------------------------------ per-item differences
def sign_flip(differences, resamples: int = 20_000, seed: int = 0) -> float:
    """Two-sided p of the mean of per-item differences under random sign flips: the share of flips
    whose |mean| reaches the observed |mean| (the null is symmetric), ties read to 12 decimals."""
    d = np.asarray(differences, float)
    if d.size == 0:
        raise ValueError("a sign-flip test needs at least one item")
    if not d.any():
        return 1.0
    result = stats.permutation_test(  # in batches of 50,000 flips: a million at once would not fit in memory
        (d,),
        size_of_mean,
        permutation_type="samples",
        alternative="greater",
        n_resamples=resamples,
        batch=min(resamples, 50_000),
        rng=np.random.default_rng(seed),
    )
    return float(result.pvalue)


def size_of_mean(values, axis=-1):
    """|mean| rounded to 12 decimals, so that flips whose mean equals the observed one up to float
    error count as ties (a coin's seed mean per item is a multiple of a third; summed in another
    order it lands a few ulps off)."""
    return np.round(np.abs(np.mean(values, axis=axis)), 12)


def bootstrap_ci(values, statistic: Callable = np.mean, level: float = 0.95, resamples: int = 5_000, seed: int = 0):
    """Percentile bootstrap interval of `statistic` over the rows (items) of `values`."""
    v = np.asarray(values, float)
    if len(v) == 0:
        raise ValueError("a bootstrap interval needs at least one item")
    draws = bootstrap_draws(v, statistic, resamples, seed)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap_draws(values, statistic: Callable, resamples: int = 5_000, seed: int = 0) -> np.ndarray:
    """`statistic` on `resamples` resamples of the rows (items) of `values`, drawn with replacement."""
    v = np.asarray(values, float)
    rng = np.random.default_rng(seed)
    return np.array([statistic(v[rng.integers(0, len(v), len(v))]) for _ in range(resamples)])


# ------------------------------------------------------------------ equivalence and multiplicity
def tost_p(interval: Callable[[float], tuple[float, float]], margin: float) -> float:
    """The TOST p-value: the smallest alpha whose (1 - 2 alpha)-level interval, `interval(level)`,
    lies inside (-margin, margin); 1.0 when even a 0-level interval is not inside."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")

    def inside(alpha: float) -> bool:
        lo, hi = interval(1 - 2 * alpha)
        return -margin < lo and hi < margin

    if not inside(0.4999):
        return 1.0
    lo, hi = 1e-12, 0.4999
    if inside(lo):
        return lo
    for _ in range(50):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if inside(mid) else (mid, hi)
    return hi


def bootstrap_tost(draws, margin: float) -> float:
    """TOST p from a bootstrap distribution of an effect: the larger of the shares of draws at or
    beyond -margin and at or beyond +margin (the percentile interval inverted)."""
    d = np.asarray(draws, float)
    return float(max((d <= -margin).mean(), (d >= margin).mean(), 1 / (d.size + 1)))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values over the non-missing entries (None stays None)."""
    present = [(p, i) for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)]
    m = len(present)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def constant(v: np.ndarray) -> bool:
    return v.size < 2 or bool(np.allclose(v, v[0], rtol=0, atol=1e-12))


def t_interval(values, level: float, bound: float = 1.0) -> tuple[float, float]:
    """The t interval of the mean of per-item values at `level` (values that do not vary, within ±`bound`:
    `unvarying_interval`)."""
    v = np.asarray(values, float)
    if constant(v):
        return unvarying_interval(v, level, bound) if v.size else (math.nan, math.nan)
    ci = stats.ttest_1samp(v, 0.0).confidence_interval(level)
    return float(ci.low), float(ci.high)


def t_tost(values, margin: float, bound: float = 1.0) -> float:
    """TOST p of per-item values within ±margin: the larger of the two one-sided t-tests' p. Values that do
    not vary have no t-test: `unvarying_p` (never certainty) reads them."""
    v = np.asarray(values, float)
    if constant(v):
        return max(unvarying_p(v, -margin, bound), unvarying_p(v, margin, bound)) if abs(v.mean()) < margin else 1.0
    low = stats.ttest_1samp(v, -margin, alternative="greater").pvalue
    high = stats.ttest_1samp(v, margin, alternative="less").pvalue
    return float(max(low, high))


def t_noninferior(values, margin: float, bound: float = 1.0) -> float:
    """One-sided p that the mean of per-item values exceeds -margin (H0: mean <= -margin); values that do
    not vary are read by `unvarying_p`."""
    v = np.asarray(values, float)
    if constant(v):
        return unvarying_p(v, -margin, bound) if v.mean() > -margin else 1.0
    return float(stats.ttest_1samp(v, -margin, alternative="greater").pvalue)


def unvarying_p(v: np.ndarray, null: float, bound: float) -> float:
    """The exact one-sided p of n per-item values that all equal c, against a mean `null` on either side of
    c, for values within ±`bound` (paired pass/fail differences: 1). By Markov's inequality on the bounded
    values, one item lands at c or beyond with probability at most (bound + null) / (bound + c) when the
    null is below c ((bound - null) / (bound - c) when above), so n items all do with at most its n-th
    power: for c = 0 and a null at ±margin, (1 - margin / bound)^n. A t-test reads the zero spread as
    certainty at any n (seven concordant items "equivalent"); this does not."""
    c, n = float(v.mean()), v.size
    share = (bound + null) / (bound + c) if null < c else (bound - null) / (bound - c) if null > c else 1.0
    return float(min(max(share, 0.0), 1.0) ** n)


def unvarying_interval(v: np.ndarray, level: float, bound: float) -> tuple[float, float]:
    """The means `unvarying_p` does not reject at 1 - level, two-sided, for n values that all equal c."""
    c, tail = float(v.mean()), ((1 - level) / 2) ** (1 / v.size)
    return (bound + c) * tail - bound, bound - (bound - c) * tail
