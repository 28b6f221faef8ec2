"""What the notebooks show, as data: run records gathered from disk, the tables and frames the
figures draw, and one inspectable record per agent call.

Three parts:

- Runs on disk. `collect` returns the per-item and per-call records of a set of conditions on
  one grid cell (benchmark, agent count, items, new tokens). A condition already run by
  `bcr run` (any folder under the results folder whose `cell.json` has the same settings and at
  least as many items) is read from there; anything missing is computed with `run_cell`, one
  condition per folder, so notebooks that share a condition (Dense, KVComm) compute it once and
  an interrupted notebook resumes where it stopped.
- Frames. Paired tables in the paper's form (b/c before p), the gate's rejection counter, the
  warm-up blocks, Equation 3's line with residuals, the budget check of every repaired call,
  seed spreads, and the token-by-token tokenization diff.
- Calls. `inspect_requests` serves requests through a condition's server and keeps, for every
  call served from an assembled cache, a `CallView`: ids, token strings, segment map, the
  assembled cache before repair, the draft's attention per layer and head, the rows the server
  repaired, its answer and Dense's on the same prompt. `explore` turns a view and the
  explorer's controls (layer or summed score, head, layout, rho) into everything the heatmap
  draws.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from scipy import stats as scipy_stats
from tqdm.auto import tqdm

from bcr_core import tasks
from bcr_core.conditions import (DEFAULT_RHO, DEFAULT_VALUES, OPTIONS, REPAIR_LAYOUTS, layout_config, make_server, parse,
                                 value_of)
from bcr_core.draft_scores import row_scores
from bcr_core.kv import KV
from bcr_core.layouts import LayoutConfig, layout
from bcr_core.pipeline import Pipeline
from bcr_core.prompts import tokenization_diff
from bcr_core.runner import Cell, paired_only, read_jsonl, run_cell
from bcr_core.serving import DenseServer
from bcr_core.stats import SPLIT, line_residuals, paired_split, paired_table, wilson_ci

# ============================================================================ runs on disk


@dataclass(frozen=True)
class Grid:
    """The settings every condition of one comparison shares (a `bcr run` cell minus conditions)."""

    benchmark: str
    agents: int
    n: int
    max_new_tokens: int
    model: str = "default"
    pinned: str | None = None
    item_seed: int = 0  # the synthetic task's items; ignored by the other benchmarks

    @property
    def extra(self) -> dict:
        return {"seed": self.item_seed} if self.benchmark == "synthetic" else {}

    def items(self) -> list[dict]:
        """The first n items, in the order every condition sees them."""
        return tasks.load_items(self.benchmark, self.n, **self.extra)

    def cell(self, conditions) -> Cell:
        return Cell(benchmark=self.benchmark, n_agents=self.agents, conditions=tuple(conditions), n=self.n,
                    max_new_tokens=self.max_new_tokens, pinned=self.pinned, model=self.model, extra=self.extra)

    @property
    def slug(self) -> str:
        parts = [self.benchmark, f"{self.agents}agents", f"n{self.n}", f"{self.max_new_tokens}tok"]
        if self.benchmark == "synthetic":
            parts.append(f"seed{self.item_seed}")
        if self.pinned:
            parts.append("pinned-" + safe_name(self.pinned))
        if self.model != "default":
            parts.append(safe_name(self.model))
        return "-".join(parts)

    def matches(self, settings: dict) -> bool:
        """Whether a run folder's `cell.json` holds these settings with at least n items."""
        return (settings.get("benchmark") == self.benchmark and settings.get("n_agents") == self.agents
                and settings.get("max_new_tokens") == self.max_new_tokens and settings.get("pinned") == self.pinned
                and settings.get("model") == self.model and (settings.get("extra") or {}) == self.extra
                and int(settings.get("n", 0)) >= self.n)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@=,-]+", "_", text).strip("_")[:80] or "x"


def label(condition: str) -> str:
    """A condition's label (`bcr-chunk@0.2:chunk=16`), as the runner records it."""
    return parse(condition).label


def canonical(condition: str) -> tuple:
    """What a condition runs, with every default filled in, so `bcr-chunk`, `bcr-chunk@0.2` and
    `bcr-chunk@0.2:chunk=64` compare equal (a run recorded under any of them is reused)."""
    return parse(condition).settings


def condition(name: str, value: float | None = None, **options) -> str:
    """A condition label from its parts, leaving out options at their defaults:
    condition("bcr-chunk", 0.2, chunk=64) == "bcr-chunk@0.2"; condition("kvcomm", 0.3) == "kvcomm"."""
    if name == "kvcomm" and value == DEFAULT_VALUES["kvcomm"]:
        value = None
    takes = OPTIONS.get(name, {})
    kept = {k: v for k, v in options.items() if v is not None and (k not in takes or takes[k].default != v)}
    spec = name + ("" if value is None else f"@{value:g}")
    if kept:
        spec += ":" + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in kept.items())
    return label(spec)


