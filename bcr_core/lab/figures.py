"""The plotly figures more than one notebook draws, each from a condition table (one row per
condition, as `tables.condition_table` builds it: `condition`, `accuracy`, `agrees_dense`,
`reuse_rate`, `wilson_lo`, `wilson_hi`; accuracies as fractions, drawn in percent).

- `equation3`: accuracy and agreement with Dense against the reuse rate, beside the line of
  Equation 3 from Dense to a reuse endpoint (paper §4.2; notebooks 02 and 08).
- `accuracy_bars`: accuracy with its Wilson 95% interval and agreement with Dense, per condition
  (notebooks 05 and 10).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bcr_core.experiments.stats import reuse_accuracy_line

PANELS = {"accuracy": "accuracy (%)", "agrees_dense": "items identical to Dense (%)"}
REUSE_AXIS = "reuse rate (fraction of calls served from cache)"


def equation3(table: pd.DataFrame, endpoint: str, title: str, line_name: str = "Equation 3") -> go.Figure:
    """Two panels (accuracy, agreement with Dense), each with the conditions as labelled points and
    Equation 3's line through Dense at reuse 0 and `endpoint` at its realised reuse rate."""
    by = table.set_index("condition")
    rate = by.loc[endpoint, "reuse_rate"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accuracy", "agreement with Dense"))
    for col, (value, axis) in enumerate(PANELS.items(), start=1):
        line = reuse_accuracy_line(100 * by.loc["dense", value], 100 * by.loc[endpoint, value], rate)
        ends = np.array([0.0, 1.0])
        dash = dict(dash="dash", color="grey")
        fig.add_scatter(
            x=ends, y=line(ends), mode="lines", line=dash, name=line_name, showlegend=col == 1, row=1, col=col
        )
        fig.add_scatter(
            x=table["reuse_rate"],
            y=100 * table[value],
            mode="markers+text",
            text=table["condition"],
            textposition="top center",
            marker=dict(size=10),
            showlegend=False,
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text=REUSE_AXIS, range=[-0.05, 1.05], row=1, col=col)
        fig.update_yaxes(title_text=axis, row=1, col=col)
    fig.update_layout(title=title, height=480)
    return fig


def accuracy_bars(table: pd.DataFrame, title: str, **layout) -> go.Figure:
    """Grouped bars per condition: accuracy with asymmetric Wilson 95% error bars, and the share of
    items whose final answer is identical to Dense's. `layout` goes to `update_layout`."""
    fig = go.Figure()
    accuracy = 100 * table["accuracy"]
    wilson = dict(
        type="data",
        symmetric=False,
        array=100 * table["wilson_hi"] - accuracy,
        arrayminus=accuracy - 100 * table["wilson_lo"],
    )
    fig.add_bar(x=table["condition"], y=accuracy, name="accuracy", error_y=wilson)
    fig.add_bar(x=table["condition"], y=100 * table["agrees_dense"], name="identical to Dense")
    fig.update_layout(barmode="group", title=title, xaxis_title="condition", yaxis_title="items (%)")
    fig.update_layout(yaxis_range=[0, 105], **layout)
    return fig
