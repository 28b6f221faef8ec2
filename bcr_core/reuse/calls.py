"""One agent call as every server serves it: the decode requests it yields, and the record it returns.

A server's `steps(prompt, max_new_tokens)` is a generator that yields `Decode` requests and returns
a `CallRecord`; `drive` answers each request at once, the batched runner answers several together.
A served cache stops one token short of the prompt; the final prompt token is fed at decode, so
every method shares one decode path and TTFT (from before cache assembly to the first token) is
comparable across them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

import torch

from bcr_core.engine.backbone import Backbone, Draft, Generation
from bcr_core.engine.kv import KV
from bcr_core.engine.stopping import StopRule
from bcr_core.reuse.anchors import REUSE
from bcr_core.reuse.segments import predicted_rows


class Cached(NamedTuple):
    """A served cache and the prompt's last id, which decoding feeds first (the cache stops one row
    short of the prompt)."""

    kv: KV
    last_id: int


@dataclass
class Trace:
    """Inside a call served from an assembled cache, kept when the caller asks (`server.trace = True`):
    the cache before any repair, a draft on it (the selector's own when it drafted, so none is run
    twice), and the selector's scores of its candidate rows. The rows repaired are the record's."""

    assembled: KV
    draft: Draft
    candidates: torch.Tensor | None = None  # the rows the selector ranked (None: no selection ran)
    scores: torch.Tensor | None = None  # their scores, higher = repair first


def mode_of(reason: str) -> str:
    """A call's mode from its reason: "reuse" when the gate passed it, else "dense"."""
    return REUSE if reason == REUSE else "dense"


def wasted_rows(segment_map: list[dict], cached_rows: int, repaired_rows: list[int]) -> int:
    """How many repaired rows lie outside what KVComm predicted (the agent's exact prefix)."""
    predicted = set(predicted_rows(segment_map, cached_rows))
    return sum(row not in predicted for row in repaired_rows)


@dataclass
class CallRecord:
    """What serving one call did. Built by the server that served it, with keyword arguments; it
    stores nothing another field implies: `mode` and the row counts are properties (and
    `run_folder.derive` gives a reader of the stored dict the same), and which ids were served follows
    from the condition (Dense the chat template's, every other the reuse path's)."""

    node: str
    role: str
    condition: str
    reason: str  # "dense" for dense-only servers; "reuse" if served from an assembled cache; else why not
    dense_ids: list[int]  # the chat template's ids of the prompt
    merged_ids: list[int]  # the reuse path's (segment by segment); token-matched Dense serves these
    output_tokens: list[int]
    output_text: str
    ttft_s: float
    total_s: float
    repaired_rows: list[int] = field(default_factory=list)
    skipped: bool = False  # served from an assembled cache that the repair's skip rule left unrepaired
    segment_map: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    fidelity: dict = field(default_factory=dict)  # in-situ comparison with Dense on the same prompt, if asked
    assembly_s: float = 0.0  # anchor matching and cache assembly (KVComm-based servers), inside the TTFT
    served: Cached | None = field(default=None, repr=False)  # not serialised
    trace: Trace | None = field(default=None, repr=False)  # when asked; not serialised

    @property
    def mode(self) -> str:
        """`reuse` (served from an assembled cache) or `dense`: what the reason says."""
        return mode_of(self.reason)

    @property
    def rows_recomputed(self) -> int:
        return len(self.repaired_rows)

    @property
    def rows_wasted(self) -> int:
        """Repaired rows that were already exact (the agent's prefix): budget that changed nothing."""
        return wasted_rows(self.segment_map, len(self.merged_ids) - 1, self.repaired_rows)

    def to_dict(self) -> dict:
        record = asdict(replace(self, served=None, trace=None))  # the caches are not copied, only dropped
        del record["served"], record["trace"]
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
    prior: tuple[int, ...] = ()  # the answer's tokens decoded before this request (a continuation's)
    stop_rule: StopRule | None = None  # set by the pipeline for every request of a call (`engine.stopping`)
    keep_cache: bool = False  # the Generation carries the cache after decoding (`Backbone.generate`)

    def now(self, bb: Backbone) -> Generation:
        """Answer the request on the spot, alone."""
        return bb.generate(
            self.kv,
            self.last_id,
            self.max_new_tokens,
            keep_logits=self.keep_logits,
            stop_rule=self.stop_rule,
            prior=self.prior,
            keep_cache=self.keep_cache,
        )


