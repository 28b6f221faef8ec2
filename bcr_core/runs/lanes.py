"""Serving several requests at once: lanes whose decoding is batched.

A lane is one request's steps (`Pipeline.steps`): a generator that runs prefills, gates and
repairs itself and yields a `Decode` whenever it needs tokens. Waiting requests decode together in
one `BatchDecoder`, one token per step; a lane whose sequence ends runs on to its next request,
which joins the batch, and a finished lane makes room for the next unit.
On a CPU a decode step costs about the same for one sequence as for several (it is bound by reading
the weights), so batching decoding is where the throughput is; prefills and repairs stay per call.
A request identical to one decoding or just decoded (the same cache object, last id, token budget,
stop rule and prior tokens: Dense's prefill of a prompt, shared with the `--fidelity` reference and
every condition that prefilled the same ids) is answered with that request's tokens instead of
decoding them again (`SharedDecodes`).

Which lanes may run side by side is the caller's rule (`may_start`): the runner lets a stateful
condition (KVComm's anchor pool) serve its items strictly one after another, in order, so every
server sees exactly the calls it would see at batch size 1.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, replace
from typing import Any

from bcr_core.engine.backbone import Generation
from bcr_core.engine.batching import BatchDecoder
from bcr_core.errors import UsageError
from bcr_core.reuse.calls import Decode


@dataclass
class Unit:
    """A request waiting to run: `key` names it, `start()` makes its steps."""

    key: Hashable
    start: Callable[[], Generator]


@dataclass(eq=False)  # a lane is itself: hashed by identity
class Lane:
    unit: Unit
    steps: Generator


class SharedDecodes:
    """Decode requests already answered, or being answered, in one batch run: a request for the same
    cache object with the same last id, token budget, stop rule and prior tokens gets the same
    tokens (a copy of the `Generation`, its first token timed when it is handed over), within the
    float rounding batched decoding allows anyway. The `keep` most recent answers are kept; entries
    name their cache and stop rule weakly, so an object that is gone is never matched."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self.answered: OrderedDict[tuple, tuple[weakref.ref, object, Generation]] = OrderedDict()
        # key -> (cache, rule, [(waiting lane, when it joined)])
        self.running: dict[tuple, tuple[weakref.ref, object, list]] = {}
        self.decoded = self.shared = 0

    @staticmethod
    def key(request: Decode) -> tuple:
        return (id(request.kv), int(request.last_id), request.max_new_tokens, id(request.stop_rule), request.prior)

    @staticmethod
    def matches(entry: tuple, request: Decode) -> bool:
        return entry[0]() is request.kv and entry[1] is request.stop_rule

    def answer(self, request: Decode) -> Generation | None:
        """A copy of the answer to an identical request decoded before, if one is kept."""
        key = self.key(request)
        found = self.answered.get(key)
        if found is None or not self.matches(found, request):
            return None
        self.answered.move_to_end(key)
        self.shared += 1
        return handed_over(found[2], time.perf_counter())

    def join(self, request: Decode, lane) -> bool:
        """Wait for an identical request being decoded, if there is one; else `lane` decodes it."""
        key = self.key(request)
        found = self.running.get(key)
        if found is not None and self.matches(found, request):
            found[2].append((lane, time.perf_counter()))
            self.shared += 1
            return True
        self.running[key] = (weakref.ref(request.kv), request.stop_rule, [])
        self.decoded += 1
        return False

    def finish(self, request: Decode, generation: Generation) -> list:
        """Keep `generation` as the answer to `request`; return the lanes that waited for it, each with
        when it joined."""
        key = self.key(request)
        cache, rule, waiting = self.running.pop(key)
        self.answered[key] = (cache, rule, generation)
        if len(self.answered) > self.keep:
            self.answered.popitem(last=False)
        return waiting


def handed_over(generation: Generation, at: float) -> Generation:
    """A copy of a shared answer for another request: its own token list, its first token known no
    earlier than `at` (when it was handed over) so that call's times stay its own."""
    return replace(generation, tokens=list(generation.tokens), first_token_at=max(generation.first_token_at, at))


class Lanes:
    """The lanes `run_lanes` runs: each advanced until it waits in the batch or ends, the decode
    requests they wait on, and the decodes they share."""

    def __init__(self, bb, width: int, finished: Callable[[Unit, Any], None], share_decodes: bool):
        self.bb, self.finished, self.share_decodes = bb, finished, share_decodes
        self.running: list[Lane] = []
        self.decoder = BatchDecoder(bb) if width > 1 else None
        self.shared, self.waiting = SharedDecodes(), {}  # waiting: lane -> the request it waits on

    def start(self, unit: Unit) -> None:
        lane = Lane(unit, unit.start())
        self.running.append(lane)
        self.advance(lane, None)

    def advance(self, lane: Lane, value) -> None:
        """Run the lane until it waits in the batch or ends; requests that keep logits are answered on the spot."""
        while True:
            try:
                request: Decode = lane.steps.send(value)
            except StopIteration as done:
                self.running.remove(lane)
                self.finished(lane.unit, done.value)
                return
            if self.decoder is not None and not request.keep_logits:
                value = self.shared.answer(request) if self.share_decodes else None
                if value is not None:
                    continue
                self.waiting[lane] = request
                if not (self.share_decodes and self.shared.join(request, lane)):
                    self.decoder.add(
                        lane, request.kv, request.last_id, request.max_new_tokens, request.stop_rule, request.prior
                    )
                return
            value = request.now(self.bb)

    def step(self) -> None:
        """One batched decoding step; every lane whose sequence finished runs on, and those that shared its decode."""
        for lane, generation in self.decoder.step():
            request = self.waiting.pop(lane)
            followers = self.shared.finish(request, generation) if self.share_decodes else []
            self.advance(lane, generation)
            for follower, joined in followers:  # a follower that joined after the first token knows it on joining
                self.waiting.pop(follower)
                self.advance(follower, handed_over(generation, joined))


def run_lanes(
    bb,
    units: list[Unit],
    width: int,
    may_start: Callable[[Unit, list[Unit]], bool],
    finished: Callable[[Unit, Any], None],
    share_decodes: bool = True,
) -> None:
    """Run `units` with up to `width` lanes at once, in list order wherever `may_start` allows.

    `may_start(unit, running)` says whether `unit` may start beside the running ones; `finished`
    receives each unit and its steps' return value as soon as it ends. Decoding is continuous: a
    lane whose sequence finishes runs on at once and its next request joins the running batch.
    At width 1 every request is decoded on the spot, exactly as `drive` does. `share_decodes`
    answers a request identical to one decoded before with its tokens (`SharedDecodes`).
    """
    if width < 1:
        raise UsageError(f"batch size must be >= 1, got {width}")
    queue, lanes = list(units), Lanes(bb, width, finished, share_decodes)
    while True:
        while len(lanes.running) < width:
            running = [lane.unit for lane in lanes.running]
            unit = next((u for u in queue if may_start(u, running)), None)
            if unit is None:
                break
            queue.remove(unit)
            lanes.start(unit)
        if not lanes.running:
            if queue:
                raise RuntimeError("no waiting unit may start although nothing runs: check may_start")
            return
        lanes.step()
