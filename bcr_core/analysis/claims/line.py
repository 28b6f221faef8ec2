"""Equation 3's line and what repair does to it (paper §4.2, §4.3, Fig. 2b).

Fig. 2b draws the line through Dense (reuse 0) and unconditional reuse (`kvcomm@1`, the gate that
never refuses) and says every gate setting, the answer-side gate included, lands on it. With the rates
held at their means, a condition's residual off the line through `start` (reuse 0) and `end` (its
realised reuse rate r_E) is the mean over items of

    e_i = y_i - (s_i - (s_i - x_i) r / r_E)

(y, s, x: the condition's, `start`'s and `end`'s outcome on item i; r: the condition's reuse rate), so
every test below is over items, on accuracy (the paper's measure):

- `line_claim`: every gate setting between the anchors (the default gate, the other gammas, OpenGate)
  within ±`LINE_MARGIN` of the line through Dense and unconditional reuse: 1.6 points, the paper's
  own bound (§4.2: no allocation policy more than 1.6 points off, "about half a standard error at
  n = 150"). TOST by two one-sided t-tests, the intersection-union over settings (the largest p), read
  on 90% intervals; it does not hold when any setting's 90% interval lies wholly beyond the margin.
  Beside it, the items the TOST would need for 80% power at that margin. A gate setting's dense calls
  use the reuse path's ids, so the tax shows at reuse 0 as an offset off this line: the paper's line
  has no such term, and a tax larger than the margin is a reason for the claim to fail;
- `lift_text`: BCR-chunk's residual above the line through Dense and KVComm (the paper: 9.5 points
  above, §4.3), description beside BCR-chunk vs KVComm;
- `recovery_claim`: repair recovers most of the cost: (BCR - KVComm) / (Dense - KVComm) with a
  bootstrap interval, tested against one half by the sign-flip of (BCR - KVComm) - (Dense - KVComm) / 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from bcr_core.analysis.claims.protocol import LINE_MARGIN, MEASURES, Verdict, equivalence_claim, mean_claim, paired
from bcr_core.analysis.claims.tax import scaled, share_ci
from bcr_core.analysis.statistics import inference as inf
from bcr_core.analysis.statistics import power

RECOVERY_NULL = 0.5  # "most of the cost": more than half of the Dense-to-KVComm drop


def reuse_accuracy_line(dense_acc, reuse_acc, reuse_rate: float) -> Callable[[float], float | np.ndarray]:
    """The reuse-accuracy line of Equation 3 (paper §4.2).

    The paper draws the line through Dense at reuse 0 and unmodified KVComm at its
    realised reuse rate (0.600 in Table 7), not at reuse 1:
    slope = (85.3 - 75.3) / 0.600 = 16.7, so accuracy(%) = 85.3 - 16.7 x reuse rate.
    In general, with r_K = `reuse_rate` (the reuse endpoint's realised reuse rate):

        acc(r) = dense_acc - (dense_acc - reuse_acc) / r_K * r

    so acc(0) = dense_acc and acc(r_K) = reuse_acc. Accuracies may be percent or
    fractions; the line keeps whatever unit it is given. They may also be arrays of
    per-item outcomes (one line per item, as the claims test it: `analysis.claims.line`).
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


def residuals(items: pd.DataFrame, measure: str, start: str, end: str, conditions: list[str]) -> pd.DataFrame:
    """Per item, each condition's residual e_i off the line through `start` (reuse 0) and `end` (its
    mean reuse rate), on the items all of them ran."""
    y = paired(items, measure, start, end, *conditions).astype(float)
    rate = paired(items, "reuse_rate", start, end, *conditions).loc[y.index].mean()
    line = reuse_accuracy_line(y[start].to_numpy(), y[end].to_numpy(), max(float(rate[end]), 1e-9))
    return pd.DataFrame({c: y[c] - line(float(rate[c])) for c in conditions}, index=y.index), rate


def line_claim(gate: pd.DataFrame | None, dense, unconditional, settings, measure="correct") -> Verdict:
    """Every gate setting within ±LINE_MARGIN of the line through Dense and unconditional reuse:
    TOST over items, the largest p over settings."""
    claim, paper = "the gate only slides along Equation 3's line", "§4.2, Eq. 3, Fig. 2b, Tables 7 and 9"
    present = [s for s in settings if gate is not None and s in set(gate["condition"]) and s != unconditional]
    if not present or {dense, unconditional} - set(gate["condition"]):
        evidence = "no gate run" if gate is None else "no Dense and unconditional reuse on the gate's items"
        return Verdict(claim, paper, measure, "residuals off the line", "not measured", evidence=evidence)
    e, rate = residuals(gate, measure, dense, unconditional, present)
    margin = LINE_MARGIN
    parts, rows = [], []
    bounds = {s: max(1.0, rate[s] / rate[unconditional]) for s in present}  # |e_i| <= max(1, r / r_E)
    for s in present:
        p, ci90 = inf.t_tost(e[s], margin, bounds[s]), inf.t_interval(e[s], 0.90, bounds[s])
        ci95 = inf.t_interval(e[s], 0.95, bounds[s])
        beyond = ci90[0] >= margin or ci90[1] <= -margin
        rows.append((beyond, p, s, ci90, ci95))
        parts.append(
            f"{s} (reuse {rate[s]:.2f}): {100 * e[s].mean():+.1f} pts [{100 * ci95[0]:+.1f}, {100 * ci95[1]:+.1f}], "
            f"TOST p {p:.2g}"
        )
    beyond, _, worst, ci90, ci95 = max(rows, key=lambda r: (r[0], r[1]))  # a setting beyond, else the weakest
    test = (
        f"residual off the line through Dense (reuse 0) and {unconditional} (unconditional reuse) within "
        f"±{100 * margin:g} pts (the paper's bound): TOST by one-sided t-tests over items, largest p over settings"
    )
    ends = paired(gate, measure, dense, unconditional).loc[e.index].astype(float).mean()
    evidence = (
        f"Dense to unconditional reuse {100 * (ends[dense] - ends[unconditional]):+.1f} pts at reuse "
        f"{rate[unconditional]:.2f}; "
    )
    row = equivalence_claim(
        claim, paper, measure, test, float(e[worst].mean()), ci95, max(r[1] for r in rows), len(e), evidence
    )
    row.evidence += "; ".join(parts)
    row.margin, (row.tost_lo, row.tost_hi) = margin, ci90
    row.items_needed = max(power.tost_items_needed(e[s], margin, bound=bounds[s]) or 0 for s in present)
    row.per_item = e[worst]
    return row


def lift_text(items, dense, kvcomm, bcr, measure="correct") -> str:
    """BCR-chunk's residual above the line through Dense and KVComm, with its 95% interval (description)."""
    e, rate = residuals(items, measure, dense, kvcomm, [bcr])
    lo, hi = inf.bootstrap_ci(e[bcr].to_numpy())
    return (
        f"{scaled(e[bcr].mean(), measure)} [{scaled(lo, measure)}, {scaled(hi, measure)}] above Equation 3's line "
        f"through Dense and KVComm (reuse {rate[bcr]:.2f} vs KVComm's {rate[kvcomm]:.2f})"
    )


def recovery_claim(items, dense, kvcomm, bcr, measure) -> Verdict:
    """(BCR - KVComm) / (Dense - KVComm) with its interval, tested against RECOVERY_NULL."""
    y = paired(items, measure, dense, kvcomm, bcr).astype(float)
    recovered, cost = y[bcr] - y[kvcomm], y[dense] - y[kvcomm]
    test = (
        f"(BCR - KVComm) / (Dense - KVComm) against {RECOVERY_NULL:g}: sign-flip over items of "
        f"(BCR - KVComm) - {RECOVERY_NULL:g} (Dense - KVComm)"
    )
    row = mean_claim(
        "repair recovers most of the cost of reuse", "§1, §4.3", measure, test, recovered - RECOVERY_NULL * cost
    )
    share, lo, hi = share_ci(recovered.to_numpy(), cost.to_numpy())
    row.evidence = f"recovered {scaled(recovered.mean(), measure)} of {scaled(cost.mean(), measure)}"
    row.evidence += f" on {MEASURES[measure]}"
    row.effect, row.ci_lo, row.ci_hi, row.measure, row.null = share, lo, hi, "share", RECOVERY_NULL
    row.parts = pd.DataFrame({"numerator": recovered, "denominator": cost})
    return row


__all__ = ["line_claim", "lift_text", "recovery_claim", "residuals"]
