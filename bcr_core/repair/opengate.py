"""OpenGate (paper App. A P2, App. I): decide reuse from the answer's opening, not the prompt.

On a call with an assembled cache (KVComm's entropy gate off, gamma = 1), draft k tokens; accept
if their mean top-1 probability is at least theta and continue decoding from the draft, else fall
back to a dense prefill. Nothing is recorded until the decision, so a rejected draft leaves no
state behind (no anchor activations, no output). At theta = 0 every draft is accepted and the
output must equal plain reuse token for token: App. I's plumbing control.
"""

from __future__ import annotations

import time

import torch

from bcr_core import paper
from bcr_core.engine.kv import KV
from bcr_core.errors import UsageError
from bcr_core.reuse.anchors import KVCommConfig
from bcr_core.reuse.calls import Decode, Refused, Served
from bcr_core.reuse.servers import KVCommServer


class OpenGateServer(KVCommServer):
    def __init__(
        self,
        bb,
        theta: float = paper.OPENGATE_THETA,
        k: int = paper.DRAFT_TOKENS,
        config: KVCommConfig = KVCommConfig(gamma=1.0),
        name: str = "opengate",
    ):
        super().__init__(bb, config, name)
        if not 0.0 <= theta <= 1.0:
            raise UsageError(f"OpenGate's theta must lie in [0, 1], got {theta}")
        self.theta, self.k = theta, k

    def serve_assembled(self, kv, ids, max_new_tokens, started, spans):
        steps = min(self.k, max_new_tokens)
        draft = yield Decode(kv, ids[-1], steps, keep_logits=True, keep_cache=True)
        confidence = float(torch.stack(draft.logits).softmax(-1).amax(-1).mean())
        if confidence < self.theta:
            return Refused("low_confidence")
        tokens = list(draft.tokens)
        if not draft.stopped and len(tokens) < max_new_tokens:
            cache = draft.cache  # rows: the prompt's last token and all drafted tokens but the last
            grown = KV.from_cache(cache, torch.arange(cache.get_seq_length(), device=kv.keys.device))
            tokens += (yield Decode(grown, tokens[-1], max_new_tokens - len(tokens), prior=tuple(tokens))).tokens
        return Served(kv, tokens, draft.first_token_at - started, time.perf_counter() - started)
