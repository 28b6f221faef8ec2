"""The servers that answer one agent call: Dense, token-matched Dense, and KVComm reuse.

KVComm (docs/design.md §2): the call's cache is assembled from the node's exact prefix cache and, for
each placeholder in order, the predicted cache of its value and of the template text after it,
keys re-rotated to their offsets. If any placeholder fails the gate, the call is prefilled densely
over the reuse path's ids (so segment boundaries are exact) and anchors are stored from it.
"""

from __future__ import annotations

import time
from functools import partial

import torch

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.kv import KV
from bcr_core.reuse.anchors import REUSE, AnchorPool, Deviation, GateDecision, KVCommConfig, deviation, predict_into
from bcr_core.reuse.calls import Cached, CallRecord, Refused, Served, Server, Trace, decode_call
from bcr_core.reuse.prompts import Prompt
from bcr_core.reuse.segments import SegmentCaches, placeholder_spans, rows
from bcr_core.spec_grammar import label


class DenseServer(Server):
    """Prefill the whole prompt: the chat template's ids, or the reuse path's (token-matched)."""

    stateless = True  # calls do not depend on earlier calls: items may be served in any order

    def __init__(self, bb: Backbone, token_matched: bool = False):
        self.bb = bb
        self.token_matched = token_matched
        self.name = "token-matched-dense" if token_matched else "dense"

    def steps(self, prompt: Prompt, max_new_tokens: int):
        ids = prompt.merged_ids if self.token_matched else prompt.dense_ids
        started = time.perf_counter()
        kv = self.prefill(ids[:-1])
        generation, ttft, total = yield from decode_call(kv, ids[-1], max_new_tokens, started)
        return CallRecord(
            node=prompt.template.node,
            role=prompt.template.role,
            condition=self.name,
            reason="dense",
            dense_ids=prompt.dense_ids,
            merged_ids=prompt.merged_ids,
            output_tokens=generation.tokens,
            output_text=self.bb.decode(generation.tokens),
            ttft_s=ttft,
            total_s=total,
            segment_map=prompt.segment_map(dense=not self.token_matched),
            served=Cached(kv, ids[-1]),
        )


class DenseAgainServer(DenseServer):
    """Dense served again, the way the serial conditions are served: its items one after another in order
    (not stateless, so the batched runner serves it as it serves KVComm), every prefill and decode its own
    (`shares_work` off: never another condition's prefill or tokens). Its agreement with Dense is the
    instrument's floor: what an agreement measure reads when nothing but the serving arrangement changed.
    Under batch-invariant decoding (`engine.invariance`) it reads 100%."""

    stateless = False
    shares_work = False

    def __init__(self, bb: Backbone):
        super().__init__(bb)
        self.name = "dense-again"


