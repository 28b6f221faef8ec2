"""The per-condition table every report of the lab prints (`bcr run`, `bcr grid`, the notebooks and
the claims' grid), and the item-level pieces it is built from: paired items only, agreement with
Dense.

One builder (`condition_table`) and one vocabulary (`COLUMNS`: every column such a table may hold,
with its meaning, in the order the columns appear). A table asks for column groups (`GROUPS`);
`RUN` is what `bcr run`, `bcr grid` and the notebooks print, `GRID` the claims' grid table
(results/**/grid_table.csv).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from bcr_core.analysis.claims.protocol import paired, realised_rows, with_agreement
from bcr_core.analysis.statistics.binary import SPLIT, paired_split, wilson_ci
from bcr_core.analysis.statistics.inference import sign_flip
from bcr_core.conditions import find
from bcr_core.errors import UsageError
from bcr_core.paths import write_text_whole

KL_RESAMPLES = 20_000  # sign flips behind the KL p: its floor is 1 / 20,001, printed as a bound

COLUMNS = {
    "condition": "the condition's label as recorded",
    "n": "items every condition of the table finished (every comparison is paired)",
    "accuracy": "share of those items answered correctly",
    "wilson_lo": "lower end of accuracy's Wilson 95% interval",
    "wilson_hi": "upper end of accuracy's Wilson 95% interval",
    "accuracy_strict": "accuracy under the benchmark's strict rule, where it has two",
    "agrees_dense": "share of items whose final text is identical to Dense's",
    "answer_agreement": "share of items whose extracted answer equals Dense's (two missing answers agree)",
    "kl_per_item": "mean over items of the item's mean KL to Dense (items every condition measured)",
    "reuse_rate": "mean over items of the share of calls served from an assembled cache",
    "reuse_calls": "calls served from an assembled cache",
    "first_token_agree": "share of reuse calls whose first token is Dense's (description)",
    "kl_reuse_calls": "mean KL to Dense of the reuse calls (description)",
    "rows_per_call": "mean over items of rows recomputed per call, every call counted",
    "rows_per_reuse_call": "rows recomputed per reuse call",
    "rows_share": "mean share of the cached rows recomputed, on the calls that repaired",
    "rows_wasted_per_call": "rows recomputed on the agent's exact prefix per call: per reuse call where "
    "the table reads the calls (group `calls`), else the items' mean over every call (group `items`)",
    "skipped_calls": "calls the skip rule served unrepaired",
    "ttft_ms": "median over items of the item's mean time to first token, ms",
    "reference": "the condition the paired split is against",
    "only_reference_right": "items only the reference gets right (on the table's `value`)",
    "only_condition_right": "items only the row's condition gets right",
    "p_exact": "exact McNemar p of that split",
    "kl_p_vs_reference": "sign-flip p of the per-item KL difference from the reference",
}

GROUPS = {
    "strict": ("accuracy_strict",),
    "agreement": ("agrees_dense",),
    "answers": ("answer_agreement",),
    "reuse": ("reuse_rate",),
    "items": ("reuse_rate", "rows_per_call", "rows_wasted_per_call", "skipped_calls"),
    "latency": ("ttft_ms",),
    "calls": (
        "kl_per_item",
        "reuse_rate",
        "reuse_calls",
        "first_token_agree",
        "kl_reuse_calls",
        "rows_per_reuse_call",
        "rows_share",
        "rows_wasted_per_call",
        "skipped_calls",
        "kl_p_vs_reference",
    ),
    "reference": ("reference",),
    "split": (*SPLIT, "p_exact"),
}
BASE = ("condition", "n", "accuracy", "wilson_lo", "wilson_hi")
RUN = ("strict", "agreement", "answers", "items", "latency", "reference", "split")
GRID = ("agreement", "calls", "split")


def paired_only(items: pd.DataFrame) -> pd.DataFrame:
    """The items every condition finished (every comparison is paired)."""
    n_conditions = items["condition"].nunique()
    complete = items.groupby("item_id")["condition"].nunique() == n_conditions
    return items[items["item_id"].isin(complete[complete].index)]


def same(a: pd.Series, b: pd.Series) -> pd.Series:
    """Elementwise equality where two missing answers (nothing extracted) also count as the same."""
    return (a == b) | (a.isna() & b.isna())


def condition_table(
    items: pd.DataFrame,
    reference: str | None = None,
    *,
    conditions: list[str] | None = None,
    calls: pd.DataFrame | None = None,
    dense: str = "dense",
    value: str = "correct",
    groups: tuple[str, ...] = RUN,
) -> pd.DataFrame:
    """One row per condition (`conditions`, each found by its settings; default every recorded one,
    in order of appearance) on the items all of them finished: `BASE`, then the columns of `groups`
    in `COLUMNS`' order. The paired split compares each condition with `reference` (default KVComm
    where recorded, else the first condition) on the boolean `value`; the reference's own row has
    none. Group `calls` reads `calls`, the call records."""
    recorded = list(dict.fromkeys(items["condition"]))
    conditions = [find(recorded, c) for c in conditions] if conditions else recorded
    reference = find(recorded, reference or ("kvcomm" if "kvcomm" in recorded else conditions[0]))
    dense = find(recorded, dense)
    if reference not in conditions:
        raise UsageError(f"reference {reference!r} is not among the conditions: {', '.join(conditions)}")
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise UsageError(f"unknown column group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    if "calls" in groups and calls is None:
        raise UsageError("the `calls` column group reads the call records: pass calls=")
    check_unpooled(items)
    ids = paired_only(items[items["condition"].isin(conditions)])["item_id"].unique()
    items = items[items["item_id"].isin(ids)]
    if dense in recorded:
        items = with_agreement(items, dense)
    if value not in items:
        raise UsageError(f"the paired split reads {value!r}, which the records do not hold")
    wide = items.pivot(index="item_id", columns="condition", values=value).astype(bool)
    calls = calls[calls["item_id"].isin(ids)] if calls is not None else None
    kl = paired(items, "kl_mean", *conditions) if "calls" in groups and "kl_mean" in items else None
    rows = []
    for c in conditions:
        mine = items[items["condition"] == c]
        row = base_columns(mine) | strict_columns(mine) | agreement_columns(mine, items, dense)
        row |= item_columns(mine) | {"reference": reference}
        if "calls" in groups:
            row |= call_columns(calls, c, ids, kl)
        row |= split_columns(wide, kl, reference, c)
        rows.append(row)
    wanted = set(BASE).union(*(GROUPS[g] for g in groups))
    present = set().union(*rows)
    return pd.DataFrame(rows).reindex(columns=[c for c in COLUMNS if c in wanted and c in present])


def check_unpooled(items: pd.DataFrame) -> None:
    """Refuse records holding an (item, condition) pair twice: repeated cells (the same items re-run
    under another agent count, say) are never pooled into one paired test (the paper's protocol)."""
    repeated = items.duplicated(subset=["item_id", "condition"], keep=False)
    if repeated.any():
        item, condition = items.loc[repeated, ["item_id", "condition"]].iloc[0]
        raise UsageError(
            f"{int(repeated.sum())} records repeat an (item, condition) pair, e.g. item {item} of {condition!r}: "
            "repeated cells are never pooled into one paired test; table each cell's records on their own"
        )


def write_summary(items: pd.DataFrame, reference: str, folder: Path) -> pd.DataFrame:
    """A run folder's `summary.csv`: the `condition_table` of its items, which it returns."""
    table = condition_table(items, reference)
    write_text_whole(Path(folder) / "summary.csv", table.to_csv(index=False))
    return table


def no_reuse_note(calls: list[dict], n: int) -> str | None:
    """Why a run's table shows every condition alike, when none of its gated calls reused a cache:
    KVComm's gate turns a segment down until its placeholder's pool holds two anchors, for the node,
    at least as long as the segment (docs/design.md), which a run of a few items may never fill. None
    when a call reused, or when no condition gates (Dense alone)."""
    gated = Counter(c["reason"] for c in calls if c["reason"] != "dense")
    if not gated or "reuse" in gated:
        return None
    reasons = ", ".join(f"{count} {reason}" for reason, count in gated.most_common())
    return (
        f"no call of these {n} items reused a cache (the gate's reasons: {reasons}): KVComm reuses a segment only "
        "once its placeholder holds 2 anchors at least as long (docs/design.md), laid down by earlier items' dense "
        "prefills, so every condition served what Dense serves and the rows are alike; run more items (--n)"
    )


def floor_note(table: pd.DataFrame) -> str | None:
    """The floor beside the agreement column: what `dense-again` (Dense recomputed as the serial conditions
    are served) agrees with Dense on, or that the cell measured none. None for a cell of Dense alone."""
    conditions = set(table["condition"])
    if conditions <= {"dense"}:
        return None
    if "dense-again" not in conditions:
        return "no dense-again in this cell: its agreement with Dense is printed without a measured floor"
    share = float(table.set_index("condition").loc["dense-again", "agrees_dense"])
    said = "dense-again (Dense served again as the serial conditions are) agrees with Dense on"
    return f"floor: {said} {100 * share:.1f}%"


def base_columns(mine: pd.DataFrame) -> dict:
    k, n = int(mine["correct"].astype(bool).sum()), len(mine)
    lo, hi = wilson_ci(k, n)
    return {"condition": mine["condition"].iloc[0], "n": n, "accuracy": k / n, "wilson_lo": lo, "wilson_hi": hi}


def strict_columns(mine: pd.DataFrame) -> dict:
    return {"accuracy_strict": float(mine["correct_strict"].astype(bool).mean())} if "correct_strict" in mine else {}


def agreement_columns(mine: pd.DataFrame, items: pd.DataFrame, dense: str) -> dict:
    """Agreement with Dense's final text and extracted answer (None where Dense was not run)."""
    if "agrees_dense" not in mine:
        return {"agrees_dense": None, "answer_agreement": None}
    row = {"agrees_dense": float(mine["agrees_dense"].astype(float).mean())}
    if "answer" in mine:
        answers = items[items["condition"] == dense].set_index("item_id")["answer"].reindex(mine["item_id"])
        row["answer_agreement"] = float(
            same(mine["answer"].reset_index(drop=True), answers.reset_index(drop=True)).mean()
        )
    return row


def item_columns(mine: pd.DataFrame) -> dict:
    """Per-item means of what the item records hold about reuse and time."""
    means = ("reuse_rate", "rows_per_call", "rows_wasted_per_call")
    return {column: float(mine[column].mean()) if column in mine else None for column in means} | {
        "skipped_calls": int(mine["skipped_calls"].sum()) if "skipped_calls" in mine else None,
        "ttft_ms": 1000 * float(mine["ttft_s_mean"].median()) if "ttft_s_mean" in mine else None,
    }


def call_columns(calls: pd.DataFrame, condition: str, ids, kl: pd.DataFrame | None) -> dict:
    """What the condition's call records say: per-item KL, and on its reuse calls first-token
    agreement and KL (description), rows repaired and wasted, and calls skipped."""
    mine = calls[calls["condition"] == condition]
    reused = mine[mine["mode"] == "reuse"]
    fid = [f for f in reused["fidelity"] if f] if "fidelity" in reused else []
    rows_per_call, share = realised_rows(calls, condition, ids)
    return {
        "kl_per_item": float(kl[condition].mean()) if kl is not None else np.nan,
        "reuse_calls": len(reused),
        "first_token_agree": float(np.mean([f["first_token_agree"] for f in fid])) if fid else np.nan,
        "kl_reuse_calls": float(np.mean([f["kl"] for f in fid])) if fid else np.nan,
        "rows_per_reuse_call": rows_per_call,
        "rows_share": share,
        "rows_wasted_per_call": float(reused["rows_wasted"].mean()) if len(reused) else 0.0,
        "skipped_calls": int(mine["skipped"].sum()) if "skipped" in mine else 0,
        "kl_p_vs_reference": np.nan,
    }


def split_columns(wide: pd.DataFrame, kl: pd.DataFrame | None, reference: str, condition: str) -> dict:
    """The paired split against the reference with its exact p, and the sign-flip p on per-item KL
    (none on the reference's own row)."""
    if condition == reference:
        return {"only_reference_right": np.nan, "only_condition_right": np.nan, "p_exact": np.nan}
    split = paired_split(wide[reference], wide[condition])
    if kl is not None:
        split["kl_p_vs_reference"] = sign_flip(kl[condition] - kl[reference], resamples=KL_RESAMPLES)
    return split
