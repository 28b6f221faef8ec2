"""Binary outcomes on paired items (paper §4, "The statistical protocol"): exact McNemar, Wilson, the split.

Every comparison in the paper is paired: two conditions run the same items, and the
discordant split b/c is reported before any p-value, with p from an exact two-sided
McNemar test. Accuracies carry Wilson 95% intervals; continuous per-item measurements are
tested in `inference` (sign-flip, bootstrap, equivalence). Repeated cells (the
same items re-run under several agent counts) are never pooled into one test, so the one
table built on these (`analysis.reports.summary.condition_table`) refuses records where an (item, condition)
pair appears more than once.

All probability machinery comes from `scipy.stats`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import numpy as np
from scipy import stats

__all__ = [
    "mcnemar_exact",
    "wilson_ci",
    "discordant",
    "paired_split",
]


# ---------------------------------------------------------------- validation helpers


def _count(name: str, value: object) -> int:
    """Return `value` as a non-negative int, or raise ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a non-negative integer count, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer count, got {value!r}")
    return int(value)


def _paired_bool(a: Iterable[object], b: Iterable[object]) -> tuple[np.ndarray, np.ndarray]:
    """Convert two paired correctness vectors to boolean arrays of equal length.

    Accepts booleans or the integers 0/1; anything else (NaN, 2, "yes") is an error.
    """
    out = []
    for label, values in (("first", a), ("second", b)):
        arr = np.asarray(values, dtype=object).ravel()
        bad = [v for v in arr if not (isinstance(v, (bool, np.bool_)) or v in (0, 1))]
        if bad:
            raise ValueError(f"{label} array must be boolean (or 0/1), found e.g. {bad[0]!r}")
        out.append(arr.astype(bool))
    if out[0].shape != out[1].shape:
        raise ValueError(f"paired arrays must have equal length, got {out[0].size} and {out[1].size}")
    return out[0], out[1]


# ---------------------------------------------------------------- tests on counts


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value on the discordant split b/c.

    Under H0 each discordant item is equally likely to fall either way, so b is
    Binomial(b + c, 0.5); p is scipy's two-sided exact binomial test of b. With no
    discordant items (b + c == 0) there is no evidence either way and p = 1.0.
    """
    b = _count("b", b)
    c = _count("c", c)
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(b, b + c, p=0.5, alternative="two-sided").pvalue)


def wilson_ci(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n, as fractions in [0, 1]."""
    k = _count("k", k)
    n = _count("n", n)
    if n == 0:
        raise ValueError("n must be positive: a Wilson interval needs at least one trial")
    if k > n:
        raise ValueError(f"k must lie in [0, n], got k={k}, n={n}")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level!r}")
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=float(level), method="wilson")
    return float(ci.low), float(ci.high)


def discordant(a: Iterable[object], b: Iterable[object]) -> tuple[int, int]:
    """Discordant split (b, c) of two paired correctness vectors.

    `a` is the first-named condition, `b` the second, item i in both at position i.
    Returned b counts items the FIRST condition gets right and the second gets wrong;
    returned c counts items the first gets wrong and the second right (paper §4).
    """
    first, second = _paired_bool(a, b)
    return int(np.sum(first & ~second)), int(np.sum(~first & second))


# ---------------------------------------------------------------- paired table


SPLIT = ("only_reference_right", "only_condition_right")


def paired_split(reference: Iterable[object], condition: Iterable[object]) -> dict:
    """The discordant split of a condition against a reference, named by what each count counts,
    and its exact McNemar p: the one orientation every table of the lab uses."""
    only_reference, only_condition = discordant(reference, condition)
    return {
        "only_reference_right": only_reference,
        "only_condition_right": only_condition,
        "p_exact": mcnemar_exact(only_reference, only_condition),
    }
