"""The repair microscope (the arena's field in the explorer), on a tiny random model's pipeline: its
bands are the quantities they name, computed here from the exact cache by hand; every selector's
lane spends the same rows as the layout, by its own rule; the figure marks exactly those rows; a
saved inspection keeps the field; and the title lies inside the figure, under nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bcr_core import lab
from bcr_core.lab import microscope
from bcr_core.lab import saved_inspection as saved

SETTINGS = dict(
    model="tiny", benchmark="synthetic", item_seed=34, agents=2, n=4, max_new_tokens=4, gamma=1.0, layout="chunk"
) | dict(rho=0.3, chunk=8)


@pytest.fixture(scope="module")
def served(tiny_chat):
    items = lab.Comparison("synthetic", 2, 4, 4, item_seed=34).items()
    return lab.inspect_requests(
        tiny_chat, "synthetic", items, 2, "bcr-chunk@0.3:gamma=1,chunk=8", 4, progress=False, chunk=8
    )


def test_the_bands_are_the_true_error_and_cacheblends_deviation(served, tiny_chat):
    view = served.view()
    drawn = lab.explore(view, layout_name="chunk", rho=0.3, chunk=8)
    exact = tiny_chat.prefill(view.ids[:-1])
    kv = view.kv
    error, deviation = [], []
    for j in range(view.rows):  # written out row by row, layer by layer
        squares = 0.0
        for layer in range(kv.keys.shape[0]):
            squares += float(((kv.keys[layer, :, :, j] - exact.keys[layer, :, :, j]) ** 2).sum())
            squares += float(((kv.values[layer, :, :, j] - exact.values[layer, :, :, j]) ** 2).sum())
        error.append(math.sqrt(squares))
        heads = [
            float(torch.linalg.vector_norm(exact.values[1, 0, h, j] - kv.values[1, 0, h, j]))
            for h in range(kv.values.shape[2])
        ]
        deviation.append(sum(heads) / len(heads))
    assert np.allclose(drawn.error, error, rtol=1e-4, atol=1e-6)
    assert np.allclose(drawn.deviation, deviation, rtol=1e-4, atol=1e-6)
    prefix = view.segments[0]["stop"]
    assert max(error[:prefix]) < 1e-4 < max(error[prefix:])  # the agent's prefix is exact, the rest predicted


def test_every_lane_spends_the_layouts_rows_by_its_own_rule(served):
    view = served.view()
    assert set(view.rankings) == {e.label for e in microscope.field_entries(3, 8)}  # cacheblend:layer=3 dropped
    prefix = view.segments[0]["stop"]
    pieces = [(s["start"], min(s["stop"], view.rows)) for s in view.segments if 0 < s["start"] < view.rows]
    for rho in (0.3, 0.6):
        drawn = lab.explore(view, layout_name="chunk", rho=rho, chunk=8)
        assert drawn.count > 0
        for label, rows in drawn.picks.items():
            assert len(rows) == len(set(rows)) == drawn.count, label
        # rank=predicted ranks only rows KVComm predicted: none on the exact prefix
        assert min(drawn.picks["draft:rank=predicted"]) >= prefix
        # seams: every segment's first row, then every second row, ..., in prompt order at each depth
        by_depth = sorted((j - start, j) for start, stop in pieces for j in range(start, stop))
        assert drawn.picks["seams"] == sorted(j for _, j in by_depth[: drawn.count])
        # kv-error in the chunk unit: no chunk left out has more mean true error than one taken whole
        chunks = [set(range(c, min(c + 8, view.rows))) for c in range(0, view.rows, 8)]
        taken = set(drawn.picks["kv-error"])
        whole = [c for c in chunks if c <= taken]
        untouched = [c for c in chunks if not c & taken]
        mean = [sum(drawn.error[j] for j in c) / len(c) for c in chunks]  # Algorithm 1: a chunk by its mean
        whole, untouched = ([mean[chunks.index(c)] for c in group] for group in (whole, untouched))
        assert whole and min(whole) >= max(untouched, default=0.0) - 1e-6


def test_the_figure_marks_each_lanes_rows_and_its_title_is_two_lines_inside(served):
    view = served.view()
    drawn = lab.explore(view, layout_name="chunk", rho=0.3, chunk=8)
    figure = lab.attention_figure(view, drawn, widget=True)
    assert lab.field_rows(figure) == {k: v for k, v in drawn.picks.items() if v}
    assert list(figure.layout.yaxis5.categoryarray) == list(drawn.picks)[::-1]
    title = figure.layout.title
    assert "<br>" not in title.text and f"{drawn.count} rows" in title.subtitle.text
    assert title.yref == "container" and title.yanchor == "top"


def test_a_saved_inspection_keeps_the_field_and_each_selectors_continuation(served, tiny_chat, tmp_path):
    back = saved.load(saved.save(served, tmp_path, SETTINGS, tiny_chat))
    for a, b in zip(served.views, back.views):
        assert a.rankings.keys() == b.rankings.keys()
        assert all(torch.equal(a.rankings[k], b.rankings[k]) for k in a.rankings)
    explorer = lab.Explorer(None, back, served.condition, 4, "chunk", 0.3, 8)
    shown = explorer.shown
    assert shown.picks == lab.explore(served.views[-1], layout_name="chunk", rho=0.3, chunk=8).picks
    for label, rows in shown.picks.items():  # decoded at the saved setting: shown without a model
        assert f"{label}, {len(rows)} rows" in explorer.answers_w.value
        assert explorer.view.answer_with(None, rows, 4) is not None
    moved = explorer.update(rho=0.7)
    labels = [f"{label}, {len(rows)} rows" for label, rows in moved.picks.items() if rows]
    assert labels and not any(a in explorer.answers_w.value for a in labels)  # unticked: only answers held
    explorer.update(decode=True)  # ticked, with no model to decode: said, not raised
    assert all(a in explorer.answers_w.value for a in labels) and lab.explorer.NOT_DECODED in explorer.answers_w.value
