"""Experiment throughput: items per hour of one runner cell, and where its time goes.

    OMP_NUM_THREADS=1 python benchmarks/throughput.py [--cell results/claims/a] [--n 10]
                                                      [--variants 8,8+prefix] [--json]

The cell is a committed run folder's `cell.json` (default: the claims grid's cell a, eight
conditions with `--fidelity`), cut to its first `--n` items. Each variant runs that cell from
scratch in its own folder, one after another in this process: `B` is the runner at batch size B
as `bcr run --batch B` runs it, `B-shared` the same without sharing decodes and teacher-forced
measurements across conditions (`lanes.SharedDecodes`, `fidelity.ForcedLogProbs`: the runner
before they were added), `B+prefix` with prefix-extended prefills too (`segments.PrefixPrefills`).
Items per hour counts an item once every condition has served it.

The time of each run is split by what the engine was doing (self time: a section nested in
another counts only in the inner one): dense prefills of the conditions' own calls, reference
prefills (the `--fidelity` Dense), the exact segment caches (node prefixes, segment bases),
KVComm's gate and assembly, storing anchors, CacheBlend's layer probe, drafts, repairs, decoding,
the fidelity KL's teacher-forced forwards, and the rest (`other`: tokenising, prompts, records).
The sections are timed by wrapping those methods for the benchmark's run only: nothing is timed,
and nothing costs, in any other run.

Every call's tokens, route, gate decisions and repaired rows are compared with the first variant,
and (when the folder holds committed records) with the committed calls, floats within the test
suite's tolerance (`rel 1e-4`, `abs 1e-6`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.batching import BatchDecoder
from bcr_core.engine.memory import keep_freed_memory
from bcr_core.reuse.calls import Server
from bcr_core.reuse.segments import SegmentCaches
from bcr_core.reuse.servers import KVCommServer
from bcr_core.run_folder import committed, read_calls, read_records
from bcr_core.runs.cell import Cell
from bcr_core.runs.runner import SharedReference, run_cell

COMPARED = ("output_tokens", "reason", "decisions", "rows_recomputed", "rows_wasted", "skipped", "cached_rows")
COMPARED += ("ids_match", "segment_map", "fidelity")
REL, ABS = 1e-4, 1e-6  # the suite's tolerance for a rerun's floats (tests/conftest.py `record_differences`)


def prefill_kind(server) -> str:
    return "reference prefills" if isinstance(server, SharedReference) else "dense prefills"


SECTIONS = (  # (owner, method, section or a function of the instance giving it)
    (Server, "prefill", prefill_kind),
    (SegmentCaches, "prefix", "segment caches"),
    (SegmentCaches, "base", "segment caches"),
    (KVCommServer, "gate", "gate + assembly"),
    (KVCommServer, "assemble", "gate + assembly"),
    (KVCommServer, "store_anchors", "storing anchors"),
    (Backbone, "prefill_layers", "layer probes"),
    (Backbone, "draft", "drafts"),
    (Backbone, "repair", "repairs"),
    (Backbone, "generate", "decoding"),
    (BatchDecoder, "step", "decoding"),
    (BatchDecoder, "add", "decoding"),
    (Backbone, "forced_logits_batch", "KL"),
)


class Sections:
    """Self time per section while `installed`: each listed method is wrapped to add its wall time
    to its section, less the time of wrapped methods it called."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self.inner: list[float] = []

    def wrap(self, method, section):
        @functools.wraps(method)
        def timed(obj, *args, **kwargs):
            start = time.perf_counter()
            self.inner.append(0.0)
            try:
                return method(obj, *args, **kwargs)
            finally:
                elapsed, nested = time.perf_counter() - start, self.inner.pop()
                self.seconds[section(obj) if callable(section) else section] += elapsed - nested
                if self.inner:
                    self.inner[-1] += elapsed

        return timed

    @contextlib.contextmanager
    def installed(self):
        originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in SECTIONS]
        try:
            for (owner, name, section), (_, _, method) in zip(SECTIONS, originals):
                setattr(owner, name, self.wrap(method, section))
            yield self
        finally:
            for owner, name, method in originals:
                setattr(owner, name, method)