@dataclass
class Runs:
    """Per-item and per-call records of several conditions on one grid cell, items in order."""

    grid: Grid
    conditions: list[str]
    items: pd.DataFrame
    calls: pd.DataFrame
    sources: dict[str, Path]  # condition -> the folder its records came from

    def sources_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"condition": c, "folder": str(p)} for c, p in self.sources.items()])


def find_runs(results_dir) -> list[tuple[Path, dict]]:
    """Every run folder under `results_dir` (a folder holding `cell.json`), with its settings."""
    root = Path(results_dir)
    if not root.exists():
        return []
    found = []
    for settings in sorted(root.rglob("cell.json")):
        try:
            found.append((settings.parent, json.loads(settings.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return found


def finished_records(folder: Path, condition: str, n: int) -> tuple[list[dict], list[dict]] | None:
    """The first n items of `condition` in a run folder and their calls, or None if any is missing."""
    items = [r for r in read_jsonl(folder / "items.jsonl") if r.get("condition") == condition and r["index"] < n]
    if sorted(r["index"] for r in items) != list(range(n)):
        return None
    ids = {r["item_id"] for r in items}
    calls = [c for c in read_jsonl(folder / "calls.jsonl") if c.get("condition") == condition and c["item_id"] in ids]
    return sorted(items, key=lambda r: r["index"]), calls


def collect(grid: Grid, conditions, results_dir, backbone: Callable | object | None = None,
            progress: bool = True) -> Runs:
    """The records of every condition on `grid`: read from existing runs, computed when missing.

    `backbone` is a `Backbone` or a zero-argument function returning one; it is only loaded when
    something has to be computed.
    """
    labels = list(dict.fromkeys(label(c) for c in conditions))
    results_dir = Path(results_dir)
    item_rows, call_rows, sources = [], [], {}
    for condition in labels:
        found = None
        wanted = canonical(condition)
        for folder, settings in find_runs(results_dir):
            if not grid.matches(settings):
                continue
            recorded = next((c for c in settings.get("conditions", []) if canonical(c) == wanted), None)
            found = None if recorded is None else finished_records(folder, recorded, grid.n)
            if found is not None:
                relabel = {"condition": condition}  # the label this notebook asked for
                found = ([r | relabel for r in found[0]], [c | relabel for c in found[1]])
                sources[condition] = folder
                break
        if found is None:
            folder = results_dir / grid.slug / safe_name(condition)
            bb = backbone() if callable(backbone) else backbone
            if bb is None:
                raise ValueError(f"no finished run of {condition} on {grid.slug} under {results_dir}, "
                                 "and no model to compute it with")
            run_cell(bb, grid.cell([condition]), folder, progress=progress)
            found = finished_records(folder, condition, grid.n)
            sources[condition] = folder
        item_rows += found[0]
        call_rows += found[1]
    items = pd.DataFrame(item_rows)
    calls = pd.DataFrame(call_rows)
    return Runs(grid, labels, items, calls, sources)


def lazy_backbone(model: str = "default") -> Callable:
    """A function that loads the model on its first call and returns the same one afterwards."""
    loaded = {}

    def get():
        if "bb" not in loaded:
            from bcr_core.allocator import keep_freed_memory
            from bcr_core.backbone import Backbone

            keep_freed_memory()
            loaded["bb"] = Backbone.load(model)
        return loaded["bb"]

    return get


def cached_frame(path, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """A frame read from `path` (CSV) if it exists, else computed and written there."""
    path = Path(path)
    if path.exists():
        return pd.read_csv(path)
    frame = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return frame


# ============================================================================ tables


def with_agreement(items: pd.DataFrame, dense: str = "dense") -> pd.DataFrame:
    """Adds `agrees_dense`: the item's final text is identical to Dense's on the same item."""
    if dense not in set(items["condition"]):
        raise ValueError(f"Dense-agreement needs the {dense!r} condition among {sorted(set(items['condition']))}")
    reference = items[items["condition"] == dense].set_index("item_id")["final_text"]
    return items.assign(agrees_dense=items["final_text"].to_numpy() == reference.reindex(items["item_id"]).to_numpy())


def condition_table(items: pd.DataFrame, reference: str, dense: str = "dense", value: str = "correct") -> pd.DataFrame:
    """One row per condition: accuracy (Wilson 95%), Dense-agreement, reuse rate, rows per call,
    TTFT, and the paired split against `reference` on `value` (`stats.paired_table`: items only the
    reference gets right, items only the row's condition gets right, then the exact McNemar p)."""
    items = paired_only(with_agreement(items, dense))
    split = paired_table(items, reference, value=value).set_index("condition")
    order = list(dict.fromkeys(items["condition"]))
    rows = []
    for condition in order:
        mine = items[items["condition"] == condition]
        k, n = int(mine["correct"].sum()), len(mine)
        lo, hi = wilson_ci(k, n)
        rows.append({
            "condition": condition,
            "n": n,
            "accuracy": k / n,
            "wilson_lo": lo,
            "wilson_hi": hi,
            "agrees_dense": float(mine["agrees_dense"].mean()),
            "reuse_rate": float(mine["reuse_rate"].mean()),
            "rows_per_call": float(mine["rows_per_call"].mean()),
            "ttft_ms": 1000 * float(mine["ttft_s_mean"].median()),
            "rows_wasted_per_call": float(mine["rows_wasted_per_call"].mean()) if "rows_wasted_per_call" in mine else None,
            "skipped_calls": int(mine["skipped_calls"].sum()) if "skipped_calls" in mine else None,
        } | split.loc[condition, [*SPLIT, "p_exact"]].to_dict())
    table = pd.DataFrame(rows)
    for column in SPLIT:
        table[column] = table[column].astype("Int64")
    return table


def agreement_table(items: pd.DataFrame, reference: str, dense: str = "dense") -> pd.DataFrame:
    """Dense-agreement (final text identical to Dense's) compared pairwise like accuracy: items where
    only the reference agrees with Dense, items where only the row's condition does, exact p."""
    items = paired_only(with_agreement(items, dense))
    table = paired_table(items[items["condition"] != dense], reference, value="agrees_dense")
    return table.rename(columns={"accuracy": "agrees_dense"})


def gate_counts(calls: pd.DataFrame) -> pd.DataFrame:
    """The rejection counter: per condition, calls served from cache vs densely, and every gate
    decision (one per placeholder of a call) by its reason."""
    rows = []
    for condition, group in calls.groupby("condition", sort=False):
        counts = {"condition": condition, "calls": len(group), "reused": int((group["mode"] == "reuse").sum()),
                  "dense": int((group["mode"] == "dense").sum())}
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
    return {c: sum(d["reason"] == "entropy" for ds in g["decisions"] for d in ds)
            for c, g in calls.groupby("condition", sort=False)}


def block_table(items: pd.DataFrame, dense: str, reuse: str, block: int) -> pd.DataFrame:
    """Table 6: per block of `block` consecutive items, the reuse condition's reuse rate, both
    accuracies, their difference, and the block's own paired split (reference: Dense)."""
    items = paired_only(items)
    wide = items.pivot(index="index", columns="condition", values="correct").astype(bool).sort_index()
    reuse_rate = items[items["condition"] == reuse].set_index("index")["reuse_rate"].sort_index()
    text = items.pivot(index="index", columns="condition", values="final_text").sort_index()

    def row(name, index):
        d, r = wide.loc[index, dense], wide.loc[index, reuse]
        return {"items": name, "n": len(index), "reuse_rate": float(reuse_rate.loc[index].mean()),
                "dense_acc": float(d.mean()), "reuse_acc": float(r.mean()),
                "delta_points": 100 * float(r.mean() - d.mean()),
                "agrees_dense": float((text.loc[index, reuse] == text.loc[index, dense]).mean())} | paired_split(d, r)

    indices = list(wide.index)
    rows = [row(f"{chunk[0] + 1}-{chunk[-1] + 1}", chunk)
            for chunk in (indices[i:i + block] for i in range(0, len(indices), block))]
    rows.append(row(f"1-{len(indices)} (all)", indices))
    return pd.DataFrame(rows)


def line_table(table: pd.DataFrame, dense: str, endpoint: str, value: str = "accuracy") -> pd.DataFrame:
    """Equation 3 through Dense (reuse 0) and `endpoint` (its realised reuse rate): each
    condition's prediction from its reuse rate and its residual (value - prediction), in points."""
    by = table.set_index("condition")
    rate = float(by.loc[endpoint, "reuse_rate"])
    if rate <= 0:
        raise ValueError(f"{endpoint} reused no call, so Equation 3's line through it is undefined: "
                         "run more items (the anchor pool warms up) or raise gamma")
    points = pd.DataFrame({"name": table["condition"], "reuse_rate": table["reuse_rate"],
                           "accuracy": 100 * table[value].astype(float)})
    out = line_residuals(points, 100 * float(by.loc[dense, value]), 100 * float(by.loc[endpoint, value]), rate)
    return out.rename(columns={"name": "condition", "accuracy": f"{value}_pct", "prediction": "predicted_pct",
                               "residual": "residual_points"})


def line_points(dense_value: float, endpoint_value: float, endpoint_rate: float, steps: int = 21) -> pd.DataFrame:
    """Points of Equation 3's line from reuse 0 to 1, for plotting (values in the given unit)."""
    rates = np.linspace(0.0, 1.0, steps)
    slope = (dense_value - endpoint_value) / endpoint_rate
    return pd.DataFrame({"reuse_rate": rates, "value": dense_value - slope * rates})


# -- budgets --------------------------------------------------------------------------------------
def condition_budget(condition: str) -> tuple[str, float, LayoutConfig] | None:
    """(layout, rho, layout settings) a repair condition spends, or None for one that repairs nothing."""
    c = parse(condition)
    server_layout = REPAIR_LAYOUTS.get(c.name)
    if server_layout is None:
        return None
    rho = 1.0 - c.value if c.name == "cacheblend-reuse" else value_of(c)
    return server_layout, rho, layout_config(c)


def row_limit(layout_name: str, rho: float, m: int, config: LayoutConfig) -> tuple[int, int]:
    """(fewest, most) rows a layout may recompute on an M-row cache at budget rho (paper §3, App. B)."""
    return layout(layout_name, config).bounds(m, rho)


def budget_check(calls: pd.DataFrame) -> pd.DataFrame:
    """Every call of every condition: rows recomputed against what its layout allows at its rho.
    Calls served densely, and conditions that do not repair, must recompute nothing."""
    rows = []
    for call in calls.itertuples(index=False):
        spent = condition_budget(call.condition)
        m = len(call.merged_ids) - 1
        if spent is None or call.mode != "reuse":
            low, high, name, rho = 0, 0, spent[0] if spent else "-", spent[1] if spent else 0.0
        else:
            name, rho, config = spent
            low, high = row_limit(name, rho, m, config)
        rows.append({"condition": call.condition, "item_id": call.item_id, "node": call.node, "mode": call.mode,
                     "layout": name, "rho": rho, "cached_rows": m, "rows": call.rows_recomputed,
                     "fewest": low, "most": high, "within": low <= call.rows_recomputed <= high})
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
        rows.append({"condition": condition, "calls": len(group), "repaired_calls": len(repaired),
                     "rows_per_call": float(group["rows_recomputed"].mean()),
                     "rows_per_repaired_call": float(repaired["rows_recomputed"].mean()) if len(repaired) else 0.0,
                     "mean_span": float(np.mean([n for r in repaired["repaired_rows"] for n in spans(r)]))
                     if len(repaired) else float("nan"),
                     "cached_rows_per_call": float(group["merged_ids"].map(len).mean() - 1)})
    return pd.DataFrame(rows)


def seed_table(items: pd.DataFrame, dense: str = "dense") -> pd.DataFrame:
    """Table 11: per repair budget rho, accuracy under each coin seed, their mean, spread (max - min)
    and a t-based 95% half-width over seeds; Dense-agreement likewise. Descriptive: the seeds re-run
    the same items, so nothing here is a test."""
    items = with_agreement(paired_only(items), dense)
    groups: dict[tuple, list[dict]] = {}
    for condition, group in items.groupby("condition", sort=False):
        c = parse(condition)
        seed = c.options.get("seed", 0 if c.name.startswith("coin") else None)
        groups.setdefault((c.name, c.value), []).append({
            "column": "acc" if seed is None else f"acc_seed{int(seed)}",
            "accuracy": float(group["correct"].mean()), "agrees_dense": float(group["agrees_dense"].mean()),
            "rows_per_call": float(group["rows_per_call"].mean())})
    out, seed_columns = [], []
    for (name, rho), runs in groups.items():
        accuracy = np.array([r["accuracy"] for r in runs])
        k = len(accuracy)
        half = float(scipy_stats.t.ppf(0.975, k - 1) * accuracy.std(ddof=1) / math.sqrt(k)) if k > 1 else float("nan")
        row = {"method": name, "rho": rho, "seeds": k}
        for r in runs:
            row[r["column"]] = r["accuracy"]
            seed_columns += [r["column"]] if r["column"] not in seed_columns else []
        row |= {"mean": float(accuracy.mean()), "spread": float(accuracy.max() - accuracy.min()), "ci95_half": half,
                "agrees_dense_mean": float(np.mean([r["agrees_dense"] for r in runs])),
                "rows_per_call": float(np.mean([r["rows_per_call"] for r in runs]))}
        out.append(row)
    columns = ["method", "rho", "seeds", *sorted(seed_columns), "mean", "spread", "ci95_half", "agrees_dense_mean",
               "rows_per_call"]
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
        rows.append({"condition": call.condition, "item_id": call.item_id, "node": call.node,
                     "dense_tokens": len(dense), "merged_tokens": len(merged), "identical": dense == merged,
                     "first_difference": first,
                     "served_path": "both (identical)" if dense == merged else
                     "merged" if list(call.served_ids) == merged else "dense"})
    return pd.DataFrame(rows)


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
        rows.append({"diff": number, "op": op, "dense_row": d["row"], "dense_id": d["id"], "dense_text": d["text"],
                     "merged_row": m["row"], "merged_id": m["id"], "merged_text": m["text"]})

    for number, span in enumerate(spans):
        (a0, a1), (b0, b1) = span["dense_rows"], span["merged_rows"]
        for k in range(min(context, a0, b0), 0, -1):
            add(number, "equal", a0 - k, a0, b0 - k, b0)
        for k in range(max(a1 - a0, b1 - b0)):
            add(number, span["op"], a0 + k, a1, b0 + k, b1)
        for k in range(min(context, len(dense_ids) - a1, len(merged_ids) - b1)):
            add(number, "equal", a1 + k, len(dense_ids), b1 + k, len(merged_ids))
    frame = pd.DataFrame(rows, columns=["diff", "op", "dense_row", "dense_id", "dense_text", "merged_row", "merged_id",
                                        "merged_text"])
    for column in ("dense_row", "dense_id", "merged_row", "merged_id"):
        frame[column] = frame[column].astype("Int64")
    return frame


def decomposition(items: pd.DataFrame, dense: str, matched: str, reuse: str) -> pd.DataFrame:
    """The cost of reuse split in two (paper §4.3): Dense vs token-matched Dense is the tokenization
    term (same computation, other ids), token-matched Dense vs reuse the approximation term (same ids,
    predicted cache). Per term: accuracy points first − second, the paired split with the first as
    reference (`stats.paired_split`), and the second's agreement with Dense."""
    items = with_agreement(paired_only(items), dense)
    wide = items.pivot(index="item_id", columns="condition", values="correct").astype(bool)
    agree = items.pivot(index="item_id", columns="condition", values="agrees_dense")
    rows = []
    for term, first, second in [("tokenization", dense, matched), ("approximation", matched, reuse),
                                ("total", dense, reuse)]:
        a, b = wide[first], wide[second]
        rows.append({"term": term, "first": first, "second": second, "points": 100 * float(a.mean() - b.mean())}
                    | paired_split(a, b) | {"second_agrees_dense": float(agree[second].mean())})
    return pd.DataFrame(rows)


# ============================================================================ calls


@dataclass
class CallView:
    """One agent call served from an assembled cache, everything about it indexable by name.

    `attention` is the draft's attention over the cached rows, (layers, draft steps, query heads,
    rows), taken on the assembled cache before any repair (the keys BCR scores are the predicted
    ones). Row j of the cache holds token `tokens[j]`; the prompt's last token is fed at decode.
    """

    index: int  # the item's position in the run
    item_id: str
    node: str
    role: str
    condition: str
    mode: str
    reason: str
    ids: list[int]  # the reuse path's ids of the whole prompt
    tokens: list[str]  # token strings of the cached rows (ids[:-1])
    segments: list[dict]  # [{name, start, stop, placeholder}]
    decisions: list[dict]
    kv: KV | None = field(default=None, repr=False)  # the assembled cache, before repair
    attention: torch.Tensor | None = field(default=None, repr=False)
    draft_tokens: list[int] = field(default_factory=list)
    repaired_rows: list[int] = field(default_factory=list)
    output_text: str = ""
    dense_text: str | None = None  # Dense on the same prompt (the chat template's ids), in situ
    answers: dict = field(default_factory=dict, repr=False)  # cache of repaired answers by rows

    @property
    def rows(self) -> int:
        return len(self.ids) - 1

    @property
    def key(self) -> str:
        return f"item {self.index} · {self.node} ({self.role})"

    @property
    def layers(self) -> int:
        return self.attention.shape[0]

    @property
    def heads(self) -> int:
        return self.attention.shape[2]

    def pattern(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """Attention over the rows averaged over draft steps: (layers, rows) for one head or the
        mean of heads when `layer` is None, else that layer's (rows,)."""
        att = self.attention.mean(dim=1)  # (layers, heads, rows)
        att = att.mean(dim=1) if head is None else att[:, head]
        return (att if layer is None else att[layer]).numpy()

    def score(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """The selection score: BCR's a_j (Algorithm 2: layers > 0, mean over steps and heads) when
        `layer` is None and `head` is None; otherwise the chosen layer (or every layer > 0) and head."""
        if layer is None and head is None:
            return row_scores(self.attention).numpy()
        pattern = self.pattern(None, head)
        return pattern[1:].sum(axis=0) if layer is None else pattern[layer]

    def select(self, layout_name: str, rho: float, config: LayoutConfig = LayoutConfig(), layer=None, head=None):
        """The rows a layout repairs at budget rho when ranked by `score(layer, head)`."""
        return layout(layout_name, config).rows(torch.from_numpy(self.score(layer, head).copy()), rho).tolist()

    def answer_with(self, bb, rows: list[int], max_new_tokens: int) -> str:
        """The greedy answer from the assembled cache with `rows` recomputed exactly."""
        key = (tuple(rows), max_new_tokens)
        if key not in self.answers:
            kv = self.kv if not rows else bb.repair(self.kv, self.ids[:-1], rows)
            self.answers[key] = bb.decode(bb.generate(kv, self.ids[-1], max_new_tokens).tokens)
        return self.answers[key]

    def segment_frame(self, layer=None, head=None) -> pd.DataFrame:
        """Per segment of the cache: its rows, whether KVComm predicted it (every segment after the
        agent's prefix; the prefix is exact) and whether it is a shared value, the share of the score
        mass it gets (with and without row 0, the attention sink), the mean score per row, and the
        rows the server repaired there."""
        score = self.score(layer, head)
        total, rest = float(score.sum()), float(score[1:].sum())
        repaired = np.zeros(self.rows, dtype=bool)
        repaired[self.repaired_rows] = True
        rows = []
        for s in self.segments:
            start, stop = s["start"], min(s["stop"], self.rows)
            if start >= stop:
                continue
            part = score[start:stop]
            no_sink = float(part.sum() - (score[0] if start == 0 else 0.0))
            rows.append({"segment": s["name"], "start": start, "stop": stop, "rows": stop - start,
                         "predicted": start > 0, "shared": s["placeholder"], "text": preview(s.get("text", "")),
                         "score_share": float(part.sum()) / total,
                         "share_without_row0": no_sink / rest if rest else float("nan"),
                         "mean_score_per_row": float(part.mean()),
                         "repaired_rows": int(repaired[start:stop].sum())})
        return pd.DataFrame(rows)


def readable(frame: pd.DataFrame) -> pd.DataFrame:
    """A table for display: newlines in text cells shown as ⏎ (pandas would print a literal \\n)."""
    return frame.apply(lambda column: column.map(lambda v: v.replace("\n", " ⏎ ") if isinstance(v, str) else v))


def preview(text: str, width: int = 60) -> str:
    """A one-line preview of a segment's text (newlines shown as ⏎)."""
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class Recorder:
    """Serves calls through `server` like the pipeline does, keeping a `CallView` of every call
    served from an assembled cache (and, with `dense`, Dense's answer to the same prompt)."""

    def __init__(self, bb, server, dense: bool = True, k: int = 2):
        self.bb, self.server, self.k = bb, server, k
        self.name = server.name
        self.dense = DenseServer(bb) if dense else None
        self.views: list[CallView] = []
        self.index, self._assembled = 0, None
        if hasattr(server, "serve_assembled"):
            original = server.serve_assembled

            def capture(kv, ids, max_new_tokens, started, spans):
                self._assembled = kv
                return (yield from original(kv, ids, max_new_tokens, started, spans))

            server.serve_assembled = capture

    def serve(self, prompt, max_new_tokens):
        self._assembled = None
        call = self.server.serve(prompt, max_new_tokens)
        if call.mode == "reuse" and self._assembled is not None:
            kv, ids = self._assembled, call.merged_ids
            draft = self.bb.draft(kv, ids[-1], self.k)
            dense = self.dense.serve(prompt, max_new_tokens).output_text if self.dense else None
            self.views.append(CallView(
                self.index, "", call.node, call.role, call.condition, call.mode, call.reason, list(ids),
                self.bb.tokenizer.convert_ids_to_tokens(ids[:-1]),
                [span | {"text": segment.text} for span, segment in zip(call.segment_map, prompt.segments)],
                call.decisions, kv,
                draft.attention.cpu(), draft.tokens, list(call.repaired_rows), call.output_text, dense))
        return call


@dataclass
class Inspection:
    """Requests served by one condition, with a view of every call served from an assembled cache."""

    condition: str
    requests: list  # RequestRecord per item, in order
    views: list[CallView]

    def calls_frame(self) -> pd.DataFrame:
        """Every call of every request: mode, reason, rows repaired, and whether it has a view."""
        viewed = {(v.item_id, v.node) for v in self.views}
        return pd.DataFrame([{"index": i, "item_id": r.item_id, "node": c.node, "role": c.role, "mode": c.mode,
                              "reason": c.reason, "cached_rows": len(c.merged_ids) - 1,
                              "rows_repaired": c.rows_recomputed, "inspectable": (r.item_id, c.node) in viewed,
                              "output": c.output_text}
                             for i, r in enumerate(self.requests) for c in r.calls])

    def view(self, index: int | None = None, node: str | None = None) -> CallView:
        """The view of item `index` (default: the last with any) at `node` (default: its last)."""
        chosen = [v for v in self.views if (index is None or v.index == index) and (node is None or v.node == node)]
        if not chosen:
            have = sorted({(v.index, v.node) for v in self.views})
            raise ValueError(f"no call served from an assembled cache at item {index}, node {node}; "
                             f"inspectable calls: {have or 'none (every call was served densely)'}")
        return chosen[-1]


def inspect_requests(bb, benchmark: str, items: list[dict], agents: int, condition: str, max_new_tokens: int,
                     pinned: str | None = None, dense: bool = True, progress: bool = True) -> Inspection:
    """Serve `items` in order through a fresh server for `condition` (the anchor pool warms up over
    them, as in a run) and keep a `CallView` of every call served from an assembled cache."""
    recorder = Recorder(bb, make_server(bb, condition), dense=dense)
    pipeline = Pipeline(bb, benchmark, agents, max_new_tokens, pinned)
    requests = []
    for index, item in enumerate(tqdm(items, desc=f"{label(condition)} requests", disable=not progress)):
        recorder.index = index
        first = len(recorder.views)
        requests.append(pipeline.run(recorder, str(item["id"]), tasks.question_text(benchmark, item)))
        for view in recorder.views[first:]:
            view.item_id = str(item["id"])
    return Inspection(label(condition), requests, recorder.views)


def answers_side_by_side(inspections: dict[str, Inspection], index: int) -> pd.DataFrame:
    """Each call of item `index` under each condition: how it was served and what it answered."""
    rows = []
    for name, inspection in inspections.items():
        for call in inspection.requests[index].calls:
            rows.append({"node": call.node, "condition": name, "mode": call.mode, "reason": call.reason,
                         "rows_repaired": call.rows_recomputed, "answer": call.output_text})
    frame = pd.DataFrame(rows)
    return frame.pivot(index="node", columns="condition", values="answer").reindex(
        list(dict.fromkeys(frame["node"])))[list(inspections)]


# -- the explorer's data --------------------------------------------------------------------------
@dataclass
class Exploration:
    """Everything the explorer draws for one setting of its controls."""

    heat: np.ndarray  # (layers, rows): attention per layer, for one head or the mean of heads
    score: np.ndarray  # (rows,): what the layout ranks
    score_name: str
    selected: list[int]  # the rows the layout picks at rho
    expected: tuple[int, int]  # (fewest, most) rows the layout may pick at rho on this cache
    boundaries: list[dict]  # segment spans {name, start, stop, placeholder}
    segments: pd.DataFrame  # per segment: rows, score share, rows selected

    @property
    def count(self) -> int:
        return len(self.selected)


def explore(view: CallView, layer: int | None = None, head: int | None = None, layout_name: str = "chunk",
            rho: float = DEFAULT_RHO, chunk: int = LayoutConfig.chunk, log: bool = True,
            skip: str = LayoutConfig.skip) -> Exploration:
    """The explorer's data for one call and one setting of its controls: the attention heatmap
    (log10 when `log`), the score the layout ranks, the rows it selects, and per segment how much
    of the score and of the selection falls there."""
    config = LayoutConfig(chunk=chunk, skip=skip)
    heat = view.pattern(None, head)
    if log:
        heat = np.log10(np.clip(heat, 1e-6, None))
    score = view.score(layer, head)
    selected = view.select(layout_name, rho, config, layer, head)
    layers = "layers 1+" if layer is None else f"layer {layer}"
    heads = "mean of heads" if head is None else f"head {head}"
    name = ("BCR row score (layers 1+, mean of steps and heads)" if layer is None and head is None
            else f"{layers}, {heads}")
    picked = np.zeros(view.rows, dtype=bool)
    picked[selected] = True
    segments = view.segment_frame(layer, head)
    segments["selected_rows"] = [int(picked[s:e].sum()) for s, e in zip(segments["start"], segments["stop"])]
    bounds = [s | {"stop": min(s["stop"], view.rows)} for s in view.segments if s["start"] < view.rows]
    return Exploration(heat, score, name, selected, row_limit(layout_name, rho, view.rows, config), bounds, segments)


# -- the explorer's figure --------------------------------------------------------------------------
SELECTED, OTHER, SHARED_FILL = "crimson", "steelblue", "rgba(255, 200, 0, 0.12)"


def attention_figure(view: CallView, exploration: Exploration, widget: bool = False):
    """The draft's attention over the cache rows: a layers x rows heatmap above the score the
    layout ranks (log scale), segment boundaries as dotted lines, shared segments shaded, the
    selected rows in red. `widget=True` returns a plotly FigureWidget (for live updates)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    base = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.6, 0.4], vertical_spacing=0.08)
    base.add_trace(go.Heatmap(colorscale="Viridis", colorbar=dict(title="log10 attention", len=0.55, y=0.78),
                              hovertemplate="row %{x}: %{customdata}<br>layer %{y}<br>log10 weight %{z:.2f}"
                                            "<extra></extra>"), row=1, col=1)
    base.add_trace(go.Bar(name="row score", hovertemplate="row %{x}: %{customdata}<br>score %{y:.3g}<extra></extra>"),
                   row=2, col=1)
    base.add_trace(go.Scatter(name="selected rows", mode="markers", hoverinfo="skip",
                              marker=dict(symbol="triangle-down", color=SELECTED, size=7)), row=1, col=1)
    base.update_layout(height=620, autosize=True, showlegend=False, bargap=0, margin=dict(t=170))
    base.update_xaxes(title_text="cache row (token position in the prompt)", row=2, col=1)
    base.update_yaxes(title_text="layer", row=1, col=1)
    base.update_yaxes(title_text="score (attention weight)", type="log", dtick=1, exponentformat="power", row=2, col=1)
    figure = go.FigureWidget(base) if widget else base
    update_figure(figure, view, exploration)
    return figure


def update_figure(figure, view: CallView, exploration: Exploration) -> None:
    """Redraw an `attention_figure` (a Figure or a FigureWidget) for another call or setting."""
    rows = np.arange(view.rows)
    tokens = np.array(view.tokens, dtype=object)
    picked = np.zeros(view.rows, dtype=bool)
    picked[exploration.selected] = True
    layers = exploration.heat.shape[0]
    shapes, notes = [], []
    for span in exploration.boundaries:
        if span["start"] > 0:
            shapes.append(dict(type="line", xref="x", yref="paper", x0=span["start"] - 0.5, x1=span["start"] - 0.5,
                               y0=0, y1=1, line=dict(color="black", width=1, dash="dot")))
        if span["placeholder"]:
            shapes.append(dict(type="rect", xref="x", yref="paper", x0=span["start"] - 0.5, x1=span["stop"] - 0.5,
                               y0=0, y1=1, fillcolor=SHARED_FILL, line=dict(width=0), layer="below"))
        notes.append(dict(x=(span["start"] + span["stop"] - 1) / 2, y=1.0, xref="x", yref="paper", text=span["name"],
                          showarrow=False, textangle=-35, yanchor="bottom", font=dict(size=10)))
    # Plain lists, not numpy arrays: a FigureWidget compares what the browser sends back with
    # `not value`, which numpy arrays refuse ("truth value of an array is ambiguous").
    with figure.batch_update() if hasattr(figure, "batch_update") else contextlib.nullcontext():
        heat, bars, marks = figure.data
        heat.update(z=exploration.heat.tolist(), x=rows.tolist(), y=list(range(layers)),
                    customdata=np.tile(tokens, (layers, 1)).tolist())
        bars.update(x=rows.tolist(), y=np.asarray(exploration.score).tolist(), customdata=tokens.tolist(),
                    marker=dict(color=np.where(picked, SELECTED, OTHER).tolist()))
        marks.update(x=[int(r) for r in exploration.selected], y=[layers - 0.5] * exploration.count,
                     marker=dict(symbol="triangle-down", color=SELECTED, size=7))
        figure.layout.shapes = shapes
        figure.layout.annotations = notes
        figure.layout.title = dict(
            text=f"{view.key}: {view.rows} cached rows, {exploration.count} selected<br>"
                 f"<sup>ranked by {exploration.score_name}</sup>", x=0.0, xanchor="left", y=0.99, yanchor="top")


def highlighted_rows(figure) -> list[int]:
    """The rows an `attention_figure` currently marks as selected (for checks)."""
    return [int(x) for x in (figure.data[2].x or [])]
