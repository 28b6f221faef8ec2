"""`bcr grid`: cells from a TOML file, in this process or on Ray, into DIR/NAME as `bcr run` writes them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import bcr_core
from bcr_core import cli
from bcr_core.run_folder import count_lines
from bcr_core.runs import grid, grid_folder, grid_ray
from bcr_core.runs.grid_file import read_grid
from bcr_core.runs.run_writer import process_alive, read_jsonl

TIMING = {"ttft_s_mean", "total_s", "ttft_s", "assembly_s"}
GRID = """
[defaults]
benchmark = "synthetic"
model = "config:{config}"
agents = 2
n = {n}
max_new_tokens = {tokens}
conditions = ["dense", "kvcomm@1"]
item_seed = 7

[cells.two_agents]

[cells.coin]
conditions = "dense,coin-single@0.3:gamma=1,seed=3"
item_seed = 3
"""


def grid_file(folder: Path, config: Path, n: int = 3, tokens: int = 4) -> Path:
    path = folder / "grid.toml"
    path.write_text(GRID.format(config=config, n=n, tokens=tokens))
    return path


def records(folder: Path, name: str, timing: bool = False) -> list[dict]:
    rows = read_jsonl(folder / name)
    rows = rows if timing else [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    return sorted(rows, key=lambda r: (r["condition"], r["item_id"], r.get("node", "")))


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, tiny_config) -> Path:
    """The two-cell grid run in this process (one torch thread, as in a Ray worker)."""
    out = tmp_path_factory.mktemp("in_process")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli.main(["grid", str(grid_file(out, tiny_config)), "--out", str(out / "grid")]) == 0
    finally:
        torch.set_num_threads(threads)
    return out / "grid"


def test_in_process_grid_writes_each_cell_as_bcr_run_and_one_table(in_process):
    for name in ("two_agents", "coin"):
        assert len(read_jsonl(in_process / name / "items.jsonl")) == 6
        assert (in_process / name / "summary.csv").exists() and (in_process / name / "cell.json").exists()
    table = pd.read_csv(in_process / "grid.csv")
    assert list(table[["cell", "condition"]].itertuples(index=False, name=None)) == [
        ("two_agents", "dense"),
        ("two_agents", "kvcomm@1"),
        ("coin", "dense"),
        ("coin", "coin-single@0.3:gamma=1,seed=3"),
    ]
    columns = list(table.columns)
    assert columns[:2] == ["cell", "finished"] and table["finished"].all()
    assert columns.index("only_reference_right") < columns.index("only_condition_right") < columns.index("p_exact")


def test_a_finished_grid_runs_nothing(in_process, tiny_config):
    before = {p: p.stat().st_mtime_ns for p in in_process.glob("*/*.jsonl")}
    cells = read_grid(in_process.parent / "grid.toml")
    assert grid.run_grid(cells, in_process) == []
    assert {p: p.stat().st_mtime_ns for p in in_process.glob("*/*.jsonl")} == before


def test_the_grid_files_in_the_readme_read():
    root = Path(bcr_core.__file__).parent.parent
    assert [g.name for g in read_grid(root / "grids" / "two_cells.toml")] == ["synthetic_2", "synthetic_3"]
    paper = read_grid(root / "grids" / "paper.toml")
    assert len(paper) == 13 and {g.cell.model for g in paper} == {"meta-llama/Llama-3.1-8B-Instruct"}
    two_cells = (root / "grids" / "two_cells.toml").read_text().split("\n\n", 1)[1]
    assert two_cells in (root / "README.md").read_text()


def test_the_paper_grid_runs_random_allocation_as_notebook_08_does():
    """App. A.1 (P5) chooses Random's probability so that its reuse rate lands on Protect-the-Root's:
    p = 1 - reuse(protect-root) / reuse(kvcomm), derived from the run. Notebook 08 derives it; the
    paper grid cannot know the rates before its cell runs, so it runs no Random at a constant p and
    says how to run it from the cell's rates."""
    import json

    root = Path(bcr_core.__file__).parent.parent
    paper = read_grid(root / "grids" / "paper.toml")
    allocation = next(g for g in paper if g.name == "allocation_gsm8k_5")
    assert {"protect-root", "protect-leaf", "kvcomm", "dense"} == set(allocation.cell.conditions)
    assert not any(c.startswith("random-alloc") for g in paper for c in g.cell.conditions)
    text = (root / "grids" / "paper.toml").read_text()
    assert "p = 1 - reuse(protect-root) / reuse(kvcomm)" in text and "random-alloc@P" in text
    cells = json.loads((root / "notebooks" / "08_allocation.ipynb").read_text())["cells"]
    source = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "1 - rates[root] / rates[reuse_label]" in source


