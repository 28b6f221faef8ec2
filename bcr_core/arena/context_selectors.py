"""The arena's selectors beyond `bcr_core.repair.selectors`: each ranks the rows of one assembled cache.

Every class keeps the one selector protocol of `bcr_core.repair.selectors.Selector`:
`rank(bb, kv, ids, last_id, rows=None, *, context=None) -> Ranking` (scores of the candidate `rows`,
higher = repair first), the keyword `context` (a `CallContext`) holding what the cache alone does
not: the segment map (`seams`, `window`, `question`) and, for the K/V-error rankings only, the
exact cache; and the class attributes `row_rule`, `passes` and `reads_exact` (how a selector is
spent and what it costs). The draft (BCR, Algorithm 2), the coin, CacheBlend and `ours` are
`bcr_core.repair.selectors`' own classes (a run serves them as repair conditions); `bcr_core.arena.registry`
names them all.
"""

from __future__ import annotations

import torch

from bcr_core.arena.context import CallContext
from bcr_core.engine.kernels import GROUPED_EAGER
from bcr_core.repair.row_scores import row_scores
from bcr_core.repair.selectors import Ranking, Selector

EXACT_ROW = -1.0e9  # a row rule's score for a row KVComm did not predict: chosen only after every predicted row


def candidate_scores(scores: torch.Tensor, rows) -> torch.Tensor:
    return scores if rows is None else scores[torch.as_tensor(rows, dtype=torch.long)]


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


def trailing_attention(bb, kv, ids, last_id, start: int) -> torch.Tensor:
    """(layers, queries, query heads, M): the attention the prompt's trailing tokens (rows
    `start`..M-1 of the prompt and its last token) pay to the cache's rows when run forward over
    the assembled rows before `start`, causally among themselves. The cache is not modified."""
    m = kv.length
    trailing = [int(t) for t in ids[start:m]] + [int(last_id)]
    cache = kv.truncate(start).to_cache(room=len(trailing))
    fed = torch.tensor([trailing], device=bb.device)
    positions = torch.arange(start, start + len(trailing), device=bb.device)[None]
    with torch.inference_mode(), bb.attention_implementation(GROUPED_EAGER):
        out = bb.model(
            input_ids=fed, position_ids=positions, cache=cache, use_cache=True, output_attentions=True, logits_to_keep=1
        )
    return torch.stack([a[0, :, :, :m].transpose(0, 1) for a in out.attentions]).float()


class QuestionSelector(Selector):
    """`question` (the A3 / ProphetKV family in its plainest form, no draft): the prompt's own
    trailing tokens, the template text after the last placeholder (the instruction after the last
    shared segment) and the prompt's final token, are run forward over the assembled cache before
    them. Kept: their softmax attention weights on every cached row, at every layer (layer 1
    included) and query head. Fused: row j scores the sum over layers of the mean over those
    queries and query heads. Their own rows are scored by the attention among themselves. The
    forward is discarded (one pass)."""

    name, row_rule, passes = "question", False, 1

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        context = context or CallContext([])
        attention = trailing_attention(bb, kv, ids, last_id, context.trailing_start(kv.length))
        return Ranking(candidate_scores(attention.mean(dim=(1, 2)).sum(dim=0).cpu(), rows))


class SeamsSelector(Selector):
    """`seams` (EPIC's LegoLink, the attention sink at every seam): the first rows of every reused
    segment (each placeholder's value and the text after it, `CallContext.segments`), spread
    evenly: every segment's first row, then every segment's second row, and so on, in prompt order
    at each depth, until the count; rows KVComm did not predict only after every predicted row.
    Row j of a segment starting at s scores -(j - s)."""

    name, row_rule, passes = "seams", True, 0

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        scores = torch.full((kv.length,), EXACT_ROW, dtype=torch.float64)
        for start, stop in (context or CallContext([])).segments(kv.length):
            scores[start:stop] = -torch.arange(stop - start, dtype=torch.float64)
        return Ranking(candidate_scores(scores, rows))


class WindowSelector(Selector):
    """`window` (arXiv 2609.17983, "Contiguity, Not Importance"): a contiguous window right after
    each seam, every segment's window the same share of its length. Row j of a segment [s, e)
    scores -(j - s + 1/2) / (e - s), so the count is apportioned over the segments by their lengths
    as Webster's (Sainte-Lague's) divisor method does: a segment of L rows gets about R x L / P of
    R rows (P the predicted rows), each window contiguous from its seam, ties to the earlier row;
    rows KVComm did not predict only after every predicted row. Where `seams` gives every segment
    the same number of rows, `window` gives every segment the same fraction."""

    name, row_rule, passes = "window", True, 0

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        scores = torch.full((kv.length,), EXACT_ROW, dtype=torch.float64)
        for start, stop in (context or CallContext([])).segments(kv.length):
            scores[start:stop] = -(torch.arange(stop - start, dtype=torch.float64) + 0.5) / (stop - start)
        return Ranking(candidate_scores(scores, rows))
