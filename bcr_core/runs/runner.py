"""The experiment runner: one grid cell (benchmark x agent count) under several conditions.

Every condition sees the same items in the same order. Items run one at a time under every
condition in turn, so an interrupted run still holds paired results. Per-item and per-call records
are appended to `items.jsonl` and `calls.jsonl` as each item finishes; a rerun with the same
settings skips finished items, replaying their recorded calls into the stateful servers (KVComm's
anchor pool, BCR's coin stream) so the rest of the run continues exactly as it would have.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from bcr_core.agents.pipeline import Pipeline
from bcr_core.conditions import make_server
from bcr_core.data import benchmarks
from bcr_core.engine.memory import release_freed_memory
from bcr_core.engine.models import dtype_name
from bcr_core.errors import UsageError
from bcr_core.reuse.fidelity import ForcedLogProbs
from bcr_core.reuse.segments import PrefixPrefills, SharedPrefills, share_segment_caches
from bcr_core.reuse.servers import DenseServer
from bcr_core.runs.cell import Cell
from bcr_core.runs.copies import copy_conditions
from bcr_core.runs.lanes import Unit, run_lanes
from bcr_core.runs.run_writer import RunFiles


class Interrupted(KeyboardInterrupt):
    """^C (or SIGTERM) during a run: its message says how many item records this run wrote, and how to resume."""

    def __init__(self, files: RunFiles):
        super().__init__(f"interrupted after {files.kept()} items; rerun the same command to resume")


class SharedReference(DenseServer):
    """The `--fidelity` reference: Dense on a call's prompt, served once per distinct prompt and
    shared by every condition whose call has that prompt (agent 1's always does; later agents' do
    whenever their predecessors answered alike). Dense is stateless, so sharing changes no number.
    Its `log_probs` keep the teacher-forced measurements of the fidelity KL, each cache's once."""

    def __init__(self, bb, keep: int = 96, share_log_probs: bool = True):
        super().__init__(bb)
        self.keep, self.served = keep, OrderedDict()
        self.log_probs = ForcedLogProbs(bb) if share_log_probs else None

    def steps(self, prompt, max_new_tokens):
        key = (tuple(prompt.dense_ids), max_new_tokens)
        if key not in self.served:
            self.served[key] = yield from super().steps(prompt, max_new_tokens)
            if len(self.served) > self.keep:
                self.served.popitem(last=False)
        self.served.move_to_end(key)
        return self.served[key]


def item_record(cell: Cell, condition: str, index: int, item: dict, request) -> dict:
    scored = benchmarks.score(cell.benchmark, request.final_text, item)
    calls = request.calls
    strictness = {key: bool(scored[key]) for key in ("correct_strict", "correct_lenient") if key in scored}
    checker = {"result": scored["result"]} if "result" in scored else {}  # HumanEval's: why an item failed
    measured = [c.fidelity for c in calls if c.fidelity]
    fidelity = (
        {
            "first_token_agree": sum(f["first_token_agree"] for f in measured) / len(measured),
            "call_identical": sum(f["identical"] for f in measured) / len(measured),
            "kl_mean": sum(f["kl"] for f in measured) / len(measured),
        }
        if measured
        else {}
    )
    return fidelity | {
        "condition": condition,
        "item_id": request.item_id,
        "index": index,
        "correct": bool(scored["correct"]),
        **strictness,
        **checker,
        "answer": scored.get("answer"),
        "final_text": request.final_text,
        "reuse_rate": request.reuse_rate,
        "rows_per_call": sum(c.rows_recomputed for c in calls) / len(calls),
        "rows_wasted_per_call": sum(c.rows_wasted for c in calls) / len(calls),
        "skipped_calls": sum(c.skipped for c in calls),
        "ttft_s_mean": sum(c.ttft_s for c in calls) / len(calls),
        "total_s": sum(c.total_s for c in calls),
    }


