"""Serving one agent call: Dense, token-matched Dense, or KVComm reuse.

Every server returns a `CallRecord`. A served cache stops one token short of the prompt; the
final prompt token is fed to `Backbone.generate`, so every method shares one decode path and
TTFT (from before cache assembly to the first token) is comparable across them.

KVComm (DESIGN §3): the call's cache is assembled from the node's exact prefix cache and, for
each placeholder in order, the predicted cache of its value and of the template text after it,
keys re-rotated to their offsets. If any placeholder fails the gate, the call is prefilled densely
over the reuse path's ids (so segment boundaries are exact) and anchors are stored from it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Generator

import torch

from bcr_core.anchors import REUSE, AnchorPool, Deviation, GateDecision, KVCommConfig, deviation, predict_into
from bcr_core.backbone import Backbone, Generation
from bcr_core.kv import KV
from bcr_core.prompts import Prompt, base_header, tokenize


@dataclass
class CallRecord:
    node: str
    role: str
    condition: str
    mode: str  # "dense" or "reuse"
    reason: str  # "dense" for dense-only servers; else the gate's reason (first failing placeholder)
    served_ids: list[int]  # the ids whose cache was served (dense path or reuse path)
    dense_ids: list[int]
    merged_ids: list[int]
    output_tokens: list[int]
    output_text: str
    ttft_s: float
    total_s: float
    rows_recomputed: int = 0
    repaired_rows: list[int] = field(default_factory=list)
    rows_wasted: int = 0  # repaired rows that were already exact (the agent's prefix): budget that changed nothing
    skipped: bool = False  # served from an assembled cache that the repair's skip rule left unrepaired
    segment_map: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    fidelity: dict = field(default_factory=dict)  # in-situ comparison with Dense on the same prompt, if asked
    assembly_s: float = 0.0  # anchor matching and cache assembly (KVComm-based servers), inside the TTFT
    served: tuple[KV, int] | None = field(default=None, repr=False)  # (cache, last id); not serialised

    def to_dict(self) -> dict:
        record = asdict(self) | {"served": None}
        del record["served"]
        return record


@dataclass
class Decode:
    """What a server's `steps` yields when it needs greedy decoding from a served cache; it is sent
    back the `Generation`. Whoever drives the steps decides when and how: `drive` decodes at once,
    the batched runner decodes the requests of several calls together."""

    kv: KV
    last_id: int
    max_new_tokens: int
    keep_logits: bool = False

    def now(self, bb: Backbone) -> Generation:
        """Answer the request on the spot, alone."""
        return bb.generate(self.kv, self.last_id, self.max_new_tokens, keep_logits=self.keep_logits)


def drive(bb: Backbone, steps: Generator):
    """Run a server's (or pipeline's) steps to the end, decoding each request as it comes."""
    value = None
    while True:
        try:
            request = steps.send(value)
        except StopIteration as done:
            return done.value
        value = request.now(bb)


def decode_call(kv: KV, last_id: int, max_new_tokens: int, started: float):
    """Greedy decoding from a served cache (yields one `Decode`); TTFT and total seconds counted from `started`."""
    generation = yield Decode(kv, last_id, max_new_tokens)
    return generation, generation.first_token_at - started, time.perf_counter() - started


class Server:
    """A serving policy. `steps(prompt, max_new_tokens)` is a generator that yields `Decode`
    requests and returns the `CallRecord`; `serve` runs it with immediate decoding."""

    bb: Backbone

    def serve(self, prompt: Prompt, max_new_tokens: int) -> CallRecord:
        return drive(self.bb, self.steps(prompt, max_new_tokens))

    def steps(self, prompt: Prompt, max_new_tokens: int) -> Generator[Decode, Generation, CallRecord]:
        raise NotImplementedError


@dataclass
class Served:
    kv: KV  # the cache decoding started from
    tokens: list[int]
    ttft: float
    total: float
    repaired_rows: list[int] = field(default_factory=list)
    skipped: bool = False  # a repair server's skip rule left the assembled cache as it was


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
        kv = self.bb.prefill(ids[:-1])
        generation, ttft, total = yield from decode_call(kv, ids[-1], max_new_tokens, started)
        return CallRecord(
            prompt.template.node, prompt.template.role, self.name, "dense", "dense", ids, prompt.dense_ids,
            prompt.merged_ids, generation.tokens, self.bb.decode(generation.tokens), ttft, total,
            segment_map=prompt.segment_map(dense=not self.token_matched), served=(kv, ids[-1]),
        )


class SegmentCaches:
    """Exact caches keyed by token content: node prefixes (at position 0) and base caches
    (a segment behind the user-turn header alone, moved to position 0). A base is computed once
    per distinct segment, when the segment is first seen, and shared by every call that uses it."""

    def __init__(self, bb: Backbone, max_bases: int = 256):
        self.bb = bb
        self.header_ids = tokenize(bb.tokenizer, base_header(bb.tokenizer))
        self.prefixes: dict[tuple[int, ...], KV] = {}
        self.bases: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self.max_bases = max_bases

    def prefix(self, ids: list[int]) -> KV:
        key = tuple(ids)
        if key not in self.prefixes:
            self.prefixes[key] = self.bb.prefill(ids)
        return self.prefixes[key]

    def base(self, ids: list[int]) -> KV:
        key = tuple(ids)
        if key in self.bases:
            self.bases.move_to_end(key)
            return self.bases[key]
        h = len(self.header_ids)
        base = self.bb.shift(self.bb.prefill(self.header_ids + list(ids)).slice(h), -h)
        self.bases[key] = base
        if len(self.bases) > self.max_bases:
            self.bases.popitem(last=False)
        return base

    def prepare(self, prompt: Prompt) -> None:
        """Compute the caches a call will read (outside its TTFT: the released code builds a
        segment's base when the segment is produced, not when it is consumed)."""
        self.prefix(prompt.segments[0].ids)
        for segment in prompt.segments[1:]:
            self.base(segment.ids)


def share_segment_caches(bb: Backbone, servers) -> SegmentCaches:
    """Give every KVComm-based server one store of exact caches. They are keyed by token content and
    exact, so sharing changes no result; it computes each base cache once instead of once per server."""
    caches = SegmentCaches(bb)
    for server in servers:
        if hasattr(server, "caches"):
            server.caches = caches
    return caches


def placeholder_spans(segment_map: list[dict]) -> list[tuple[dict, dict | None]]:
    """(value span, the span of the template text after it or None), in prompt order."""
    spans = []
    for i, span in enumerate(segment_map):
        if span["placeholder"]:
            nxt = segment_map[i + 1] if i + 1 < len(segment_map) else None
            spans.append((span, nxt if nxt is not None and nxt["name"] == f"after:{span['name']}" else None))
    return spans


def predicted_rows(spans: list[dict], m: int) -> list[int]:
    """The rows of an M-row assembled cache that KVComm predicted: every placeholder's value and the
    template text after it. The rest (the agent's own prefix) is exact."""
    covered = [(v["start"], v["stop"]) for pair in placeholder_spans(spans) for v in pair if v is not None]
    return [j for start, stop in covered for j in range(start, min(stop, m))]


def rows(ids: list[int], span: dict) -> list[int]:
    return ids[span["start"] : span["stop"]]


class KVCommServer(Server):
    """The reuse baseline: anchor pool, entropy gate, offset prediction, dense fallback."""

    stateless = False  # the anchor pool carries every call into the next

    def __init__(self, bb: Backbone, config: KVCommConfig = KVCommConfig(), name: str | None = None):
        self.bb = bb
        self.config = config
        self.pool = AnchorPool(config)
        self.caches = SegmentCaches(bb)
        self.name = name or (f"kvcomm@{config.gamma:g}" if config.gamma != KVCommConfig.gamma else "kvcomm")

    def steps(self, prompt: Prompt, max_new_tokens: int):
        self.caches.prepare(prompt)
        ids, spans, node = prompt.merged_ids, prompt.segment_map(), prompt.template.node
        started = time.perf_counter()
        decisions = self.gate(ids, spans, node)
        reason = self.allocate(decisions, node)
        served, assembly_s = None, time.perf_counter() - started
        if reason == REUSE:
            assembled = self.assemble(ids, spans, node, decisions)
            assembly_s = time.perf_counter() - started
            served = yield from self.serve_assembled(assembled, ids, max_new_tokens, started, spans)
            if served is None:
                reason = self.refusal
            else:
                for d in decisions:
                    self.pool.activate(d)
        if served is None:
            kv = self.bb.prefill(ids[:-1])
            generation, ttft, total = yield from decode_call(kv, ids[-1], max_new_tokens, started)
            full = KV.from_cache(generation.cache, torch.arange(len(ids)))  # the prompt's rows, the last included
            self.store_anchors(ids, spans, node, full)
            served = Served(kv, generation.tokens, ttft, total)
        predicted = set(predicted_rows(spans, len(ids) - 1))
        return CallRecord(
            node, prompt.template.role, self.name, "reuse" if reason == REUSE else "dense", reason, ids,
            prompt.dense_ids, ids, served.tokens, self.bb.decode(served.tokens), served.ttft, served.total,
            rows_recomputed=len(served.repaired_rows), repaired_rows=served.repaired_rows,
            rows_wasted=sum(j not in predicted for j in served.repaired_rows), skipped=served.skipped,
            segment_map=spans, decisions=[d.to_dict() for d in decisions], served=(served.kv, ids[-1]),
            assembly_s=assembly_s,
        )

    # -- hooks for the policies built on this server ----------------------------------------
    refusal = "refused"  # the reason recorded when serve_assembled declines the assembled cache

    def allocate(self, decisions: list[GateDecision], node: str) -> str:
        """The call's reason: reuse iff every placeholder passed the gate."""
        return next((d.reason for d in decisions if not d.reuse), REUSE)

    def serve_assembled(self, kv: KV, ids: list[int], max_new_tokens: int, started: float, spans: list[dict]):
        """Decode from the assembled cache as it is (KVComm); steps returning a `Served`, or None
        to send the call to the dense path. `spans` is the prompt's segment map."""
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
                predict_into(keys[:, :, :, start:stop], values[:, :, :, start:stop], base, deviations, weights,
                             lambda src, out, delta=start: self.bb.rerotate(src, delta, out=out))
                filled = stop
        if filled != n:
            raise ValueError(f"segment map covers {filled} of the {n} cached rows")
        return KV(keys, values, torch.arange(n, device=keys.device))

    @torch.inference_mode()
    def store_anchors(self, ids: list[int], spans: list[dict], node: str, full: KV) -> None:
        """After a dense prefill of the whole prompt: each placeholder's deviation, and its
        following text's, for this node (Equation 1), in the base caches' frame."""
        for value, after in placeholder_spans(spans):
            base = self.caches.base(rows(ids, value))
            real = self.bb.shift(full.slice(value["start"], value["stop"]), -value["start"])
            after_deviation = None
            if after is not None:
                after_base = self.caches.base(rows(ids, after))
                real_after = self.bb.shift(full.slice(after["start"], after["stop"]), -after["start"])
                after_deviation = deviation(real_after, after_base)
            self.pool.store(value["name"], tuple(rows(ids, value)), base, node, Deviation(deviation(real, base), after_deviation))

    def replay(self, call: dict) -> None:
        """Bring the pool to the state serving `call` left it in, without decoding (for resuming a
        run): count its decisions, re-activate the anchors a reuse call used, and re-store the
        anchors a dense call produced."""
        for decision in call["decisions"]:
            self.pool.counts[decision["reason"]] += 1
        if call["mode"] == "reuse":
            for decision in call["decisions"]:
                for anchor in self.pool.anchors(decision["placeholder"]):
                    anchor.activations += anchor.serial in decision["anchors"]
        else:
            ids = call["merged_ids"]
            self.store_anchors(ids, call["segment_map"], call["node"], self.bb.prefill(ids))
