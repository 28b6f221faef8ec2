"""The segments of an assembled prompt: where each placeholder's value lies, which rows KVComm
predicts, and the exact caches (node prefixes, segment bases) and anchor deviations every
KVComm-based server reads."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.kv import KV
from bcr_core.reuse.prompts import Prompt, base_prefix, tokenize


class SegmentCaches:
    """Exact caches keyed by token content: node prefixes (at position 0) and base caches (a segment
    behind begin-of-text and the user-turn header, `prompts.base_prefix`, moved to position 0). A base
    is computed once per distinct segment, when the segment is first seen, and shared by every call that uses it.

    Anchor deviations are kept here too, keyed by the ids they were computed from: the rows of a
    dense prefill up to position p depend only on ids[:p], so two nodes (or two servers) that
    prefilled the same text hold the same deviation, and hold it once. Only anchors keep them
    alive: the store forgets a deviation when the last anchor holding it is evicted."""

    def __init__(self, bb: Backbone, max_bases: int = 256):
        self.bb = bb
        self.base_prefix_ids = tokenize(bb.tokenizer, base_prefix(bb.tokenizer))
        self.prefixes: dict[tuple[int, ...], KV] = {}
        self.bases: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self.max_bases = max_bases
        self.deviations: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def deviation(self, key: tuple, compute: Callable):
        """The deviation stored under `key` (the ids it depends on and its rows), computing it once."""
        found = self.deviations.get(key)
        if found is None:
            found = compute()
            self.deviations[key] = found
        return found

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
        h = len(self.base_prefix_ids)
        base = self.bb.shift(self.bb.prefill(self.base_prefix_ids + list(ids)).slice(h), -h)
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


class SharedPrefills:
    """Dense prefills of whole prompts, kept for other servers that prefill the same ids. In a cell
    every condition's first agent reads the same prompt, and a later agent's prompt is the same
    wherever the answers before it agree, so most dense prefills repeat across conditions. A
    prefill depends on its ids alone and the engine never writes into a served cache, so a shared
    prefill is bit-identical to computing it again. The `keep` most recently used are kept."""

    def __init__(self, bb: Backbone, keep: int = 16):
        self.bb, self.keep = bb, keep
        self.kept: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self.computed = self.shared = 0

    def __call__(self, ids: list[int]) -> KV:
        key = tuple(ids)
        if key in self.kept:
            self.kept.move_to_end(key)
            self.shared += 1
            return self.kept[key]
        self.kept[key] = kv = self.bb.prefill(ids)
        self.computed += 1
        if len(self.kept) > self.keep:
            self.kept.popitem(last=False)
        return kv


class PrefixPrefills(SharedPrefills):
    """`SharedPrefills` that also extends the kept prefill sharing the longest exact prefix with a
    new prompt (`Backbone.extend`), as serving engines' prefix caches do: prompts of different
    conditions for the same agent agree up to the first answer that differs, and every call of a
    node starts with the node's system prompt. A prompt whose ids equal a kept one's is served that
    prefill, bit-identical; an extended one equals a fresh prefill within float rounding
    (`tests/test_prefix_prefills.py` states the tolerance), not bit for bit. A common prefix shorter
    than `min_rows` is prefilled from scratch."""

    def __init__(self, bb: Backbone, keep: int = 32, min_rows: int = 16):
        super().__init__(bb, keep)
        self.min_rows = min_rows
        self.extended = self.rows_reused = 0

    def __call__(self, ids: list[int]) -> KV:
        key = tuple(ids)
        if key in self.kept:
            return super().__call__(ids)
        kept, common = self.longest_common_prefix(key)
        if common < self.min_rows:
            return super().__call__(ids)
        kv = kept.truncate(common) if common == len(key) else self.bb.extend(kept.truncate(common), key[common:])
        self.kept[key] = kv
        self.extended, self.rows_reused = self.extended + 1, self.rows_reused + common
        if len(self.kept) > self.keep:
            self.kept.popitem(last=False)
        return kv

    def longest_common_prefix(self, key: tuple[int, ...]) -> tuple[KV | None, int]:
        """The kept prefill sharing the longest prefix with `key`, and that prefix's length."""
        best, length = None, 0
        for ids, kv in reversed(self.kept.items()):  # the most recent first, among equals
            n = common_prefix(ids, key)
            if n > length:
                best, length = kv, n
        return best, length


def common_prefix(a, b) -> int:
    """How many leading ids two sequences share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def share_segment_caches(bb: Backbone, servers) -> SegmentCaches:
    """Give every KVComm-based server one store of exact caches. They are keyed by token content and
    exact, so sharing changes no result; it computes each base cache once instead of once per server."""
    caches = SegmentCaches(bb)
    for server in servers:
        server.share_caches(caches)
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


def text_rows(tokenizer, ids: list[int], span: dict, text: str, char_spans) -> list[int]:
    """The rows of a segment whose ids are `text` tokenized alone (as the reuse path tokenizes a placeholder's
    value) that cover `char_spans` of the text, in order: a row belongs when the characters it was cut from
    overlap a span. [] when the segment's ids are not the text tokenized alone."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if encoded["input_ids"] != rows(ids, span):
        return []
    return [
        span["start"] + j
        for j, (a, b) in enumerate(encoded["offset_mapping"])
        if b > a and any(a < stop and start < b for start, stop in char_spans)
    ]
