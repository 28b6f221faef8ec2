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
    items = lab.Comparison(benchmark="synthetic", agents=2, n=4, max_new_tokens=4, item_seed=34).items()
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


def test_the_searched_lane_leaves_no_more_kl_than_any_lane_and_is_kept_at_its_count(served, tiny_chat, tmp_path):
    """Saving with the model searches each call's best set at the saved layout's count: it has that
    many rows and leaves at most the KL of every lane that spends them, each copy repaired and
    measured here by the fidelity KL against Dense's served cache; loaded, the lane and its
    continuation are there at that count and absent at another."""
    from bcr_core.repair.layouts import LayoutConfig
    from bcr_core.reuse.fidelity import teacher_forced_kl

    path = saved.save(served, tmp_path, SETTINGS, tiny_chat)
    for v in served.views:
        count = len(v.select("chunk", 0.3, LayoutConfig(chunk=8)))
        found = v.searched[count]

        def kl(rows, v=v):
            copy = tiny_chat.repair(v.kv, v.ids[:-1], list(rows)) if rows else v.kv
            return teacher_forced_kl(tiny_chat, tuple(v.dense.served), (copy, v.ids[-1]), v.dense.output_tokens)

        assert len(found["rows"]) == count and found["case"] in ("exhaustive", "local", "none")
        assert found["kl"] == pytest.approx(kl(found["rows"]), rel=1e-4, abs=1e-6)
        assert found["unrepaired_kl"] == pytest.approx(kl([]), rel=1e-4, abs=1e-6)
        lanes = {label: rows for label, rows in microscope.picks(v, count, 8).items() if label != "searched"}
        assert len(lanes) == len(v.rankings)
        for label, rows in lanes.items():
            if len(rows) == count:
                assert found["kl"] <= kl(rows) + 1e-6, label
    back = saved.load(path)
    assert [b.searched for b in back.views] == [a.searched for a in served.views]
    view = back.views[-1]
    drawn = lab.explore(view, layout_name="chunk", rho=0.3, chunk=8)
    assert drawn.picks["searched"] == served.views[-1].searched[drawn.count]["rows"]
    assert view.answer_with(None, drawn.picks["searched"], 4) is not None
    assert "searched" not in lab.explore(view, layout_name="chunk", rho=0.7, chunk=8).picks


def test_the_figure_marks_each_seam_where_the_reuse_paths_ids_part_from_denses(served):
    """A red tick over each seam's cached rows: none where the two id lists agree; with one of Dense's ids
    changed at row 7 (a seam injected), exactly one tick, over row 7; a seam past the cached rows is not drawn."""
    import dataclasses

    view = served.view()

    def ticks(record) -> list[tuple[float, float]]:
        changed = dataclasses.replace(view, record=record)
        figure = lab.attention_figure(changed, lab.explore(changed, layout_name="chunk", rho=0.3, chunk=8))
        return [(s.x0, s.x1) for s in figure.layout.shapes if s.name == "seam"]

    same = dataclasses.replace(view.record, dense_ids=list(view.record.merged_ids))
    assert ticks(same) == []
    dense = list(view.record.merged_ids)
    dense[7] = dense[7] + 1
    assert ticks(dataclasses.replace(view.record, dense_ids=dense)) == [(6.5, 7.5)]
    last = list(view.record.merged_ids)
    last[-1] = last[-1] + 1  # the prompt's last id is fed at decode, not cached
    assert ticks(dataclasses.replace(view.record, dense_ids=last)) == []
