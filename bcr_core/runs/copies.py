"""Conditions a cell shares with a finished run of the same settings, copied in rather than served again.

Under the batch-invariant instrument (`engine.invariance`) a condition's records depend on the cell's settings and
the machine's arithmetic only, never on the conditions served beside it: serving Dense or KVComm again in a second
cell of the same settings would write, bit for bit, the records the first cell holds. So `copy_conditions` copies
them, and spends its time on the conditions only the new cell serves. It trusts nothing it has not seen: the source
must be a raw run folder (its calls keep the id lists a resume replays) of the same settings and arithmetic, hold
every item of each shared condition, and reproduce here: each shared condition's first item is served again, and
its records must equal the source's in every field but the times.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.paths import write_text_whole
from bcr_core.run_folder import ARITHMETIC, COPIED, read_records, read_settings
from bcr_core.runs.cell import Cell
from bcr_core.runs.run_writer import RunFiles, arithmetic_change, identity
from bcr_core.setting_kinds import differences

NOT_COMPARED = ("conditions", "reference")  # settings two cells sharing conditions may differ in

Serve = Callable[[Cell, Path], None]  # runs a cell into a new run folder, as the runner does


def copy_conditions(cell: Cell, source: Path, files: RunFiles, arithmetic: dict, serve: Serve) -> list[str]:
    """Copy into `files` every condition of `cell` that the run folder `source` holds and `files` holds no record
    of yet, once each one's first item, served here by `serve`, equals the source's; returns the conditions copied
    (none once `copied.json` is written: a copy cut short leaves its conditions' remaining items to serve).
    `arithmetic` is this machine's (`Backbone.arithmetic`).
    Refuses, naming why, a source of other settings or arithmetic, an exported one, one missing items of a
    shared condition, and one this machine does not reproduce."""
    if (files.out / COPIED).exists():  # copied when the run began: what it lacks now is served here
        return []
    source = Path(source)
    shared = [c for c in cell.conditions if c in check_source(cell, source, arithmetic)["conditions"]]
    present = {row["condition"] for row in read_records(files.items_path)} if files.items_path.exists() else set()
    wanted = [c for c in shared if c not in present]
    if not wanted:
        return []
    items, calls = source_records(source, cell, wanted)
    check_reproduced(cell, wanted, items, calls, serve)
    checked = f"the first item ({items[wanted[0]][0]['item_id']}) of each served again here: equal but for times"
    record = {"from": str(source.resolve()), "conditions": wanted, "checked": checked}
    write_text_whole(files.out / COPIED, json.dumps(record, indent=2))  # first: a copy cut short is resumed
    for condition in wanted:
        for item in items[condition]:
            files.append(item, calls[condition][item["item_id"]])
    return wanted


def check_source(cell: Cell, source: Path, arithmetic: dict) -> dict:
    """`source` is a raw run folder of `cell`'s settings (but its conditions) made with this machine's arithmetic;
    returns its settings."""
    if not (source / "cell.json").is_file():
        raise UsageError(f"copies: {source} holds no cell.json, so it is not a run folder")
    if not (source / "calls.jsonl").is_file():
        raise UsageError(
            f"copies: {source} holds no calls.jsonl: an exported folder keeps no id lists to resume from; "
            "copy from the raw run folder (runs/..., or partial-runs/snapshot.sh restore)"
        )
    settings = read_settings(source / "cell.json")
    theirs = {k: v for k, v in identity(settings).items() if k not in NOT_COMPARED}
    ours = {k: v for k, v in json.loads(json.dumps(identity(cell.record()))).items() if k not in NOT_COMPARED}
    if theirs != ours:
        raise UsageError(f"copies: {source} is a run of other settings ({differences(theirs, ours)})")
    if not (source / ARITHMETIC).is_file():
        raise UsageError(f"copies: {source} does not record the arithmetic that made its records ({ARITHMETIC})")
    changed = arithmetic_change(read_settings(source / ARITHMETIC), arithmetic)
    if changed:
        raise UsageError(f"copies: {source} was made on a machine that rounds otherwise ({changed})")
    return settings


def source_records(source: Path, cell: Cell, conditions: list[str]) -> tuple[dict, dict]:
    """The source's item records of `conditions`, in item order, and their calls by item id; every item of
    each condition must be there (its state is built in item order, and a copy is all or nothing)."""
    items = {c: [] for c in conditions}
    for row in read_records(source / "items.jsonl"):
        if row["condition"] in items:
            items[row["condition"]].append(row)
    calls = {c: {} for c in conditions}
    for call in read_records(source / "calls.jsonl"):
        if call["condition"] in calls:
            calls[call["condition"]].setdefault(call["item_id"], []).append(call)
    for condition, rows in items.items():
        rows.sort(key=lambda row: row["index"])
        if [row["index"] for row in rows] != list(range(cell.n)):
            raise UsageError(
                f"copies: {source} holds {len(rows)} of the {cell.n} items of {condition}; finish that run first"
            )
    return items, calls


def check_reproduced(cell: Cell, conditions, items, calls, serve: Serve) -> None:
    """Serve the first item of `conditions` here (beside each other) and hold its records equal to the source's
    in every field but the times, or refuse naming the first that differs."""
    scratch = Path(tempfile.mkdtemp(prefix="bcr-copies-check-"))
    try:
        first = replace(cell, conditions=tuple(conditions), n=1, reference=None)
        serve(first, scratch)
        served_items = {row["condition"]: row for row in read_records(scratch / "items.jsonl")}
        served_calls: dict[str, list] = {}
        for call in read_records(scratch / "calls.jsonl"):
            served_calls.setdefault(call["condition"], []).append(call)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for condition in conditions:
        first = items[condition][0]
        recorded = calls[condition][first["item_id"]]
        if len(recorded) != len(served_calls[condition]):
            raise not_reproduced(condition, f"{len(served_calls[condition])} calls against {len(recorded)}")
        for theirs, ours in [(first, served_items[condition]), *zip(recorded, served_calls[condition])]:
            differing = [k for k in theirs.keys() | ours.keys() if not is_time(k) and theirs.get(k) != ours.get(k)]
            if differing:
                where = f"{theirs['node']}'s call" if "node" in theirs else "the item record"
                raise not_reproduced(condition, f"{', '.join(sorted(differing))} of {where}")


def not_reproduced(condition: str, what: str) -> UsageError:
    return UsageError(
        f"copies: {condition}'s first item served here differs from its record in the source ({what}): this "
        "machine does not reproduce it, so nothing was copied; serve every condition here (no copies)"
    )


def is_time(key: str) -> bool:
    """Fields that time a call or an item: the only ones two servings of one condition may differ in."""
    return key.endswith("_s") or key.endswith("_s_mean")
