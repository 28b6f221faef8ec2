"""A cell copies the conditions a finished run of the same settings holds (`bcr_core.runs.copies`): the copied
records are what serving them here gives, the conditions only it lists are served as without copies, and every
source it cannot trust is refused, naming why, with nothing copied."""

import gzip
import json
import shutil

import pytest

from bcr_core.cli import main
from bcr_core.errors import UsageError
from bcr_core.run_folder import read_records
from bcr_core.runs import runner
from bcr_core.runs.cell import Cell
from bcr_core.runs.runner import run_cell

SETTINGS = dict(benchmark="synthetic", agents=2, n=4, max_new_tokens=6, item_seed=11, fidelity=True)
SOURCE = Cell(conditions=("dense", "kvcomm@1", "token-matched-dense"), **SETTINGS)
CELL = Cell(conditions=("dense", "kvcomm@1", "bcr-chunk@0.5:gamma=1"), **SETTINGS)
TIMES = ("ttft_s_mean", "total_s", "ttft_s", "assembly_s")  # the only fields two servings may differ in


def records(folder, name, condition=None):
    rows = [r for r in read_records(folder / name) if condition is None or r["condition"] == condition]
    return sorted(
        ({k: v for k, v in r.items() if k not in TIMES} for r in rows),
        key=lambda r: (r["condition"], r["item_id"], r.get("node", "")),
    )


@pytest.fixture(scope="module")
def source(tiny_chat, tmp_path_factory):
    out = tmp_path_factory.mktemp("source")
    run_cell(tiny_chat, SOURCE, out, progress=False, batch=3)
    return out


@pytest.fixture(scope="module")
def served(tiny_chat, tmp_path_factory):
    """CELL served whole, no copies: what the copying run must equal."""
    out = tmp_path_factory.mktemp("served")
    run_cell(tiny_chat, CELL, out, progress=False, batch=3)
    return out


def copy_of(source, tmp_path):
    folder = tmp_path / "source"
    shutil.copytree(source, folder)
    return folder


def test_copied_conditions_are_what_serving_them_gives_and_the_rest_is_served(tiny_chat, source, served, tmp_path):
    out = tmp_path / "copying"
    run_cell(tiny_chat, CELL, out, progress=False, batch=3, copies=source)
    for name in ("items.jsonl", "calls.jsonl"):
        assert records(out, name) == records(served, name)
        for condition in ("dense", "kvcomm@1"):  # copied as recorded, times included
            assert read_records(out / name) and [
                r for r in read_records(out / name) if r["condition"] == condition
            ] == [r for r in read_records(source / name) if r["condition"] == condition]
    assert any(c["reason"] == "reuse" for c in read_records(out / "calls.jsonl") if c["condition"] == "kvcomm@1")
    said = json.loads((out / "copied.json").read_text())
    assert said["from"] == str(source.resolve()) and said["conditions"] == ["dense", "kvcomm@1"]
    assert "token-matched-dense" not in {r["condition"] for r in read_records(out / "items.jsonl")}  # not this cell's
    exported = tmp_path / "exported"
    assert main(["export", str(out), str(exported)]) == 0
    assert json.loads((exported / "copied.json").read_text()) == said  # the committed form says so too


def test_a_resume_copies_nothing_twice_and_replays_no_finished_condition(tiny_chat, source, tmp_path, monkeypatch):
    out, folder = tmp_path / "copying", copy_of(source, tmp_path)
    run_cell(tiny_chat, CELL, out, progress=False, copies=folder)
    shutil.rmtree(folder)  # copied once: a resume needs the source no more
    before = (out / "items.jsonl").read_bytes(), (out / "calls.jsonl").read_bytes()
    replayed = []
    real = runner.make_servers

    def counting(*args):
        servers, reference = real(*args)
        for condition, server in servers.items():
            server.replay = lambda call, condition=condition: replayed.append(condition)
        return servers, reference

    monkeypatch.setattr(runner, "make_servers", counting)
    run_cell(tiny_chat, CELL, out, progress=False, copies=folder)
    assert ((out / "items.jsonl").read_bytes(), (out / "calls.jsonl").read_bytes()) == before
    assert replayed == []  # every condition finished: no state to rebuild


def test_a_source_this_machine_does_not_reproduce_is_refused_with_nothing_copied(tiny_chat, source, tmp_path):
    """A world where copying would be wrong: the source's first KVComm call decoded other tokens than this
    machine does (as another CPU's rounding would)."""
    folder = copy_of(source, tmp_path)
    calls = read_records(folder / "calls.jsonl")
    first = next(c for c in calls if c["condition"] == "kvcomm@1" and c["item_id"] == calls[0]["item_id"])
    first["output_tokens"] = first["output_tokens"][:-1] + [first["output_tokens"][-1] + 1]
    (folder / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    out = tmp_path / "copying"
    with pytest.raises(UsageError, match=r"kvcomm@1's first item served here differs .* \(output_tokens of agent_1's"):
        run_cell(tiny_chat, CELL, out, progress=False, copies=folder)
    assert not (out / "items.jsonl").exists() and not (out / "copied.json").exists()


@pytest.mark.parametrize(
    "damage, message",
    [
        ("other-settings", r"is a run of other settings \(max_new_tokens: 5 there, 6 now\)"),
        ("missing-item", r"holds 3 of the 4 items of kvcomm@1; finish that run first"),
        ("exported", r"holds no calls.jsonl: an exported folder keeps no id lists"),
        ("other-machine", r"was made on a machine that rounds otherwise \(cpu kernels: .* there, 'AMX' now\)"),
        ("no-arithmetic", r"does not record the arithmetic that made its records"),
    ],
)
def test_a_source_that_cannot_be_trusted_is_refused_naming_why(
    tiny_chat, source, tmp_path, monkeypatch, damage, message
):
    folder = copy_of(source, tmp_path)
    if damage == "other-settings":
        settings = json.loads((folder / "cell.json").read_text())
        (folder / "cell.json").write_text(json.dumps(settings | {"max_new_tokens": 5}))
    elif damage == "missing-item":
        items = [r for r in read_records(folder / "items.jsonl") if (r["condition"], r["index"]) != ("kvcomm@1", 3)]
        (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    elif damage == "exported":
        with gzip.open(folder / "calls.jsonl.gz", "wt") as f:
            f.write((folder / "calls.jsonl").read_text())
        (folder / "calls.jsonl").unlink()
    elif damage == "other-machine":  # the source made here, this run on an AMX CPU
        real = type(tiny_chat).arithmetic
        monkeypatch.setattr(type(tiny_chat), "arithmetic", lambda self: real(self) | {"cpu kernels": "AMX"})
    else:
        (folder / "arithmetic.json").unlink()
    out = tmp_path / "copying"
    with pytest.raises(UsageError, match=message):
        run_cell(tiny_chat, CELL, out, progress=False, copies=folder)
    assert not (out / "items.jsonl").exists()


def test_a_grid_cell_names_its_copies_and_the_cell_leaves_them_out(tmp_path):
    from bcr_core.runs.grid_file import read_grid

    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[defaults]\nbenchmark = "synthetic"\nn = 4\n'
        '[cells.new]\nconditions = ["dense"]\ncopies = "runs/first/claims"\n'
    )
    (cell,) = read_grid(grid)
    assert cell.copies.endswith("runs/first/claims") and cell.copies.startswith("/")
    assert "copies" not in cell.cell.record()  # how a cell's records are made, not what they are