class KVCommServer(Server):
    """The reuse baseline: anchor pool, entropy gate, offset prediction, dense fallback."""

    stateless = False  # the anchor pool carries every call into the next

    def __init__(self, bb: Backbone, config: KVCommConfig = KVCommConfig(), name: str | None = None):
        self.bb = bb
        self.config = config
        self.pool = AnchorPool(config)
        self.caches = SegmentCaches(bb)
        self.name = name or label("kvcomm", None if config.gamma == KVCommConfig.gamma else config.gamma)

    def steps(self, prompt: Prompt, max_new_tokens: int):
        if self.config.assembly == "aligned":
            prompt = prompt.aligned()
        self.caches.prepare(prompt)
        ids, spans, node = prompt.merged_ids, prompt.segment_map(), prompt.template.node
        started = time.perf_counter()
        decisions = self.gate(ids, spans, node)
        reason = self.allocate(decisions, node)
        served, assembled, assembly_s = None, None, time.perf_counter() - started
        if reason == REUSE:
            assembled = self.assemble(ids, spans, node, decisions)
            assembly_s = time.perf_counter() - started
            served = yield from self.serve_assembled(assembled, ids, max_new_tokens, started, spans)
            if isinstance(served, Refused):
                reason, served = served.reason, None
            else:
                for d in decisions:
                    self.pool.activate(d)
        if served is None:
            kv = self.prefill(ids[:-1])
            generation, ttft, total = yield from decode_call(kv, ids[-1], max_new_tokens, started, keep_cache=True)
            full = KV.from_cache(generation.cache, torch.arange(len(ids)))  # the prompt's rows, the last included
            self.store_anchors(ids, spans, node, full)
            served = Served(kv, generation.tokens, ttft, total)
        return CallRecord(
            node=node,
            role=prompt.template.role,
            condition=self.name,
            reason=reason,
            dense_ids=prompt.dense_ids,
            merged_ids=ids,
            output_tokens=served.tokens,
            output_text=self.bb.decode(served.tokens),
            ttft_s=served.ttft,
            total_s=served.total,
            repaired_rows=served.repaired_rows,
            skipped=served.skipped,
            segment_map=spans,
            decisions=[d.to_dict() for d in decisions],
            served=Cached(served.kv, ids[-1]),
            assembly_s=assembly_s,
            trace=self.traced(assembled, ids, served) if reason == REUSE else None,
        )

    def traced(self, assembled: KV, ids: list[int], served: Served) -> Trace | None:
        """The call's `Trace`, when the caller asked for one; a draft is run only if no selector ran one."""
        if not self.trace:
            return None
        draft = served.draft or self.bb.draft(assembled, ids[-1])
        return Trace(assembled, draft, served.candidates, served.scores)

    def share_caches(self, caches: SegmentCaches) -> None:
        self.caches = caches

    # -- hooks for the policies built on this server ----------------------------------------
    def allocate(self, decisions: list[GateDecision], node: str) -> str:
        """The call's reason: reuse iff every placeholder passed the gate."""
        return next((d.reason for d in decisions if not d.reuse), REUSE)

    def serve_assembled(self, kv: KV, ids: list[int], max_new_tokens: int, started: float, spans: list[dict]):
        """Decode from the assembled cache as it is (KVComm); steps returning a `Served`, or a
        `Refused(reason)` to send the call to the dense path with that reason recorded. `spans` is
        the prompt's segment map."""
        generation, ttft, total = yield from decode_call(kv, ids[-1], max_new_tokens, started)
        return Served(kv, generation.tokens, ttft, total)

    def gate(self, ids: list[int], spans: list[dict], node: str) -> list[GateDecision]:
        return [self.pool.decide(v["name"], node, self.caches.base(rows(ids, v))) for v, _ in placeholder_spans(spans)]

    @torch.inference_mode()
    def assemble(self, ids: list[int], spans: list[dict], node: str, decisions: list[GateDecision]) -> KV:
        """Prefix (exact) + each placeholder's predicted value and following text, keys re-rotated
        to their offsets; one row short of the prompt. Written piece by piece into one cache."""
        prefix = self.caches.prefix(rows(ids, spans[0]))
        n = len(ids) - 1
        shape = (*prefix.keys.shape[:3], n, prefix.keys.shape[-1])
        keys, values = prefix.keys.new_empty(shape), prefix.values.new_empty(shape)
        keys[:, :, :, : prefix.length] = prefix.keys
        values[:, :, :, : prefix.length] = prefix.values
        filled = prefix.length
        for (value, after), decision in zip(placeholder_spans(spans), decisions):
            weights = [w for _, w in decision.chosen]
            found = [a.deviations[node] for a, _ in decision.chosen]
            pieces = [(value, [d.segment for d in found])] + ([(after, [d.after for d in found])] if after else [])
            for span, deviations in pieces:
                start, stop = span["start"], min(span["stop"], n)
                if start != filled:
                    raise ValueError(f"segment map leaves rows {filled}..{start} uncovered")
                base = self.caches.base(rows(ids, span))
                predict_into(
                    keys[:, :, :, start:stop],
                    values[:, :, :, start:stop],
                    base,
                    deviations,
                    weights,
                    lambda src, out, delta=start: self.bb.rerotate(src, delta, out=out),
                )
                filled = stop
        if filled != n:
            raise ValueError(f"segment map covers {filled} of the {n} cached rows")
        return KV(keys, values, torch.arange(n, device=keys.device))

    @torch.inference_mode()
    def store_anchors(self, ids: list[int], spans: list[dict], node: str, full: KV) -> None:
        """After a dense prefill of the whole prompt: each placeholder's deviation, and its
        following text's, for this node (Equation 1), in the base caches' frame. A deviation
        another node or server already computed from the same ids is shared, not recomputed."""
        for value, after in placeholder_spans(spans):
            base = self.caches.base(rows(ids, value))
            key = (tuple(ids[: (after or value)["stop"]]), value["start"], value["stop"])
            shared = self.caches.deviation(key, partial(self.placeholder_deviation, ids, value, after, full))
            self.pool.store(value["name"], tuple(rows(ids, value)), base, node, shared)

    def placeholder_deviation(self, ids: list[int], value: dict, after: dict | None, full: KV) -> Deviation:
        """Equation 1 for one placeholder: real - base of its value and of the text after it."""

        def real_minus_base(span: dict) -> KV:
            real = self.bb.shift(full.slice(span["start"], span["stop"]), -span["start"])
            return deviation(real, self.caches.base(rows(ids, span)))

        return Deviation(real_minus_base(value), real_minus_base(after) if after is not None else None)

    def replay(self, call: dict) -> None:
        """Bring the pool to the state serving `call` left it in, without decoding (for resuming a
        run): count its decisions, re-activate the anchors a reuse call used, and re-store the
        anchors a dense call produced."""
        for decision in call["decisions"]:
            self.pool.counts[decision["reason"]] += 1
        if call["reason"] == REUSE:
            for decision in call["decisions"]:
                for anchor in self.pool.anchors(decision["placeholder"]):
                    anchor.activations += anchor.serial in decision["anchors"]
        else:
            ids = call["merged_ids"]
            self.store_anchors(ids, call["segment_map"], call["node"], self.bb.prefill(ids))