def check_served_dtype(bb, cell: Cell) -> None:
    """Refuse a cell recorded in one precision served by a model loaded in another."""
    served_in = dtype_name(bb.dtype)
    if cell.dtype != served_in:
        raise UsageError(
            f"the run's cell is in {cell.dtype} but the model is served in {served_in}: load the model with "
            f"--dtype {cell.dtype}, or make the cell with dtype {served_in!r}"
        )


def check_confirmation(cell: Cell, out: Path) -> None:
    """A confirmation's items are fresh: refuse one whose item draw a committed pilot of the model read."""
    if cell.confirms:
        from bcr_core.analysis.claims.confirmation import check_fresh
        from bcr_core.paths import RESULTS

        check_fresh(cell.record(), RESULTS, str(out))


def items_to_run(bb, cell: Cell, out: Path) -> list[dict]:
    """The cell's items, once what a run needs holds: its grader runs here (HumanEval's sandbox, checked first),
    the items load, the model is served in the cell's dtype, and a confirmation's items are fresh."""
    benchmarks.check_grader(cell.benchmark)
    items = benchmarks.load_items(cell.benchmark, cell.n, **cell.extra)
    check_served_dtype(bb, cell)
    check_confirmation(cell, out)
    return items


def make_servers(bb, cell: Cell, batch: int, prefix_prefills: bool, share_log_probs: bool):
    """Each condition's server and the fidelity reference (None without `--fidelity`), sharing
    segment caches, and above batch size 1 the prefills of equal ids. `prefix_prefills` also extends
    the kept prefill sharing the longest exact prefix with a prompt instead of prefilling it whole
    (`PrefixPrefills`): equal to a fresh prefill within float rounding, not bit for bit.
    `share_log_probs` measures each cache's teacher-forced log-probabilities for the fidelity KL once
    (`fidelity.ForcedLogProbs`, bit-identical), on unless turned off to measure it."""
    servers = {c: make_server(bb, c) for c in cell.conditions}
    share_segment_caches(bb, servers.values())
    reference = SharedReference(bb, share_log_probs=share_log_probs) if cell.fidelity else None
    if batch > 1:  # at batch size 1 every call pays its own prefill, so its TTFT stays a latency
        prefills = PrefixPrefills(bb) if prefix_prefills else SharedPrefills(bb)
        for server in [*servers.values(), *([reference] if reference else [])]:
            if server.shares_work:
                server.prefills = prefills
    return servers, reference


def pending_units(cell: Cell, items, pipeline, servers: dict, reference, done, done_calls) -> list[Unit]:
    """One unit per (condition, item) not yet finished; a finished item's calls are replayed into
    its server instead (a stateful condition's finished items are a prefix of its items), unless every
    item of the condition is finished (its state serves nothing more)."""
    units = []
    complete = {c for c in servers if all((c, str(item["id"])) in done for item in items)}
    for index, item in enumerate(items):
        item_id = str(item["id"])
        for condition, server in servers.items():
            if (condition, item_id) in done:
                for call in done_calls.get((condition, item_id), []) if condition not in complete else ():
                    server.replay(call)
            else:
                question = benchmarks.question_text(cell.benchmark, item)
                units.append(Unit((condition, index), partial(pipeline.steps, server, item_id, question, reference)))
    return units


def stateful_in_order(servers: dict) -> Callable[[Unit, list[Unit]], bool]:
    """Whether a unit (condition, item) may start beside the running ones: always for a stateless
    condition, and for a stateful one only when none of its items runs (its items go in order)."""
    return lambda unit, running: servers[unit.key[0]].stateless or all(r.key[0] != unit.key[0] for r in running)


