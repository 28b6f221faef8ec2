"""The experiment runner: one grid cell (benchmark x agent count) under several conditions.

Every condition sees the same items in the same order. Items run one at a time under every
condition in turn, so an interrupted run still holds paired results. Per-item and per-call records
are appended to `items.jsonl` and `calls.jsonl` as each item finishes; a rerun with the same
settings skips finished items, replaying their recorded calls into the stateful servers (KVComm's
anchor pool, BCR's coin stream) so the rest of the run continues exactly as it would have.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from bcr_core.agents.pipeline import Pipeline
from bcr_core.data import benchmarks
from bcr_core.engine.memory import release_freed_memory
from bcr_core.experiments.conditions import expand_seeds, make_server, parse
from bcr_core.experiments.lanes import Unit, run_lanes
from bcr_core.paths import written_whole
from bcr_core.reuse.segments import SharedPrefills, share_segment_caches
from bcr_core.reuse.servers import DenseServer


@dataclass(frozen=True)
class Cell:
    benchmark: str
    n_agents: int
    conditions: tuple[str, ...]
    n: int
    max_new_tokens: int = 512
    pinned: str | None = None
    model: str = "default"
    reference: str | None = None  # condition the b/c splits are taken against (default: kvcomm or the first)
    extra: dict = field(default_factory=dict)  # task options (e.g. the synthetic task's seed)
    fidelity: bool = False  # also serve every call densely and record its in-situ fidelity (about 2x the work)

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"--n must be >= 1, got {self.n}")
        parsed = [parse(c) for c in self.conditions]
        seen: dict[tuple, str] = {}
        for c in parsed:
            if c.settings in seen:
                raise ValueError(
                    f"conditions {seen[c.settings]} and {c.label} repeat one run (the same settings); list it once"
                )
            seen[c.settings] = c.label
        object.__setattr__(self, "conditions", tuple(c.label for c in parsed))
        if self.reference is not None and parse(self.reference).settings not in seen:
            raise ValueError(f"--reference {self.reference} is not among the conditions: {', '.join(self.conditions)}")


def make_cell(
    benchmark: str,
    agents: int,
    conditions: list[str],
    n: int,
    max_new_tokens: int = 512,
    pinned: str | None = None,
    model: str = "default",
    reference: str | None = None,
    seeds: list[int] | None = None,
    item_seed: int = 0,
    fidelity: bool = False,
) -> Cell:
    """The cell `bcr run` runs for these settings (each cell of `bcr grid` too): coin conditions
    without a seed once per seed in `seeds`, the synthetic task's items drawn with `item_seed`."""
    if seeds and not any(c.startswith("coin-") for c in conditions):
        raise ValueError(
            "--seeds runs coin conditions once per seed, and no coin condition (coin-chunk, coin-single) is listed"
        )
    extra = {"seed": item_seed} if benchmark == "synthetic" else {}
    return Cell(
        benchmark,
        agents,
        tuple(expand_seeds(conditions, seeds)),
        n,
        max_new_tokens,
        pinned,
        model,
        reference,
        extra,
        fidelity,
    )


class SharedReference(DenseServer):
    """The `--fidelity` reference: Dense on a call's prompt, served once per distinct prompt and
    shared by every condition whose call has that prompt (agent 1's always does; later agents' do
    whenever their predecessors answered alike). Dense is stateless, so sharing changes no number."""

    def __init__(self, bb, keep: int = 96):
        super().__init__(bb)
        self.keep, self.served = keep, OrderedDict()

    def steps(self, prompt, max_new_tokens):
        key = (tuple(prompt.dense_ids), max_new_tokens)
        if key not in self.served:
            self.served[key] = yield from super().steps(prompt, max_new_tokens)
            if len(self.served) > self.keep:
                self.served.popitem(last=False)
        self.served.move_to_end(key)
        return self.served[key]


