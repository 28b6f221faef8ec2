"""The shared notebook figures draw the table they are given: checked on the figures' data."""

import pandas as pd
import pytest

from bcr_core.lab import figures

TABLE = pd.DataFrame(
    {
        "condition": ["dense", "kvcomm", "bcr-chunk"],
        "accuracy": [0.60, 0.45, 0.55],
        "agrees_dense": [1.0, 0.30, 0.70],
        "reuse_rate": [0.0, 0.50, 0.50],
        "wilson_lo": [0.40, 0.25, 0.35],
        "wilson_hi": [0.75, 0.65, 0.70],
    }
)


def test_equation3_draws_the_line_through_dense_and_the_endpoint():
    fig = figures.equation3(TABLE, "kvcomm", "title")
    lines = [t for t in fig.data if t.mode == "lines"]
    points = [t for t in fig.data if t.mode == "markers+text"]
    assert len(lines) == len(points) == 2  # one of each per panel: accuracy, then agreement
    for line, column in zip(lines, ["accuracy", "agrees_dense"]):
        dense, endpoint = 100 * TABLE[column][0], 100 * TABLE[column][1]
        at = dict(zip(line.x, line.y))
        assert at[0.0] == pytest.approx(dense)  # reuse 0: Dense's value
        assert at[1.0] == pytest.approx(dense - (dense - endpoint) / 0.5)  # through kvcomm at reuse 0.5
    for trace, column in zip(points, ["accuracy", "agrees_dense"]):
        assert list(trace.x) == [0.0, 0.5, 0.5] and list(trace.text) == list(TABLE["condition"])
        assert list(trace.y) == pytest.approx(list(100 * TABLE[column]))
    assert lines[0].xaxis == "x" and lines[1].xaxis == "x2"


def test_accuracy_bars_are_the_tables_values_with_wilson_intervals():
    fig = figures.accuracy_bars(TABLE, "title", height=300)
    accuracy, agreement = fig.data
    assert list(accuracy.x) == list(agreement.x) == list(TABLE["condition"])
    assert list(accuracy.y) == pytest.approx([60, 45, 55])
    assert list(agreement.y) == pytest.approx([100, 30, 70])
    assert list(accuracy.error_y.array) == pytest.approx([15, 20, 15])  # up to Wilson's upper end
    assert list(accuracy.error_y.arrayminus) == pytest.approx([20, 20, 20])  # down to its lower end
    assert fig.layout.barmode == "group" and fig.layout.height == 300


def test_gate_points_are_paired_means_and_the_line_runs_through_dense_and_the_endpoint():
    """Four items; kvcomm@1 misses item 3, so every point is over items 0-2 only (paired)."""
    from bcr_core.analysis.claims.synthetic import gate_points

    rows = []
    for condition, correct, reuse in [
        ("dense", [1, 1, 1, 0], [0.0] * 4),
        ("kvcomm", [1, 0, 1, 1], [0.5, 0.5, 0.25, 1.0]),
        ("kvcomm@1", [0, 0, 1], [1.0, 1.0, 0.25]),
    ]:
        rows += [
            {"item_id": str(i), "condition": condition, "correct": bool(c), "reuse_rate": r}
            for i, (c, r) in enumerate(zip(correct, reuse))
        ]
    points = gate_points(pd.DataFrame(rows), ["dense", "kvcomm@0.3", "kvcomm@1", "kvcomm@0.9"])
    assert list(points["condition"]) == ["dense", "kvcomm", "kvcomm@1"]  # kvcomm@0.3 is the recorded kvcomm
    assert list(points["reuse_rate"]) == pytest.approx([0.0, 1.25 / 3, 2.25 / 3])
    assert list(points["accuracy"]) == pytest.approx([100.0, 200 / 3, 100 / 3])
    fig = figures.gate_line(points)
    (line,) = [t for t in fig.data if t.mode == "lines"]
    at = dict(zip(line.x, line.y))
    assert at[0.0] == pytest.approx(100.0)  # Dense at reuse 0
    assert at[1.0] == pytest.approx(100 - (100 - 200 / 3) / (1.25 / 3))  # through kvcomm at its reuse rate
    unreused = points.assign(reuse_rate=[0.0, 0.0, 0.5])
    assert [t.mode for t in figures.gate_line(unreused).data] == ["markers+text"]  # no line through reuse 0


