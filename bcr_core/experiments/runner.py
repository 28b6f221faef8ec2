"""The experiment runner: one grid cell (benchmark x agent count) under several conditions.

Every condition sees the same items in the same order. Items run one at a time under every
condition in turn, so an interrupted run still holds paired results. Per-item and per-call records
are appended to `items.jsonl` and `calls.jsonl` as each item finishes; a rerun with the same
settings skips finished items, replaying their recorded calls into the stateful servers (KVComm's
anchor pool, BCR's coin stream) so the rest of the run continues exactly as it would have.
"""

from __future__ import annotations

import errno
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
from bcr_core.errors import UsageError
from bcr_core.experiments.conditions import REPAIRS, SPECS, Condition, expand_seeds, make_server, parse
from bcr_core.experiments.lanes import Unit, run_lanes
from bcr_core.paths import utf8_text, written_whole
from bcr_core.reuse.segments import SharedPrefills, share_segment_caches
from bcr_core.reuse.servers import DenseServer
from bcr_core.settings import RUN, SettingError, check_run, check_setting


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
        check_setting("n", self.n, RUN["n"].kind)
        parsed = [parse(c) for c in self.conditions]
        seen: dict[tuple, str] = {}
        for c in parsed:
            if c.settings in seen:
                raise SettingError(
                    "conditions",
                    f"{seen[c.settings]} and {c.label} repeat one run (the same settings); list it once",
                )
            seen[c.settings] = c.label
        for c in parsed:
            check_value(c)
        object.__setattr__(self, "conditions", tuple(c.label for c in parsed))
        if self.reference is not None and parse(self.reference).settings not in seen:
            raise SettingError(
                "reference", f"{self.reference} is not among the conditions: {', '.join(self.conditions)}"
            )


