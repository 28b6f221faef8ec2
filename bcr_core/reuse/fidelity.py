"""Fidelity to Dense (docs/design.md §4): answer identity, first-token agreement, and the mean next-token
KL(Dense || method) teacher-forced on Dense's output.

Per call, in situ: the same prompt served by Dense and by the method, each from its own cache.
(Per item, across runs, agreement is computed from run records:
`bcr_core.analysis.summary.with_agreement`.)
"""

from __future__ import annotations

from bcr_core.engine.backbone import Backbone
from bcr_core.reuse.calls import CallRecord


def teacher_forced_kl(bb: Backbone, reference: tuple, candidate: tuple, tokens: list[int]) -> float:
    """Mean over steps of KL(P_reference || P_candidate), both fed `tokens` after their last prompt id."""
    tokens = list(tokens) or [bb.stop_ids[0]]
    return mean_kl(
        bb.forced_logits(*reference, tokens).log_softmax(-1), bb.forced_logits(*candidate, tokens).log_softmax(-1)
    )


def mean_kl(log_p, log_q) -> float:
    """Mean over steps of KL(P || Q), from (steps, vocab) log-probabilities."""
    return float((log_p.exp() * (log_p - log_q)).sum(-1).mean())


def call_fidelity(bb: Backbone, dense: CallRecord, method: CallRecord) -> dict:
    """Compare one call served two ways; both records must still hold their served caches."""
    if dense.served is None or method.served is None:
        raise ValueError("call_fidelity needs records that kept their caches (Pipeline.run(keep_caches=True))")
    return {
        "identical": method.output_tokens == dense.output_tokens,
        "first_token_agree": method.output_tokens[:1] == dense.output_tokens[:1],
        "kl": teacher_forced_kl(bb, dense.served, method.served, dense.output_tokens),
    }