def differences(fresh, wanted, at: str = "") -> list[str]:
    """Where two records differ: floats within REL/ABS, everything else exactly."""
    if isinstance(fresh, dict) and isinstance(wanted, dict):
        if fresh.keys() != wanted.keys():
            return [f"{at}: keys differ"]
        return [d for k in fresh for d in differences(fresh[k], wanted[k], f"{at}.{k}")]
    if isinstance(fresh, list) and isinstance(wanted, list):
        if len(fresh) != len(wanted):
            return [f"{at}: {len(fresh)} != {len(wanted)} entries"]
        return [d for i, (a, b) in enumerate(zip(fresh, wanted)) for d in differences(a, b, f"{at}[{i}]")]
    if isinstance(fresh, float) and isinstance(wanted, float):
        return [] if math.isclose(fresh, wanted, rel_tol=REL, abs_tol=ABS) else [f"{at}: {fresh!r} != {wanted!r}"]
    return [] if type(fresh) is type(wanted) and fresh == wanted else [f"{at}: {fresh!r} != {wanted!r}"]


def call_outputs(calls: list[dict]) -> dict:
    """Each call's compared fields, keyed by (condition, item, node)."""
    return {(c["condition"], c["item_id"], c["node"]): {k: c.get(k) for k in COMPARED} for c in calls}


def differing_calls(fresh: dict, wanted: dict) -> list[tuple]:
    return sorted(key for key in fresh if key in wanted and differences(fresh[key], wanted[key]))


VARIANTS = {  # what follows the batch size: the runner's sharing options
    "": {},
    "-shared": {"share_decodes": False, "share_log_probs": False},
    "+prefix": {"prefix_prefills": True},
}


def parse_variant(text: str) -> tuple[int, dict]:
    batch = text.rstrip("abcdefghijklmnopqrstuvwxyz+-")
    if not batch.isdigit() or text[len(batch) :] not in VARIANTS:
        raise SystemExit(f"--variants: {text!r} is not B, B-shared or B+prefix (B a batch size)")
    return int(batch), VARIANTS[text[len(batch) :]]


def run_variant(bb, cell: Cell, folder: Path, batch: int, options: dict, progress: bool) -> dict:
    sections = Sections()
    start = time.perf_counter()
    with sections.installed():
        run_cell(bb, cell, folder, progress=progress, batch=batch, **options)
    seconds = time.perf_counter() - start
    timed = dict(sections.seconds)
    timed["other"] = seconds - sum(timed.values())
    return {"seconds": seconds, "items_per_hour": 3600 * cell.n / seconds, "sections": timed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="results/claims/a", help="a run folder holding cell.json")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--variants", default="8-shared,8,8+prefix")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    folder = Path(args.cell)
    cell = replace(Cell.from_record(json.loads((folder / "cell.json").read_text())), n=args.n)
    wanted = call_outputs(read_calls(folder / "calls.jsonl")) if list(folder.glob("calls.jsonl*")) else {}
    keep_freed_memory()
    bb = Backbone.load(cell.model)
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.variants.split(","):
            batch, options = parse_variant(text)
            out = Path(tmp) / text.replace("+", "_")
            row = {"variant": text} | run_variant(bb, cell, out, batch, options, not args.json)
            calls = [committed(c) for c in read_records(out / "calls.jsonl")]
            outputs = call_outputs(calls)
            reference = reference or outputs
            row["calls"] = len(outputs)
            row["differing_from_first"] = differing_calls(outputs, reference)
            row["differing_from_committed"] = differing_calls(outputs, wanted) if wanted else None
            rows.append(row)
    first = rows[0]["items_per_hour"]
    for row in rows:
        row["speedup"] = row["items_per_hour"] / first
    if args.json:
        print(json.dumps({"cell": cell.record() | {"source": str(folder)}, "rows": rows}, indent=2, default=str))
        return
    print(f"{folder}: {cell.benchmark} x{cell.agents} agents, {cell.n} items, {len(cell.conditions)} conditions")
    table = pd.DataFrame(
        [
            {
                "variant": r["variant"],
                "seconds": r["seconds"],
                "items/h": r["items_per_hour"],
                "speedup": r["speedup"],
                "calls": r["calls"],
                "differ from first": len(r["differing_from_first"]),
                "differ from committed": len(r["differing_from_committed"] or ()) if wanted else "-",
            }
            for r in rows
        ]
    )
    print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    split = pd.DataFrame({r["variant"]: r["sections"] for r in rows}).fillna(0.0)
    print("\nseconds by section (self time)")
    print(split.sort_values(split.columns[0], ascending=False).to_string(float_format=lambda x: f"{x:.1f}"))
    for r in rows:
        for key in (r["differing_from_first"] + (r["differing_from_committed"] or []))[:3]:
            print(f"{r['variant']}: differs at {' '.join(map(str, key))}")


if __name__ == "__main__":
    main()
