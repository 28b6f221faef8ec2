"""Serving several requests at once: lanes whose decoding is batched.

A lane is one request's steps (`Pipeline.steps`): a generator that runs prefills, gates and
repairs itself and yields a `Decode` whenever it needs tokens. The scheduler advances every lane to
its next `Decode`, then decodes all waiting requests in one `Backbone.generate_batch`, and repeats.
On a CPU a decode step costs about the same for one sequence as for several (it is bound by reading
the weights), so batching decoding is where the throughput is; prefills and repairs stay per call.

Which lanes may run side by side is the caller's rule (`may_start`): the runner lets a stateful
condition (KVComm's anchor pool) serve its items strictly one after another, in order, so every
server sees exactly the calls it would see at batch size 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Hashable

from bcr_core.serving import Decode


@dataclass
class Unit:
    """A request waiting to run: `key` names it, `start()` makes its steps."""

    key: Hashable
    start: Callable[[], Generator]


@dataclass
class Lane:
    unit: Unit
    steps: Generator
    waiting: Decode | None = None


def run_lanes(bb, units: list[Unit], width: int, may_start: Callable[[Unit, list[Unit]], bool],
              finished: Callable[[Unit, Any], None]) -> None:
    """Run `units` with up to `width` lanes at once, in list order wherever `may_start` allows.

    `may_start(unit, running)` says whether `unit` may start beside the running ones; `finished`
    receives each unit and its steps' return value as soon as it ends.
    """
    if width < 1:
        raise ValueError(f"batch size must be >= 1, got {width}")
    queue, lanes = list(units), []

    def advance(lane: Lane, value) -> None:
        try:
            lane.waiting = lane.steps.send(value)
        except StopIteration as done:
            lanes.remove(lane)
            finished(lane.unit, done.value)

    while queue or lanes:
        started = True
        while started and len(lanes) < width:
            running = [lane.unit for lane in lanes]
            unit = next((u for u in queue if may_start(u, running)), None)
            started = unit is not None
            if started:
                queue.remove(unit)
                lane = Lane(unit, unit.start())
                lanes.append(lane)
                advance(lane, None)
        if not lanes:
            if queue:
                raise RuntimeError("no waiting unit may start although nothing runs: check may_start")
            break
        for lane, generation in zip(list(lanes), decode_all(bb, [lane.waiting for lane in lanes])):
            advance(lane, generation)


def decode_all(bb, requests: list[Decode]) -> list:
    """Answer every request: plain ones in one batch, ones that keep logits one by one."""
    plain = [i for i, r in enumerate(requests) if not r.keep_logits]
    answers = [None] * len(requests)
    if plain:
        batch = bb.generate_batch([(requests[i].kv, requests[i].last_id, requests[i].max_new_tokens) for i in plain])
        for i, generation in zip(plain, batch):
            answers[i] = generation
    for i, r in enumerate(requests):
        if r.keep_logits:
            answers[i] = bb.generate(r.kv, r.last_id, r.max_new_tokens, keep_logits=True)
    return answers