def test_budget_sweep_draws_each_seed_the_mean_over_seeds_with_its_span_and_the_two_levels():
    answers = {  # final answers per item; "d" is Dense's, so agreement counts the "d"s
        "dense": ["d", "d", "d", "d"],
        "kvcomm": ["d", "x", "x", "x"],
        "coin-chunk@0.2:seed=0": ["d", "d", "x", "x"],
        "coin-chunk@0.2:seed=1": ["d", "x", "x", "x"],
        "coin-chunk@0.4:seed=0": ["d", "d", "d", "x"],
        "coin-chunk@0.4:seed=1": ["d", "d", "d", "d"],
    }
    correct = {"dense": 3, "kvcomm": 1, "coin-chunk@0.2:seed=0": 2, "coin-chunk@0.2:seed=1": 0}
    correct |= {"coin-chunk@0.4:seed=0": 2, "coin-chunk@0.4:seed=1": 4}
    items = pd.DataFrame(
        [
            {"item_id": str(i), "condition": c, "final_text": text, "correct": i < correct[c]}
            for c, texts in answers.items()
            for i, text in enumerate(texts)
        ]
    )
    coins = {(rho, s): f"coin-chunk@{rho:g}:seed={s}" for rho in (0.2, 0.4) for s in (0, 1)}
    fig = figures.budget_sweep(items, coins, "title")
    seeds = [t for t in fig.data if t.mode == "markers"]
    means = [t for t in fig.data if t.mode == "lines+markers"]
    assert len(seeds) == len(means) == 2  # accuracy panel, then agreement
    assert sorted((x, round(y, 9)) for x, y in zip(seeds[0].x, seeds[0].y)) == [
        (0.2, 0),
        (0.2, 50),
        (0.4, 50),
        (0.4, 100),
    ]
    assert list(means[0].x) == [0.2, 0.4] and list(means[0].y) == pytest.approx([25, 75])
    assert list(means[0].error_y.array) == pytest.approx([25, 25])  # up to the best seed
    assert list(means[0].error_y.arrayminus) == pytest.approx([25, 25])  # down to the worst
    assert list(means[1].y) == pytest.approx([37.5, 87.5])  # agreement with Dense: (2+1)/8, (3+4)/8
    levels = sorted(shape.y0 for shape in fig.layout.shapes)
    assert levels == pytest.approx([25, 25, 75, 100])  # kvcomm and dense: accuracy 25/75, agreement 25/100


def test_the_latency_figure_draws_each_method_twice_with_its_percentile_bars():
    ttft = pd.DataFrame(
        {
            "label": ["dense", "dense", "bcr-chunk ρ=0.2", "bcr-chunk ρ=0.2"],
            "length": [64, 512, 64, 512],
            "ttft_ms": [10.0, 40.0, 12.0, 20.0],
            "ttft_ms_p10": [9.0, 35.0, 11.0, 18.0],
            "ttft_ms_p90": [12.0, 50.0, 15.0, 21.0],
            "speedup_vs_dense": [1.0, 1.0, 0.8, 2.0],
        }
    )
    fig = figures.latency(ttft)
    assert [t.name for t in fig.data] == ["dense", "dense", "bcr-chunk ρ=0.2", "bcr-chunk ρ=0.2"]
    timed = fig.data[2]
    assert list(timed.y) == [12.0, 20.0] and list(timed.error_y.array) == [3.0, 1.0]
    assert list(timed.error_y.arrayminus) == [1.0, 2.0]
    assert list(fig.data[3].y) == [0.8, 2.0] and fig.data[3].showlegend is False
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
