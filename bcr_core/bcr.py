"""Budgeted Cache Repair (paper §3, App. A.2, Algorithm 1): on every call KVComm serves from an
assembled cache, rank the cached rows, recompute a budget rho of them exactly, then decode.

The selector ranks (draft attention for BCR, a coin, CacheBlend's layer-1 deviation), the layout
spends the budget (chunk, grow, single), and `Backbone.repair` recomputes. Calls KVComm serves
densely are untouched. The draft is discarded: decoding starts again from the repaired cache.
"""

from __future__ import annotations

from bcr_core.anchors import KVCommConfig
from bcr_core.layouts import Layout, check_rho
from bcr_core.serving import KVCommServer, Served, decode_call


class BCRServer(KVCommServer):
    def __init__(self, bb, selector, layout: Layout, rho: float = 0.20, config: KVCommConfig = KVCommConfig(),
                 name: str = "bcr"):
        super().__init__(bb, config, name)
        check_rho(rho)
        self.selector, self.layout, self.rho = selector, layout, rho

    def serve_assembled(self, kv, ids, max_new_tokens, started):
        rows = []
        if not self.layout.skip(kv.length, self.rho):  # Algorithm 1, line 1: no draft, no coin, if skipped
            scores = self.selector.scores(self.bb, kv, ids[:-1], ids[-1])
            rows = self.layout.rows(scores, self.rho).tolist()
        if rows:
            kv = self.bb.repair(kv, ids[:-1], rows)
        generation, ttft, total = yield from decode_call(kv, ids[-1], max_new_tokens, started)
        return Served(kv, generation.tokens, ttft, total, rows)

    def replay(self, call: dict) -> None:
        super().replay(call)
        if call["rows_recomputed"] and hasattr(self.selector, "draw"):
            self.selector.draw(len(call["merged_ids"]) - 1)  # the coin advanced once on this call
