"""`bcr export` and `bcr report`: the two subcommands that read records already on disk.

The export is checked on a hand-made run folder whose counts are worked out here by hand (which rows
KVComm predicted, which repaired rows sat on the exact prefix); a bad path is one line and exit 2.
"""

from __future__ import annotations

import gzip
import json

import pytest

from bcr_core.cli import main
from bcr_core.errors import UsageError
from bcr_core.record_files import export

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
