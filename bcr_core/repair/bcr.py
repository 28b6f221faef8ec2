"""Budgeted Cache Repair (paper §3, App. A.2, Algorithm 1): on every call KVComm serves from an
assembled cache, rank the cached rows, recompute a budget rho of them exactly, then decode.

The selector ranks (draft attention for BCR, a coin, CacheBlend's layer-1 deviation, or any other deployable
rule of `repair.selectors`, handed the call's segment map as a `CallContext`), the layout
spends the budget (chunk, grow, single), and `Backbone.repair` recomputes. Calls KVComm serves
densely are untouched. The draft is discarded: decoding starts again from the repaired cache.

The ranking covers every cached row (`rank="all"`, the paper's rule: App. B ranks "over the whole
cached prefix", so budget can land on the agent's exact prefix and change nothing) or only the rows
KVComm predicted (`rank="predicted"`); either way the budget counts the whole cache.

A row-matched control (`match`) spends no budget of its own: on each call it first asks the BCR
rule it is paired with (the draft's ranking and that condition's layout) how many rows it would
recompute on this very cache, then recomputes exactly that many rows by its own ranking
(`Layout.exactly`). Same prompt, same cache, same row count: the two differ only in which rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bcr_core import paper
from bcr_core.errors import UsageError
from bcr_core.repair.call_context import CallContext
from bcr_core.repair.layouts import RANKS, Layout, check_rho
from bcr_core.repair.selectors import Selector
from bcr_core.reuse.anchors import KVCommConfig
from bcr_core.reuse.calls import Served, decode_call
from bcr_core.reuse.segments import predicted_rows
from bcr_core.reuse.servers import KVCommServer


@dataclass(frozen=True)
class MatchedBudget:
    """The BCR rule whose row count a control matches on each call: its selector and layout."""

    selector: Selector
    layout: Layout

    def rows(self, bb, kv, ids, candidates, rho, context: CallContext) -> int:
        ranking = self.selector.rank(bb, kv, ids[:-1], ids[-1], candidates, context=context)
        return len(self.layout.rows(ranking.scores, rho, kv.length))


class BCRServer(KVCommServer):
    def __init__(
        self,
        bb,
        selector: Selector,
        layout: Layout,
        rho: float = paper.RHO,
        config: KVCommConfig = KVCommConfig(),
        name: str = "bcr",
        rank: str = "all",
        match: MatchedBudget | None = None,
    ):
        if not isinstance(selector, Selector):
            raise TypeError(f"a BCR server needs a repair.selectors.Selector, got {type(selector).__name__}")
        super().__init__(bb, config, name)
        check_rho(rho)
        if rank not in RANKS:
            raise UsageError(f"rank must be one of {', '.join(RANKS)}; got {rank!r}")
        self.selector, self.layout, self.rho, self.rank, self.match = selector, layout, rho, rank, match

    def candidates(self, m: int, spans: list[dict]) -> torch.Tensor:
        """The rows the selector ranks: all M cached rows, or only those KVComm predicted."""
        if self.rank == "all":
            return torch.arange(m)
        return torch.tensor(predicted_rows(spans, m), dtype=torch.long)

    def serve_assembled(self, kv, ids, max_new_tokens, started, spans):
        skipped, candidates, ranking, rows = self.skips(kv.length), None, None, []
        if not skipped:  # Algorithm 1, line 1: no draft, no coin, if skipped
            candidates, context = self.candidates(kv.length, spans), CallContext(spans)
            ranking = self.selector.rank(self.bb, kv, ids[:-1], ids[-1], candidates, context=context)
            rows = candidates[self.chosen(ranking.scores, kv, ids, candidates, context)].tolist()
        repaired = self.bb.repair(kv, ids[:-1], rows) if rows else kv
        generation, ttft, total = yield from decode_call(repaired, ids[-1], max_new_tokens, started)
        scores, draft = (ranking.scores, ranking.draft) if ranking is not None else (None, None)
        return Served(repaired, generation.tokens, ttft, total, rows, skipped, candidates, scores, draft)

    def skips(self, m: int) -> bool:
        """Algorithm 1's skip rule; a row-matched control skips wherever its paired rule does too."""
        return self.layout.skip(m, self.rho) or (self.match is not None and self.match.layout.skip(m, self.rho))

    def chosen(self, scores, kv, ids, candidates, context: CallContext) -> torch.Tensor:
        """Indices into the candidates: the layout's budget, or exactly the paired rule's row count."""
        if self.match is None:
            return self.layout.rows(scores, self.rho, kv.length)
        return self.layout.exactly(scores, self.match.rows(self.bb, kv, ids, candidates, self.rho, context))

    def replay(self, call: dict) -> None:
        super().replay(call)
        if call["repaired_rows"]:  # the selector ranked this call's candidates
            self.selector.replay(len(self.candidates(len(call["merged_ids"]) - 1, call["segment_map"])))
