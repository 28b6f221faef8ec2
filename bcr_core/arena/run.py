"""`bcr arena`: one KVComm-family run (BCR-chunk, its serving unchanged) with the arena on every call
it serves from an assembled cache.

The run is a `bcr run` cell of one condition with `--fidelity` (every call also served by Dense),
written by the runner's own machinery (`RunFiles`: settings, lock, append, resume, replay into the
stateful server): `items.jsonl` and `calls.jsonl` as `bcr run` writes them, each assembled call's
record holding one more field, `arena` (`copies.run_call`'s measures). The arena only reads the
call's trace, so the run's outputs, and every downstream agent's prompt, are those of a plain
BCR-chunk run: pairing is exact. Items run one at a time in order (batch 1). A run can be split
across processes (`shard`, see `shards`): each serves every item and measures its share.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from bcr_core.agents.pipeline import Pipeline
from bcr_core.arena.copies import ArenaCall, DenseReference, run_call
from bcr_core.arena.registry import DEFAULT, make_entries, parse_spec
from bcr_core.arena.search import runs
from bcr_core.arena.shards import owns, parse_shard
from bcr_core.conditions import condition, make_server, parse
from bcr_core.data import benchmarks
from bcr_core.engine.memory import release_freed_memory
from bcr_core.errors import UsageError
from bcr_core.repair.layouts import check_rho
from bcr_core.reuse.calls import drive
from bcr_core.reuse.prompts import QUESTION
from bcr_core.reuse.segments import text_rows
from bcr_core.runs.cell import Cell
from bcr_core.runs.run_writer import RunFiles
from bcr_core.runs.runner import Interrupted, SharedReference, item_record
from bcr_core.schema import ARENA, ARENA_RHOS
from bcr_core.setting_kinds import check_settings


@dataclass(frozen=True, kw_only=True)
class ArenaCell(Cell):
    """A `bcr run` cell (one BCR-chunk condition, fidelity on) and the arena's settings, all of
    which are the run folder's identity: resuming with other selectors or budgets is refused. `shard`
    ("K/M", `shards`) makes the run one lane of a split; "" runs the arena on every item."""

    selectors: tuple[str, ...] = ()
    rhos: tuple[float, ...] = tuple(ARENA_RHOS)
    shard: str = ""

    def check(self):
        super().check()
        parse_shard(self.shard)
        for rho in self.rhos:
            check_rho(rho)
        object.__setattr__(self, "rhos", tuple(float(rho) for rho in self.rhos))
        object.__setattr__(self, "selectors", tuple(e.label for e in make_entries(",".join(self.selectors))))


def make_arena_cell(**settings) -> ArenaCell:
    """The arena's cell from `ARENA`'s settings, by name (the others at their defaults); every one is
    checked here, by the one validator, before a model is loaded or a folder touched."""
    s = check_settings(ARENA, settings)
    parse_shard(s["shard"])
    selectors = make_entries(DEFAULT if s["selectors"] is None else s["selectors"], s["chunk"], s["seeds"])
    shared = ("benchmark", "agents", "n", "max_new_tokens", "model", "item_seed", "prompt", "stop", "dtype")
    return ArenaCell(
        conditions=(condition("bcr-chunk", s["rho"], chunk=s["chunk"], gamma=s["gamma"]),),
        fidelity=True,
        selectors=tuple(e.label for e in selectors),
        rhos=tuple(s["rhos"]),
        shard=s["shard"],
        **{key: s[key] for key in shared},
    )


class KeptReference(SharedReference):
    """The run's Dense reference, whose served records (caches included) the arena reads back."""

    def record(self, dense_ids: list[int], max_new_tokens: int):
        return self.served[(tuple(dense_ids), max_new_tokens)]


def arena_calls(bb, request, reference: KeptReference, entries, cell: ArenaCell, index: int, question: str):
    """The item's call records, each assembled call's with its `arena` field where this lane
    measures the item (and, on a code question, `docstring`: the rows of its prose, as runs)."""
    chunk = parse(cell.conditions[0]).option("chunk")
    prose = benchmarks.prose_spans(cell.benchmark, question)
    out = []
    for number, call in enumerate(request.calls):
        record = call.to_dict() | {"item_id": request.item_id}
        if call.trace is not None and owns(cell.shard, index):
            dense = DenseReference(bb, reference.record(call.dense_ids, cell.max_new_tokens), cell.max_new_tokens)
            arena = ArenaCall(
                call.trace.assembled, call.merged_ids, call.segment_map, len(call.repaired_rows), (index, number)
            )
            record["arena"] = run_call(bb, arena, dense, entries, cell.rhos, chunk) | {
                "item_index": index,
                "items": cell.n,
            }
            if prose:
                record["arena"]["docstring"] = prose_rows(bb, call, question, prose)
        out.append(record)
    return out


