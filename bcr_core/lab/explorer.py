"""The attention explorer: what its heatmap draws for one setting of its controls, the figure,
and `Explorer`, the controller behind notebook 09's widgets (and `bcr explore`'s app).

`explore` turns a `CallView` and the controls (layer or BCR's summed score, head, layout, rho)
into an `Exploration`; `attention_figure` draws it and `update_figure` redraws it in place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bcr_core import paper
from bcr_core.analysis.reports import seams
from bcr_core.errors import UsageError
from bcr_core.lab import microscope
from bcr_core.lab.heatmap import attention_figure, update_figure
from bcr_core.lab.inspection import CallView, Inspection
from bcr_core.lab.live import PRELOAD, Decoder, LiveCaches
from bcr_core.repair.layouts import LayoutConfig, layout


# -- the explorer's data --------------------------------------------------------------------------
@dataclass
class Exploration:
    """Everything the explorer draws for one setting of its controls."""

    heat: np.ndarray  # (layers, rows): attention per layer, for one head or the mean of heads
    score: np.ndarray  # (rows,): what the layout ranks
    score_name: str
    selected: list[int]  # the rows the layout picks at rho
    expected: tuple[int, int]  # (fewest, most) rows the layout may pick at rho on this cache
    boundaries: list[dict]  # segment spans {name, start, stop, placeholder}
    segments: pd.DataFrame  # per segment: rows, score share, rows selected
    picks: dict[str, list[int]]  # the microscope: each selector's rows at the same count ({} without a field)
    error: np.ndarray | None  # (rows,): the true per-row error (the oracle's score)
    deviation: np.ndarray | None  # (rows,): CacheBlend's layer-1 deviation
    seams: list[tuple[int, int]] = field(default_factory=list)  # cached rows where the ids part from Dense's

    @property
    def count(self) -> int:
        return len(self.selected)


def explore(
    view: CallView,
    layer: int | None = None,
    head: int | None = None,
    layout_name: str = "chunk",
    rho: float = paper.RHO,
    chunk: int = LayoutConfig.chunk,
    log: bool = True,
    skip: str = LayoutConfig.skip,
) -> Exploration:
    """The explorer's data for one call and one setting of its controls: the attention heatmap
    (log10 when `log`), the score the layout ranks, the rows it selects, and per segment how much
    of the score and of the selection falls there."""
    config = LayoutConfig(chunk=chunk, skip=skip)
    heat = view.pattern(None, head)
    if log:
        heat = np.log10(np.clip(heat, 1e-6, None))
    score = view.score(layer, head)
    selected = view.select(layout_name, rho, config, layer, head)
    layers = "layers 1+" if layer is None else f"layer {layer}"
    heads = "mean of heads" if head is None else f"head {head}"
    name = (
        "BCR row score (layers 1+, mean of steps and heads)" if layer is None and head is None else f"{layers}, {heads}"
    )
    picked = np.zeros(view.rows, dtype=bool)
    picked[selected] = True
    segments = view.segment_frame(layer, head)
    segments["selected_rows"] = [int(picked[s:e].sum()) for s, e in zip(segments["start"], segments["stop"])]
    bounds = [s | {"stop": min(s["stop"], view.rows)} for s in view.segments if s["start"] < view.rows]
    return Exploration(
        heat,
        score,
        name,
        selected,
        layout(layout_name, config).bounds(view.rows, rho),
        bounds,
        segments,
        microscope.picks(view, len(selected), chunk),
        microscope.band(view, microscope.ERROR),
        microscope.band(view, microscope.DEVIATION),
        seam_rows(view),
    )


def seam_rows(view: CallView) -> list[tuple[int, int]]:
    """The cached rows (start, stop) where the reuse path's ids part from Dense's: the tokenization tax's seams."""
    record = view.record
    spans = seams.seam_spans(record.dense_ids, record.merged_ids)
    return [(b0, min(max(b1, b0 + 1), view.rows)) for _, _, b0, b1 in spans if b0 < view.rows]


NOT_DECODED = "(not decoded: a saved inspection keeps only the answers decoded when it was made)"
DECODING = "(decoding …)"
SUM = -1  # the dropdowns' stand-in for None: BCR's summed score, the mean of heads
LAYOUTS = ("chunk", "grow", "single")


