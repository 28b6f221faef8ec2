"""The tokenization tax read as the factorial a HumanEval cell holds: {Dense's ids, the reuse path's ids} x
{exact cache, predicted cache} is Dense, token-matched Dense, KVComm under the aligned assembly (Dense's ids,
a predicted cache) and KVComm as released. The paper's decomposition (§4.3, App. F) is one path through the
square (ids first, then the cache); where the two factors interact, the other path gives another share, and
a measure that saturates (code identity: once the cache is predicted, little more can be lost) makes them
interact. So each measure gets both simple effects of each factor, the main effects, their interaction and
the ids' share of the cost by either order, every one with a paired percentile bootstrap 95% interval over
items. Description beside the family, not a verdict: the family's tax rows were fixed before the run.

Each cell's per-item cost is its distance from Dense (`tax.distance`): 1 - pass for pass@1, 1 - identity for
code identity, the KL itself for KL; an effect is a difference of costs, + where the factor costs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bcr_core.analysis.claims import tax
from bcr_core.analysis.statistics import inference as inf
from bcr_core.conditions import parse

MEASURES = {"correct": "pass@1", "kl_mean": "KL to Dense", "agrees_code": "final code = Dense's"}
CELLS = ("dense", "matched", "aligned", "released")  # (Dense's ids, exact), (reuse ids, exact), ...
CONTRASTS = {  # name -> weights on (dense, matched, aligned, released) costs
    "ids, exact cache (the tax: token-matched - Dense)": (-1, 1, 0, 0),
    "ids, predicted cache (released - aligned KVComm)": (0, 0, -1, 1),
    "cache, Dense's ids (aligned KVComm - Dense)": (-1, 0, 1, 0),
    "cache, reuse ids (released KVComm - token-matched)": (0, -1, 0, 1),
    "ids, main effect": (-0.5, 0.5, -0.5, 0.5),
    "cache, main effect": (-0.5, -0.5, 0.5, 0.5),
    "interaction (ids under a predicted cache - ids under an exact one)": (1, -1, -1, 1),
    "cost of reuse (released KVComm - Dense)": (-1, 0, 0, 1),
}
SHARES = {  # name -> (numerator, total) weights: the ids' effect over the cost of reuse, by either order
    "ids' share of the cost, ids first": ((-1, 1, 0, 0), (-1, 0, 0, 1)),
    "ids' share of the cost, cache first": ((0, 0, -1, 1), (-1, 0, 0, 1)),
}


def factorial_conditions(conditions: list[str]) -> dict[str, str] | None:
    """The cell's four conditions by role, or None where the cell lacks one."""
    kvcomm = {parse(c).option("assembly"): c for c in conditions if parse(c).name == "kvcomm"}
    found = {
        "dense": "dense" if "dense" in conditions else None,
        "matched": "token-matched-dense" if "token-matched-dense" in conditions else None,
        "aligned": kvcomm.get("aligned"),
        "released": kvcomm.get("released"),
    }
    return found if all(found.values()) else None


def costs(items: pd.DataFrame, measure: str, cells: dict[str, str]) -> np.ndarray:
    """(items, 4): each item's cost in each cell, on the items all four hold."""
    table = tax.distance(items, measure, *(cells[c] for c in CELLS))
    return table[[cells[c] for c in CELLS]].to_numpy(float)


def row(measure: str, contrast: str, effect: float, lo: float, hi: float, items: int) -> dict:
    return {"measure": measure, "contrast": contrast, "effect": effect, "lo": lo, "hi": hi, "items": items}


def factorial_table(items: pd.DataFrame, cells: dict[str, str]) -> pd.DataFrame:
    """One row per contrast and measure: effect, its 95% interval, and the items it is read on."""
    rows = []
    for measure, name in MEASURES.items():
        if measure not in items:
            continue
        cost = costs(items, measure, cells)
        for contrast, weights in CONTRASTS.items():
            per_item = cost @ np.asarray(weights, float)
            rows.append(row(name, contrast, per_item.mean(), *inf.bootstrap_ci(per_item), len(cost)))
        for order, (numerator, total) in SHARES.items():
            share = tax.share_ci(cost @ np.asarray(numerator, float), cost @ np.asarray(total, float))
            rows.append(row(name, order, *share, len(cost)))
    return pd.DataFrame(rows)


def scaled(value: float, measure: str, share: bool) -> str:
    """An effect as the tables print it: a share in percent, KL to four places, a rate in points."""
    if np.isnan(value):
        return "n/a"
    if share:
        return f"{100 * value:.1f}%"
    return f"{value:+.4f}" if measure == MEASURES["kl_mean"] else f"{100 * value:+.1f}"


def factorial_markdown(table: pd.DataFrame) -> str:
    """Contrasts as rows, one column per measure: effect [95% CI]."""
    measures = list(dict.fromkeys(table["measure"]))
    named = [m if m == MEASURES["kl_mean"] else f"{m} (pts)" for m in measures]
    lines = ["| contrast | " + " | ".join(named) + " |", "| --- |" + " --- |" * len(measures)]
    for contrast in dict.fromkeys(table["contrast"]):
        share = contrast.startswith("ids' share")
        cells = []
        for measure in measures:
            found = table[(table["contrast"] == contrast) & (table["measure"] == measure)].iloc[0]
            low, high = scaled(found.lo, measure, share), scaled(found.hi, measure, share)
            cells.append(f"{scaled(found.effect, measure, share)} [{low}, {high}]")
        lines.append(f"| {contrast} | " + " | ".join(cells) + " |")
    items = int(table["items"].min())
    return "\n".join(lines) + (
        f"\n\nOn {items} items; each cell's cost is its distance from Dense; + is a cost. Percentile bootstrap "
        "95% intervals over items (5,000 resamples); a share's interval resamples its two terms together."
    )
