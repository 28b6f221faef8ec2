"""The tables and frames the notebooks draw, from run records (the per-condition table is
`analysis.reports.summary.condition_table`): Dense-agreement compared pairwise, the gate's rejection
counter, the warm-up blocks, Equation 3's line with residuals, the budget check of every repaired
call, seed spreads, and the token-by-token tokenization diff.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from bcr_core.analysis.claims.line import line_residuals, reuse_accuracy_line
from bcr_core.analysis.claims.protocol import with_agreement
from bcr_core.analysis.reports.summary import paired_only
from bcr_core.analysis.statistics.binary import paired_split
from bcr_core.conditions import DEFINITIONS, layout_config, parse
from bcr_core.errors import UsageError
from bcr_core.repair.layouts import LayoutConfig, layout
from bcr_core.reuse.prompts import tokenization_diff
from bcr_core.spec_grammar import is_coin


def gate_counts(calls: pd.DataFrame) -> pd.DataFrame:
    """The rejection counter: per condition, calls served from cache vs densely, and every gate
    decision (one per placeholder of a call) by its reason."""
    rows = []
    for condition, group in calls.groupby("condition", sort=False):
        counts = {
            "condition": condition,
            "calls": len(group),
            "reused": int((group["mode"] == "reuse").sum()),
            "dense": int((group["mode"] == "dense").sum()),
        }
        reasons = pd.Series([d["reason"] for ds in group["decisions"] for d in ds], dtype=object).value_counts()
        for reason, count in reasons.items():
            counts[f"gate:{reason}"] = int(count)
        for reason, count in group.loc[group["mode"] == "dense", "reason"].value_counts().items():
            if reason != "dense":
                counts[f"call:{reason}"] = int(count)
        rows.append(counts)
    table = pd.DataFrame(rows).fillna(0)
    columns = [c for c in table.columns if c.startswith(("gate:", "call:"))]
    table[columns] = table[columns].astype(int)
    return table


def entropy_rejections(calls: pd.DataFrame) -> dict[str, int]:
    """Per condition, how many gate decisions the entropy test refused (Equation 2 firing)."""
    return {
        c: sum(d["reason"] == "entropy" for ds in g["decisions"] for d in ds)
        for c, g in calls.groupby("condition", sort=False)
    }


def block_table(items: pd.DataFrame, dense: str, reuse: str, block: int) -> pd.DataFrame:
    """Table 6: per block of `block` consecutive items, the reuse condition's reuse rate, both
    accuracies, their difference, and the block's own paired split (reference: Dense)."""
    items = paired_only(items)
    wide = items.pivot(index="index", columns="condition", values="correct").astype(bool).sort_index()
    reuse_rate = items[items["condition"] == reuse].set_index("index")["reuse_rate"].sort_index()
    text = items.pivot(index="index", columns="condition", values="final_text").sort_index()

    def row(name, index):
        d, r = wide.loc[index, dense], wide.loc[index, reuse]
        return {
            "items": name,
            "n": len(index),
            "reuse_rate": float(reuse_rate.loc[index].mean()),
            "dense_acc": float(d.mean()),
            "reuse_acc": float(r.mean()),
            "delta_points": 100 * float(r.mean() - d.mean()),
            "agrees_dense": float((text.loc[index, reuse] == text.loc[index, dense]).mean()),
        } | paired_split(d, r)

    indices = list(wide.index)
    rows = [
        row(f"{chunk[0] + 1}-{chunk[-1] + 1}", chunk)
        for chunk in (indices[i : i + block] for i in range(0, len(indices), block))
    ]
    rows.append(row(f"1-{len(indices)} (all)", indices))
    return pd.DataFrame(rows)


def line_table(table: pd.DataFrame, dense: str, endpoint: str, value: str = "accuracy") -> pd.DataFrame:
    """Equation 3 through Dense (reuse 0) and `endpoint` (its realised reuse rate): each
    condition's prediction from its reuse rate and its residual (value - prediction), in points."""
    by = table.set_index("condition")
    rate = float(by.loc[endpoint, "reuse_rate"])
    if rate <= 0:
        raise UsageError(
            f"{endpoint} reused no call, so Equation 3's line through it is undefined: "
            "run more items (the anchor pool warms up) or raise gamma"
        )
    points = pd.DataFrame(
        {"name": table["condition"], "reuse_rate": table["reuse_rate"], "accuracy": 100 * table[value].astype(float)}
    )
    out = line_residuals(points, 100 * float(by.loc[dense, value]), 100 * float(by.loc[endpoint, value]), rate)
    return out.rename(
        columns={
            "name": "condition",
            "accuracy": f"{value}_pct",
            "prediction": "predicted_pct",
            "residual": "residual_points",
        }
    )