def check_value(c: Condition) -> None:
    """Refuse a condition value no server can take, naming it (before any folder is touched); the
    error is about the `conditions` setting and reads `condition LABEL: why`."""
    refuse = lambda why: SettingError("conditions", why, label=f"condition {c.label}")  # noqa: E731
    if c.name == "cacheblend-reuse" and c.value is not None and not 0.0 <= c.value <= 1.0:
        raise refuse(f"r is the paired BCR-chunk reuse rate, in [0, 1]; got {c.value:g}")
    if c.name in REPAIRS and c.value is not None and not 0.0 <= c.value <= 1.0:
        raise refuse(f"rho is the share of rows repaired, in [0, 1]; got {c.value:g}")
    if "seed" in SPECS[c.name].options and c.option("seed") < 0:
        raise refuse(f"option seed is a coin stream's seed, at least 0; got {c.option('seed')}")


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
    without a seed once per seed in `seeds`, the synthetic task's items drawn with `item_seed`.
    Every setting is checked first by the one validator (`settings.check_run`): an error names its key."""
    given = dict(benchmark=benchmark, agents=agents, conditions=conditions, n=n, max_new_tokens=max_new_tokens)
    given |= dict(pinned=pinned, model=model, reference=reference, seeds=seeds, item_seed=item_seed, fidelity=fidelity)
    checked = check_run(given)
    conditions, seeds = checked["conditions"], checked["seeds"]
    if seeds and not any(c.startswith("coin-") for c in conditions):
        raise SettingError(
            "seeds", "runs coin conditions once per seed, and no coin condition (coin-chunk, coin-single) is listed"
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


class Interrupted(KeyboardInterrupt):
    """^C during a run: its message says how many item records this run wrote, and how to resume."""


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
    process from writing the same folder (a lock left by a killed run is recognised and taken over).
    The settings are written by `settle`, once every condition's server has been built, so a
    condition refused while building leaves no `cell.json` behind to refuse the corrected command."""

    def __init__(self, out: Path, cell: Cell):
        self.out, self.cell = Path(out), cell
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            probe = self.out / ".writable"
            probe.touch()
            probe.unlink()
        except OSError as err:
            raise UsageError(f"--out {self.out} cannot hold a run: {err.strerror or err}") from None
        self.items_path, self.calls_path = self.out / "items.jsonl", self.out / "calls.jsonl"
        check_folder(self.out, cell)
        self.lock = self.out / ".lock"
        self.take_lock()

    def settle(self) -> None:
        settings = self.out / "cell.json"
        if not settings.exists():
            settings.write_text(json.dumps(identity(asdict(self.cell)), indent=2))

    def take_lock(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                holder = self.lock.read_text().strip()
                if holder.isdigit() and process_alive(int(holder)):
                    raise UsageError(
                        f"{self.out} is being written by another process (pid {holder}); wait for "
                        "it to finish, or use another --out"
                    ) from None
                self.lock.unlink(missing_ok=True)  # left by a run that was killed
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return
        raise UsageError(f"could not take the lock {self.lock}")

    def release(self) -> None:
        if self.lock.exists() and self.lock.read_text().strip() == str(os.getpid()):
            self.lock.unlink()

    def items_table(self) -> pd.DataFrame:
        """Every item record written so far, in item order."""
        table = pd.DataFrame(read_jsonl(self.items_path))
        return table.sort_values("index", kind="stable").reset_index(drop=True) if len(table) else table

    def finished(
        self, item_ids: list[str], nodes: list[str], stateful: set[str] = frozenset()
    ) -> tuple[dict[tuple[str, str], dict], dict[tuple[str, str], list[dict]]]:
        """The finished items and their calls, keyed by (condition, item id).

        `append` writes an item's calls (synced) before its item line, so a crash can leave only a
        torn last line or the calls of items without an item line at the end of `calls.jsonl`:
        those are dropped and redone. Any other damage cannot come from a crash, and trusting or
        dropping it could change the rest of the run, so it stops the run naming file, line and
        what is wrong, with nothing rewritten: a record of the wrong type or of a condition not in
        `cell.json`, an item repeated or not this cell's, a call missing or repeated (also where
        an item line survived its torn last call), orphan calls before finished ones, or a gap in a
        stateful condition's items (its anchor pool and coin are built in item order)."""
        item_rows, torn_items = numbered_jsonl(self.items_path)
        call_rows, torn_calls = numbered_jsonl(self.calls_path)
        items = self.checked_items(item_rows, item_ids)
        calls: dict[tuple[str, str], list[dict]] = {}
        orphan = None
        for line, call in call_rows:
            check_record(self.calls_path, line, call, CALL_FIELDS, self.cell.conditions)
            key = (call["condition"], call["item_id"])
            if key not in items:
                orphan = orphan or (line, key)
                continue
            if orphan is not None:
                raise damaged(
                    self.calls_path,
                    orphan[0],
                    f"a call of {orphan[1]} has no item line, yet calls of finished items follow it",
                )
            calls.setdefault(key, []).append((line, call))
        for key, (line, _) in items.items():
            self.check_calls(key, line, calls.get(key, []), nodes)
        check_order(self.items_path, items, item_ids, stateful)
        kept_calls = [c for _, c in call_rows if (c["condition"], c["item_id"]) in items]
        if torn_items or torn_calls or len(kept_calls) < len(call_rows):
            rewrite_jsonl(self.items_path, [r for _, r in items.values()])
            rewrite_jsonl(self.calls_path, kept_calls)
        return {k: r for k, (_, r) in items.items()}, {k: [c for _, c in v] for k, v in calls.items()}

    def checked_items(self, rows: list[tuple[int, dict]], item_ids: list[str]) -> dict[tuple[str, str], tuple]:
        position = {item_id: i for i, item_id in enumerate(item_ids)}
        items = {}
        for line, row in rows:
            check_record(self.items_path, line, row, ITEM_FIELDS, self.cell.conditions)
            key = (row["condition"], row["item_id"])
            if position.get(row["item_id"]) != row["index"]:
                raise damaged(
                    self.items_path,
                    line,
                    f"item {row['item_id']!r} at index {row['index']} is not one of this cell's items",
                )
            if key in items:
                raise damaged(self.items_path, line, f"repeats the record of {key} on line {items[key][0]}")
            items[key] = (line, row)
        return items

    def check_calls(self, key: tuple[str, str], line: int, calls: list[tuple[int, dict]], nodes: list[str]) -> None:
        seen: dict[str, int] = {}
        for call_line, call in calls:
            if call["node"] in seen:
                raise damaged(
                    self.calls_path, call_line, f"repeats call {call['node']} of {key} (line {seen[call['node']]})"
                )
            seen[call["node"]] = call_line
        if [c["node"] for _, c in calls] != [n for n in nodes if n in seen] or len(seen) != len(nodes):
            missing = [n for n in nodes if n not in seen]
            what = (
                f"has no call {', '.join(missing)} in {self.calls_path.name}"
                if missing
                else f"has calls {list(seen)}, expected {nodes}"
            )
            raise damaged(
                self.items_path, line, f"item {key} {what}; restore the calls, or delete the item's lines to redo it"
            )

    def append(self, item: dict, calls: list[dict]) -> None:
        try:
            append_jsonl(self.calls_path, calls)
            append_jsonl(self.items_path, [item])
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise UsageError(
                    f"{self.out}: the disk is full ({err.strerror}) while appending item {item['item_id']}; "
                    "the finished records are intact: free space, then rerun the same command to resume"
                ) from None
            raise


# The fields resuming reads, with their JSON types (a bool is not an int here).
ITEM_FIELDS = {"condition": str, "item_id": str, "index": int, "correct": bool, "final_text": str}
CALL_FIELDS = {"condition": str, "item_id": str, "node": str, "mode": str, "reason": str, "merged_ids": list}
CALL_FIELDS |= {"segment_map": list, "decisions": list, "rows_recomputed": int}


def check_record(path: Path, line: int, row: dict, fields: dict, conditions: tuple[str, ...]) -> None:
    """A record's fields have their types and its condition is one of `conditions`."""
    kind = "an item" if fields is ITEM_FIELDS else "a call"
    for name, expected in fields.items():
        if name not in row:
            raise damaged(path, line, f"not {kind} record: it has no {name!r}")
        if type(row[name]) is not expected:
            raise damaged(path, line, f"{name} is {row[name]!r}, expected {expected.__name__}")
    if row["condition"] not in conditions:
        raise damaged(path, line, f"condition {row['condition']!r} is not among cell.json's: {', '.join(conditions)}")


def read_items(path: Path, conditions: tuple[str, ...]) -> list[dict]:
    """The item records at `path` (a torn last line dropped), each checked as `check_record` does."""
    rows = numbered_jsonl(path)[0]
    for line, row in rows:
        check_record(path, line, row, ITEM_FIELDS, conditions)
    return [row for _, row in rows]


def damaged(path: Path, line: int, what: str) -> UsageError:
    return UsageError(f"{path}, line {line}: {what}; nothing was changed on disk")


def check_order(path: Path, items: dict, item_ids: list[str], stateful: set[str]) -> None:
    """A stateful condition's finished items must be the first k: its state is built in item order."""
    for condition in stateful:
        done = sorted((row["index"], line) for (c, _), (line, row) in items.items() if c == condition)
        for expected, (index, line) in enumerate(done):
            if index != expected:
                raise damaged(
                    path,
                    line,
                    f"{condition} has item {index} but not item {expected} ({item_ids[expected]!r}); "
                    "its state is built in item order, so delete its records from the gap on to redo them",
                )


def check_folder(out: Path, cell: Cell) -> None:
    """Refuse a folder that holds another run's records (a missing folder, or this cell's, is fine)."""
    out = Path(out)
    settings = out / "cell.json"
    if settings.exists():
        found = identity(read_settings(settings))
        if found != json.loads(json.dumps(identity(asdict(cell)))):
            raise UsageError(f"{out} holds a run with other settings ({found}); use another --out or delete it")
    elif (out / "items.jsonl").exists() or (out / "calls.jsonl").exists():
        raise UsageError(
            f"{out} holds records but no cell.json, so their settings are unknown; "
            "use another --out, or delete the records"
        )


def read_settings(path: Path) -> dict:
    """A run's `cell.json`: a JSON object, else an error naming the file."""
    try:
        found = json.loads(utf8_text(path, "a run's settings as a JSON object"))
    except json.JSONDecodeError:
        found = "text that is not JSON"
    if not isinstance(found, dict):
        shown = found if isinstance(found, str) else f"a {type(found).__name__}"
        raise UsageError(
            f"{path} should hold a run's settings as a JSON object, but holds {shown}; restore it, or use another --out"
        )
    return found


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
    return [row for _, row in numbered_jsonl(path)[0]]


def numbered_jsonl(path: Path) -> tuple[list[tuple[int, dict]], bool]:
    """`read_jsonl`'s records with their line numbers, and whether a torn last line was dropped."""
    if not path.exists():
        return [], False
    text = utf8_text(path, "records as JSON lines")
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
            rows.append((number, row))
        elif number == len(lines) and not text.endswith("\n"):
            return rows, True  # torn by a crash: redone
        else:
            shown = "a blank line" if not line.strip() else repr(line[:60])
            raise UsageError(
                f"{path}, line {number}: unreadable record ({shown}); only a torn last line is "
                "redone. Restore or delete that line, then run again; nothing was changed on disk"
            )
    return rows, False


def rewrite_jsonl(path: Path, rows) -> None:
    """Replace the records at `path`, or at the file it links to (the link stays a link)."""
    with written_whole(Path(path).resolve()) as partial:
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
    files, written = RunFiles(out, cell), []
    try:
        items = benchmarks.load_items(cell.benchmark, cell.n, **cell.extra)
        pipeline = Pipeline(bb, cell.benchmark, cell.n_agents, cell.max_new_tokens, cell.pinned)
        servers = {c: make_server(bb, c) for c in cell.conditions}
        files.settle()
        stateful = {c for c, server in servers.items() if not server.stateless}
        done, done_calls = files.finished([str(i["id"]) for i in items], [t.node for t in pipeline.templates], stateful)
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
                        server.replay(call)
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
            return servers[condition].stateless or all(r.key[0] != condition for r in running)

        def finished(unit: Unit, request) -> None:
            condition, index = unit.key
            record = item_record(cell, condition, index, items[index], request)
            files.append(
                record, [c.to_dict() | {"condition": condition, "item_id": request.item_id} for c in request.calls]
            )
            written.append(unit.key)
            bar.update(1)
            release_freed_memory()  # a long run's resident memory stays near what it holds
            if on_item is not None:
                on_item()

        with bar:  # closed on ^C too, so the message below starts its own line
            run_lanes(bb, units, batch, may_start, finished)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after {len(written)} items; rerun the same command to resume") from None
    finally:
        files.release()
    return files.items_table()
