"""A run folder on disk and its one reader: the settings (`cell.json`), and the records as JSON lines,
appended and synced one item at a time, read back with a torn last line dropped (a crash's only
possible damage), from a file or its `.gz` twin. `RunFolder` reads one folder, `run_folders` finds
every one under a folder; the runner's writing side is `bcr_core.runs.run_writer`.

A call record (`reuse.calls.CallRecord.to_dict`) stores only what nothing else in it implies. A
reader gets the implied fields back from `derive`, the one place they are computed:

- `mode`: "reuse" when the call's reason is the gate's "reuse", else "dense";
- `rows_recomputed` and `rows_wasted`: how many rows were repaired, and how many of those sat on
  the agent's exact prefix (outside every placeholder and the text after it);
- `cached_rows` and `ids_match`: the served cache's rows (one short of the prompt) and whether the
  chat template's ids equal the reuse path's.

`export` writes a run's records for committing under results/: the same record with its three id
lists (the prompt's two tokenizations, the repaired rows) left out and the counts above kept in
their place, because those lists are most of a record's bytes and no committed table reads them.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.paths import all_written_whole, utf8_text, written_whole
from bcr_core.reuse.calls import mode_of, wasted_rows

ID_LISTS = ("dense_ids", "merged_ids", "repaired_rows")  # left out of committed records
SETTINGS, ITEMS, CALLS = "cell.json", "items.jsonl", "calls.jsonl"  # a run folder's files (`.gz` once committed)
ARITHMETIC, COPIED = "arithmetic.json", "copied.json"  # the machine that made the records; what was copied


@dataclass(frozen=True)
class RunFolder:
    """One run folder: its settings, items and calls (each call with its implied fields, `derive`),
    read from the files a run writes or from their committed `.gz` twins."""

    path: Path

    @cached_property
    def settings(self) -> dict:
        try:
            return read_settings(self.path / SETTINGS)
        except OSError as err:
            raise UsageError(f"{self.path / SETTINGS}: cannot read a run's settings ({err.strerror})") from None

    @property
    def model(self) -> str:
        return self.settings.get("model", "default")

    @property
    def is_arena(self) -> bool:
        """An arena's folder names selectors where a run's names conditions."""
        return "selectors" in self.settings

    def items(self) -> list[dict]:
        return read_records(self.path / ITEMS)

    def calls(self) -> list[dict]:
        return read_calls(self.path / CALLS)


def run_folders(root) -> list[RunFolder]:
    """Every run folder under `root` (one holding `cell.json`), in path order; none if `root` is missing.
    A damaged or unreadable `cell.json` is an error naming it, not a folder skipped (a skipped run would
    be silently recomputed)."""
    folders = [RunFolder(settings.parent) for settings in sorted(Path(root).rglob(SETTINGS))]
    for folder in folders:
        _ = folder.settings  # read now: a damaged one is an error here, not wherever it is first used
    return folders


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


def count_lines(path: Path) -> int:
    """A cheap running count of a JSONL file's records (its whole lines; a missing file has none)."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


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


def read_records(path: Path) -> list[dict]:
    """A JSONL file, or its `.gz` twin when only that exists."""
    path = Path(path)
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    if path.suffix != ".gz":
        return read_jsonl(path)  # a run still being written may end in a torn line
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_calls(path: Path) -> list[dict]:
    """The call records at `path` (or its `.gz` twin), each with its implied fields (`derive`)."""
    return [derive(call) for call in read_records(path)]


def derive(call: dict) -> dict:
    """The call record with the fields it implies added (see the module's docstring); a committed
    record, which keeps the counts in place of its id lists, is returned with `mode` added."""
    out = dict(call)
    out["mode"] = mode_of(call["reason"])
    if "merged_ids" in call:
        cached = len(call["merged_ids"]) - 1
        out["cached_rows"] = cached
        out["ids_match"] = call["dense_ids"] == call["merged_ids"]
        out["rows_recomputed"] = len(call["repaired_rows"])
        out["rows_wasted"] = wasted_rows(call["segment_map"], cached, call["repaired_rows"])
    return out


def committed(call: dict) -> dict:
    """A call record as committed under results/: its implied counts kept, its id lists and its
    `mode` (which the reason gives) left out."""
    full = derive(call)
    return {k: v for k, v in full.items() if k not in ID_LISTS and k != "mode"}


def export(run: Path, target: Path) -> int:
    """Write a run folder's records for committing (gzip, `committed` calls) beside its settings, the
    arithmetic that made them and the conditions it copied from another run (`arithmetic.json`,
    `copied.json`, where it has them); returns the item records written. The files take their names
    together, once all are written: a failure leaves an earlier export in `target` as it was."""
    run, target = Path(run), Path(target)
    check_exportable(run, target)
    items = read_records(run / "items.jsonl")
    calls = [committed(c) for c in read_records(run / "calls.jsonl")]
    copied = [name for name in (SETTINGS, ARITHMETIC, COPIED) if (run / name).is_file()]
    names = (*copied, "items.jsonl.gz", "calls.jsonl.gz")
    with all_written_whole([target / name for name in names]) as (*copies, items_file, calls_file):
        for name, copy in zip(copied, copies, strict=True):
            copy.write_bytes((run / name).read_bytes())
        write_gzip_jsonl(items_file, items, "items.jsonl")
        write_gzip_jsonl(calls_file, calls, "calls.jsonl")
    return len(items)


def write_gzip_jsonl(path: Path, rows: list[dict], name: str) -> None:
    """`rows` as gzip'd JSON lines, the header naming `name` and no time, so one export's bytes are
    the same every time."""
    with open(path, "wb") as raw, gzip.GzipFile(name, "wb", compresslevel=9, fileobj=raw, mtime=0) as f:
        f.writelines((json.dumps(r) + "\n").encode("utf-8") for r in rows)


def check_exportable(run: Path, target: Path) -> None:
    """A run folder (`cell.json` and `items.jsonl` inside) exported somewhere other than itself."""
    if not run.is_dir():
        raise UsageError(f"{run}: no such run folder")
    if not (run / "cell.json").is_file():
        raise UsageError(f"{run}: no cell.json, so not a run folder (`bcr run --out` and `bcr arena --out` write one)")
    if not (run / "items.jsonl").is_file():
        raise UsageError(f"{run}: no items.jsonl to export (a committed folder is already exported)")
    if target.resolve() == run.resolve():
        raise UsageError(f"{target}: the export would overwrite its own run folder; name another folder")
