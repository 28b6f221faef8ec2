"""The statistical protocol every claim of notebook 10 is read by: one `Verdict` row per claim.

The rules (paper §4, App. D), the same for every row:

- The item is the unit. Binary outcomes (agreement with Dense, accuracy) are one value per item; a
  per-call measure (teacher-forced KL to Dense) is the item's mean over all its calls, a call served
  densely counting with its measured value. Tests pair items, never calls.
- A random control's seeds are one control: per item, the mean of its seeds' outcomes (a share, for
  a binary outcome). The draft is compared with that mean by a sign-flip test over items.
- Budgets are matched in rows: every comparison of repairs shows both sides' realised rows per call.
  Where they differ by more than 5%, the claim is read on the row-matched control (`match=`: exactly
  the paired BCR condition's rows on each call) and the row says so.
- Each row has one test, and its effect, 95% interval and p come from it. Effects are signed so that
  positive is the paper's direction. Binary pairs: exact McNemar, Newcombe's interval. Per-item
  differences: a sign-flip permutation test of their mean, a bootstrap interval over items.
- A claim of no difference is an equivalence test (TOST) with the margin `MARGIN`, fixed before the
  runs. It holds when equivalence is shown; does not hold when the 95% interval lies wholly beyond
  the margin; else it is undecided.
- The claims of one table are one family: Holm-adjusted p beside the raw p, verdicts read from the
  adjusted one. An undecided claim gives the items 80% power would need at the observed rates, and
  the smallest difference the current n detects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from bcr_core.analysis import inference as inf
from bcr_core.analysis.stats import mcnemar_exact

ALPHA = inf.ALPHA
MARGIN = 0.03  # equivalence margin of the null claims: 3 points of accuracy or agreement
ROW_TOLERANCE = 0.05  # realised rows that differ by more than this share are not a matched budget
MEASURES = {"agrees_dense": "agreement with Dense", "correct": "accuracy", "kl_mean": "KL to Dense"}


@dataclass
class Verdict:
    claim: str
    paper: str
    measure: str
    test: str  # the test and its unit, in one line
    verdict: str  # holds | does not hold | undecided | not measured
    effect: float | None = None  # + = the paper's direction (points for proportions)
    ci_lo: float | None = None
    ci_hi: float | None = None
    p: float | None = None
    p_holm: float | None = None
    n: int | None = None
    evidence: str = ""
    rows: str = ""  # realised rows per call of both sides, and their share of the cached rows
    read_on: str = ""  # which pair the verdict is read on, when it is not the nominal one
    items_needed: int | None = None  # for 80% power at alpha 0.05, at the observed rates
    detectable: float | None = None  # smallest effect the current n detects with 80% power
    kind: str = "superiority"  # superiority | equivalence | exact


def paired(items: pd.DataFrame, value: str, *conditions: str) -> pd.DataFrame:
    """`value` per item (rows) and condition (columns), only items every named condition finished."""
    table = items[items["condition"].isin(conditions)].pivot(index="item_id", columns="condition", values=value)
    return table.reindex(columns=list(conditions)).dropna()


# ------------------------------------------------------------------------------- one row each
def binary_claim(claim, paper, measure, test, better, worse) -> Verdict:
    """`better` is claimed to beat `worse` on paired booleans per item: exact McNemar, Newcombe CI."""
    both, b_only, w_only, neither = inf.table_of(better, worse)
    n = both + b_only + w_only + neither
    lo, hi = inf.paired_difference_ci(both, b_only, w_only, neither)
    row = Verdict(claim, paper, measure, test, "undecided", (b_only - w_only) / n, lo, hi)
    row.p, row.n = mcnemar_exact(b_only, w_only), n
    row.evidence = f"{b_only}/{w_only} (items only the claimed side / only the other side gets)"
    row.items_needed = inf.mcnemar_items_needed(b_only / n, w_only / n)
    row.detectable = inf.detectable_difference((b_only + w_only) / n, n)
    return row


def mean_claim(claim, paper, measure, test, gain, rates=None) -> Verdict:
    """Per-item differences `gain` (+ = the paper's direction): sign-flip p, bootstrap 95% CI.
    `rates` = (p10, p01) for a binary outcome's power under exact McNemar; else a normal approx."""
    gain = np.asarray(gain, float)
    if gain.size == 0:
        return Verdict(claim, paper, measure, test, "not measured", evidence="no paired items")
    lo, hi = inf.bootstrap_ci(gain)
    row = Verdict(claim, paper, measure, test, "undecided", float(gain.mean()), lo, hi, inf.sign_flip(gain))
    row.n = int(gain.size)
    if rates is None:
        row.items_needed, row.detectable = inf.mean_items_needed(gain), inf.mean_detectable(gain)
    else:
        row.items_needed = inf.mcnemar_items_needed(*rates)
        row.detectable = inf.detectable_difference(sum(rates), row.n)
    return row


def equivalence_claim(claim, paper, measure, test, effect, ci, p_tost, n, evidence) -> Verdict:
    """A null claim read by TOST within ±MARGIN (set afterwards from the adjusted p)."""
    row = Verdict(claim, paper, measure, test, "undecided", effect, *ci, p_tost, n=n, evidence=evidence)
    row.kind = "equivalence"
    return row


def decide(row: Verdict) -> Verdict:
    """The verdict from the Holm-adjusted p (exact checks and unmeasured rows keep theirs)."""
    if row.kind == "exact" or row.verdict == "not measured" or row.p_holm is None:
        return row
    significant = row.p_holm < ALPHA
    if row.kind == "equivalence":
        beyond = row.ci_lo >= MARGIN or row.ci_hi <= -MARGIN
        row.verdict = "holds" if significant else "does not hold" if beyond else "undecided"
    else:
        row.verdict = ("holds" if row.effect > 0 else "does not hold") if significant else "undecided"
    if row.verdict != "undecided":
        row.items_needed = row.detectable = None
    return row


# ------------------------------------------------------------------------------- rows and budgets
def realised_rows(calls: pd.DataFrame, condition: str, item_ids) -> tuple[float, float]:
    """Mean rows recomputed per call served from an assembled cache, and their mean share of the
    call's cached rows on the calls that repaired (0, 0 for a condition that never repairs)."""
    own = calls[(calls["condition"] == condition) & calls["item_id"].isin(item_ids) & (calls["mode"] == "reuse")]
    if own.empty or "rows_recomputed" not in own:
        return 0.0, 0.0
    repaired = own[own["rows_recomputed"] > 0]
    cached = repaired["cached_rows"]
    share = float((repaired["rows_recomputed"] / cached).mean()) if len(repaired) else 0.0
    return float(own["rows_recomputed"].mean()), share


def rows_text(calls, a: str, b: str, item_ids) -> str:
    (ra, sa), (rb, sb) = realised_rows(calls, a, item_ids), realised_rows(calls, b, item_ids)
    return f"{ra:.1f} vs {rb:.1f} rows/reuse call ({100 * sa:.1f}% vs {100 * sb:.1f}% of cached rows)"


def rows_differ(calls, a: str, b: str, item_ids) -> bool:
    ra, rb = realised_rows(calls, a, item_ids)[0], realised_rows(calls, b, item_ids)[0]
    return abs(ra - rb) > ROW_TOLERANCE * max(ra, rb, 1e-9)
