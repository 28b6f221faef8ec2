"""The notebooks: parameter checking, the headless executor, the inspection helpers, and every
notebook run end to end in smoke mode (`bcr notebooks --smoke`, marked `notebooks`)."""

from __future__ import annotations

import json
import re

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch

from bcr_core import lab
from bcr_core.cli import main
from bcr_core.errors import UsageError
from bcr_core.lab import inspection, params
from bcr_core.lab.notebooks import (
    NotebookError,
    export_html,
    notebook_paths,
    remote_scripts,
    run_notebooks,
)
from bcr_core.lab.params import ParameterError
from bcr_core.repair.layouts import LayoutConfig, layout
from bcr_core.runs.cell import Cell
from bcr_core.runs.runner import run_cell

EXPECTED = [
    "00_quickstart",
    "01_warmup",
    "02_gate_sweep",
    "03_unit_of_choice",
    "04_tokenization_control",
    "05_layouts",
    "06_budget_sweep",
    "07_latency",
    "08_allocation",
    "09_attention_explorer",
    "10_claims",
    "11_arena",
]


# -- parameters ---------------------------------------------------------------------------------
def test_check_accepts_and_normalises():
    p = params.check(n=3, rho=1, gammas=(0.3, 1), smoke=False, pinned=None, layout="grow", conditions=["kvcomm@0.5"])
    assert p.n == 3 and p["rho"] == 1.0 and isinstance(p.rho, float)
    assert p.gammas == [0.3, 1.0] and p.pinned is None and p.layout == "grow"


@pytest.mark.parametrize(
    "name, value, expected, given",
    [
        ("n", "3", "expected int", "got str '3'"),
        ("n", True, "expected int", "got bool True"),
        ("n", 2.0, "expected int", "got float 2.0"),
        ("rho", "0.2", "expected float", "got str '0.2'"),
        ("smoke", 1, "expected bool", "got int 1"),
        ("gammas", [0.3, "1"], "expected list of float", "got list"),
        ("seeds", 0, "expected list of int", "got int 0"),
        ("benchmark", 5, "expected str", "got int 5"),
    ],
)
def test_wrong_type_names_parameter_expected_and_given(name, value, expected, given):
    with pytest.raises(ParameterError) as err:
        params.check(**{name: value})
    message = str(err.value)
    assert f"parameter {name!r}" in message and expected in message and given in message


@pytest.mark.parametrize(
    "name, value, why",
    [
        ("n", 0, "outside >= 1"),
        ("agents", 6, "outside in [2, 5]"),
        ("rho", 1.5, "outside in [0, 1]"),
        ("budget", 0.0, "outside in (0, 1]"),
        ("benchmark", "gsm9k", "not one of"),
        ("layout", "blocks", "not one of"),
        ("conditions", ["kvcomm", "densest"], "unknown condition 'densest'"),
        ("units", [], "fewer than 1"),
        ("model", " ", "empty"),
    ],
)
def test_out_of_range_values_are_refused(name, value, why):
    with pytest.raises(ParameterError, match=f"parameter {name!r}") as err:
        params.check(**{name: value})
    assert why in str(err.value)


def test_unknown_parameter_is_refused():
    with pytest.raises(ParameterError, match="unknown parameter 'n_items'"):
        params.check(n_items=3)


def test_smoke_applies_only_to_declared_names_and_overrides():
    p = params.check(benchmark="gsm8k", n=60, smoke=True, rhos=[0.1, 0.2])
    small = p.smoke(rhos=[0.4])
    assert small.benchmark == "synthetic" and small.n == params.SMOKE["n"] and small.rhos == [0.4]
    assert "agents" not in small  # not declared by this notebook, so not added
    assert params.check(n=60, smoke=False).smoke(n=2).n == 60
    with pytest.raises(ParameterError, match="parameter 'n'"):
        p.replace(n="few")
    assert "smoke setting" in small._repr_html_()


# -- notebooks on disk ----------------------------------------------------------------------------
def test_every_notebook_is_stored_clean_with_parameters_then_check():
    paths = notebook_paths()
    assert [p.stem for p in paths] == EXPECTED
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name} has outputs"
        assert code[0].metadata.get("tags") == ["parameters"], path.name
        assert "params.from_cell(globals())" in code[1].source, (
            f"{path.name}: the cell after parameters must check them"
        )
        declared = [line.split("=")[0].strip() for line in code[0].source.splitlines() if "=" in line]
        assert set(declared) <= set(params.SCHEMA), f"{path.name} declares a parameter from_cell would not check"
        assert "smoke" in declared and "assert" in code[-1].source, path.name
        assert nb.metadata["kernelspec"]["name"] == "bcr-lab"