def run_cell(
    bb,
    cell: Cell,
    out: Path,
    progress: bool = True,
    batch: int = 1,
    label: str | None = None,
    on_item: Callable[[], None] | None = None,
    prefix_prefills: bool = False,
    share_decodes: bool = True,
    share_log_probs: bool = True,
    copies: Path | str | None = None,
) -> pd.DataFrame:
    """Run (or resume) a cell; returns the tidy per-item table. `label` names its progress bar;
    `on_item` is called after each item record is written (a grid's overall count).

    `batch` > 1 serves up to that many requests at once with their decoding batched
    (`lanes.run_lanes`): Dense's items in any order, each stateful condition's items one at a
    time in order, so results equal batch size 1 up to float rounding in batched decoding. Dense
    prefills of ids another condition already prefilled are shared (`SharedPrefills`). Call times
    then include waiting for the batch and exclude shared prefills; measure latency at batch size 1
    or with `bcr ttft`. `prefix_prefills` and `share_log_probs`: see `make_servers`; `share_decodes`
    (batch > 1) answers a decode request identical to one decoded before with its tokens
    (`lanes.SharedDecodes`), on unless turned off to measure it. `copies`: a run folder of the same settings
    whose conditions are copied rather than served (`runs.copies`).
    """
    items = items_to_run(bb, cell, out)
    files = RunFiles(out, cell)
    try:
        pipeline = Pipeline(
            bb, cell.benchmark, cell.agents, cell.max_new_tokens, cell.pinned, prompt=cell.prompt, stop=cell.stop
        )
        servers, reference = make_servers(bb, cell, batch, prefix_prefills, share_log_probs)
        settle(bb, cell, files, copies, batch)
        stateful = {c for c, server in servers.items() if not server.stateless}
        done, done_calls = files.finished([str(i["id"]) for i in items], [t.node for t in pipeline.templates], stateful)
        units = pending_units(cell, items, pipeline, servers, reference, done, done_calls)
        bar = tqdm(
            total=len(items) * len(servers),
            initial=len(items) * len(servers) - len(units),
            disable=not progress,
            desc=label or f"{cell.benchmark} x{cell.agents}",
        )

        def finished(unit: Unit, request) -> None:
            condition, index = unit.key
            record = item_record(cell, condition, index, items[index], request)
            files.append(record, [c.to_dict() | {"item_id": request.item_id} for c in request.calls])
            bar.update(1)
            release_freed_memory()  # a long run's resident memory stays near what it holds
            if on_item is not None:
                on_item()

        with bar:  # closed on ^C too, so the message below starts its own line
            run_lanes(bb, units, batch, stateful_in_order(servers), finished, share_decodes)
    except KeyboardInterrupt:
        raise Interrupted(files) from None
    finally:
        files.release()
    return files.items_table()


def settle(bb, cell: Cell, files: RunFiles, copies: Path | str | None, batch: int) -> None:
    """The run folder checked against this machine's arithmetic (`RunFiles.settle`), then the conditions `copies`
    holds copied in (`runs.copies`), each checked by serving its first item here at `batch`."""
    arithmetic = bb.arithmetic()
    files.settle(arithmetic)
    if copies is not None:
        copy_conditions(cell, Path(copies), files, arithmetic, partial(run_cell, bb, progress=False, batch=batch))


def run_and_summarize(run, out: Path, reference: str) -> tuple[pd.DataFrame, list[str]]:
    """`bcr run`: every setting, condition and the grader (HumanEval's sandbox) checked before the model loads,
    the cell run (or resumed) into `out`, and its summary table (written as summary.csv) with the notes a reader
    needs beside it: the instrument's floor, and why nothing was reused where nothing was."""
    from bcr_core.analysis.reports.summary import floor_note, no_reuse_note, write_summary
    from bcr_core.engine.loading import load_backbone
    from bcr_core.run_folder import RunFolder

    cell = run.cell()
    benchmarks.check_grader(cell.benchmark)
    bb = load_backbone(cell.model, cell.dtype)
    items = run_cell(bb, cell, out, progress=True, batch=run.batch, copies=run.copies)
    table = write_summary(items, reference, out)
    notes = [floor_note(table), no_reuse_note(RunFolder(out).calls(), cell.n)]
    return table, [note for note in notes if note]
