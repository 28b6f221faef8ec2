"""Which rows to recompute on real code: the lab's selectors on the Qwen coder's HumanEval calls, one Holm family
fixed before its cell ran (grids/qwen2.5-coder-0.5b-humaneval-selectors.toml).

On the first HumanEval cell the paper's draft, ranking the whole cache, left more KL to Dense than its
row-matched coin, because a quarter of the rows it repaired were exact already (the attention sink on the
system prompt and chat header). Two rules the lab measured on the synthetic task only are served here on code:
the draft ranking only the rows KVComm predicted (`rank=predicted`, Gemma's best deployable selector there) and
the pre-registered `ours` (the draft's attention times CacheBlend's layer-1 deviation). Each is read against its
own row-matched coin (the same rows on every call, by a fair coin) and against the paper's whole-cache draft, on
the measure with power here, per-item KL to Dense (`kl_mean`, the mean teacher-forced KL over the item's calls):

| row | better | worse |
| --- | --- | --- |
| the predicted-row draft beats its coin on code | the draft, rank=predicted | its row-matched coin |
| ours beats its coin on code | ours-chunk | its row-matched coin |
| the predicted-row draft beats the whole-cache draft on code | the draft, rank=predicted | the draft |
| ours beats the whole-cache draft on code | ours-chunk | the draft |

Each row: per item KL(worse) - KL(better), sign-flip over items (the item the unit). Holm over the four.
Superiority: "holds" where the Holm p is below 0.05 with the gain positive, "does not hold" where it is below 0.05
the other way, else undecided with the items 80% power needs at a tenth of KVComm's KL (`KL_EFFECT_SHARE`,
prospective). pass@1 and final-code identity are description beside it, read against the instrument's floor
(`dense-again`), never a verdict: 140 tasks give pass@1 little power and identity saturates.
"""

from __future__ import annotations

import pandas as pd

from bcr_core.analysis.claims.humaneval import KL_EFFECT_SHARE
from bcr_core.analysis.claims.protocol import beside, family, mean_claim, paired, rows_text
from bcr_core.conditions import find

PAPER = "§4.3, Table 5a (the draft against its coin); App. B (the whole-cache ranking)"
DRAFT = "bcr-chunk:chunk=16,gamma=1"  # the paper's rule: the draft ranks every cached row
PREDICTED = "bcr-chunk:chunk=16,gamma=1,rank=predicted"
PREDICTED_COIN = "coin-chunk:chunk=16,gamma=1,match=bcr-chunk,rank=predicted"
OURS = "ours-chunk:chunk=16,gamma=1"
OURS_COIN = "coin-chunk:chunk=16,gamma=1,match=ours-chunk"
KVCOMM = "kvcomm@1"
PLAN = {  # row -> (better, worse), every row read on per-item KL to Dense; fixed before the cell ran
    "the predicted-row draft beats its coin on code": (PREDICTED, PREDICTED_COIN),
    "ours beats its coin on code": (OURS, OURS_COIN),
    "the predicted-row draft beats the whole-cache draft on code": (PREDICTED, DRAFT),
    "ours beats the whole-cache draft on code": (OURS, DRAFT),
}
CONDITIONS = ("dense", KVCOMM, DRAFT, PREDICTED, PREDICTED_COIN, OURS, OURS_COIN, "dense-again")


def is_selectors_cell(conditions: list[str]) -> bool:
    """Whether a cell is this family's: it serves `ours` (which no cell of the paper's family does)."""
    return any(c.startswith("ours-") for c in conditions)


def selector_row(items: pd.DataFrame, calls: pd.DataFrame, claim: str, better: str, worse: str, kvcomm: str | None):
    """One row of `PLAN`: per item KL(worse) - KL(better), sign-flip over items, the rows each recomputed beside."""
    table = paired(items, "kl_mean", better, worse).astype(float)
    test = f"{better} vs {worse}: per-item KL({worse}) - KL({better}), sign-flip over items"
    target = None
    if kvcomm is not None:  # prospective power at a tenth of KVComm's KL on the same items
        target = KL_EFFECT_SHARE * float(paired(items, "kl_mean", kvcomm, better)[kvcomm].mean())
    row = mean_claim(claim, PAPER, "kl_mean", test, table[worse] - table[better], target=target)
    row.evidence = f"KL {table[better].mean():.4f} vs {table[worse].mean():.4f}; " + beside(items, better, worse)
    row.rows = rows_text(calls, better, worse, table.index)
    return row


def selector_verdicts(items: pd.DataFrame, calls: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """The family of `PLAN` on one selectors cell's records (Holm over the rows whose two conditions ran)."""
    conditions = list(dict.fromkeys(items["condition"]))
    recorded = {c: find(conditions, c) for c in CONDITIONS}
    kvcomm = recorded[KVCOMM] if recorded[KVCOMM] in conditions else None
    rows = [
        selector_row(items, calls, claim, recorded[better], recorded[worse], kvcomm)
        for claim, (better, worse) in PLAN.items()
        if recorded[better] in conditions and recorded[worse] in conditions
    ]
    return family(rows, seed)