def test_each_parameter_cell_checks_exactly_what_its_notebook_declares():
    """The parameters cell, then the check cell, run as a kernel would: P holds every declared
    name with its declared value (smoke off), and nothing else the namespace holds."""
    for path in notebook_paths():
        code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        namespace = {"__name__": "__main__", "In": [], "Out": {}, "_": None}
        exec(code[0].source, namespace)
        declared = {k: v for k, v in namespace.items() if k not in ("__name__", "In", "Out", "_", "__builtins__")}
        exec(code[1].source, namespace)
        assert namespace["P"].as_dict() == declared, path.name
        later = next(name for name in params.SCHEMA if name not in declared)
        namespace[later] = {"a later cell's": "variable"}  # run again after later cells: the same parameters
        exec(code[1].source, namespace)
        assert namespace["P"].as_dict() == declared, path.name


def test_unknown_notebook_or_parameter_is_a_clear_error(tmp_path, capsys):
    assert main(["notebooks", "--only", "42_nothing", "--out", str(tmp_path)]) == 2
    assert "no notebook matches ['42_nothing']" in capsys.readouterr().err
    with pytest.raises(NotebookError, match="no notebook declares parameter"):
        run_notebooks(tmp_path, only=["03"], parameters={"n_itmes": 3})


def write_notebook(path, cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "bcr-lab", "display_name": "BCR lab (Python)", "language": "python"}
    nbformat.write(nb, path)


def test_executor_names_the_failing_notebook_and_cell(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    write_notebook(
        folder / "00_fine.ipynb",
        [
            nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell("assert x == 2"),
        ],
    )
    write_notebook(
        folder / "01_boom.ipynb",
        [
            nbformat.v4.new_markdown_cell("# a notebook that fails"),
            nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell("y = x + 1"),
            nbformat.v4.new_code_cell("raise ValueError(f'boom at {y}')"),
            nbformat.v4.new_code_cell("print('never')"),
        ],
    )
    results = run_notebooks(tmp_path / "out", folder=folder, parameters={"x": 2})
    fine, boom = results
    assert fine.ok, fine.error  # the parameter was injected: x == 2
    assert boom.error.startswith("01_boom.ipynb failed at cell 4 of 5, line 1 (`raise ValueError(f'boom at {y}')`)")
    assert "ValueError: boom at 3" in boom.error
    for r in results:  # executed copies and HTML are written either way
        assert (tmp_path / "out" / f"{r.notebook}.ipynb").exists()
        assert (tmp_path / "out" / f"{r.notebook}.html").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["notebook"] for s in summary] == ["00_fine", "01_boom"]


def test_wrong_parameter_type_stops_the_notebook_with_one_clear_line(tmp_path, capsys):
    code = main(["notebooks", "--only", "03", "--out", str(tmp_path), "-p", 'segment_tokens="2048"'])
    err = capsys.readouterr().err
    assert code == 1
    assert "03_unit_of_choice.ipynb failed at cell 3 of" in err
    assert "ParameterError: parameter 'segment_tokens': expected int >= 8, got str '2048'" in err
    message = err[err.index("03_unit_of_choice.ipynb failed") :]
    assert "Traceback" not in message and "unit_curve.py" not in message


# -- inspection helpers on a tiny model -----------------------------------------------------------
COMPARISON = lab.Comparison(benchmark="synthetic", agents=2, n=4, max_new_tokens=4, item_seed=34)


def test_collect_reads_an_existing_run_under_another_label(tiny_chat, tmp_path):
    cell = Cell(
        benchmark="synthetic",
        agents=2,
        conditions=("dense", "kvcomm@0.3", "bcr-single:gamma=1"),
        n=4,
        max_new_tokens=4,
        item_seed=34,
    )
    run_cell(tiny_chat, cell, tmp_path / "by-bcr-run", progress=False)
    runs = lab.collect(
        COMPARISON, ["dense", "kvcomm", "bcr-single@0.2:gamma=1"], tmp_path, backbone=None, progress=False
    )
    assert set(runs.sources.values()) == {tmp_path / "by-bcr-run"}  # nothing recomputed (there is no model)
    assert list(runs.items["condition"].unique()) == ["dense", "kvcomm", "bcr-single@0.2:gamma=1"]
    with pytest.raises(UsageError, match="no model to compute it with"):
        lab.collect(COMPARISON, ["bcr-grow"], tmp_path, backbone=None, progress=False)


