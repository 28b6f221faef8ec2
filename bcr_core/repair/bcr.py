"""Budgeted Cache Repair (paper §3, App. A.2, Algorithm 1): on every call KVComm serves from an
assembled cache, rank the cached rows, recompute a budget rho of them exactly, then decode.

The selector ranks (draft attention for BCR, a coin, CacheBlend's layer-1 deviation), the layout
spends the budget (chunk, grow, single), and `Backbone.repair` recomputes. Calls KVComm serves
densely are untouched. The draft is discarded: decoding starts again from the repaired cache.

The ranking covers every cached row (`rank="all"`, the paper's rule: App. B ranks "over the whole
cached prefix", so budget can land on the agent's exact prefix and change nothing) or only the rows
KVComm predicted (`rank="predicted"`); either way the budget counts the whole cache.
"""

from __future__ import annotations

import torch

from bcr_core import paper
from bcr_core.repair.layouts import RANKS, Layout, check_rho
from bcr_core.reuse.anchors import KVCommConfig
from bcr_core.reuse.calls import Served, decode_call
from bcr_core.reuse.segments import predicted_rows
from bcr_core.reuse.servers import KVCommServer


class BCRServer(KVCommServer):
    def __init__(
        self,
        bb,
        selector,
        layout: Layout,
        rho: float = paper.RHO,
        config: KVCommConfig = KVCommConfig(),
        name: str = "bcr",
        rank: str = "all",
    ):
        super().__init__(bb, config, name)
        check_rho(rho)
        if rank not in RANKS:
            raise ValueError(f"rank must be one of {', '.join(RANKS)}; got {rank!r}")
        self.selector, self.layout, self.rho, self.rank = selector, layout, rho, rank

    def candidates(self, m: int, spans: list[dict]) -> torch.Tensor:
        """The rows the selector ranks: all M cached rows, or only those KVComm predicted."""
        if self.rank == "all":
            return torch.arange(m)
        return torch.tensor(predicted_rows(spans, m), dtype=torch.long)

    def serve_assembled(self, kv, ids, max_new_tokens, started, spans):
        served = Served(kv, [], 0.0, 0.0, skipped=self.layout.skip(kv.length, self.rho))
        if not served.skipped:  # Algorithm 1, line 1: no draft, no coin, if skipped
            served.candidates = self.candidates(kv.length, spans)
            ranking = self.selector.rank(self.bb, kv, ids[:-1], ids[-1], served.candidates)
            served.scores, served.draft = ranking.scores, ranking.draft
            served.repaired_rows = served.candidates[self.layout.rows(ranking.scores, self.rho, kv.length)].tolist()
        if served.repaired_rows:
            served.kv = self.bb.repair(kv, ids[:-1], served.repaired_rows)
        generation, served.ttft, served.total = yield from decode_call(served.kv, ids[-1], max_new_tokens, started)
        served.tokens = generation.tokens
        return served

    def replay(self, call: dict) -> None:
        super().replay(call)
        if call["rows_recomputed"] and hasattr(self.selector, "draw"):  # the coin advanced once on this call
            self.selector.draw(len(self.candidates(len(call["merged_ids"]) - 1, call["segment_map"])))