def line_points(dense_value: float, endpoint_value: float, endpoint_rate: float, steps: int = 21) -> pd.DataFrame:
    """Points of Equation 3's line from reuse 0 to 1, for plotting (values in the given unit)."""
    rates = np.linspace(0.0, 1.0, steps)
    return pd.DataFrame(
        {"reuse_rate": rates, "value": reuse_accuracy_line(dense_value, endpoint_value, endpoint_rate)(rates)}
    )


def condition_budget(condition: str) -> tuple[str, float, LayoutConfig] | None:
    """(layout, rho, layout settings) a repair condition spends, or None for one that repairs nothing."""
    c = parse(condition)
    definition = DEFINITIONS[c.name]
    if definition.layout is None:
        return None
    return definition.layout, definition.budget(c), layout_config(c)


def budget_check(calls: pd.DataFrame) -> pd.DataFrame:
    """Every call of every condition: rows recomputed against what its layout allows at its rho.
    Calls served densely, and conditions that do not repair, must recompute nothing."""
    rows = []
    for call in calls.itertuples(index=False):
        spent = condition_budget(call.condition)
        m = call.cached_rows
        if spent is None or call.mode != "reuse":
            low, high, name, rho = 0, 0, spent[0] if spent else "-", spent[1] if spent else 0.0
        else:
            name, rho, config = spent
            low, high = layout(name, config).bounds(m, rho)
        rows.append(
            {
                "condition": call.condition,
                "item_id": call.item_id,
                "node": call.node,
                "mode": call.mode,
                "layout": name,
                "rho": rho,
                "cached_rows": m,
                "rows": call.rows_recomputed,
                "fewest": low,
                "most": high,
                "within": low <= call.rows_recomputed <= high,
            }
        )
    return pd.DataFrame(rows)


def spans(rows: list[int]) -> list[int]:
    """Lengths of the contiguous runs in a sorted list of rows."""
    lengths, previous = [], None
    for row in rows:
        if previous is not None and row == previous + 1:
            lengths[-1] += 1
        else:
            lengths.append(1)
        previous = row
    return lengths


def rows_per_call(calls: pd.DataFrame) -> pd.DataFrame:
    """Table 15: per condition, rows recomputed per call (all calls) and per repaired call."""
    rows = []
    for condition, group in calls.groupby("condition", sort=False):
        repaired = group[group["rows_recomputed"] > 0]
        rows.append(
            {
                "condition": condition,
                "calls": len(group),
                "repaired_calls": len(repaired),
                "rows_per_call": float(group["rows_recomputed"].mean()),
                "rows_per_repaired_call": float(repaired["rows_recomputed"].mean()) if len(repaired) else 0.0,
                "mean_span": float(np.mean([n for r in repaired["repaired_rows"] for n in spans(r)]))
                if len(repaired) and "repaired_rows" in repaired
                else float("nan"),  # committed records keep the count, not the rows
                "cached_rows_per_call": float(group["cached_rows"].mean()),
            }
        )
    return pd.DataFrame(rows)


def seed_table(items: pd.DataFrame, dense: str = "dense") -> pd.DataFrame:
    """Table 11: per repair budget rho, accuracy under each coin seed, their mean, spread (max - min)
    and a t-based 95% half-width over seeds; Dense-agreement likewise. Descriptive: the seeds re-run
    the same items, so nothing here is a test."""
    items = with_agreement(paired_only(items), dense)
    groups: dict[tuple, list[dict]] = {}
    for condition, group in items.groupby("condition", sort=False):
        c = parse(condition)
        seed = c.options.get("seed", 0 if is_coin(c.name) else None)
        groups.setdefault((c.name, c.value), []).append(
            {
                "column": "acc" if seed is None else f"acc_seed{int(seed)}",
                "accuracy": float(group["correct"].mean()),
                "agrees_dense": float(group["agrees_dense"].mean()),
                "rows_per_call": float(group["rows_per_call"].mean()),
            }
        )
    out, seed_columns = [], []
    for (name, rho), runs in groups.items():
        accuracy = np.array([r["accuracy"] for r in runs])
        k = len(accuracy)
        half = float(scipy_stats.t.ppf(0.975, k - 1) * accuracy.std(ddof=1) / math.sqrt(k)) if k > 1 else float("nan")
        row = {"method": name, "rho": rho, "seeds": k}
        for r in runs:
            row[r["column"]] = r["accuracy"]
            seed_columns += [r["column"]] if r["column"] not in seed_columns else []
        row |= {
            "mean": float(accuracy.mean()),
            "spread": float(accuracy.max() - accuracy.min()),
            "ci95_half": half,
            "agrees_dense_mean": float(np.mean([r["agrees_dense"] for r in runs])),
            "rows_per_call": float(np.mean([r["rows_per_call"] for r in runs])),
        }
        out.append(row)
    columns = [
        "method",
        "rho",
        "seeds",
        *sorted(seed_columns),
        "mean",
        "spread",
        "ci95_half",
        "agrees_dense_mean",
        "rows_per_call",
    ]
    return pd.DataFrame(out).reindex(columns=columns)


