"""The arena's own selectors: the K/V-error rankings, which read the exact cache of the same ids
(`CallContext.exact`), so only the arena runs them; a server has that cache only by prefilling densely,
which is no reuse at all. They keep the one selector protocol of `bcr_core.repair.selectors.Selector`.
Every deployable selector (the draft, the coin, CacheBlend, `ours`, question, seams, window) is
`bcr_core.repair.selectors`' own, served by a run as a repair condition; `bcr_core.arena.registry` names
them all.
"""

from __future__ import annotations

import torch

from bcr_core.repair.call_context import CallContext
from bcr_core.repair.row_scores import row_scores
from bcr_core.repair.selectors import Ranking, Selector, candidate_scores


def row_error(kv, exact) -> torch.Tensor:
    """(M,) per row: the L2 norm, over every layer, batch entry, key-value head and head dimension,
    of the key deviation and the value deviation together, sqrt(sum (K - K*)^2 + sum (V - V*)^2),
    K*, V* the exact cache's rows (keys compared after RoPE, both at the same positions)."""
    if exact.length != kv.length or not torch.equal(exact.positions.cpu(), kv.positions.cpu()):
        raise ValueError(f"the exact cache ({exact.length} rows) does not cover the assembled one ({kv.length})")
    dk = (kv.keys.float() - exact.keys.float()).pow(2).sum(dim=(0, 1, 2, 4))
    dv = (kv.values.float() - exact.values.float()).pow(2).sum(dim=(0, 1, 2, 4))
    return (dk + dv).sqrt().cpu()


class KVErrorSelector(Selector):
    """`kv-error` (stored as `oracle` in records written before the rename): row j scores its true
    error, `row_error(assembled, exact)`: the L2 norm over all layers, heads and head dimensions of
    (K_j - K*_j, V_j - V*_j), the exact cache being the dense prefill of the same ids (token-matched
    Dense). It reads the exact cache, so it is not deployable; nor is it a ceiling: the largest cache
    error is not the row whose repair lowers the output's KL most (`searched` is the ceiling). Cost:
    that prefill (one pass)."""

    name, row_rule, passes, reads_exact = "kv-error", False, 1, True

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        exact = (context or CallContext([])).need_exact(self.name)
        return Ranking(candidate_scores(row_error(kv, exact), rows))


class AttendedKVErrorSelector(Selector):
    """`kv-error-attn` (stored as `oracle-attn` before the rename): the true error weighted by
    where the answer looks: row j scores
    row_error_j x a*_j, a*_j the exact cache's attention from the final prompt token (the query
    that emits the first answer token), summed over layers 2..L and averaged over query heads as
    Algorithm 2 does (`row_scores` of a one-step draft on the exact cache). Dense on the same ids
    (token-matched), so rows align with the assembled cache's. Not deployable. Passes: the exact
    prefill and one decode step."""

    name, row_rule, passes, reads_exact = "kv-error-attn", False, 2, True

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        exact = (context or CallContext([])).need_exact(self.name)
        weight = row_scores(bb.draft(exact, last_id, 1).attention).cpu()
        return Ranking(candidate_scores(row_error(kv, exact) * weight, rows))
