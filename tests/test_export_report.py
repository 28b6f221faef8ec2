"""`bcr export` and `bcr report`: the two subcommands that read records already on disk.

The export is checked on a hand-made run folder whose counts are worked out here by hand (which rows
KVComm predicted, which repaired rows sat on the exact prefix); a bad path is one line and exit 2.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bcr_core
from bcr_core.cli import main
from bcr_core.errors import UsageError
from bcr_core.run_folder import export

CELL = '{"benchmark": "synthetic", "model": "default", "n": 2}\n'
SEGMENTS = [  # rows 0-3 the agent's exact prefix, 4-7 a placeholder's value, 8-9 the text after it
    {"name": "prefix", "start": 0, "stop": 4, "placeholder": False},
    {"name": "user_question", "start": 4, "stop": 8, "placeholder": True},
    {"name": "after:user_question", "start": 8, "stop": 10, "placeholder": False},
]
REUSED = {  # 10 ids, so 9 cached rows; the reuse path's last id differs from the template's
    "node": "agent_1",
    "condition": "bcr-chunk",
    "item_id": "i0",
    "reason": "reuse",
    "dense_ids": list(range(10)),
    "merged_ids": [*range(9), 99],
    "repaired_rows": [0, 1, 5, 8],
    "segment_map": SEGMENTS,
    "output_tokens": [7],
}
DENSE = {
    "node": "agent_1",
    "condition": "dense",
    "item_id": "i0",
    "reason": "dense",
    "dense_ids": [1, 2, 3],
    "merged_ids": [1, 2, 3],
    "repaired_rows": [],
    "segment_map": [],
    "output_tokens": [7],
}


def run_folder(root):
    run = root / "run"
    run.mkdir()
    (run / "cell.json").write_text(CELL)
    items = [{"condition": c, "item_id": "i0", "correct": True} for c in ("dense", "bcr-chunk")]
    (run / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    (run / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (REUSED, DENSE)))
    return run


def exported_calls(out):
    with gzip.open(out / "calls.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def test_export_keeps_each_calls_counts_in_place_of_its_id_lists(tmp_path, capsys):
    run = run_folder(tmp_path)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == f"exported 2 item and 2 call records to {tmp_path / 'out'}\n"
    reused, dense = exported_calls(tmp_path / "out")
    for call in (reused, dense):
        assert not {"dense_ids", "merged_ids", "repaired_rows", "mode"} & set(call)
    # 9 cached rows; rows 0 and 1 of the four repaired lie on the prefix (rows 0-3), 5 and 8 were predicted
    assert (reused["cached_rows"], reused["ids_match"], reused["rows_recomputed"], reused["rows_wasted"]) == (
        9,
        False,
        4,
        2,
    )
    assert (dense["cached_rows"], dense["ids_match"], dense["rows_recomputed"], dense["rows_wasted"]) == (2, True, 0, 0)
    assert reused["output_tokens"] == [7] and reused["segment_map"] == SEGMENTS
    assert (tmp_path / "out" / "cell.json").read_text() == CELL
    with gzip.open(tmp_path / "out" / "items.jsonl.gz", "rt") as f:
        assert [json.loads(line)["condition"] for line in f] == ["dense", "bcr-chunk"]


def test_export_carries_the_arithmetic_that_made_the_records_where_the_run_recorded_it(tmp_path):
    run = run_folder(tmp_path)
    assert main(["export", str(run), str(tmp_path / "before")]) == 0  # a folder from before it was recorded
    assert not (tmp_path / "before" / "arithmetic.json").exists()
    (run / "arithmetic.json").write_text('{"device": "cpu", "cpu kernels": "AVX2"}')
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "arithmetic.json").read_text() == '{"device": "cpu", "cpu kernels": "AVX2"}'


def test_export_json_says_what_it_wrote(tmp_path, capsys):
    run = run_folder(tmp_path)
    assert main(["export", str(run), str(tmp_path / "out"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"items": 2, "calls": 2, "out": str(tmp_path / "out")}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", "no such run folder"),
        ("no-cell", "no cell.json, so not a run folder"),
        ("no-items", "no items.jsonl to export"),
        ("itself", "would overwrite its own run folder"),
    ],
)
def test_a_bad_export_path_is_one_line(damage, message, tmp_path, capsys):
    run = run_folder(tmp_path)
    out = tmp_path / "out"
    if damage == "missing":
        run = tmp_path / "nowhere"
    elif damage == "no-cell":
        (run / "cell.json").unlink()
    elif damage == "no-items":
        (run / "items.jsonl").unlink()
    else:
        out = run
    with pytest.raises(UsageError, match=message) as caught:
        export(run, out)
    assert not isinstance(caught.value, ValueError)
    assert main(["export", str(run), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bcr export: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing is written before the check


@pytest.mark.parametrize("kind", ["claims", "arena"])
def test_a_report_of_a_missing_or_empty_folder_is_one_line(kind, tmp_path, capsys):
    assert main(["report", kind, str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err == f"bcr report: error: {tmp_path / 'nowhere'}: no such folder of {kind} records\n"
    (tmp_path / "empty").mkdir()
    assert main(["report", kind, str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bcr report: error: ") and err.count("\n") == 1 and "empty" in err


def test_report_arena_of_a_folder_without_arena_records_says_what_to_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", "arena", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == (
        f"bcr report: error: {tmp_path / 'empty'} holds no arena records (no calls.jsonl): make them with "
        f"`bcr arena --n N --out {tmp_path / 'empty'}`, then report again\n"
    )


def test_report_claims_of_an_arena_folder_names_the_arena_report(capsys):
    from bcr_core.paths import RESULTS

    assert main(["report", "claims", str(RESULTS / "arena")]) == 2
    assert capsys.readouterr().err == (
        f"bcr report: error: {RESULTS / 'arena'} is an arena folder (its cell.json names selectors), not a claims "
        f"folder: run `bcr report arena {RESULTS / 'arena'}`\n"
    )


def test_report_arena_prints_the_tables_docs_results_shows():
    """The committed arena's report is the block of docs/results.md that its test checks line by line:
    here only that the subcommand prints that block, every line in the docs."""
    import contextlib
    import io

    from bcr_core.paths import CHECKOUT, RESULTS

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["report", "arena", str(RESULTS / "arena")]) == 0
    lines = printed.getvalue().splitlines()
    shown = (CHECKOUT / "docs" / "results.md").read_text()
    assert len(lines) > 40 and lines[-1].startswith("- ours beats coin: **holds**")
    assert [line for line in lines if line not in shown] == []


def test_report_arena_compares_models_only_within_one_task(monkeypatch, capsys):
    """Given the two synthetic arenas and the HumanEval one, the transfer table reads the two models on the
    synthetic task only (a verdict moving between tasks is not a model's transfer), and the answer table all
    three; a transfer table over two tasks is refused."""
    from bcr_core.arena import report
    from bcr_core.paths import RESULTS

    folders = [RESULTS / "arena", RESULTS / "arena-gemma-3-270m-bos", RESULTS / "arena-qwen2.5-coder-0.5b-humaneval"]
    monkeypatch.setattr(report, "markdown", lambda folder: "")
    monkeypatch.setattr(report, "transfer_lines", lambda group: f"transfer {[Path(f).name for f in group]}")
    monkeypatch.setattr(report, "answer_lines", lambda group: f"answer {[Path(f).name for f in group]}")
    report.main(folders)
    printed = capsys.readouterr().out
    assert printed.count("transfer") == 1 and "transfer ['arena', 'arena-gemma-3-270m-bos']" in printed
    assert f"answer {[f.name for f in folders]}" in printed
    with pytest.raises(UsageError, match="several tasks .*humaneval.*synthetic"):
        report.transfer_table([folders[0], folders[2]])


# ------------------------------------------------------------------ faults while writing: the earlier export stays

ROOT = Path(bcr_core.__file__).resolve().parent.parent  # the bcr_core under test, for the subprocesses
PREAMBLE = "import sys\nfrom bcr_core import cli\nimport bcr_core.run_folder, bcr_core.runs.run_writer\n"


def bcr(args: list, setup: str = "") -> subprocess.Popen:
    """`bcr ARGS` in a fresh interpreter, after `setup` (Python, run once the package is imported) sets a fault."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    code = f"{PREAMBLE}{setup}\nsys.exit(cli.main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def grown_run(root):
    """`run_folder` grown to 400 calls of 200 random tokens each: a calls.jsonl.gz of about 300 KB."""
    run = run_folder(root)
    rng = random.Random(0)
    calls = [DENSE | {"node": f"agent_{i}", "output_tokens": rng.choices(range(50000), k=200)} for i in range(400)]
    with open(run / "calls.jsonl", "a") as f:
        f.writelines(json.dumps(c) + "\n" for c in calls)
    return run


def folder_bytes(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.fixture
def earlier_export(tmp_path):
    """A good export of the small run in OUT, and the grown run whose export is to fail over it."""
    out, small = tmp_path / "out", tmp_path / "small"
    small.mkdir()
    assert main(["export", str(run_folder(small)), str(out)]) == 0
    return out, grown_run(tmp_path)


# The file-size limit: cell.json and the items fit, the calls do not (EFBIG, as a full disk).
FULL_DISK = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({64 * 1024}, {64 * 1024}))
"""
# Root writes through a folder's mode by its capability CAP_DAC_OVERRIDE: the export drops it first.
NO_OVERRIDE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
header, data = Header(0x20080522, 0), (Data * 2)()
assert libc.capget(ctypes.byref(header), data) == 0
data[0].effective &= ~(1 << 1)  # CAP_DAC_OVERRIDE
assert libc.capset(ctypes.byref(header), data) == 0
"""


@pytest.mark.parametrize("fault, cause", [("full disk", "File too large"), ("read-only folder", "Permission denied")])
def test_a_failed_export_leaves_the_earlier_export_as_it_was(earlier_export, fault, cause):
    out, run = earlier_export
    before = folder_bytes(out)
    if fault == "read-only folder":
        out.chmod(0o555)
    setup = FULL_DISK if fault == "full disk" else NO_OVERRIDE if os.geteuid() == 0 else ""
    try:
        done = bcr(["export", run, out], setup)
        stdout, stderr = done.communicate(timeout=300)
    finally:
        out.chmod(0o755)
    assert done.returncode == 2 and stdout == ""
    assert stderr == (
        f"bcr export: error: {out}: cannot write cell.json, items.jsonl.gz, calls.jsonl.gz ({cause}); "
        "nothing there was changed: free space or give a folder you can write, then run again\n"
    )
    assert folder_bytes(out) == before


SLOW_CALLS = """
import pathlib, time
real = bcr_core.run_folder.write_gzip_jsonl

def rows_then_stall(rows):
    for number, row in enumerate(rows):
        if number == len(rows) // 2:
            pathlib.Path({mark!r}).write_text("half the calls written")
            time.sleep(600)
        yield row

def stalling(path, rows, name):
    real(path, rows_then_stall(rows) if name == "calls.jsonl" else rows, name)

bcr_core.run_folder.write_gzip_jsonl = stalling
"""


def test_a_kill_mid_export_leaves_the_earlier_export_and_the_next_export_clears_its_partial(earlier_export, tmp_path):
    out, run = earlier_export
    before, mark = folder_bytes(out), tmp_path / "mark"
    writer = bcr(["export", run, out], SLOW_CALLS.format(mark=str(mark)))
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert writer.poll() is None and time.monotonic() < deadline, writer.communicate()
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.communicate()
    after = folder_bytes(out)
    left = sorted(set(after) - set(before))
    assert {k: after[k] for k in before} == before  # every file at its name, byte for byte
    assert left and all(f".{writer.pid}-" in name and ".partial" in name for name in left)  # the killed siblings
    assert main(["export", str(run), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["calls.jsonl.gz", "cell.json", "items.jsonl.gz"]
    assert len(exported_calls(out)) == 402


def test_an_export_of_an_unfinished_run_says_so_and_what_to_do(tmp_path, capsys):
    run = run_folder(tmp_path)
    (run / "cell.json").write_text(json.dumps({"n": 2, "conditions": ["dense", "bcr-chunk"]}))
    (run / ".lock").write_text(str(os.getpid()))  # a live process writes it
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == (
        f"bcr export: {run} is still being written (pid {os.getpid()}): 2 of 4 item records so far, and the "
        "export holds only those; export again once that run has finished\n"
    )
    (run / ".lock").unlink()  # interrupted
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == (
        f"bcr export: {run} is an unfinished run: 2 of 4 item records, and the export holds only those; rerun "
        "the run's command to finish it, then export again\n"
    )
    (run / "cell.json").write_text(json.dumps({"n": 1, "conditions": ["dense", "bcr-chunk"]}))
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == ""  # a finished run: nothing to say
