"""The paper's claims on HumanEval, as one Holm family on one model's HumanEval cell.

The paper's HumanEval finding is a null (Table 4(d), Qwen2.5-Coder-7B-Instruct, gamma 1.0): reuse costs
nothing there, "every condition's average sits inside four points", and no repair damages it. HumanEval has
164 tasks, and pass@1 on that many items has little power for anything but a large effect, so the plan
below fixes, before the cell runs, which measure decides each row (`PLAN`): the two claims the paper makes
about pass@1 are read on pass@1; the rows about the cache (the tax, the approximation, what repair
recovers, the draft against its coin) are read on fidelity to Dense, per item: the final code identical
to Dense's (`agrees_code`), or the mean teacher-forced KL over the item's calls (`kl_mean`).

| row | measure | test (item as the unit) |
| --- | --- | --- |
| reuse costs nothing on HumanEval | pass@1 | Dense vs KVComm, TOST within ±4 pts (Tango's score tests over items) |
| no repair damages HumanEval | pass@1 | BCR-chunk vs Dense, TOST within ±4 pts |
| reuse pays a tokenization tax | final code = Dense's | Dense vs token-matched Dense, sign-flip; absent below 3 pts |
| the approximation costs fidelity | final code = Dense's | token-matched Dense vs KVComm, exact McNemar |
| repair cannot touch the tokenization tax | final code = Dense's | token-matched Dense minus BCR-chunk above -1.6 pts |
| BCR-chunk beats KVComm | KL to Dense | per-item KL(KVComm) - KL(BCR-chunk), sign-flip |
| draft beats coin at chunk granularity | KL to Dense | BCR-chunk vs its coin's seeds as one control |

A superiority row whose 95% interval lies wholly below `ABSENT_BELOW` "does not hold": the tax claimed is
absent (a tax the run can show smaller than the smallest effect of interest). Every row prints the items
80% power would need (prospective at the margin or `MIN_EFFECT`, and post hoc at the observed effect);
the TOST rows' is the exact power of Tango's TOST at the observed discordance with the two truly level
(`power.tango_items_needed`), so a run with no discordant item yet does not read "2 items would do".
"""

from __future__ import annotations

import pandas as pd

from bcr_core.analysis.claims import tax
from bcr_core.analysis.claims.protocol import (
    LINE_MARGIN,
    MIN_EFFECT,
    Verdict,
    beside,
    binary_claim,
    family,
    mean_claim,
    paired,
    ran,
    read_by_tango,
    rows_text,
    with_agreement,
)
from bcr_core.analysis.claims.synthetic import coin_claim, coin_seeds
from bcr_core.analysis.statistics import inference as inf
from bcr_core.analysis.statistics import power
from bcr_core.conditions import find, parse

PAPER = "§4, Table 4(d)"
HUMANEVAL_MARGIN = 0.04  # Table 4(d): "every condition's average sits inside four points"
ABSENT_BELOW = MIN_EFFECT  # a tax whose 95% interval lies below 3 pts of code agreement is absent
KL_EFFECT_SHARE = 0.1  # the smallest KL gain of interest, for prospective power: a tenth of KVComm's KL
PLAN = {  # which measure decides each row, fixed before the cell runs
    "reuse costs nothing on HumanEval": "correct",
    "no repair damages HumanEval": "correct",
    "reuse pays a tokenization tax": "agrees_code",
    "the approximation costs fidelity": "agrees_code",
    "repair cannot touch the tokenization tax": "agrees_code",
    "BCR-chunk beats KVComm": "kl_mean",
    "draft beats coin at chunk granularity": "kl_mean",
}


def with_code_agreement(items: pd.DataFrame, dense: str) -> pd.DataFrame:
    """`agrees_code`: the item's final code (the answer HumanEval's grader ran) is Dense's, character for character."""
    found = with_agreement(items.assign(final_text=items["answer"]), dense)
    return items.assign(agrees_code=found["agrees_dense"], agrees_dense=with_agreement(items, dense)["agrees_dense"])


def tost_row(items, calls, claim, measure, a, b) -> Verdict:
    """`a` level with `b` within ±HUMANEVAL_MARGIN on a pass/fail measure: TOST by Tango's score tests on
    the paired items (a t-test would read "no discordant item" as zero variance, so certainty, at any n),
    its 90% interval the verdict's, exact McNemar and the other measures beside it."""
    table = paired(items, measure, a, b).astype(float)
    d = table[a] - table[b]
    both, a_only, b_only, neither = inf.table_of(table[a] == 1, table[b] == 1)
    test = f"{a} vs {b}: per-item difference within ±{100 * HUMANEVAL_MARGIN:g} pts, TOST by Tango's score tests"
    row = Verdict(claim, PAPER, measure, test, "undecided", float(d.mean()), n=len(d), kind="equivalence")
    row.ci_lo, row.ci_hi = inf.tango_interval(a_only, b_only, len(d), 0.95)  # effect, interval and p: one test
    read_by_tango(row, a_only, b_only, HUMANEVAL_MARGIN)
    row.per_item = d
    row.evidence = (
        f"pass@1 {100 * table[a].mean():.1f}% vs {100 * table[b].mean():.1f}%; {a_only}/{b_only} (items only "
        f"{a} / only {b} passes); " + beside(items, a, b)
    )
    row.rows = rows_text(calls, a, b, table.index)
    return row