# ------------------------------------------------------------------ a malformed grid file: one line naming the key

BASE = '[defaults]\nbenchmark = "synthetic"\nconditions = ["dense"]\nn = 2\n'


@pytest.mark.parametrize(
    "text, message",
    [
        (BASE + '[cells.gsm8k_3]\nagents = "three"\n', "cells.gsm8k_3.agents: expected int in [2, 5], got str 'three'"),
        (BASE + "[cells.a]\nagent = 3\n", "cells.a.agent: unknown setting"),
        (BASE + "[cells.a]\nn = true\n", "cells.a.n: expected int >= 1, got bool True"),
        (BASE + '[cells.a]\nconditions = ["dense", "kvcom"]\n', "cells.a.conditions: entry 1: unknown condition"),
        (  # a bad option of one condition: that entry and its option, not the list's own description
            BASE + '[cells.a]\nconditions = ["dense", "bcr-chunk@0.2:chunk=0"]\n',
            "cells.a.conditions: entry 1: condition 'bcr-chunk@0.2:chunk=0': option chunk: expected int >= 1, got 0",
        ),
        (
            BASE + '[cells.a]\nconditions = "bcr-chunk:chunk=x"\n',
            "cells.a.conditions: entry 0: condition 'bcr-chunk:chunk=x': option chunk: expected int",
        ),
        (BASE.replace('conditions = ["dense"]\n', "") + "[cells.a]\n", "cells.a.conditions: missing"),
        (BASE + "[cells.a]\n[cells.a]\n", "cells.a: declared twice"),
        (BASE + '[cells.a]\nreference = "kvcomm"\n', "cells.a.reference: kvcomm is not among the conditions: dense"),
        (BASE + "[cells.a]\nagents = 9\n", "cells.a.agents: expected int in [2, 5], got 9 (9 is outside in [2, 5])"),
        (BASE + '[cells.a]\npinned = "Nobody"\n', "cells.a.pinned: unknown role 'Nobody'"),
        (BASE + "[cells.a]\nseeds = [1, 2]\n", "cells.a.seeds: runs coin conditions once per seed"),
        (BASE.replace('"synthetic"', '"gsm9k"') + "[cells.a]\n", "defaults.benchmark: expected str (one of"),
        (BASE + '[cells."a/b"]\n', "cells.a/b: a cell name is its folder's name"),
        (BASE, "cells: no cells"),
        (BASE + "[cell.a]\n", "cell: unknown key"),
        (BASE + "[cells.a\n", "not valid TOML"),
    ],
)
def test_a_malformed_grid_file_is_one_line_naming_the_key(tmp_path, capsys, text, message):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    assert cli.main(["grid", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bcr grid: error: {path}: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # checked before any work


def test_ray_missing_says_how_to_install_it(tmp_path, monkeypatch, capsys, tiny_config):
    monkeypatch.setitem(sys.modules, "ray", None)
    assert cli.main(["grid", str(grid_file(tmp_path, tiny_config)), "--out", str(tmp_path / "out"), "--ray"]) == 2
    assert 'pip install -e ".[cluster]"' in capsys.readouterr().err


# ------------------------------------------------------------------ on Ray (a local instance with 2 CPUs)


@pytest.fixture(scope="module")
def ray_address():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
    source = str(Path(bcr_core.__file__).parent.parent)  # workers import the bcr_core under test
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    grid_ray.start_local(
        ray,
        num_cpus=2,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": path}},
        _system_config={"num_workers_soft_limit": 4},
    )  # keep this job's idle workers (and their model) warm
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_ray_grid_gives_the_records_of_the_in_process_grid(in_process, ray_address, tmp_path, tiny_config):
    cells = read_grid(grid_file(tmp_path, tiny_config))
    assert grid.run_grid(cells, tmp_path / "grid", ray=ray_address) == []
    for name in ("two_agents", "coin"):
        for kind in ("items.jsonl", "calls.jsonl"):
            assert records(tmp_path / "grid" / name, kind) == records(in_process / name, kind)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "grid").glob("*/*.jsonl")}
    assert grid.run_grid(cells, tmp_path / "grid", ray=ray_address) == []  # finished cells are not resubmitted
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "grid").glob("*/*.jsonl")} == before
    table = grid_folder.combined_table(cells, tmp_path / "grid")
    expected = pd.read_csv(in_process / "grid.csv")
    assert (
        table[["accuracy", "reuse_rate", "p_exact"]].fillna(-1).values
        == expected[["accuracy", "reuse_rate", "p_exact"]].fillna(-1).values
    ).all()


