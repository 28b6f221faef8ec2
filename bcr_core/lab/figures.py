"""The plotly figures more than one notebook draws, each from a condition table (one row per
condition, as `analysis.reports.summary.condition_table` builds it: `condition`, `accuracy`, `agrees_dense`,
`reuse_rate`, `wilson_lo`, `wilson_hi`; accuracies as fractions, drawn in percent).

- `equation3`: accuracy and agreement with Dense against the reuse rate, beside the line of
  Equation 3 from Dense to a reuse endpoint (paper §4.2; notebooks 02 and 08).
- `accuracy_bars`: accuracy with its Wilson 95% interval and agreement with Dense, per condition
  (notebooks 05 and 10).

And the figures a notebook would otherwise draw with plotly in its cells:

- `gate_line`: Equation 3's points from `claims.gate_points`, with the line through the first two
  (Dense and the reuse endpoint) when the endpoint reused anything (notebook 10).
- `budget_sweep`: accuracy and agreement with Dense against the repair budget, one point per coin
  seed, the mean over seeds with its min-max span, and Dense and KVComm as levels (notebook 06).
- `latency`: TTFT against the shared segment's length per method, with its 10th-90th percentile bars,
  and the speedup against Dense (notebook 07, Table 10).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bcr_core.analysis.claims.line import reuse_accuracy_line
from bcr_core.analysis.claims.protocol import with_agreement

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


def gate_line(points: pd.DataFrame, title: str = "Equation 3: accuracy against reuse rate") -> go.Figure:
    """`points` (condition, reuse_rate, accuracy in percent; Dense, then the reuse endpoint, then the
    rest) as labelled markers, and Equation 3's line from reuse 0 to 1 through the first two."""
    fig = px.scatter(points, x="reuse_rate", y="accuracy", text="condition", title=title)
    dense, endpoint = points.iloc[0], points.iloc[1]
    if endpoint["reuse_rate"] > 0:
        line = reuse_accuracy_line(dense["accuracy"], endpoint["accuracy"], endpoint["reuse_rate"])
        ends = np.array([0.0, 1.0])
        fig.add_trace(go.Scatter(x=ends, y=line(ends), mode="lines", name="Equation 3", line=dict(dash="dot")))
    fig.update_traces(textposition="top center")
    fig.update_layout(xaxis_title="reuse rate", yaxis_title="accuracy (%)", height=420)
    return fig


def budget_sweep(items: pd.DataFrame, coins: dict, title: str) -> go.Figure:
    """Two panels (accuracy, agreement with Dense) against the budget rho: each coin run as a point
    (`coins` maps (rho, seed) to its condition), the mean over seeds with bars spanning min to max,
    and the levels of `dense` and `kvcomm` as lines."""
    per_run = with_agreement(items).groupby("condition", as_index=False)[["correct", "agrees_dense"]].mean()
    per_run["rho"] = per_run["condition"].map({v: k[0] for k, v in coins.items()})
    per_run["seed"] = per_run["condition"].map({v: k[1] for k, v in coins.items()})
    coin = per_run.dropna(subset=["rho"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accuracy", "agreement with Dense"))
    for col, value in enumerate(["correct", "agrees_dense"], start=1):
        fig.add_scatter(
            x=coin["rho"],
            y=100 * coin[value],
            mode="markers",
            marker=dict(size=8, opacity=0.6),
            text="seed " + coin["seed"].astype("Int64").astype(str),
            name="one seed",
            showlegend=col == 1,
            row=1,
            col=col,
        )
        means = coin.groupby("rho", as_index=False)[value].agg(["mean", "min", "max"])
        span = dict(
            type="data",
            symmetric=False,
            array=100 * (means["max"] - means["mean"]),
            arrayminus=100 * (means["mean"] - means["min"]),
        )
        fig.add_scatter(
            x=means["rho"],
            y=100 * means["mean"],
            mode="lines+markers",
            name="mean over seeds",
            error_y=span,
            showlegend=col == 1,
            row=1,
            col=col,
        )
        for name, dash in [("dense", "dash"), ("kvcomm", "dot")]:
            level = 100 * per_run.set_index("condition").loc[name, value]
            fig.add_hline(y=level, line_dash=dash, annotation_text=name, row=1, col=col)
        fig.update_xaxes(title_text="repair budget ρ (fraction of cached rows)", row=1, col=col)
    fig.update_yaxes(title_text=PANELS["accuracy"], row=1, col=1)
    fig.update_yaxes(title_text=PANELS["agrees_dense"], row=1, col=2)
    fig.update_layout(title=title, height=460)
    return fig


def latency(ttft: pd.DataFrame, title: str = "Latency against segment length (Table 10)") -> go.Figure:
    """`probes.latency.ttft_table`'s table (one row per method and length: `length`, `ttft_ms` and its
    p10/p90, `speedup_vs_dense`) with a `label` per method, as two panels on a log length axis."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time to first token", "speedup against Dense"))
    for name, group in ttft.groupby("label", sort=False):
        bars = dict(
            type="data",
            symmetric=False,
            array=group["ttft_ms_p90"] - group["ttft_ms"],
            arrayminus=group["ttft_ms"] - group["ttft_ms_p10"],
        )
        line = dict(x=group["length"], mode="lines+markers", name=name, legendgroup=name)
        fig.add_scatter(y=group["ttft_ms"], error_y=bars, row=1, col=1, **line)
        fig.add_scatter(y=group["speedup_vs_dense"], showlegend=False, row=1, col=2, **line)
    fig.update_xaxes(title_text="shared segment length (tokens, log scale)", type="log")
    fig.update_yaxes(title_text="TTFT (ms, median; bars 10th-90th percentile)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="speedup vs Dense (×, mean of paired ratios)", row=1, col=2)
    fig.update_layout(title=title, height=480)
    return fig
