"""Inspecting calls: serve requests through a condition with traces on, and keep a `CallView` of
every call served from an assembled cache (its ids and token strings, segment map, the assembled
cache before repair, the draft's attention per layer and head, the rows the server repaired, its
answer and Dense's on the same prompt). Everything comes from the server's own `CallRecord.trace`.
`lab.saved_inspection` writes an `Inspection` to one file and reads it back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from bcr_core import paper
from bcr_core.agents.pipeline import Pipeline
from bcr_core.conditions import make_server, parse
from bcr_core.data import benchmarks
from bcr_core.errors import UsageError
from bcr_core.lab import microscope
from bcr_core.lab.tables import preview
from bcr_core.repair.layouts import LayoutConfig, layout
from bcr_core.repair.row_scores import row_scores
from bcr_core.reuse.calls import CallRecord, Server
from bcr_core.reuse.servers import DenseServer

# the fewest requests an inspection is worth making of (notebook 09 and `bcr explore` refuse fewer)
MIN_REQUESTS = 3
WHY_MIN_REQUESTS = "KVComm serves no call from an assembled cache until two earlier items have filled its anchor pool"


@dataclass
class CallView:
    """One agent call served from an assembled cache, everything about it indexable by name.

    `attention` is the draft's attention over the cached rows, (layers, draft steps, query heads,
    rows), taken on the assembled cache before any repair (the keys BCR scores are the predicted
    ones). Row j of the cache holds token `tokens[j]`; the prompt's last token is fed at decode.
    """

    index: int  # the item's position in the run
    item_id: str
    record: CallRecord = field(repr=False)  # with its trace
    tokens: list[str]  # token strings of the cached rows (ids[:-1])
    segments: list[dict]  # [{name, start, stop, placeholder, text}]
    dense_text: str | None = None  # Dense on the same prompt (the chat template's ids), in situ
    answers: dict = field(default_factory=dict, repr=False)  # cache of repaired answers by rows
    rankings: dict = field(default_factory=dict, repr=False)  # the microscope's field: label -> scores
    searched: dict = field(default_factory=dict, repr=False)  # count -> the searched set's record there
    dense: CallRecord | None = field(default=None, repr=False)  # Dense's call with its cache (not saved)

    node = property(lambda self: self.record.node)
    role = property(lambda self: self.record.role)
    condition = property(lambda self: self.record.condition)
    reason = property(lambda self: self.record.reason)
    decisions = property(lambda self: self.record.decisions)
    ids = property(lambda self: self.record.merged_ids)  # the reuse path's ids of the whole prompt
    output_text = property(lambda self: self.record.output_text)
    repaired_rows = property(lambda self: self.record.repaired_rows)
    kv = property(lambda self: self.record.trace.assembled)  # the assembled cache before repair (None once saved)
    attention = property(lambda self: self.record.trace.draft.attention)  # (layers, steps, heads, rows)
    draft_tokens = property(lambda self: self.record.trace.draft.tokens)

    @property
    def rows(self) -> int:
        return len(self.ids) - 1

    @property
    def key(self) -> str:
        return f"item {self.index} · {self.node} ({self.role})"

    @property
    def layers(self) -> int:
        return self.attention.shape[0]

    @property
    def heads(self) -> int:
        return self.attention.shape[2]

    def pattern(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """Attention over the rows averaged over draft steps: (layers, rows) for one head or the
        mean of heads when `layer` is None, else that layer's (rows,)."""
        att = self.attention.mean(dim=1)  # (layers, heads, rows)
        att = att.mean(dim=1) if head is None else att[:, head]
        return (att if layer is None else att[layer]).numpy()

    def score(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """The selection score: BCR's a_j (Algorithm 2: layers > 0, mean over steps and heads) when
        `layer` is None and `head` is None; otherwise the chosen layer (or every layer > 0) and head."""
        if layer is None and head is None:
            return row_scores(self.attention).numpy()
        pattern = self.pattern(None, head)
        return pattern[1:].sum(axis=0) if layer is None else pattern[layer]

    def select(self, layout_name: str, rho: float, config: LayoutConfig = LayoutConfig(), layer=None, head=None):
        """The rows a layout repairs at budget rho when ranked by `score(layer, head)`."""
        return layout(layout_name, config).rows(torch.from_numpy(self.score(layer, head).copy()), rho).tolist()

    def answer_with(self, bb, rows: list[int], max_new_tokens: int) -> str | None:
        """The greedy answer from the assembled cache with `rows` recomputed exactly; None when it
        was not decoded before and cannot be now (no model, or a loaded view without its cache)."""
        key = (tuple(rows), max_new_tokens)
        if key not in self.answers:
            if bb is None or self.kv is None:
                return None
            kv = self.kv if not rows else bb.repair(self.kv, self.ids[:-1], rows)
            self.answers[key] = bb.decode(bb.generate(kv, self.ids[-1], max_new_tokens).tokens)
        return self.answers[key]

    def segment_frame(self, layer=None, head=None) -> pd.DataFrame:
        """Per segment of the cache: its rows, whether KVComm predicted it (every segment after the
        agent's prefix; the prefix is exact) and whether it is a shared value, the share of the score
        mass it gets (with and without row 0, the attention sink), the mean score per row, and the
        rows the server repaired there."""
        score = self.score(layer, head)
        total, rest = float(score.sum()), float(score[1:].sum())
        repaired = np.zeros(self.rows, dtype=bool)
        repaired[self.repaired_rows] = True
        rows = []
        for s in self.segments:
            start, stop = s["start"], min(s["stop"], self.rows)
            if start >= stop:
                continue
            part = score[start:stop]
            no_sink = float(part.sum() - (score[0] if start == 0 else 0.0))
            rows.append(
                {
                    "segment": s["name"],
                    "start": start,
                    "stop": stop,
                    "rows": stop - start,
                    "predicted": start > 0,
                    "shared": s["placeholder"],
                    "text": preview(s.get("text", "")),
                    "score_share": float(part.sum()) / total,
                    "share_without_row0": no_sink / rest if rest else float("nan"),
                    "mean_score_per_row": float(part.mean()),
                    "repaired_rows": int(repaired[start:stop].sum()),
                }
            )
        return pd.DataFrame(rows)


class Recorder(Server):
    """Serves calls through `server` with traces on, as the pipeline asks, keeping a `CallView` of
    every call served from an assembled cache (and, with `dense`, Dense's answer to the same prompt)."""

    def __init__(self, bb, server, dense: bool = True):
        self.bb, self.server, self.name = bb, server, server.name
        server.trace = True
        self.dense = DenseServer(bb) if dense else None
        self.views: list[CallView] = []
        self.index, self.item_id = 0, ""

    def steps(self, prompt, max_new_tokens: int):
        call = yield from self.server.steps(prompt, max_new_tokens)
        if call.trace is not None:
            dense = (yield from self.dense.steps(prompt, max_new_tokens)) if self.dense else None
            ids = call.merged_ids
            self.views.append(
                CallView(
                    self.index,
                    self.item_id,
                    call,
                    self.bb.tokenizer.convert_ids_to_tokens(ids[:-1]),
                    [span | {"text": segment.text} for span, segment in zip(call.segment_map, prompt.segments)],
                    None if dense is None else dense.output_text,
                    dense=dense,
                )
            )
        return call


@dataclass
class Inspection:
    """Requests served by one condition, with a view of every call served from an assembled cache."""

    condition: str
    requests: list  # RequestRecord per item, in order
    views: list[CallView]
    parameters: dict = field(default_factory=dict)  # the settings it was served with, once saved

    def calls_frame(self) -> pd.DataFrame:
        """Every call of every request: mode, reason, rows repaired, and whether it has a view."""
        viewed = {(v.item_id, v.node) for v in self.views}
        return pd.DataFrame(
            [
                {
                    "index": i,
                    "item_id": r.item_id,
                    "node": c.node,
                    "role": c.role,
                    "mode": c.mode,
                    "reason": c.reason,
                    "cached_rows": len(c.merged_ids) - 1,
                    "rows_repaired": c.rows_recomputed,
                    "inspectable": (r.item_id, c.node) in viewed,
                    "output": c.output_text,
                }
                for i, r in enumerate(self.requests)
                for c in r.calls
            ]
        )

    def view(self, index: int | None = None, node: str | None = None) -> CallView:
        """The view of item `index` (default: the last with any) at `node` (default: its last)."""
        chosen = [v for v in self.views if (index is None or v.index == index) and (node is None or v.node == node)]
        if not chosen:
            have = sorted({(v.index, v.node) for v in self.views})
            raise UsageError(
                f"no call served from an assembled cache at item {index}, node {node}; "
                f"inspectable calls: {have or 'none (every call was served densely)'}"
            )
        return chosen[-1]


def inspect_requests(
    bb,
    benchmark: str,
    items: list[dict],
    agents: int,
    condition: str,
    max_new_tokens: int,
    pinned: str | None = None,
    dense: bool = True,
    progress: bool = True,
    chunk: int = paper.CHUNK_ROWS,
    rank: bool = True,
    each: Callable[[int], None] | None = None,
) -> Inspection:
    """Serve `items` in order through a fresh server for `condition` (the anchor pool warms up over
    them, as in a run) and keep a `CallView` of every call served from an assembled cache, with the
    microscope's field ranked on it unless `rank` is False (`microscope.rank_field`; `chunk`: the
    coin's unit). `each(i)` is called once item i has been served."""
    recorder = Recorder(bb, make_server(bb, condition), dense=dense)
    pipeline = Pipeline(bb, benchmark, agents, max_new_tokens, pinned)
    name = parse(condition).label
    requests = []
    for index, item in enumerate(tqdm(items, desc=f"{name} requests", disable=not progress)):
        recorder.index, recorder.item_id = index, str(item["id"])
        viewed = len(recorder.views)
        requests.append(pipeline.run(recorder, str(item["id"]), benchmarks.question_text(benchmark, item)))
        nodes = [c.node for c in requests[-1].calls]
        for v in recorder.views[viewed:] if rank else ():
            v.rankings = microscope.rank_field(bb, v, (index, nodes.index(v.node)), chunk)
        if each is not None:
            each(index)
    return Inspection(name, requests, recorder.views)


def answers_side_by_side(inspections: dict[str, Inspection], index: int) -> pd.DataFrame:
    """Each call of item `index` under each condition: how it was served and what it answered."""
    rows = []
    for name, inspection in inspections.items():
        for call in inspection.requests[index].calls:
            rows.append(
                {
                    "node": call.node,
                    "condition": name,
                    "mode": call.mode,
                    "reason": call.reason,
                    "rows_repaired": call.rows_recomputed,
                    "answer": call.output_text,
                }
            )
    frame = pd.DataFrame(rows)
    return frame.pivot(index="node", columns="condition", values="answer").reindex(list(dict.fromkeys(frame["node"])))[
        list(inspections)
    ]
