"""Equation 3's line and what repair does to it (paper §4.2, §4.3).

Every gate setting serves its dense calls on the reuse path's ids, so the line's reuse-0 end is
token-matched Dense, not Dense: the line runs through token-matched Dense at reuse 0 and KVComm at
its realised reuse rate r_K. With the rates held at their means, a condition's residual off the line
is the mean over items of

    e_i = y_i - (t_i - (t_i - k_i) r / r_K)

(y, t, k: the condition's, token-matched Dense's and KVComm's outcome on item i; r: the condition's
reuse rate), so every test below is over items:

- `line_claim`: every gate setting within ±margin of the line, the margin `DROP_SHARE` of the
  Dense-to-KVComm drop on the same items and measure; TOST by two one-sided t-tests, the
  intersection-union over settings (the largest p), read on 90% intervals; beside it, the items the
  TOST would need for 80% power at that margin;
- `lift_claim`: repair lifts the line: BCR-chunk's residual above the same line on the main grid
  (the paper: 9.5 points above), a sign-flip over items;
- `recovery_claim`: repair recovers most of the cost: (BCR - KVComm) / (Dense - KVComm) with a
  bootstrap interval, tested against one half by the sign-flip of (BCR - KVComm) - (Dense - KVComm) / 2.
"""

from __future__ import annotations

import pandas as pd

from bcr_core.analysis import inference as inf
from bcr_core.analysis.protocol import Verdict, equivalence_claim, mean_claim, paired
from bcr_core.analysis.tax import DROP_SHARE, scaled, share_ci

RECOVERY_NULL = 0.5  # "most of the cost": more than half of the Dense-to-KVComm drop


def residuals(items: pd.DataFrame, measure: str, matched: str, kvcomm: str, conditions: list[str]) -> pd.DataFrame:
    """Per item, each condition's residual e_i off the line through `matched` (reuse 0) and `kvcomm`
    (its mean reuse rate), on the items all of them ran."""
    y = paired(items, measure, matched, kvcomm, *conditions).astype(float)
    rate = paired(items, "reuse_rate", matched, kvcomm, *conditions).loc[y.index].mean()
    r_k = max(float(rate[kvcomm]), 1e-9)
    line = {c: y[matched] - (y[matched] - y[kvcomm]) * float(rate[c]) / r_k for c in conditions}
    return pd.DataFrame({c: y[c] - line[c] for c in conditions}), rate


def line_claim(gate: pd.DataFrame | None, dense, matched, kvcomm, settings, measure) -> Verdict:
    """Every gate setting within ±(DROP_SHARE of the Dense-to-KVComm drop) of the line through
    token-matched Dense and KVComm: TOST over items, the largest p over settings."""
    claim, paper = "the gate only slides along Equation 3's line", "§4.2, Eq. 3, Tables 7 and 9"
    present = [s for s in settings if gate is not None and s in set(gate["condition"])]
    if not present or {dense, matched, kvcomm} - set(gate["condition"]):
        evidence = "no gate run" if gate is None else "no token-matched Dense on the gate's items"
        return Verdict(claim, paper, measure, "residuals off the line", "not measured", evidence=evidence)
    e, rate = residuals(gate, measure, matched, kvcomm, present)
    ends = paired(gate, measure, dense, kvcomm).loc[e.index].astype(float).mean()
    margin = DROP_SHARE * float(ends[dense] - ends[kvcomm])
    if margin <= 0:
        return Verdict(claim, paper, measure, "residuals off the line", "not measured", evidence="reuse costs nothing")
    parts, rows = [], []
    for s in present:
        p, ci90, ci95 = inf.t_tost(e[s], margin), inf.t_interval(e[s], 0.90), inf.t_interval(e[s], 0.95)
        beyond = ci90[0] >= margin or ci90[1] <= -margin
        rows.append((beyond, p, s, ci90, ci95))
        extra = " (extrapolation: reuse beyond KVComm's)" if rate[s] > rate[kvcomm] else ""
        parts.append(
            f"{s}: {100 * e[s].mean():+.1f} pts [{100 * ci95[0]:+.1f}, {100 * ci95[1]:+.1f}], TOST p {p:.2g}{extra}"
        )
    beyond, _, worst, ci90, ci95 = max(rows, key=lambda r: (r[0], r[1]))  # a setting beyond, else the weakest
    test = (
        f"residual off the line through token-matched Dense and KVComm within ±{DROP_SHARE:g} of the "
        f"Dense-to-KVComm drop (±{100 * margin:.1f} pts): TOST by one-sided t-tests over items, largest p over settings"
    )
    evidence = f"Dense-to-KVComm drop {100 * (ends[dense] - ends[kvcomm]):.1f} pts, KVComm reuse {rate[kvcomm]:.2f}; "
    row = equivalence_claim(
        claim, paper, measure, test, float(e[worst].mean()), ci95, max(r[1] for r in rows), len(e), evidence
    )
    row.evidence += "; ".join(parts)
    row.margin, (row.tost_lo, row.tost_hi) = margin, ci90
    row.items_needed = max(inf.tost_items_needed(e[s], margin) or 0 for s in present)
    row.per_item = e[worst]
    return row


def lift_claim(items, matched, kvcomm, bcr, measure) -> Verdict:
    """BCR-chunk's residual above the line through token-matched Dense and KVComm (sign-flip)."""
    e, rate = residuals(items, measure, matched, kvcomm, [bcr])
    test = f"{bcr}'s residual above the line through token-matched Dense and KVComm, sign-flip over items"
    row = mean_claim("repair lifts Equation 3's line", "§4.3", measure, test, e[bcr])
    row.evidence = f"reuse rate {bcr} {rate[bcr]:.2f}, KVComm {rate[kvcomm]:.2f}"
    return row


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
    row.evidence = f"recovered {scaled(recovered.mean(), measure)} of {scaled(cost.mean(), measure)}; on {measure}"
    row.effect, row.ci_lo, row.ci_hi, row.measure, row.null = share, lo, hi, "share", RECOVERY_NULL
    row.parts = pd.DataFrame({"numerator": recovered, "denominator": cost})
    return row


def gate_with_matched(gate: pd.DataFrame | None, items: pd.DataFrame, matched: str) -> pd.DataFrame | None:
    """The gate run's items with token-matched Dense from the main grid on the same item ids (the
    gate run has no arm of its own on the reuse path's ids; Dense is deterministic, so the two runs'
    items pair by id)."""
    if gate is None or matched in set(gate["condition"]):
        return gate
    extra = items[(items["condition"] == matched) & items["item_id"].isin(gate["item_id"])]
    return pd.concat([gate, extra[[c for c in gate.columns if c in extra.columns]]], ignore_index=True)


__all__ = ["line_claim", "lift_claim", "recovery_claim", "residuals", "gate_with_matched"]
