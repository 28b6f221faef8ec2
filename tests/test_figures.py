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
