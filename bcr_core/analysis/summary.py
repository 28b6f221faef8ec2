"""Summaries of a run's item records: paired items only, agreement with Dense, and one row per
condition (`bcr run`'s table)."""

from __future__ import annotations

import pandas as pd

from bcr_core.analysis.stats import paired_table
from bcr_core.conditions import parse
from bcr_core.errors import UsageError


def paired_only(items: pd.DataFrame) -> pd.DataFrame:
    """The items every condition finished (every comparison is paired)."""
    n_conditions = items["condition"].nunique()
    complete = items.groupby("item_id")["condition"].nunique() == n_conditions
    return items[items["item_id"].isin(complete[complete].index)]


def with_agreement(items: pd.DataFrame, dense: str = "dense") -> pd.DataFrame:
    """Adds `agrees_dense`: the item's final text is identical to Dense's on the same item (None
    where Dense has no record of the item)."""
    if dense not in set(items["condition"]):
        raise UsageError(f"Dense-agreement needs the {dense!r} condition among {sorted(set(items['condition']))}")
    reference = items[items["condition"] == dense].set_index("item_id")["final_text"].reindex(items["item_id"])
    agrees = pd.Series(items["final_text"].to_numpy() == reference.to_numpy(), index=items.index)
    if reference.isna().any():
        agrees = agrees.astype(object).where(reference.notna().to_numpy(), None)
    return items.assign(agrees_dense=agrees)


def same(a: pd.Series, b: pd.Series) -> pd.Series:
    """Elementwise equality where two missing answers (nothing extracted) also count as the same."""
    return (a == b) | (a.isna() & b.isna())


def summarize(items: pd.DataFrame, reference: str | None = None, dense: str = "dense") -> pd.DataFrame:
    """One row per condition: accuracy with its Wilson interval (and strict accuracy where the
    benchmark has two rules), agreement with Dense's final text and extracted answer, reuse rate,
    rows per call and how many of them were already exact, calls the skip rule served unrepaired,
    TTFT, and the paired split against `reference` with its exact p (`stats.paired_table`).

    Only items every condition finished are used, so every comparison is paired.
    """
    conditions = list(dict.fromkeys(items["condition"]))
    items = paired_only(items)
    table = items.pivot(index="item_id", columns="condition")
    reference = reference or ("kvcomm" if "kvcomm" in conditions else conditions[0])
    reference = next((c for c in conditions if parse(c).settings == parse(reference).settings), reference)
    if reference not in conditions:
        raise UsageError(f"reference {reference!r} is not among the conditions: {', '.join(conditions)}")
    split = paired_table(items[["item_id", "condition", "correct"]], reference).set_index("condition")
    rows = []
    for c in conditions:
        row = {"condition": c} | split.loc[c, ["n", "accuracy", "wilson_lo", "wilson_hi"]].to_dict()
        if "correct_strict" in table:
            row["accuracy_strict"] = table["correct_strict"][c].astype(bool).mean()
        rows.append(
            row
            | {
                "dense_agreement": (table["final_text"][c] == table["final_text"][dense]).mean()
                if dense in conditions
                else None,
                "answer_agreement": same(table["answer"][c], table["answer"][dense]).mean()
                if dense in conditions
                else None,
                "reuse_rate": table["reuse_rate"][c].mean(),
                "rows_per_call": table["rows_per_call"][c].mean(),
                "rows_wasted_per_call": table["rows_wasted_per_call"][c].mean()
                if "rows_wasted_per_call" in table
                else None,
                "skipped_calls": int(table["skipped_calls"][c].sum()) if "skipped_calls" in table else None,
                "ttft_ms_median": 1000 * table["ttft_s_mean"][c].median(),
                "reference": reference,
            }
            | split.loc[c, ["only_reference_right", "only_condition_right", "p_exact"]].to_dict()
        )
    return pd.DataFrame(rows)
