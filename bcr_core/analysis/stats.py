"""Paired statistics for the BCR reproduction (paper §4, "The statistical protocol").

Every comparison in the paper is paired: two conditions run the same items, and the
discordant split b/c is reported before any p-value, with p from an exact two-sided
McNemar test. Accuracies carry Wilson 95% intervals; continuous per-item measurements are
tested in `inference` (sign-flip, bootstrap, equivalence). Repeated cells (the
same items re-run under several agent counts) are never pooled into one test, so the one
table built on these (`analysis.summary.condition_table`) refuses records where an (item, condition)
pair appears more than once.

All probability machinery comes from `scipy.stats`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

__all__ = [
    "mcnemar_exact",
    "wilson_ci",
    "discordant",
    "reuse_accuracy_line",
    "line_residuals",
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


# ---------------------------------------------------------------- Equation 3


def reuse_accuracy_line(dense_acc, reuse_acc, reuse_rate: float) -> Callable[[float], float | np.ndarray]:
    """The reuse-accuracy line of Equation 3 (paper §4.2).

    The paper draws the line through Dense at reuse 0 and unmodified KVComm at its
    realised reuse rate (0.600 in Table 7), not at reuse 1:
    slope = (85.3 - 75.3) / 0.600 = 16.7, so accuracy(%) = 85.3 - 16.7 x reuse rate.
    In general, with r_K = `reuse_rate` (the reuse endpoint's realised reuse rate):

        acc(r) = dense_acc - (dense_acc - reuse_acc) / r_K * r

    so acc(0) = dense_acc and acc(r_K) = reuse_acc. Accuracies may be percent or
    fractions; the line keeps whatever unit it is given. They may also be arrays of
    per-item outcomes (one line per item, as the claims test it: `analysis.line`).
    Returns a function of r that accepts a scalar or an array.
    """
    dense = np.asarray(dense_acc, dtype=float)
    reuse = np.asarray(reuse_acc, dtype=float)
    r_k = float(reuse_rate)
    if not 0.0 < r_k <= 1.0:
        raise ValueError(
            f"reuse_rate (the reuse endpoint's realised reuse rate) must lie in (0, 1], got {reuse_rate!r}"
        )
    slope = (dense - reuse) / r_k

    def line(r: float | np.ndarray) -> float | np.ndarray:
        """Accuracy Equation 3 predicts at reuse rate r."""
        pred = dense - slope * np.asarray(r, dtype=float)
        return float(pred) if pred.ndim == 0 else pred

    line.slope = float(slope) if slope.ndim == 0 else slope  # type: ignore[attr-defined]
    return line


def line_residuals(
    points: Iterable[Sequence[object]] | pd.DataFrame,
    dense_acc: float,
    reuse_acc: float,
    reuse_rate: float,
) -> pd.DataFrame:
    """Equation 3's prediction and residual for (name, reuse_rate, accuracy) points.

    `points` is an iterable of (name, reuse_rate, accuracy) triples or a DataFrame
    with those three columns. The line is `reuse_accuracy_line(dense_acc, reuse_acc,
    reuse_rate)`; residual = accuracy - prediction, so a positive residual is
    accuracy earned beyond the line (Table 7's "resid.").
    Columns: name, reuse_rate, accuracy, prediction, residual.
    """
    line = reuse_accuracy_line(dense_acc, reuse_acc, reuse_rate)
    cols = ["name", "reuse_rate", "accuracy"]
    if isinstance(points, pd.DataFrame):
        missing = [col for col in cols if col not in points.columns]
        if missing:
            raise ValueError(f"points frame lacks columns {missing}")
        frame = points[cols].reset_index(drop=True).copy()
    else:
        rows = [tuple(p) for p in points]
        if any(len(row) != 3 for row in rows):
            raise ValueError("each point must be a (name, reuse_rate, accuracy) triple")
        frame = pd.DataFrame(rows, columns=cols)
    frame["reuse_rate"] = frame["reuse_rate"].astype(float)
    frame["accuracy"] = frame["accuracy"].astype(float)
    if ((frame["reuse_rate"] < 0) | (frame["reuse_rate"] > 1)).any():
        raise ValueError("every point's reuse_rate must lie in [0, 1]")
    frame["prediction"] = line(frame["reuse_rate"].to_numpy())
    frame["residual"] = frame["accuracy"] - frame["prediction"]
    return frame


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