class Explorer:
    """The explorer's widgets over an `Inspection`: item, agent call, layer, head, layout, rho and
    whether to decode the repaired answer; every change redraws the figure, the answers and the
    per-segment table. `update(**controls)` does from code what the controls do. With `bb=None`
    (a loaded inspection) the answers shown are those saved with it, and, given `live` caches (the
    model is on this machine), with the decode box ticked every other one, decoded in a worker
    thread (`live.Decoder`): the figure never waits for an answer, and `wait()` does."""

    def __init__(
        self,
        bb,
        inspection: Inspection,
        served_as: str,
        max_new_tokens: int,
        layout_name: str = "chunk",
        rho: float = paper.RHO,
        chunk: int = paper.CHUNK_ROWS,
        item: int | None = None,
        call: str | None = None,
        layer: int | None = None,
        head: int | None = None,
        live: LiveCaches | None = None,
    ):
        import ipywidgets as W

        if not inspection.views:
            raise UsageError("no call was served from an assembled cache: serve more requests (n) or raise gamma")
        self.bb, self.served_as, self.max_new_tokens, self.chunk = bb, served_as, max_new_tokens, chunk
        self.views = {(v.index, v.node): v for v in inspection.views}
        self.items = sorted({i for i, _ in self.views})
        first = item if item in self.items else self.items[-1]
        start = self.views.get((first, call)) or [v for (i, _), v in self.views.items() if i == first][-1]
        self.make_controls(inspection, first, start, layer, head, layout_name, rho)
        self.answers_w, self.segments_w, self.status_w = W.HTML(), W.HTML(), W.HTML()
        self.decoder = Decoder(bb, live)
        self.figure = attention_figure(start, explore(start, None, None, layout_name, rho, chunk), widget=True)
        self.busy = False
        for w in (self.item_w, *self.controls.values()):
            w.observe(self.on_change, names="value")
        self.render()  # sets self.shown
        self.widget = self.page()
        if live is not None and os.environ.get(PRELOAD):  # a preheated kernel: load before anyone ticks
            self.decoder.submit([], lambda generation: self.say(""), self.say)

    def make_controls(self, inspection: Inspection, first: int, start, layer, head, layout_name: str, rho: float):
        """The item picker and the controls, set to the call `start` of item `first`."""
        import ipywidgets as W

        self.item_w = W.Dropdown(
            description="item", value=first, options=[(f"{i}: {inspection.requests[i].item_id}", i) for i in self.items]
        )
        self.call_w = W.Dropdown(description="agent call", options=self.nodes_of(first), value=start.node)
        self.layer_w = W.Dropdown(
            description="layer",
            value=SUM if layer is None else layer,
            options=[("summed score (BCR)", SUM)] + [(str(i), i) for i in range(start.layers)],
        )
        self.head_w = W.Dropdown(
            description="head",
            value=SUM if head is None else head,
            options=[("mean of heads", SUM)] + [(str(h), h) for h in range(start.heads)],
        )
        self.layout_w = W.ToggleButtons(description="layout", options=list(LAYOUTS), value=layout_name)
        self.rho_w = W.FloatSlider(description="ρ", min=0.0, max=1.0, step=0.05, value=rho, continuous_update=False)
        # ticked from the start only where decoding needs no model load (served here, caches in memory)
        self.decode_w = W.Checkbox(description="decode the repaired answer", value=self.bb is not None)
        self.controls = {
            "call": self.call_w,
            "layer": self.layer_w,
            "head": self.head_w,
            "layout": self.layout_w,
            "rho": self.rho_w,
            "decode": self.decode_w,
        }

    def page(self):
        """The controls, the figure, the answers and the per-segment table, top to bottom."""
        import ipywidgets as W

        return W.VBox(
            [
                W.HBox([self.item_w, self.call_w]),
                W.HBox([self.layer_w, self.head_w]),
                self.layout_w,
                W.HBox([self.rho_w, self.decode_w]),
                self.figure,
                W.HTML("<b>Answers</b>"),
                self.status_w,
                self.answers_w,
                W.HTML("<b>Per segment</b>"),
                self.segments_w,
            ]
        )

    def nodes_of(self, index: int) -> list[tuple[str, str]]:
        return [(f"{v.node} ({v.role}, {v.rows} rows)", v.node) for (i, _), v in self.views.items() if i == index]

    @property
    def view(self) -> CallView:
        return self.views[(self.item_w.value, self.call_w.value)]

    def state(self) -> dict:
        """Every control's value, None for the summed score and the mean of heads."""
        values = {"item": self.item_w.value} | {name: w.value for name, w in self.controls.items()}
        return values | {k: None if values[k] == SUM else values[k] for k in ("layer", "head")}

    def wanted_answers(self, view: CallView, exploration: Exploration) -> list[tuple[str, list[int] | None]]:
        """(label, rows) of each answer the table shows: the layout's and each selector's repair at the
        current setting (rows None: an answer already held with the call)."""
        wanted = [(f"{self.layout_w.value} at ρ={self.rho_w.value:g}, {exploration.count} rows", exploration.selected)]
        wanted += [(f"{label}, {len(rows)} rows", rows) for label, rows in exploration.picks.items()]
        return wanted

    def answers_frame(self, view: CallView, exploration: Exploration) -> tuple[pd.DataFrame, list]:
        """The answers table, and the (view, rows, max_new_tokens) jobs still to decode for it. Unticked,
        the repaired rows show only where their answer is already held."""
        t = self.max_new_tokens
        rows = [
            ("Dense, same prompt", view.dense_text),
            ("assembled cache, unrepaired", view.answers.get(((), t))),
            (f"as served ({self.served_as}, {len(view.repaired_rows)} rows)", view.output_text),
        ]
        decode = self.decode_w.value and self.decoder.can_decode(view)
        jobs = [(view, [], t)] if rows[1][1] is None and decode else []
        for label, picked in self.wanted_answers(view, exploration):
            held = view.answers.get((tuple(picked), t))
            if held is not None or self.decode_w.value:
                rows.append((label, held))
                if held is None and decode:
                    jobs.append((view, picked, t))
        table = pd.DataFrame(rows, columns=["served as", "answer"])
        table["identical to Dense"] = [None if a is None else a == view.dense_text for a in table["answer"]]
        error = self.decoder.error
        waiting = DECODING if jobs else NOT_DECODED if error is None else f"(not decoded: {error})"
        table["answer"] = table["answer"].fillna(waiting)
        return table, jobs

    def show_answers(self, view: CallView, exploration: Exploration) -> None:
        """Fill the answers table; hand what it still needs to the decoder, which fills it again when done."""
        self.answers, jobs = self.answers_frame(view, exploration)
        self.answers_w.value = self.answers.to_html(index=False)
        if not jobs:
            self.say(f"<i>{self.decoder.error}</i>" if self.decoder.error else "")
            return
        self.say(f"decoding {len(jobs)} answers …" if self.decoder.loaded else "preparing to decode …")
        self.decoder.submit(jobs, lambda generation: self.show_answers(view, exploration), self.say)

    def say(self, line: str) -> None:
        self.status_w.value = line

    def wait(self, timeout: float | None = None) -> pd.DataFrame:
        """Wait for the answers being decoded (code and tests; the widgets never wait); the table shown."""
        self.decoder.wait(timeout)
        return self.answers

    def render(self) -> Exploration:
        view, state = self.view, self.state()
        exploration = explore(view, state["layer"], state["head"], state["layout"], state["rho"], self.chunk)
        update_figure(self.figure, view, exploration)
        self.segments_w.value = exploration.segments.drop(columns=["text"]).to_html(
            index=False, float_format="{:.3f}".format
        )
        self.shown = exploration
        self.show_answers(view, exploration)
        return exploration

    def update(self, **controls) -> Exploration:
        """Set any of item, call, layer, head, layout, rho, decode (None for the summed score or the
        mean of heads) and redraw once; returns what was drawn."""
        unknown = set(controls) - {"item", *self.controls}
        if unknown:
            raise TypeError(
                f"update() got an unknown control {sorted(unknown)[0]!r}; controls: item, {', '.join(self.controls)}"
            )
        self.busy = True
        try:
            if "item" in controls:
                self.item_w.value = controls["item"]
                self.call_w.options = self.nodes_of(self.item_w.value)
                self.call_w.value = self.call_w.options[-1][1]
            for name, value in controls.items():
                if name != "item":
                    self.controls[name].value = SUM if value is None and name in ("layer", "head") else value
        finally:
            self.busy = False
        return self.render()

    def on_change(self, change) -> None:
        if self.busy:
            return
        if change["owner"] is self.item_w:
            self.update(item=self.item_w.value)
        else:
            self.render()
