"""Monte-Carlo p values precise enough not to move a verdict.

A sign-flip p from R random flips carries a Monte-Carlo standard error sqrt(p (1 - p) / R). Where
that error could carry p across the threshold Holm holds it to (alpha / k for the k-th smallest of
m tests, k = m - rank), the test is rerun with more flips (`refine`); a p at the resampling floor,
1 / (R + 1) (the share of flips whose |mean| reaches the observed one, the observed flip counted
once), says only p < 1 / R and prints so (`p_text`). Where 2^n is within the flips, scipy's
`permutation_test` enumerates every sign and the p is exact.
"""

from __future__ import annotations

import math

import numpy as np

from bcr_core.analysis.statistics import inference as inf

RESAMPLES = 20_000  # the first draw of every sign-flip test
MAX_RESAMPLES = 1_000_000  # the most a p near its threshold is refined to
Z_CLOSE = 4.0  # a p within this many Monte-Carlo errors of its threshold is refined (a crossing ~1 in 30,000)


def exact(n: int, resamples: int) -> bool:
    """Whether a sign-flip test on n items enumerates every sign (scipy does when 2^n <= R)."""
    return n < 63 and 2**n <= resamples


def mc_error(p: float, resamples: int) -> float:
    p = max(p, 1 / resamples)
    return math.sqrt(p * (1 - p) / resamples)


def close_to(p: float, threshold: float, resamples: int) -> bool:
    return abs(p - threshold) < Z_CLOSE * mc_error(p, resamples)


def at_floor(p: float | None, resamples: int | None) -> bool:
    return p is not None and bool(resamples) and p <= 1.0001 / (resamples + 1)


def holm_thresholds(pvalues: list[float | None], alpha: float = inf.ALPHA) -> list[float | None]:
    """The raw-p threshold Holm holds each test to: alpha / (m - rank) (None for a missing p)."""
    present = sorted((p, i) for i, p in enumerate(pvalues) if p is not None and not math.isnan(p))
    out: list[float | None] = [None] * len(pvalues)
    for rank, (_, i) in enumerate(present):
        out[i] = alpha / (len(present) - rank)
    return out


def refine(gain, p: float, threshold: float, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, int]:
    """The sign-flip p of `gain` redrawn with five times the flips until it is clear of `threshold`
    by Z_CLOSE Monte-Carlo errors or MAX_RESAMPLES is reached; returns (p, flips)."""
    d = np.asarray(gain, float)
    while close_to(p, threshold, resamples) and resamples < MAX_RESAMPLES and not exact(d.size, resamples):
        resamples = min(5 * resamples, MAX_RESAMPLES)
        p = inf.sign_flip(d, resamples=resamples, seed=seed)
    return p, resamples


def p_text(p, resamples=None, bound: bool | None = None) -> str:
    """A p as the tables print it: "< 1/R" at the floor of R flips; `bound` marks a
    p (Holm's) that is only an upper bound because its raw p sat at the floor."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return ""
    if bound is None:
        bound = False
        if resamples is not None and not (isinstance(resamples, float) and math.isnan(resamples)):
            if at_floor(p, int(resamples)):
                return f"< {1 / int(resamples):.1g}"
    return f"< {p:.2g}" if bound else f"{p:.2g}"
