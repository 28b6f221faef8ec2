"""What a selector may read beside the cache: the call's segment map, its place in the run and, for the
K/V-error rankings only, the exact cache of the same ids. Deployable selectors read at most the segment map
(a BCR server hands it over on every call, the arena too); a rule that reads `exact` is a ceiling, not a
method, and only the arena runs it."""

from __future__ import annotations

from dataclasses import dataclass, field

from bcr_core.engine.kv import KV
from bcr_core.reuse.segments import placeholder_spans


@dataclass(frozen=True)
class CallContext:
    spans: list[dict]  # the prompt's segment map (`Prompt.segment_map()`, reuse path)
    key: tuple[int, ...] = ()  # the call's place in the run (item index, call number): seeds per-call coins
    exact: KV | None = field(default=None, repr=False)  # the exact cache of the same ids (token-matched Dense)

    def segments(self, m: int) -> list[tuple[int, int]]:
        """The reused segments of an M-row assembled cache, in prompt order: every placeholder's
        value and the template text after it, each a piece KVComm predicted on its own
        (`[start, stop)`, clipped to the cache; empty pieces left out)."""
        pieces = [piece for pair in placeholder_spans(self.spans) for piece in pair if piece is not None]
        clipped = [(p["start"], min(p["stop"], m)) for p in pieces]
        return [(start, stop) for start, stop in clipped if stop > start]

    def trailing_start(self, m: int) -> int:
        """The first row of the prompt's own trailing text: the template text after the last
        placeholder (the instruction after the last shared segment); M when nothing follows it."""
        pairs = placeholder_spans(self.spans)
        if not pairs:
            return m
        value, _ = pairs[-1]
        return min(value["stop"], m)

    def need_exact(self, who: str) -> KV:
        if self.exact is None:
            raise ValueError(
                f"the {who} selector reads the exact cache: pass CallContext(exact=...) (the arena does; a run cannot)"
            )
        return self.exact