def prose_rows(bb, call, question: str, prose) -> list[list[int]]:
    """The call's rows on the question's prose, as runs; [] where the call holds no question segment."""
    span = next((s for s in call.segment_map if s["name"] == QUESTION), None)
    return [] if span is None else runs(text_rows(bb.tokenizer, call.merged_ids, span, question, prose))


def check_layers(selectors, layers: int) -> None:
    """Refuse, before any folder is touched, a CacheBlend check layer the model does not have."""
    for spec in selectors:
        selector = parse_spec(spec)
        if selector.name == "cacheblend" and selector.option("layer") >= layers:
            raise UsageError(f"selector {spec}: the model has {layers} layers, so check layers 1 to {layers - 1}")


class Serving:
    """An arena run's serving: its BCR-chunk condition's traced server behind the pipeline, and the
    Dense reference the arena reads back. Items go through it in order, served or replayed (a
    finished item's calls put back into the stateful server), as the run and `deepen` both do."""

    def __init__(self, bb, cell: ArenaCell):
        self.bb, self.cell, self.condition = bb, cell, cell.conditions[0]
        self.pipeline = Pipeline(
            bb, cell.benchmark, cell.agents, cell.max_new_tokens, cell.pinned, prompt=cell.prompt, stop=cell.stop
        )
        self.server = make_server(bb, self.condition)
        self.server.trace = True
        self.reference = KeptReference(bb, keep=8)  # one item's calls (at most 6): Dense caches are not hoarded

    @property
    def nodes(self) -> list[str]:
        return [t.node for t in self.pipeline.templates]

    def serve(self, item: dict):
        """The item's request, served afresh (each call's trace kept)."""
        question = benchmarks.question_text(self.cell.benchmark, item)
        steps = partial(self.pipeline.steps, self.server, str(item["id"]), question, self.reference)
        return drive(self.bb, steps())

    def replay(self, calls: list[dict]) -> None:
        for call in calls:
            self.server.replay(call)


def run_arena(bb, cell: ArenaCell, out: Path, progress: bool = True) -> pd.DataFrame:
    """Run (or resume) the arena; returns the per-item table of the serving run."""
    check_layers(cell.selectors, bb.num_layers)
    files = RunFiles(out, cell)
    try:
        items = benchmarks.load_items(cell.benchmark, cell.n, **cell.extra)
        serving = Serving(bb, cell)
        condition = serving.condition
        entries = make_entries(",".join(cell.selectors), parse(condition).option("chunk"))
        files.settle(bb.arithmetic())
        done, done_calls = files.finished([str(i["id"]) for i in items], serving.nodes, {condition})
        bar = tqdm(total=len(items), disable=not progress, desc=f"arena {cell.benchmark} x{cell.agents}")
        with bar:
            for index, item in enumerate(items):
                item_id = str(item["id"])
                if (condition, item_id) in done:
                    serving.replay(done_calls.get((condition, item_id), []))
                else:
                    request = serving.serve(item)
                    question = benchmarks.question_text(cell.benchmark, item)
                    calls = arena_calls(bb, request, serving.reference, entries, cell, index, question)
                    files.append(item_record(cell, condition, index, item, request), calls)
                    release_freed_memory()
                bar.update(1)
    except KeyboardInterrupt:
        raise Interrupted(files) from None
    finally:
        files.release()
    return files.items_table()


def arena_table(settings: dict, out: Path) -> pd.DataFrame | None:
    """`bcr arena`: the cell made from `ARENA`'s settings (checked before the model loads), run or resumed into
    `out`, and its selector table; None when no call was served from an assembled cache (nothing compared)."""
    from bcr_core.arena.measures import arena_frame, selector_table
    from bcr_core.engine.loading import load_backbone
    from bcr_core.run_folder import RunFolder

    cell = make_arena_cell(**settings)
    run_arena(load_backbone(cell.model, cell.dtype), cell, out, progress=True)
    calls = RunFolder(out).calls()
    return selector_table(arena_frame(calls)) if any(c.get("arena") for c in calls) else None
