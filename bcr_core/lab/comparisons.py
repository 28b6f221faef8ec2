"""Run records on disk, as the notebooks read them.

`collect` returns the per-item and per-call records of a set of conditions on one `Comparison`
(benchmark, agent count, items, new tokens: what the conditions share). A condition already run by
`bcr run` (any folder under the results folder whose `cell.json` has the same settings and at least
as many items) is read from there; anything missing is computed with `run_cell`, one condition per
folder, so notebooks that share a condition (Dense, KVComm) compute it once and an interrupted
notebook resumes where it stopped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pandas as pd

from bcr_core.conditions import parse
from bcr_core.data import benchmarks
from bcr_core.data.roles import DEFAULT_PROMPT
from bcr_core.engine.stopping import DEFAULT_RULE
from bcr_core.errors import UsageError
from bcr_core.paths import write_text_whole
from bcr_core.run_folder import read_calls, read_jsonl, run_folders
from bcr_core.runs.cell import Cell, RunSettings
from bcr_core.runs.run_settings import served_dtype, settings_record
from bcr_core.runs.run_writer import LATER_SETTINGS
from bcr_core.runs.runner import run_cell

# A run's settings a comparison leaves to each of its conditions' runs (and how they run).
NOT_COMPARED = ("conditions", "reference", "fidelity", "seeds", "batch", "copies")


class Comparison(settings_record("ComparisonFields", leave_out=NOT_COMPARED)):
    """The settings every condition of one comparison shares: a `bcr run` cell's but `NOT_COMPARED`."""

    @classmethod
    def from_params(cls, params) -> Comparison:
        """The comparison a notebook's parameters describe: each of its settings the notebook has
        a parameter for, `bcr run`'s default for the rest."""
        return cls(**{f.name: params[f.name] for f in fields(cls) if f.name in params})

    def items(self) -> list[dict]:
        """The first n items, in the order every condition sees them."""
        return benchmarks.load_items(self.benchmark, self.n, **self.extra)

    def cell(self, conditions) -> Cell:
        return RunSettings(**asdict(self), conditions=list(conditions)).cell()

    @property
    def slug(self) -> str:
        parts = [self.benchmark, f"{self.agents}agents", f"n{self.n}", f"{self.max_new_tokens}tok"]
        if self.benchmark == "synthetic":
            parts.append(f"seed{self.item_seed}")
        if self.pinned:
            parts.append("pinned-" + safe_name(self.pinned))
        if self.model != "default":
            parts.append(safe_name(self.model))
        dtype = served_dtype(self.dtype, self.model)
        if dtype != "float32":
            parts.append(dtype)
        if self.prompt != DEFAULT_PROMPT:
            parts.append(f"prompt-{self.prompt}")
        if self.stop != DEFAULT_RULE:
            parts.append(f"stop-{self.stop}")
        return "-".join(parts)

    def matches(self, settings: dict) -> bool:
        """Whether a run folder's `cell.json` holds these settings with at least n items: every field
        of the cell this comparison runs (a setting added later read at its earlier value,
        `run_writer.LATER_SETTINGS`) but those a comparison leaves open (`OPEN`)."""
        theirs = LATER_SETTINGS | settings | {"extra": settings.get("extra") or {}}
        mine = self.cell(["dense"]).record()
        return all(theirs.get(k) == v for k, v in mine.items() if k not in OPEN) and int(settings.get("n", 0)) >= self.n


# What a run folder may differ in from a comparison and still serve it: its own conditions and b/c
# reference, more items, and in-situ fidelity recorded beside the same records.
OPEN = ("conditions", "reference", "n", "fidelity")


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@=,-]+", "_", text).strip("_")[:80] or "x"


@dataclass
class Runs:
    """Per-item and per-call records of several conditions on one comparison, items in order."""

    comparison: Comparison
    conditions: list[str]
    items: pd.DataFrame
    calls: pd.DataFrame
    sources: dict[str, Path]  # condition -> the folder its records came from

    def sources_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"condition": c, "folder": str(p)} for c, p in self.sources.items()])


def finished_records(folder: Path, condition: str, n: int) -> tuple[list[dict], list[dict]] | None:
    """The first n items of `condition` in a run folder and their calls, or None if any is missing."""
    items = [r for r in read_jsonl(folder / "items.jsonl") if r.get("condition") == condition and r["index"] < n]
    if sorted(r["index"] for r in items) != list(range(n)):
        return None
    ids = {r["item_id"] for r in items}
    calls = [c for c in read_calls(folder / "calls.jsonl") if c["condition"] == condition and c["item_id"] in ids]
    return sorted(items, key=lambda r: r["index"]), calls


def collect(
    comparison: Comparison, conditions, results_dir, backbone: Callable | object | None = None, progress: bool = True
) -> Runs:
    """The records of every condition on `comparison`: read from existing runs, computed when missing.

    `backbone` is a `Backbone` or a zero-argument function returning one; it is only loaded when
    something has to be computed.
    """
    labels = list(dict.fromkeys(parse(c).label for c in conditions))
    results_dir = Path(results_dir)
    item_rows, call_rows, sources = [], [], {}
    for condition in labels:
        found = None
        wanted = parse(condition).settings
        for run in run_folders(results_dir):
            if not comparison.matches(run.settings):
                continue
            recorded = next((c for c in run.settings.get("conditions", []) if parse(c).settings == wanted), None)
            found = None if recorded is None else finished_records(run.path, recorded, comparison.n)
            if found is not None:
                relabel = {"condition": condition}  # the label this notebook asked for
                found = ([r | relabel for r in found[0]], [c | relabel for c in found[1]])
                sources[condition] = run.path
                break
        if found is None:
            folder = results_dir / comparison.slug / safe_name(condition)
            bb = backbone() if callable(backbone) else backbone
            if bb is None:
                raise UsageError(
                    f"no finished run of {condition} on {comparison.slug} under {results_dir}, "
                    "and no model to compute it with"
                )
            run_cell(bb, comparison.cell([condition]), folder, progress=progress)
            found = finished_records(folder, condition, comparison.n)
            sources[condition] = folder
        item_rows += found[0]
        call_rows += found[1]
    items = pd.DataFrame(item_rows)
    calls = pd.DataFrame(call_rows)
    return Runs(comparison, labels, items, calls, sources)


def cached_frame(path, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """A frame read from `path` (CSV) if it exists, else computed and written there."""
    path = Path(path)
    if path.exists():
        return pd.read_csv(path)
    frame = compute()
    write_text_whole(path, frame.to_csv(index=False))
    return frame
