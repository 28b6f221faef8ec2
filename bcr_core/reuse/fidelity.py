"""Fidelity to Dense (docs/design.md §4): answer identity, first-token agreement, and the mean next-token
KL(Dense || method) teacher-forced on Dense's output.

Per call, in situ: the same prompt served by Dense and by the method, each from its own cache.
(Per item, across runs, agreement is computed from run records:
`bcr_core.analysis.claims.protocol.with_agreement`.)
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from functools import partial

import torch

from bcr_core.engine.backbone import Backbone
from bcr_core.reuse.calls import Cached, CallRecord


class ForcedLogProbs:
    """Teacher-forced next-token log-probabilities of served caches, the most recent kept while they
    fit in `max_bytes` (the latest always; one step is a vocabulary of floats, so 512 steps over a
    50k vocabulary are 100 MB). Within a cell one cache object is often measured many times: the
    Dense reference of a prompt once per condition whose call had that prompt, and a condition's own
    cache wherever it is that very prefill (Dense, and every dense fallback, at batch size > 1,
    where prefills are shared). The same cache object fed the same tokens gives the same numbers,
    so a repeat is looked up, bit-identical. Entries name their cache weakly: a cache that is gone is
    never matched."""

    def __init__(self, bb: Backbone, max_bytes: int = 256 * 2**20):
        self.bb, self.max_bytes, self.bytes = bb, max_bytes, 0
        self.kept: OrderedDict[tuple, tuple[weakref.ref, torch.Tensor]] = OrderedDict()
        self.computed = self.looked_up = 0

    def __call__(self, cached: Cached, tokens: list[int]) -> torch.Tensor:
        key = (id(cached.kv), int(cached.last_id), tuple(tokens))
        found = self.kept.get(key)
        if found is not None and found[0]() is cached.kv:
            self.kept.move_to_end(key)
            self.looked_up += 1
            return found[1]
        log_probs = forced_log_probs(self.bb, cached, tokens)
        if key in self.kept:  # a cache that is gone, its id taken by this one
            self.bytes -= size(self.kept.pop(key)[1])
        self.kept[key] = (weakref.ref(cached.kv), log_probs)
        self.computed, self.bytes = self.computed + 1, self.bytes + size(log_probs)
        while self.bytes > self.max_bytes and len(self.kept) > 1:
            self.bytes -= size(self.kept.popitem(last=False)[1][1])
        return log_probs


def size(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def forced_log_probs(bb: Backbone, cached: tuple, tokens: list[int]) -> torch.Tensor:
    """(steps, vocab) log-probabilities of `tokens` teacher-forced on a (cache, last id)."""
    kv, last_id = cached
    return bb.forced_logits(kv, last_id, tokens).log_softmax(-1)


def teacher_forced_kl(
    bb: Backbone, reference: tuple, candidate: tuple, tokens: list[int], log_probs: ForcedLogProbs | None = None
) -> float:
    """Mean over steps of KL(P_reference || P_candidate), both fed `tokens` after their last prompt
    id; `log_probs` looks up caches measured before."""
    tokens = list(tokens) or [bb.stop_ids[0]]
    measure = log_probs or partial(forced_log_probs, bb)
    return mean_kl(measure(Cached(*reference), tokens), measure(Cached(*candidate), tokens))


def mean_kl(log_p, log_q) -> float:
    """Mean over steps of KL(P || Q), from (steps, vocab) log-probabilities."""
    return float((log_p.exp() * (log_p - log_q)).sum(-1).mean())


def call_fidelity(bb: Backbone, dense: CallRecord, method: CallRecord, log_probs: ForcedLogProbs | None = None) -> dict:
    """Compare one call served two ways; both records must still hold their served caches."""
    if dense.served is None or method.served is None:
        raise ValueError("call_fidelity needs records that kept their caches (Pipeline.run(keep_caches=True))")
    return {
        "identical": method.output_tokens == dense.output_tokens,
        "first_token_agree": method.output_tokens[:1] == dense.output_tokens[:1],
        "kl": teacher_forced_kl(bb, dense.served, method.served, dense.output_tokens, log_probs),
    }
