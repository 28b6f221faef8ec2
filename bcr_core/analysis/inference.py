"""Effects, intervals, power, equivalence and multiplicity for the claims (paper §4's protocol).

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
- `mcnemar_power` / `mcnemar_items_needed`: the exact unconditional power of the two-sided exact
  McNemar test at discordance probabilities p10, p01 (a binomial mixture over the discordant count);
  `connor_items` is Connor's (1987) normal approximation, the usual sample-size formula.
- `tango_tost_power` / `tango_items_needed`: the exact power of Tango's TOST (summed over the discordant
  count and its split) and the fewest pairs reaching 80% of it with the two truly level.
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

from bcr_core.analysis.binary import wilson_ci

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
    at = lambda delta0, target: tango_statistic(first_only, second_only, n, delta0) - target  # noqa: E731
    estimate = (first_only - second_only) / n
    lo = -1.0 if estimate == -1 else brentq(at, -1 + tol, 1 - tol, args=(z,), xtol=tol)
    hi = 1.0 if estimate == 1 else brentq(at, -1 + tol, 1 - tol, args=(-z,), xtol=tol)
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


# ------------------------------------------------------------------ power
def mcnemar_power(p10: float, p01: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided exact McNemar test on n items whose discordance probabilities are
    p10 (first right only) and p01 (second right only)."""
    psi = p10 + p01
    if psi <= 0 or n < 1:
        return 0.0
    q = p10 / psi
    lo_d, hi_d = (int(x) for x in stats.binom.ppf([1e-10, 1 - 1e-10], n, psi))
    d = np.arange(max(lo_d, 1), hi_d + 1)
    k = reject_below(d, alpha)
    hit = np.where(k >= 0, stats.binom.cdf(k, d, q) + stats.binom.sf(d - k - 1, d, q), 0.0)
    return float(np.sum(stats.binom.pmf(d, n, psi) * hit))


def reject_below(d: np.ndarray, alpha: float) -> np.ndarray:
    """Per discordant count d, the largest b with two-sided exact McNemar p < alpha (-1: none)."""
    k = stats.binom.ppf(alpha / 2, d, 0.5).astype(int)
    for _ in range(2):  # ppf lands on or next to the boundary
        k = np.where(2 * stats.binom.cdf(k, d, 0.5) < alpha, k, k - 1)
    return k