class RunFiles:
    """The run's folder: settings, the two append-only record files, and a lock that keeps a second
    process from writing the same folder (a lock left by a killed run is recognised and taken over)."""

    def __init__(self, out: Path, cell: Cell):
        self.out = Path(out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            probe = self.out / ".writable"
            probe.touch()
            probe.unlink()
        except OSError as err:
            raise ValueError(f"--out {self.out} cannot hold a run: {err.strerror or err}") from None
        self.items_path, self.calls_path = self.out / "items.jsonl", self.out / "calls.jsonl"
        check_folder(self.out, cell)
        self.lock = self.out / ".lock"
        self.take_lock()
        settings = self.out / "cell.json"
        if not settings.exists():
            settings.write_text(json.dumps(identity(asdict(cell)), indent=2))

    def take_lock(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                holder = self.lock.read_text().strip()
                if holder.isdigit() and process_alive(int(holder)):
                    raise ValueError(
                        f"{self.out} is being written by another process (pid {holder}); wait for "
                        "it to finish, or use another --out"
                    ) from None
                self.lock.unlink(missing_ok=True)  # left by a run that was killed
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return
        raise ValueError(f"could not take the lock {self.lock}")

    def release(self) -> None:
        if self.lock.exists() and self.lock.read_text().strip() == str(os.getpid()):
            self.lock.unlink()

    def finished(self) -> tuple[dict[tuple[str, str], dict], dict[tuple[str, str], list[dict]]]:
        """Complete item records and their calls; a torn last line or orphan calls are dropped."""
        items = {(r["condition"], r["item_id"]): r for r in read_jsonl(self.items_path)}
        calls: dict[tuple[str, str], list[dict]] = {}
        for c in read_jsonl(self.calls_path):
            key = (c["condition"], c["item_id"])
            if key in items:
                calls.setdefault(key, []).append(c)
        rewrite_jsonl(self.items_path, items.values())
        rewrite_jsonl(self.calls_path, [c for key in items for c in calls.get(key, [])])
        return items, calls

    def append(self, item: dict, calls: list[dict]) -> None:
        append_jsonl(self.calls_path, calls)
        append_jsonl(self.items_path, [item])


def check_folder(out: Path, cell: Cell) -> None:
    """Refuse a folder that holds another run's records (a missing folder, or this cell's, is fine)."""
    out = Path(out)
    settings = out / "cell.json"
    if settings.exists():
        found = identity(json.loads(settings.read_text()))
        if found != json.loads(json.dumps(identity(asdict(cell)))):
            raise ValueError(f"{out} holds a run with other settings ({found}); use another --out or delete it")
    elif (out / "items.jsonl").exists() or (out / "calls.jsonl").exists():
        raise ValueError(
            f"{out} holds records but no cell.json, so their settings are unknown; "
            "use another --out, or delete the records"
        )


def identity(settings: dict) -> dict:
    """A run's identity: the settings that change its records (not the b/c reference)."""
    return {k: v for k, v in settings.items() if k != "reference"}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file. Only a last line torn by a crash (no newline after it) is
    dropped, to be redone; any other unreadable line, a blank one included, is an error naming the
    file and line, and nothing is rewritten."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the file ends with a newline: no torn line
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif number == len(lines) and not text.endswith("\n"):
            break  # torn by a crash: redone
        else:
            shown = "a blank line" if not line.strip() else repr(line[:60])
            raise ValueError(
                f"{path}, line {number}: unreadable record ({shown}); only a torn last line is "
                "redone. Restore or delete that line, then run again; nothing was changed on disk"
            )
    return rows


def rewrite_jsonl(path: Path, rows) -> None:
    with written_whole(path) as partial:
        partial.write_text("".join(json.dumps(r) + "\n" for r in rows))


def append_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def item_record(cell: Cell, condition: str, index: int, item: dict, request) -> dict:
    scored = benchmarks.score(cell.benchmark, request.final_text, item)
    calls = request.calls
    strictness = {key: bool(scored[key]) for key in ("correct_strict", "correct_lenient") if key in scored}
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
        "answer": scored.get("answer"),
        "final_text": request.final_text,
        "reuse_rate": request.reuse_rate,
        "rows_per_call": sum(c.rows_recomputed for c in calls) / len(calls),
        "rows_wasted_per_call": sum(c.rows_wasted for c in calls) / len(calls),
        "skipped_calls": sum(c.skipped for c in calls),
        "ttft_s_mean": sum(c.ttft_s for c in calls) / len(calls),
        "total_s": sum(c.total_s for c in calls),
    }


def run_cell(
    bb,
    cell: Cell,
    out: Path,
    progress: bool = True,
    batch: int = 1,
    label: str | None = None,
    on_item: Callable[[], None] | None = None,
) -> pd.DataFrame:
    """Run (or resume) a cell; returns the tidy per-item table. `label` names its progress bar;
    `on_item` is called after each item record is written (a grid's overall count).

    `batch` > 1 serves up to that many requests at once with their decoding batched
    (`lanes.run_lanes`): Dense's items in any order, each stateful condition's items one at a
    time in order, so results equal batch size 1 up to float rounding in batched decoding. Dense
    prefills of ids another condition already prefilled are shared (`SharedPrefills`). Call times
    then include waiting for the batch and exclude shared prefills; measure latency at batch size 1
    or with `bcr ttft`.
    """
    files = RunFiles(out, cell)
    try:
        done, done_calls = files.finished()
        items = benchmarks.load_items(cell.benchmark, cell.n, **cell.extra)
        pipeline = Pipeline(bb, cell.benchmark, cell.n_agents, cell.max_new_tokens, cell.pinned)
        servers = {c: make_server(bb, c) for c in cell.conditions}
        share_segment_caches(bb, servers.values())
        reference = SharedReference(bb) if cell.fidelity else None
        if batch > 1:  # at batch size 1 every call pays its own prefill, so its TTFT stays a latency
            prefills = SharedPrefills(bb)
            for server in [*servers.values(), *([reference] if reference else [])]:
                server.prefills = prefills
        units = []
        for index, item in enumerate(items):
            item_id = str(item["id"])
            for condition, server in servers.items():
                if (condition, item_id) in done:  # a stateful condition's finished items are a prefix
                    for call in done_calls.get((condition, item_id), []):
                        getattr(server, "replay", lambda call: None)(call)
                else:
                    question = benchmarks.question_text(cell.benchmark, item)
                    units.append(
                        Unit((condition, index), partial(pipeline.steps, server, item_id, question, reference))
                    )
        bar = tqdm(
            total=len(items) * len(servers),
            initial=len(items) * len(servers) - len(units),
            disable=not progress,
            desc=label or f"{cell.benchmark} x{cell.n_agents}",
        )

        def may_start(unit: Unit, running: list[Unit]) -> bool:
            condition = unit.key[0]
            return getattr(servers[condition], "stateless", False) or all(r.key[0] != condition for r in running)

        def finished(unit: Unit, request) -> None:
            condition, index = unit.key
            record = item_record(cell, condition, index, items[index], request)
            files.append(
                record, [c.to_dict() | {"condition": condition, "item_id": request.item_id} for c in request.calls]
            )
            bar.update(1)
            release_freed_memory()  # a long run's resident memory stays near what it holds
            if on_item is not None:
                on_item()

        run_lanes(bb, units, batch, may_start, finished)
        bar.close()
    finally:
        files.release()
    table = pd.DataFrame(read_jsonl(files.items_path))
    return table.sort_values("index", kind="stable").reset_index(drop=True) if len(table) else table