def test_a_killed_ray_grid_is_finished_by_the_next_run(ray_address, tmp_path, tiny_config):
    """SIGKILL the driver's process group mid-grid; the rerun does only the items that were missing."""
    path = grid_file(tmp_path, tiny_config, n=8, tokens=6)
    out = tmp_path / "grid"
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(bcr_core.__file__).parent.parent)}
    driver = subprocess.Popen(
        [sys.executable, "-m", "bcr_core", "grid", str(path), "--out", str(out), "--ray", ray_address],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cells = read_grid(path)
    deadline = time.monotonic() + 600  # generous: a loaded machine starts Ray workers slowly (240 s ran out beside
    # three other jobs on 2 cores); a driver that died still fails at once
    while sum(count_lines(out / g.name / "items.jsonl") for g in cells) < 3:
        assert driver.poll() is None and time.monotonic() < deadline, "the Ray grid wrote no items"
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30  # the dead driver's tasks are ended by Ray
    while any(
        holder and process_alive(int(holder)) for holder in (grid_folder.lock_holder(out / g.name) for g in cells)
    ):
        assert time.monotonic() < deadline, "the killed grid's tasks kept running"
        time.sleep(0.2)
    written = {g.name: records(out / g.name, "items.jsonl", timing=True) for g in cells}
    assert 0 < sum(map(len, written.values())) < 32  # killed mid-grid

    assert grid.run_grid(cells, out, ray=ray_address) == []
    for g in cells:
        items = records(out / g.name, "items.jsonl", timing=True)
        assert len(items) == 16 and len({(r["condition"], r["item_id"]) for r in items}) == 16
        assert all(r in items for r in written[g.name])  # finished items were not redone (their times too)
        calls = read_jsonl(out / g.name / "calls.jsonl")
        assert len(calls) == 16 * 3 and len({(c["condition"], c["item_id"], c["node"]) for c in calls}) == 48


def test_a_cell_that_fails_fails_alone_with_its_reason_and_the_grid_goes_on(tiny_config, tmp_path, monkeypatch, capsys):
    """Three cells: one whose data cannot be fetched (a usage error: one line), one that hits a bug
    (its traceback in the log), one that runs. The last is finished; the grid exits 1 naming the two."""
    from bcr_core.data import benchmarks
    from bcr_core.engine.assets import AssetError

    real = benchmarks.load_items

    def load_items(benchmark, n, **extra):
        if extra.get("seed") == 5:
            raise AssetError("pinned wheel not in the cache and the index cannot be reached")
        if extra.get("seed") == 6:
            raise RuntimeError("an internal invariant broke")
        return real(benchmark, n, **extra)

    monkeypatch.setattr(benchmarks, "load_items", load_items)
    (tmp_path / "grid.toml").write_text(
        f'[defaults]\nbenchmark = "synthetic"\nmodel = "config:{tiny_config}"\nagents = 2\nn = 1\n'
        'max_new_tokens = 2\nconditions = ["dense"]\n\n'
        "[cells.unfetchable]\nitem_seed = 5\n\n[cells.buggy]\nitem_seed = 6\n\n[cells.fine]\nitem_seed = 7\n"
    )
    assert cli.main(["grid", str(tmp_path / "grid.toml"), "--out", str(tmp_path / "g")]) == 1
    err = capsys.readouterr().err
    assert len(read_jsonl(tmp_path / "g" / "fine" / "items.jsonl")) == 1
    # a progress bar may share the line; the reason is the rest of it, and only that
    unfetchable = [line.partition("bcr grid: ")[2] for line in err.splitlines() if "cell unfetchable failed" in line]
    assert unfetchable == ["cell unfetchable failed: pinned wheel not in the cache and the index cannot be reached"]
    buggy = err[err.index("cell buggy failed") :]
    assert "internal error" in buggy.splitlines()[0] and "an internal invariant broke" in buggy.splitlines()[0]
    assert "Traceback (most recent call last)" in buggy and "in load_items" in buggy
    assert "Traceback" not in err[: err.index("cell buggy failed")]
    assert "cell buggy did not finish" in err and "cell unfetchable did not finish" in err
    assert "cell fine did not finish" not in err


class FakeRay:
    """Ray's `init` and `shutdown`, raising what it is given at every start."""

    def __init__(self, error: Exception):
        self.error, self.starts = error, 0

    def init(self, **options):
        self.starts += 1
        raise self.error

    def shutdown(self):
        pass


@pytest.mark.parametrize(
    "error",
    [
        Exception("The current node timed out during startup."),  # what Ray's node raises
        RuntimeError("Failed to start the GCS server"),
        ConnectionError("Could not find any running Ray instance."),
    ],
)
def test_ray_that_cannot_start_is_one_line_after_a_retry(error):
    ray = FakeRay(error)
    with pytest.raises(grid_ray.GridError, match=r"--ray: could not start a local Ray instance: "):
        grid_ray.start_local(ray)
    assert ray.starts == 2
    with pytest.raises(grid_ray.GridError, match=r"--ray HOST:1: cannot join the Ray cluster: "):
        grid_ray.connect(FakeRay(error), "HOST:1", quiet=True)


@pytest.mark.parametrize("error", [TypeError("init() got an unexpected keyword"), KeyError("num_cpus")])
def test_a_bug_under_ray_start_keeps_its_traceback(error):
    ray = FakeRay(error)
    with pytest.raises(type(error)):
        grid_ray.start_local(ray)
    assert ray.starts == 1  # not retried, not turned into a message
    with pytest.raises(type(error)):
        grid_ray.connect(FakeRay(error), "HOST:1", quiet=True)


@pytest.mark.parametrize(
    "name, folder",
    [
        ("smollm2-135m", "claims"),
        ("gemma-3-270m", "claims-gemma-3-270m-bos"),
        ("qwen2.5-coder-0.5b", "claims-qwen2.5-coder-0.5b"),
    ],
)
def test_a_models_claims_grid_file_is_the_recipe_of_its_committed_folders(name, folder):
    """The README regenerates each model's committed claims folder from its grid file, each confirmation
    `confirm-K` in it from `grids/<model>-confirm-K.toml` (one cell, planned by `bcr plan`) and its HumanEval
    cell `humaneval` from `grids/<model>-humaneval.toml` (one cell): every committed run folder is a cell of
    them, with the very settings its cell.json records, and every cell is committed."""
    import json

    from bcr_core.runs.cell import Cell

    root = Path(bcr_core.__file__).parent.parent
    cells = {g.name: g.cell for g in read_grid(root / "grids" / f"{name}.toml")}
    for plan in [*(root / "grids").glob(f"{name}-confirm-*.toml"), *(root / "grids").glob(f"{name}-humaneval.toml")]:
        (one,) = read_grid(plan)
        cells[plan.stem.removeprefix(f"{name}-")] = one.cell
    committed = {
        path.parent.name: Cell.from_record(json.loads(path.read_text()))
        for path in (root / "results" / folder).glob("*/cell.json")
    }
    assert committed == cells