def connor_items(p10: float, p01: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Connor (1987): n = (z_{a/2} sqrt(psi) + z_b sqrt(psi - delta^2))^2 / delta^2."""
    psi, delta = p10 + p01, p10 - p01
    if delta == 0:
        return math.inf
    za, zb = stats.norm.ppf(1 - alpha / 2), stats.norm.ppf(power)
    return (za * math.sqrt(psi) + zb * math.sqrt(psi - delta**2)) ** 2 / delta**2


def mcnemar_items_needed(p10: float, p01: float, alpha: float = ALPHA, power: float = POWER, limit: int = 10**7):
    """The fewest items at which the exact McNemar test reaches `power` (None if unequal rates
    never reach it within `limit`, or the rates are equal). Searched around Connor's estimate."""
    guess = connor_items(p10, p01, alpha, power)
    if not math.isfinite(guess) or guess > limit:
        return None
    lo, hi = max(1, int(guess * 0.7)), int(guess * 1.5) + 10
    while mcnemar_power(p10, p01, hi, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while mcnemar_power(p10, p01, lo, alpha) >= power and lo > 1:
        lo = max(1, lo // 2)
    while hi - lo > 1:  # the smallest n with the power, up to the test's discreteness
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mcnemar_power(p10, p01, mid, alpha) >= power else (mid, hi)
    return hi


def detectable_difference(psi: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest |p10 - p01| the exact McNemar test detects with `power` on n items at a total
    discordance rate psi (None if even all-one-way discordance does not reach it)."""
    if psi <= 0 or mcnemar_power(psi, 0.0, n, alpha) < power:
        return None
    lo, hi = 0.0, psi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if mcnemar_power((psi + mid) / 2, (psi - mid) / 2, n, alpha) >= power else (mid, hi)
    return hi


def tango_tost_power(p10: float, p01: float, n: int, margin: float, alpha: float = ALPHA) -> float:
    """Power of `tango_tost` within ±margin at level alpha on n pairs whose discordance probabilities are
    p10 (first only) and p01 (second only): exact, summed over the discordant count d ~ Bin(n, p10 + p01)
    and the first-only count b ~ Bin(d, p10 / (p10 + p01))."""
    psi = p10 + p01
    if n < 1:
        return 0.0
    if psi <= 0:
        return float(tango_tost(0, 0, n, margin) < alpha)
    lo_d, hi_d = (int(x) for x in stats.binom.ppf([1e-10, 1 - 1e-10], n, psi))
    power = 0.0
    for d in range(lo_d, hi_d + 1):
        b = np.arange(d + 1)
        hit = tango_tost(b, d - b, n, margin) < alpha
        power += stats.binom.pmf(d, n, psi) * float(np.sum(stats.binom.pmf(b, d, p10 / psi) * hit))
    return float(power)


def tango_items_needed(
    discordance: float, margin: float, alpha: float = ALPHA, power: float = POWER, limit: int = 20_000
) -> int | None:
    """The fewest pairs at which `tango_tost` within ±margin reaches `power` when the two are truly level
    (p10 = p01) and a share `discordance` of pairs disagree: the TOST's sample size on paired pass/fail
    outcomes (None beyond `limit`). With no discordance it is the n at which n concordant pairs alone show
    equivalence. Searched by doubling, then bisection (the power of a discrete test is nearly monotone)."""
    if margin <= 0 or not 0 <= discordance <= 1:
        raise ValueError(f"a TOST's sample size needs margin > 0 and a discordance in [0, 1]: {margin}, {discordance}")
    reaches = lambda n: tango_tost_power(discordance / 2, discordance / 2, n, margin, alpha) >= power  # noqa: E731
    lo, hi = 0, 8
    while not reaches(hi):
        if hi >= limit:
            return None
        lo, hi = hi, min(2 * hi, limit)
    return bisect_first(reaches, lo, hi)


def bisect_first(reaches: Callable[[int], bool], lo: int, hi: int) -> int:
    """The smallest n in (lo, hi] with `reaches(n)`, given reaches(hi) and not reaches(lo)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi


def mean_items_needed(differences, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """Items a paired test of a mean difference needs at the observed mean and spread (normal
    approximation, n = ((z_{a/2} + z_b) sd / mean)^2)."""
    d = np.asarray(differences, float)
    if d.size < 2 or d.mean() == 0:
        return None
    if constant(d):  # every item the same nonzero difference: the sign-flip's own floor, 2 / 2^n < alpha
        return math.ceil(math.log2(2 / alpha))
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return math.ceil((z * d.std(ddof=1) / abs(d.mean())) ** 2)


def mean_detectable(differences, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest mean difference the current n detects at the observed spread (normal approx.)."""
    d = np.asarray(differences, float)
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return float(z * d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else math.nan


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


# ------------------------------------------------------------------ prospective power
def mean_items_needed_at(differences, effect: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Items the sign-flip test of a mean difference needs for `power` at a stated `effect`, at the
    spread of the observed per-item differences (normal approximation to the test's null
    distribution, n = ((z_{a/2} + z_b) sd / effect)^2): prospective, not at the observed mean."""
    d = np.asarray(differences, float)
    if d.size < 2 or effect == 0:
        return None
    if constant(d):  # no spread: the sign-flip's own floor decides, 2 / 2^n < alpha (as `mean_items_needed`)
        return math.ceil(math.log2(2 / alpha))
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return math.ceil((z * d.std(ddof=1) / abs(effect)) ** 2)


def tost_items_needed(
    differences, margin: float, alpha: float = ALPHA, power: float = POWER, bound: float = 1.0
) -> int | None:
    """Items a TOST within ±margin needs for `power` when the true effect is 0, at the observed
    spread: n = ((z_a + z_{b/2}) sd / margin)^2 (both one-sided tests at alpha)."""
    d = np.asarray(differences, float)
    if d.size < 2 or margin <= 0:
        return None
    sd = d.std(ddof=1)
    z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(1 - (1 - power) / 2)
    return unvarying_items_needed(margin, alpha, bound) if constant(d) else max(2, math.ceil((z * sd / margin) ** 2))


def noninferior_items_needed(differences, margin: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Items the one-sided test of a mean above -margin needs for `power` when the true mean is 0, at the
    observed spread: n = ((z_a + z_b) sd / margin)^2."""
    d = np.asarray(differences, float)
    if d.size < 2 or margin <= 0:
        return None
    sd = d.std(ddof=1)
    z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)
    return unvarying_items_needed(margin, alpha) if constant(d) else max(2, math.ceil((z * sd / margin) ** 2))


def unvarying_items_needed(margin: float, alpha: float = ALPHA, bound: float = 1.0) -> int:
    """Where no item varies, the items at which `unvarying_p` of all-zero values falls below alpha."""
    return math.ceil(math.log(alpha) / math.log(1 - min(margin / bound, 1 - 1e-12)))


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