def test_tables_and_budget_check_on_a_tiny_run(tiny_chat, tmp_path):
    conditions = [
        "dense",
        "kvcomm@1",
        "bcr-single@0.3:gamma=1",
        "bcr-chunk@0.5:gamma=1,chunk=8",
        "coin-chunk@0.5:gamma=1,chunk=8",
    ]
    runs = lab.collect(COMPARISON, conditions, tmp_path, backbone=tiny_chat, progress=False)
    budget = lab.budget_check(runs.calls)
    assert budget["within"].all() and (budget[budget["mode"] == "reuse"]["rows"] > 0).any()
    table = lab.condition_table(runs.items, reference="kvcomm@1")
    assert list(table.columns).index("only_reference_right") < list(table.columns).index("p_exact")
    final = runs.items.set_index(["condition", "item_id"])["final_text"]
    for condition, agreement in table.set_index("condition")["agrees_dense"].items():
        # the share of items whose final text is Dense's, counted here item by item
        ids = runs.items.loc[runs.items["condition"] == condition, "item_id"]
        assert agreement == pytest.approx(sum(final[condition, i] == final["dense", i] for i in ids) / len(ids))
    counts = lab.gate_counts(runs.calls).set_index("condition")
    assert (counts["reused"] + counts["dense"] == counts["calls"]).all()
    assert lab.entropy_rejections(runs.calls)["kvcomm@1"] == 0
    line = lab.line_table(table, "dense", "kvcomm@1").set_index("condition")
    by = table.set_index("condition")
    d, k = 100 * by.loc["dense", "accuracy"], 100 * by.loc["kvcomm@1", "accuracy"]
    r_k = by.loc["kvcomm@1", "reuse_rate"]
    off_the_ends = [c for c in by.index if c not in ("dense", "kvcomm@1")]
    assert len(off_the_ends) == 3
    for condition in off_the_ends:  # Equation 3 off its endpoints: acc(r) = d - (d - k) / r_K * r
        r, accuracy = by.loc[condition, "reuse_rate"], 100 * by.loc[condition, "accuracy"]
        assert line.loc[condition, "residual_points"] == pytest.approx(accuracy - (d - (d - k) / r_k * r)), condition
    # a tampered record is caught
    tampered = runs.calls.copy()
    tampered.loc[tampered["mode"] == "reuse", "rows_recomputed"] += 1000
    assert not lab.budget_check(tampered)["within"].all()


def test_explore_selects_what_the_layout_prescribes(tiny_chat):
    items = COMPARISON.items()
    inspection = lab.inspect_requests(
        tiny_chat, "synthetic", items, 2, "bcr-single@0.2:gamma=1,skip=off", 4, progress=False
    )
    view = inspection.view()
    assert view.repaired_rows  # the captured draft reproduces the server's choice
    assert view.select("single", 0.2, LayoutConfig(skip="off")) == view.repaired_rows
    for rho in (0.1, 0.35):
        ex = lab.explore(view, layout_name="single", rho=rho, skip="off")
        assert ex.count == round(rho * view.rows) and ex.expected == (ex.count, ex.count)
    chunk = lab.explore(view, layout_name="chunk", rho=0.5, chunk=8)
    assert chunk.expected[0] <= chunk.count <= chunk.expected[1]
    assert chunk.segments["rows"].sum() == view.rows and chunk.segments["selected_rows"].sum() == chunk.count
    head = lab.explore(view, layer=1, head=0)
    assert torch.allclose(torch.from_numpy(head.score), view.attention[1, :, 0].mean(0))
    figure = lab.attention_figure(view, chunk)
    assert lab.highlighted_rows(figure) == chunk.selected
    lab.update_figure(figure, view, lab.explore(view, layout_name="single", rho=0.1, skip="off"))
    assert len(lab.highlighted_rows(figure)) == round(0.1 * view.rows)
    assert layout("chunk", LayoutConfig(chunk=64)).bounds(100, 0.2) == (0, 0)  # under two chunks: no repair


def test_reports_open_offline(tmp_path):
    import plotly.graph_objects as go
    from nbconvert import HTMLExporter
    from plotly.io._renderers import renderers

    figure = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    bundle = renderers["notebook"].to_mimebundle(figure.to_dict())
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("Costs $500 and $20"),
            nbformat.v4.new_code_cell("fig", outputs=[nbformat.v4.new_output("display_data", data=bundle)]),
        ]
    )
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2, "version_minor": 0}
    }
    executed = tmp_path / "n.ipynb"
    nbformat.write(nb, executed)
    assert remote_scripts(HTMLExporter().from_notebook_node(nb)[0])  # what nbconvert alone would load
    page = export_html(executed, tmp_path / "n.html").read_text()
    assert remote_scripts(page) == [] and "unpkg.com" not in page and "Plotly.newPlot" in page


