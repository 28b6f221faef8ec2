"""Serving several requests at once: lanes whose decoding is batched.

A lane is one request's steps (`Pipeline.steps`): a generator that runs prefills, gates and
repairs itself and yields a `Decode` whenever it needs tokens. Waiting requests decode together in
one `BatchDecoder`, one token per step; a lane whose sequence ends runs on to its next request,
which joins the batch, and a finished lane makes room for the next unit.
On a CPU a decode step costs about the same for one sequence as for several (it is bound by reading
the weights), so batching decoding is where the throughput is; prefills and repairs stay per call.

Which lanes may run side by side is the caller's rule (`may_start`): the runner lets a stateful
condition (KVComm's anchor pool) serve its items strictly one after another, in order, so every
server sees exactly the calls it would see at batch size 1.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Any

from bcr_core.engine.batching import BatchDecoder
from bcr_core.errors import UsageError
from bcr_core.reuse.calls import Decode


@dataclass
class Unit:
    """A request waiting to run: `key` names it, `start()` makes its steps."""

    key: Hashable
    start: Callable[[], Generator]


@dataclass
class Lane:
    unit: Unit
    steps: Generator


def run_lanes(
    bb,
    units: list[Unit],
    width: int,
    may_start: Callable[[Unit, list[Unit]], bool],
    finished: Callable[[Unit, Any], None],
) -> None:
    """Run `units` with up to `width` lanes at once, in list order wherever `may_start` allows.

    `may_start(unit, running)` says whether `unit` may start beside the running ones; `finished`
    receives each unit and its steps' return value as soon as it ends. Decoding is continuous: a
    lane whose sequence finishes runs on at once and its next request joins the running batch.
    At width 1 every request is decoded on the spot, exactly as `drive` does.
    """
    if width < 1:
        raise UsageError(f"batch size must be >= 1, got {width}")
    queue, lanes = list(units), []
    decoder = BatchDecoder(bb) if width > 1 else None

    def advance(lane: Lane, value) -> None:
        """Run the lane until it waits in the batch or ends; requests that keep logits are answered on the spot."""
        while True:
            try:
                request: Decode = lane.steps.send(value)
            except StopIteration as done:
                lanes.remove(lane)
                finished(lane.unit, done.value)
                return
            if decoder is not None and not request.keep_logits:
                decoder.add(lane, request.kv, request.last_id, request.max_new_tokens, request.stop_rule, request.prior)
                return
            value = request.now(bb)

    while True:
        while len(lanes) < width:
            running = [lane.unit for lane in lanes]
            unit = next((u for u in queue if may_start(u, running)), None)
            if unit is None:
                break
            queue.remove(unit)
            lane = Lane(unit, unit.start())
            lanes.append(lane)
            advance(lane, None)
        if not lanes:
            if queue:
                raise RuntimeError("no waiting unit may start although nothing runs: check may_start")
            return
        for lane, generation in decoder.step():
            advance(lane, generation)
