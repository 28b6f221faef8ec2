"""Power and sample size of the tests in `inference`: what a claim needs to be decided, prospective at a
stated effect or margin, and post hoc at the observed one.

- `mcnemar_power` / `mcnemar_items_needed`: the exact unconditional power of the two-sided exact
  McNemar test at discordance probabilities p10, p01 (a binomial mixture over the discordant count);
  `connor_items` is Connor's (1987) normal approximation, the usual sample-size formula.
- `tango_tost_power` / `tango_items_needed`: the exact power of Tango's TOST (summed over the discordant
  count and its split) and the fewest pairs reaching 80% of it with the two truly level.
- the mean tests' sizes (`mean_items_needed`, `mean_items_needed_at`, `tost_items_needed`,
  `noninferior_items_needed`): normal approximations at the observed per-item spread; where no item varies,
  the sign-flip's or Markov's bound of `inference` decides instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats

from bcr_core.analysis.statistics.inference import ALPHA, POWER, constant, tango_tost


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

    def reaches(n: int) -> bool:
        return tango_tost_power(discordance / 2, discordance / 2, n, margin, alpha) >= power

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