# -- tokenization --------------------------------------------------------------------------------
def tokenization_calls(calls: pd.DataFrame) -> pd.DataFrame:
    """Per call: the Dense path's and the reuse path's id counts, whether they match, and where the
    first difference sits."""
    rows = []
    for call in calls.itertuples(index=False):
        dense, merged = list(call.dense_ids), list(call.merged_ids)
        first = next((i for i, (a, b) in enumerate(zip(dense, merged)) if a != b), None)
        if first is None and len(dense) != len(merged):
            first = min(len(dense), len(merged))
        rows.append(
            {
                "condition": call.condition,
                "item_id": call.item_id,
                "node": call.node,
                "dense_tokens": len(dense),
                "merged_tokens": len(merged),
                "identical": dense == merged,
                "first_difference": first,
                "served_path": "both (identical)" if dense == merged else served_path(call.condition),
            }
        )
    return pd.DataFrame(rows)


def served_path(condition: str) -> str:
    """Which tokenization a condition serves: Dense the chat template's ids, every other the reuse path's."""
    return "dense" if parse(condition).name == "dense" else "merged"


def token_alignment(tokenizer, dense_ids: list[int], merged_ids: list[int], context: int = 3) -> pd.DataFrame:
    """The two id sequences side by side around each difference (with `context` equal tokens
    either side): op ('equal', 'replace', 'insert', 'delete'), and per path the row, the id and the
    token's text (repr, so a newline shows as '\\n')."""
    spans = tokenization_diff(tokenizer, dense_ids, merged_ids)
    rows = []

    def side(ids, i, stop):
        if i >= stop:
            return {"row": None, "id": None, "text": ""}
        return {"row": i, "id": ids[i], "text": repr(tokenizer.decode([ids[i]]))}

    def add(number, op, a, a_stop, b, b_stop):
        d, m = side(dense_ids, a, a_stop), side(merged_ids, b, b_stop)
        rows.append(
            {
                "diff": number,
                "op": op,
                "dense_row": d["row"],
                "dense_id": d["id"],
                "dense_text": d["text"],
                "merged_row": m["row"],
                "merged_id": m["id"],
                "merged_text": m["text"],
            }
        )

    for number, span in enumerate(spans):
        (a0, a1), (b0, b1) = span["dense_rows"], span["merged_rows"]
        for k in range(min(context, a0, b0), 0, -1):
            add(number, "equal", a0 - k, a0, b0 - k, b0)
        for k in range(max(a1 - a0, b1 - b0)):
            add(number, span["op"], a0 + k, a1, b0 + k, b1)
        for k in range(min(context, len(dense_ids) - a1, len(merged_ids) - b1)):
            add(number, "equal", a1 + k, len(dense_ids), b1 + k, len(merged_ids))
    frame = pd.DataFrame(
        rows, columns=["diff", "op", "dense_row", "dense_id", "dense_text", "merged_row", "merged_id", "merged_text"]
    )
    for column in ("dense_row", "dense_id", "merged_row", "merged_id"):
        frame[column] = frame[column].astype("Int64")
    return frame


def decomposition(items: pd.DataFrame, dense: str, matched: str, reuse: str) -> pd.DataFrame:
    """The cost of reuse split in two (paper §4.3): Dense vs token-matched Dense is the tokenization
    term (same computation, other ids), token-matched Dense vs reuse the approximation term (same ids,
    predicted cache). Per term: accuracy points first − second, the paired split with the first as
    reference (`binary.paired_split`), and the second's agreement with Dense."""
    items = with_agreement(paired_only(items), dense)
    wide = items.pivot(index="item_id", columns="condition", values="correct").astype(bool)
    agree = items.pivot(index="item_id", columns="condition", values="agrees_dense")
    rows = []
    for term, first, second in [
        ("tokenization", dense, matched),
        ("approximation", matched, reuse),
        ("total", dense, reuse),
    ]:
        a, b = wide[first], wide[second]
        rows.append(
            {"term": term, "first": first, "second": second, "points": 100 * float(a.mean() - b.mean())}
            | paired_split(a, b)
            | {"second_agrees_dense": float(agree[second].mean())}
        )
    return pd.DataFrame(rows)


def readable(frame: pd.DataFrame) -> pd.DataFrame:
    """A table for display: newlines in text cells shown as ⏎ (pandas would print a literal \\n)."""
    return frame.apply(lambda column: column.map(lambda v: v.replace("\n", " ⏎ ") if isinstance(v, str) else v))


def preview(text: str, width: int = 60) -> str:
    """A one-line preview of a segment's text (newlines shown as ⏎)."""
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[: width - 1] + "…"
