"""The explorer's figure: `attention_figure` draws an `Exploration` (`bcr_core.lab.explorer`) and
`update_figure` redraws it in place, in a plotly Figure or a live FigureWidget.

Five panels share the cache-row axis: the draft's attention per layer (log10, the selected rows
marked in red above it), the microscope's two bands (the true per-row error and CacheBlend's
layer-1 deviation, each coloured on its own scale), the score the layout ranks (selected rows
red), and one lane per selector of the microscope's field with the rows it picks at the same
count. Segment boundaries are dotted lines, shared segments shaded, and a red tick above the heatmap marks
each seam where the reuse path's ids part from Dense's (the tokenization tax).

Traces, in order (checks read them by index): 0 heatmap, 1 score bars, 2 selected-row marks,
3 error band, 4 deviation band, 5 the field's picks.
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np

SELECTED, OTHER, SHARED_FILL = "crimson", "steelblue", "rgba(255, 200, 0, 0.12)"
SEAM = "rgba(220, 0, 0, 0.8)"  # a seam of the tokenization tax: the reuse path's ids part from Dense's there
ERROR_NAME, DEVIATION_NAME = "true error (kv-error)", "CacheBlend deviation (layer 1)"
PANELS = [0.40, 0.045, 0.045, 0.2, 0.31]  # heatmap, error band, deviation band, score, field lanes
HEIGHT = 960


def attention_figure(view, exploration, widget: bool = False):
    """The explorer's figure for one call and setting; `widget=True` returns a plotly FigureWidget."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    base = make_subplots(rows=5, cols=1, shared_xaxes=True, row_heights=PANELS, vertical_spacing=0.025)
    base.add_trace(
        go.Heatmap(
            colorscale="Viridis",
            colorbar=dict(title="log10 attention", len=0.38, y=0.8),
            hovertemplate="row %{x}: %{customdata}<br>layer %{y}<br>log10 weight %{z:.2f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    base.add_trace(
        go.Bar(name="row score", hovertemplate="row %{x}: %{customdata}<br>score %{y:.3g}<extra></extra>"), row=4, col=1
    )
    base.add_trace(
        go.Scatter(name="selected rows", mode="markers", hoverinfo="skip", marker=marker("triangle-down")),
        row=1,
        col=1,
    )
    for row, (name, scale) in enumerate([(ERROR_NAME, "Reds"), (DEVIATION_NAME, "Purples")], start=2):
        base.add_trace(
            go.Heatmap(
                name=name,
                colorscale=scale,
                showscale=False,
                hovertemplate=f"row %{{x}}: %{{customdata}}<br>{name} %{{z:.3g}}<extra></extra>",
            ),
            row=row,
            col=1,
        )
    base.add_trace(
        go.Scatter(
            name="each selector's rows",
            mode="markers",
            marker=dict(symbol="square", size=6, color="black"),
            hovertemplate="%{y}<br>row %{x}: %{customdata}<extra></extra>",
        ),
        row=5,
        col=1,
    )
    base.update_layout(height=HEIGHT, autosize=True, showlegend=False, bargap=0, margin=dict(t=170))
    base.update_xaxes(title_text="cache row (token position in the prompt)", row=5, col=1)
    base.update_yaxes(title_text="layer", row=1, col=1)
    base.update_yaxes(showticklabels=True, tickfont=dict(size=10), row=2, col=1)
    base.update_yaxes(showticklabels=True, tickfont=dict(size=10), row=3, col=1)
    base.update_yaxes(title_text="score", type="log", dtick=1, exponentformat="power", row=4, col=1)
    base.update_yaxes(type="category", tickfont=dict(size=10), row=5, col=1)
    figure = go.FigureWidget(base) if widget else base
    update_figure(figure, view, exploration)
    return figure


def marker(symbol: str) -> dict:
    return dict(symbol=symbol, color=SELECTED, size=7)


def boundary_shapes(exploration) -> tuple[list[dict], list[dict]]:
    """Dotted lines at the segment boundaries, shaded shared segments, and the segments' names."""
    shapes, notes = [], []
    for span in exploration.boundaries:
        edge = span["start"] - 0.5
        if span["start"] > 0:
            line = dict(color="black", width=1, dash="dot")
            shapes.append(dict(type="line", xref="x", yref="paper", x0=edge, x1=edge, y0=0, y1=1, line=line))
        if span["placeholder"]:
            shade = dict(fillcolor=SHARED_FILL, line=dict(width=0), layer="below")
            shapes.append(dict(type="rect", xref="x", yref="paper", x0=edge, x1=span["stop"] - 0.5, y0=0, y1=1) | shade)
        notes.append(
            dict(
                x=(span["start"] + span["stop"] - 1) / 2,
                y=1.0,
                xref="x",
                yref="paper",
                text=span["name"],
                showarrow=False,
                textangle=-35,
                yanchor="bottom",
                font=dict(size=10),
            )
        )
    return shapes, notes


def seam_shapes(exploration) -> list[dict]:
    """A red tick over the rows of each seam (where the reuse path's ids part from Dense's), above the heatmap."""
    tick = dict(fillcolor=SEAM, line=dict(width=0), layer="above", name="seam")
    return [
        dict(type="rect", xref="x", yref="paper", x0=start - 0.5, x1=stop - 0.5, y0=0.97, y1=1.0) | tick
        for start, stop in exploration.seams
    ]


def band(values, rows: int) -> list[list]:
    """One band's z: a single row of values (None where the field has no score for the row)."""
    if values is None:
        return [[None] * rows]
    return [[None if np.isnan(v) else float(v) for v in values]]


def title(view, exploration) -> dict:
    """Two lines as a plotly title and subtitle, anchored from the top of the figure: plotly places
    a `<br>`-split title's first line at the anchor and grows it upwards, out of the figure."""
    field = f"; each selector below spends the same {exploration.count} rows" if exploration.picks else ""
    return dict(
        text=f"{view.key}: {view.rows} cached rows, {exploration.count} selected",
        subtitle=dict(text=f"ranked by {exploration.score_name}{field}"),
        x=0.0,
        xanchor="left",
        yref="container",
        y=0.985,
        yanchor="top",
    )


def update_figure(figure, view, exploration) -> None:
    """Redraw an `attention_figure` (a Figure or a FigureWidget) for another call or setting."""
    rows = np.arange(view.rows)
    tokens = np.array(view.tokens, dtype=object)
    picked = np.zeros(view.rows, dtype=bool)
    picked[exploration.selected] = True
    layers = exploration.heat.shape[0]
    shapes, notes = boundary_shapes(exploration)
    shapes += seam_shapes(exploration)
    lanes = list(exploration.picks)
    field_x = [r for label in lanes for r in exploration.picks[label]]
    field_y = [label for label in lanes for _ in exploration.picks[label]]
    # Plain lists, not numpy arrays: a FigureWidget compares what the browser sends back with
    # `not value`, which numpy arrays refuse ("truth value of an array is ambiguous").
    with figure.batch_update() if hasattr(figure, "batch_update") else contextlib.nullcontext():
        heat, bars, marks, error, deviation, field = figure.data
        heat.update(
            z=exploration.heat.tolist(),
            x=rows.tolist(),
            y=list(range(layers)),
            customdata=np.tile(tokens, (layers, 1)).tolist(),
        )
        bars.update(
            x=rows.tolist(),
            y=np.asarray(exploration.score).tolist(),
            customdata=tokens.tolist(),
            marker=dict(color=np.where(picked, SELECTED, OTHER).tolist()),
        )
        marks.update(
            x=[int(r) for r in exploration.selected],
            y=[layers - 0.5] * exploration.count,
            marker=marker("triangle-down"),
        )
        bands = ((error, exploration.error, ERROR_NAME), (deviation, exploration.deviation, DEVIATION_NAME))
        for trace, values, name in bands:
            trace.update(z=band(values, view.rows), x=rows.tolist(), y=[name], customdata=[tokens.tolist()])
        field.update(x=field_x, y=field_y, customdata=[str(tokens[r]) for r in field_x])
        figure.layout.yaxis5.update(categoryorder="array", categoryarray=lanes[::-1])  # the field in its order
        figure.layout.shapes = shapes
        figure.layout.annotations = notes
        figure.layout.title = title(view, exploration)
    if hasattr(figure, "_widget_data"):
        # A FigureWidget sends each change to the views that exist; a view created later (Voila draws
        # the widgets once the notebook has run; a reloaded page) starts from this synced state, which
        # plotly refreshes only when the figure itself is displayed, not inside a VBox: keep it current.
        figure._widget_data = copy.deepcopy(figure._data)
        figure._widget_layout = copy.deepcopy(figure._layout_obj._props)


def highlighted_rows(figure) -> list[int]:
    """The rows an `attention_figure` currently marks as selected (for checks)."""
    return [int(x) for x in (figure.data[2].x or [])]


def field_rows(figure) -> dict[str, list[int]]:
    """The rows each selector's lane of an `attention_figure` currently marks (for checks)."""
    lanes: dict[str, list[int]] = {}
    for x, y in zip(figure.data[5].x or [], figure.data[5].y or []):
        lanes.setdefault(str(y), []).append(int(x))
    return lanes