def drive(bb: Backbone, steps: Generator):
    """Run a server's (or pipeline's) steps to the end, decoding each request as it comes."""
    value = None
    while True:
        try:
            request = steps.send(value)
        except StopIteration as done:
            return done.value
        value = request.now(bb)


def stopping(steps: Generator, stop_rule: StopRule | None) -> Generator:
    """A server's (or a call's) steps with `stop_rule` set on every `Decode` they yield."""
    if stop_rule is None:
        return (yield from steps)
    value = None
    while True:
        try:
            request = steps.send(value)
        except StopIteration as done:
            return done.value
        value = yield replace(request, stop_rule=stop_rule)


def decode_call(kv: KV, last_id: int, max_new_tokens: int, started: float, keep_cache: bool = False):
    """Greedy decoding from a served cache (yields one `Decode`); TTFT and total seconds counted from `started`."""
    generation = yield Decode(kv, last_id, max_new_tokens, keep_cache=keep_cache)
    return generation, generation.first_token_at - started, time.perf_counter() - started


@dataclass
class Served:
    """What decoding from an assembled cache gave a KVComm-based server: the cache decoding started
    from, its tokens and times, the rows repaired, and (for the call's trace) the selector's work."""

    kv: KV
    tokens: list[int]
    ttft: float
    total: float
    repaired_rows: list[int] = field(default_factory=list)
    skipped: bool = False  # a repair server's skip rule left the assembled cache as it was
    candidates: torch.Tensor | None = None  # the rows a selector ranked, and their scores
    scores: torch.Tensor | None = None
    draft: Draft | None = None  # the selector's draft, if it drafted


@dataclass(frozen=True)
class Refused:
    """What a KVComm-based server's `serve_assembled` returns when it declines the assembled cache:
    the call goes to the dense path and `reason` is recorded as the call's reason."""

    reason: str


class Server(ABC):
    """A serving policy, the protocol every server follows (the runner, the pipeline and the lanes
    call nothing else). `steps(prompt, max_new_tokens)` is a generator that yields `Decode` requests
    and returns the `CallRecord`; a subclass must define it. `serve` runs it with immediate decoding.

    - `stateless`: True when a call does not depend on earlier calls, so items may be served in any
      order; False (the default) makes the runner serve the condition's items one at a time, in order.
    - `replay(call)`: bring the server's state to what serving the stored `call` (its record as a
      dict) left it in, without decoding; called for every finished call when a run resumes. A
      stateless server has nothing to replay (the default).
    - `share_caches(caches)`: take a shared store of exact segment caches (`segments.SegmentCaches`);
      a server that reads none ignores it (the default).

    - `shares_work`: True (the default) lets a batched run hand the server another server's dense prefill
      of the same ids and its decode (`SharedPrefills`, `lanes.SharedDecodes`); False keeps all its work
      its own (`dense-again`, whose point is to compute again).

    Set `trace` to keep a `Trace` on every call served from an assembled cache. Set `prefills` (a
    `segments.SharedPrefills`) to take dense prefills of ids another server already prefilled."""

    bb: Backbone
    name: str
    stateless: bool = False
    shares_work: bool = True  # may take another server's dense prefill and decode of the same ids (batched runs)
    trace: bool = False
    prefills = None

    @abstractmethod
    def steps(self, prompt, max_new_tokens: int) -> Generator[Decode, Generation, CallRecord]:
        """Serve one call: yield `Decode` requests, return the `CallRecord`."""

    def serve(self, prompt, max_new_tokens: int) -> CallRecord:
        return drive(self.bb, self.steps(prompt, max_new_tokens))

    def prefill(self, ids: list[int]) -> KV:
        """A call's dense prefill: computed here, or taken from the shared store when one is set."""
        return self.bb.prefill(ids) if self.prefills is None else self.prefills(ids)

    def replay(self, call: dict) -> None:
        """Nothing to bring back by default (a stateless server)."""
        return

    def share_caches(self, caches) -> None:
        """Nothing to share by default (a server that reads no segment caches)."""
        return