def test_a_progress_bar_saved_mid_run_is_left_out_of_the_report(tmp_path):
    """A tqdm bar in a notebook is a widget; its state is left out of the report, and without it the
    bar's output would read as the text it was made with: '0%'."""
    bar = {"application/vnd.jupyter.widget-view+json": {"model_id": "a1", "version_major": 2, "version_minor": 0}}
    bar["text/plain"] = "synthetic x3:   0%|          | 0/12 [00:00<?, ?it/s]"
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "run()",
                outputs=[
                    nbformat.v4.new_output("display_data", data=bar),
                    nbformat.v4.new_output("stream", name="stdout", text="accuracy 0.75\n"),
                ],
            )
        ]
    )
    executed = tmp_path / "n.ipynb"
    nbformat.write(nb, executed)
    page = export_html(executed, tmp_path / "n.html").read_text()
    assert "0/12" not in page and "accuracy 0.75" in page
    assert len(nbformat.read(executed, as_version=4).cells[0].outputs) == 2  # the executed copy keeps it


def test_explorer_figure_holds_plain_lists_and_keeps_its_highlight_colour(tiny_chat):
    items = COMPARISON.items()
    view = lab.inspect_requests(
        tiny_chat, "synthetic", items, 2, "bcr-single@0.2:gamma=1,skip=off", 4, progress=False
    ).view()
    figure = lab.attention_figure(view, lab.explore(view, layout_name="single", rho=0.2, skip="off"), widget=True)
    for rho in (0.1, 0.3):
        lab.update_figure(figure, view, lab.explore(view, layout_name="single", rho=rho, skip="off"))
        heat, bars, marks, error, deviation, field = figure.data
        assert marks.marker.color == lab.SELECTED and len(marks.x) == round(rho * view.rows)
        shown = (heat.z, heat.x, bars.y, bars.customdata, marks.x, error.z, deviation.z, field.x, field.y)
        assert not any(isinstance(v, np.ndarray) for v in shown)
    assert figure.layout.autosize and figure.layout.width is None


def test_readable_tables_and_a_too_small_n_are_caught_up_front():
    table = lab.readable(pd.DataFrame({"answer": ["one\n\ntwo", None], "n": [1, 2]}))
    assert table["answer"].tolist()[0] == "one ⏎  ⏎ two" and table["n"].tolist() == [1, 2]
    with pytest.raises(params.ParameterError, match="parameter 'n': got 2, but .*raise n to at least 3"):
        params.check(n=2).at_least("n", 3, "the pool needs two items")
    for name in ("00_quickstart", "09_attention_explorer"):
        check = [c for c in nbformat.read(notebook_paths([name])[0], as_version=4).cells if c.cell_type == "code"][1]
        minimum = re.search(r'at_least\(\s*"n",\s*(\d+|MIN_REQUESTS)\b', check.source)  # however formatted
        assert minimum, name
        said = inspection.MIN_REQUESTS if minimum.group(1) == "MIN_REQUESTS" else int(minimum.group(1))
        assert said == inspection.MIN_REQUESTS, name  # 00 writes the number, 09 and `bcr explore` name it


def test_the_fewest_requests_an_inspection_takes_are_the_fewest_that_give_it_a_call_to_show(tiny_chat):
    """`inspection.MIN_REQUESTS` is where KVComm's anchor pool first lets a request be served from an
    assembled cache (at gamma 1, reuse whenever two anchors exist): one request fewer leaves an inspection
    with no call to show, that many give its last request one."""
    items = COMPARISON.items()
    for n in (inspection.MIN_REQUESTS - 1, inspection.MIN_REQUESTS):
        shown = lab.inspect_requests(
            tiny_chat, "synthetic", items[:n], 2, "bcr-chunk@0.2:gamma=1,chunk=16", 4, progress=False, rank=False
        )
        assert {v.index for v in shown.views} == ({n - 1} if n == inspection.MIN_REQUESTS else set()), n


# -- every notebook, headless -----------------------------------------------------------------------
@pytest.mark.notebooks
@pytest.mark.real_model
def test_every_notebook_runs_headless_in_smoke_mode(tmp_path):
    out = tmp_path / "reports"
    assert main(["notebooks", "--smoke", "--out", str(out)]) == 0
    summary = {s["notebook"]: s for s in json.loads((out / "summary.json").read_text())}
    assert list(summary) == EXPECTED
    for name in EXPECTED:
        executed, page = out / f"{name}.ipynb", out / f"{name}.html"
        assert executed.exists() and page.exists() and summary[name]["error"] is None
        nb = nbformat.read(executed, as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"]
        assert "checks passed" in "".join(o.get("text", "") for o in nb.cells[-1].outputs)
        assert "Plotly.newPlot" in page.read_text(), f"{name}.html has no figure"
        assert remote_scripts(page.read_text()) == [], f"{name}.html loads scripts from the network"
    explorer = "".join(
        o.get("text", "") for o in nbformat.read(out / "09_attention_explorer.ipynb", as_version=4).cells[-1].outputs
    )
    assert "explorer left at the parameters" in explorer
