"""A run's folder on disk: `cell.json`, the append-only `items.jsonl` and `calls.jsonl`, and the
lock that keeps a second process out (`RunFiles`); reading them back, and checking every record a
resumed run trusts, so damage a crash cannot leave stops the run naming file, line and what is wrong.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pandas as pd

from bcr_core.data.roles import DEFAULT_PROMPT
from bcr_core.engine.stopping import DEFAULT_RULE
from bcr_core.errors import UsageError
from bcr_core.paths import process_alive, write_text_whole
from bcr_core.run_folder import (
    ARITHMETIC,
    append_jsonl,
    count_lines,
    derive,
    numbered_jsonl,
    read_jsonl,
    read_settings,
    rewrite_jsonl,
)
from bcr_core.runs.cell import Cell
from bcr_core.setting_kinds import differences


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
        self.found = None  # the item records on disk when the run began (`finished`)

    def settle(self, arithmetic: dict[str, str]) -> None:
        """Write the settings, and the machine's `arithmetic` (`engine.products.arithmetic`) where none is
        recorded; refuse to go on where the folder's records were made with other arithmetic."""
        settings = self.out / "cell.json"
        if not settings.exists():
            write_text_whole(settings, json.dumps(identity(self.cell.record()), indent=2))
        check_arithmetic(self.out, arithmetic)

    def take_lock(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                holder = live_writer(self.out)
                if holder is not None:
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

    def kept(self) -> int:
        """The item records this run has written so far: those on disk now, less those it found."""
        return count_lines(self.items_path) - self.found if self.found is not None else 0

    def items_table(self) -> pd.DataFrame:
        """Every item record written so far, in item order."""
        table = pd.DataFrame(read_jsonl(self.items_path))
        return table.sort_values("index", kind="stable").reset_index(drop=True) if len(table) else table

    def finished(
        self, item_ids: list[str], nodes: list[str], stateful: set[str] = frozenset()
    ) -> tuple[dict[tuple[str, str], dict], dict[tuple[str, str], list[dict]]]:
        """The finished items and their calls (each with its implied fields, `run_folder.derive`), keyed
        by (condition, item id).

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
        self.found = len(items)
        return {k: r for k, (_, r) in items.items()}, {k: [derive(c) for _, c in v] for k, v in calls.items()}

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
CALL_FIELDS = {"condition": str, "item_id": str, "node": str, "reason": str, "merged_ids": list, "dense_ids": list}
CALL_FIELDS |= {"segment_map": list, "decisions": list, "repaired_rows": list}


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


def live_writer(folder: Path) -> int | None:
    """The pid of the process writing a run folder (its lock's holder, still running), or None."""
    try:
        holder = (Path(folder) / ".lock").read_text().strip()
    except OSError:
        return None
    return int(holder) if holder.isdigit() and process_alive(int(holder)) else None


def unfinished(folder: Path, items: int) -> str | None:
    """Why a run folder holding `items` item records is not a finished run, and what to do, or None:
    a process still writing it, or fewer records than its settings ask for (n items per condition)."""
    settings = read_settings(Path(folder) / "cell.json")
    wanted = settings.get("n", 0) * len(settings.get("conditions", ()))
    writer = live_writer(folder)
    if writer is not None:
        return (
            f"{folder} is still being written (pid {writer}): {items} of {wanted or '?'} item records so far, "
            "and the export holds only those; export again once that run has finished"
        )
    if items < wanted:
        return (
            f"{folder} is an unfinished run: {items} of {wanted} item records, and the export holds only "
            "those; rerun the run's command to finish it, then export again"
        )
    return None


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
        found, wanted = identity(read_settings(settings)), json.loads(json.dumps(identity(cell.record())))
        if found != wanted:
            raise UsageError(
                f"{out} holds a run with other settings ({differences(found, wanted)}); use another --out or delete it"
            )
    elif (out / "items.jsonl").exists() or (out / "calls.jsonl").exists():
        raise UsageError(
            f"{out} holds records but no cell.json, so their settings are unknown; "
            "use another --out, or delete the records"
        )


ONLY_FOR_THE_READER = {"cpu model"}  # two CPUs with one instruction set run the same kernels


def check_arithmetic(out: Path, here: dict[str, str]) -> None:
    """Record the arithmetic of the machine a run starts on; refuse a resume on a machine that rounds
    otherwise (another instruction set, GPU, PyTorch, or half-precision product path), since one cell's
    records would then mix two roundings and its pairs would read the machines' difference as an effect.
    A folder written before this file existed takes the current machine's (it holds no other record)."""
    path = out / ARITHMETIC
    if not path.exists():
        write_text_whole(path, json.dumps(here, indent=2))
        return
    changed = arithmetic_change(read_settings(path), here)
    if changed:
        raise UsageError(
            f"{out}'s records were made on a machine that rounds otherwise ({changed}); "
            "resuming here would mix two arithmetics in one cell. Resume on a machine like the one that made them, "
            f"or use another --out (or delete {path} to mix them knowingly)"
        )


def arithmetic_change(recorded: dict[str, str], here: dict[str, str]) -> str:
    """How two machines' arithmetic (`engine.products.arithmetic`) differ in what decides rounding, as
    `differences` words it; empty where they round alike."""
    compared = lambda found: {k: v for k, v in found.items() if k not in ONLY_FOR_THE_READER}
    return differences(compared(recorded), compared(here))


# Settings added after runs were committed, at the value every earlier run had: a folder written before
# one existed holds no key for it, and one at that value writes none, so both keep one identity.
LATER_SETTINGS = {
    "prompt": DEFAULT_PROMPT,
    "stop": DEFAULT_RULE,
    "shard": "",
    "dtype": "float32",
    "first_item": 0,
    "confirms": None,
}


def identity(settings: dict) -> dict:
    """A run's identity: the settings that change its records (not the b/c reference); a later setting
    at its earlier value is left out (`LATER_SETTINGS`)."""
    return {
        k: v for k, v in settings.items() if k != "reference" and not (k in LATER_SETTINGS and v == LATER_SETTINGS[k])
    }