def tax_row(items, dense, matched) -> Verdict:
    """The tax on code agreement: Dense (which agrees with itself) minus token-matched Dense, per item."""
    table = paired(items, "agrees_code", dense, matched).astype(float)
    test = (
        "Dense vs token-matched Dense: per-item difference in final code identical to Dense's, sign-flip; "
        f"absent if its 95% interval lies below {100 * ABSENT_BELOW:g} pts"
    )
    row = mean_claim(
        "reuse pays a tokenization tax", "§4.3, App. F", "agrees_code", test, table[dense] - table[matched]
    )
    row.absent_below = ABSENT_BELOW
    row.evidence = f"token-matched Dense's final code is Dense's on {100 * table[matched].mean():.1f}% of items"
    return row


def untouched_row(items, matched, bcr) -> Verdict:
    """Repair at or below token-matched Dense on code agreement, within LINE_MARGIN (one-sided t over items)."""
    table = paired(items, "agrees_code", matched, bcr).astype(float)
    gap = table[matched] - table[bcr]
    test = f"{bcr} at or below token-matched Dense: its lead under {100 * LINE_MARGIN:g} pts, one-sided t-test"
    row = Verdict("repair cannot touch the tokenization tax", "§4.3, App. F", "agrees_code", test, "undecided")
    row.effect, (row.ci_lo, row.ci_hi), row.n = float(gap.mean()), inf.t_interval(gap, 0.95), len(gap)
    row.p, row.kind, row.margin, row.per_item = inf.t_noninferior(gap, LINE_MARGIN), "noninferiority", LINE_MARGIN, gap
    row.items_needed = power.noninferior_items_needed(gap, LINE_MARGIN)
    row.evidence = (
        f"final code Dense's: {bcr} {100 * table[bcr].mean():.1f}%, token-matched {100 * table[matched].mean():.1f}%"
    )
    return row


def recorded(conditions: list[str], name: str) -> str | None:
    """The first recorded condition called `name` under the released assembly (the family's; the aligned
    assembly's rows are description beside it)."""
    return next((c for c in conditions if parse(c).name == name and parse(c).option("assembly") == "released"), None)


def humaneval_verdicts(
    items: pd.DataFrame,
    calls: pd.DataFrame,
    bcr: str | None = None,
    kvcomm: str | None = None,
    dense: str = "dense",
    matched: str = "token-matched-dense",
    seed: int = 0,
) -> pd.DataFrame:
    """The family of `PLAN` on one HumanEval cell's records (Holm over the rows measured). BCR-chunk and
    KVComm are the cell's own (the first of each under the released assembly) unless named."""
    conditions = list(dict.fromkeys(items["condition"]))
    bcr = bcr or recorded(conditions, "bcr-chunk") or "bcr-chunk"
    kvcomm = kvcomm or recorded(conditions, "kvcomm") or "kvcomm@1"
    bcr, kvcomm, dense, matched = (find(conditions, c) for c in (bcr, kvcomm, dense, matched))
    items = with_code_agreement(items, dense)
    rows = []
    if ran(conditions, dense, kvcomm):
        rows.append(tost_row(items, calls, "reuse costs nothing on HumanEval", "correct", dense, kvcomm))
    if ran(conditions, dense, bcr):
        rows.append(tost_row(items, calls, "no repair damages HumanEval", "correct", bcr, dense))
    if ran(conditions, dense, matched):
        rows.append(tax_row(items, dense, matched))
    if ran(conditions, matched, kvcomm):
        table = paired(items, "agrees_code", matched, kvcomm).astype(bool)
        test = "token-matched Dense vs KVComm (the same ids, a predicted cache), exact McNemar"
        claim = "the approximation costs fidelity"
        rows.append(binary_claim(claim, "§4.3, App. F", "agrees_code", test, table[matched], table[kvcomm]))
    if ran(conditions, matched, bcr):
        rows.append(untouched_row(items, matched, bcr))
    if ran(conditions, bcr, kvcomm):
        table = paired(items, "kl_mean", bcr, kvcomm).astype(float)
        test = "BCR-chunk vs KVComm: per-item KL(KVComm) - KL(BCR-chunk), sign-flip over items"
        target = KL_EFFECT_SHARE * table[kvcomm].mean()  # prospective power at a tenth of KVComm's KL
        gain = table[kvcomm] - table[bcr]
        row = mean_claim("BCR-chunk beats KVComm", "§4.3, Table 5a", "kl_mean", test, gain, target=target)
        row.evidence, row.rows = beside(items, bcr, kvcomm), rows_text(calls, bcr, kvcomm, table.index)
        # the share of the approximation's KL (KVComm's over token-matched Dense's) it recovers
        if ran(conditions, matched):
            row.evidence += "; " + tax.recovered_text(items, matched, kvcomm, bcr, "kl_mean")
        rows.append(row)
    coins = coin_seeds(bcr, conditions, "bcr-chunk") or coin_seeds(bcr, conditions) if bcr in conditions else []
    if coins:
        claim = "draft beats coin at chunk granularity"
        rows.append(
            coin_claim(items, calls, claim, "§4.3, Table 5a", "kl_mean", bcr, coins, coin_seeds(bcr, conditions))
        )
    return family(rows, seed)
