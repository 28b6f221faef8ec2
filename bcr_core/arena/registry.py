"""Selector names for the arena: `name[:key=value,...]`, e.g. `draft:rank=predicted`,
`coin:seed=2`, `cacheblend:layer=4`. An unknown name or option is one line naming those that
exist; `Entry` is what the arena runs: the rule, the rows it ranks, how its scores become rows,
and what it costs.

Every selector takes `rank=all` (rank every cached row, the paper's rule, the default) or
`rank=predicted` (only rows KVComm predicted; the count is the same, capped at what they hold).
The coin draws afresh on every call from a stream seeded by (its seed, the call's place in the
run), one uniform per chunk (`CoinSelector(unit=chunk)`), so a resumed arena draws what an
unbroken one draws and no stream has to be replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bcr_core import paper, spec_grammar
from bcr_core.arena import error_selectors, search
from bcr_core.conditions import REPAIR, SEED, split_conditions
from bcr_core.errors import UsageError
from bcr_core.repair.call_context import CallContext
from bcr_core.repair.selectors import SELECTORS as DEPLOYABLE
from bcr_core.repair.selectors import CoinSelector, Ranking, Selector
from bcr_core.reuse.segments import predicted_rows
from bcr_core.setting_kinds import Int
from bcr_core.spec_grammar import Family, Option, Spec

RANK = {"rank": REPAIR["rank"]}  # the conditions' own option: one rule for which rows are ranked
OPTIONS: dict[str, dict[str, Option]] = {
    "kv-error": RANK,
    "kv-error-attn": RANK,
    "draft": RANK | {"k": Option(Int(1), paper.DRAFT_TOKENS, "drafted tokens")},
    "coin": RANK | SEED,
    "cacheblend": RANK | {"layer": Option(Int(1), 1, "the check layer")},
    "question": RANK,
    "seams": {},
    "window": {},
    "ours": RANK,
    "searched": {
        "cap": Option(Int(1), search.CAP, "enumerate the chunk layout's sets when at most this many"),
        "evals": Option(Int(0), search.EVALS, "the local search's evaluations per call and budget"),
    },
}
# every selector's class under its name: the deployable ones the repair conditions are made of, and
# the arena's own; `searched` is no ranking (`arena.search` finds its rows)
SELECTORS: dict[str, type[Selector]] = {
    "kv-error": error_selectors.KVErrorSelector,
    "kv-error-attn": error_selectors.AttendedKVErrorSelector,
    **DEPLOYABLE,
}
# names records written before the rename hold: the K/V-error rankings were called oracles
RENAMED = {"oracle": "kv-error", "oracle-attn": "kv-error-attn"}
SELECTOR_SPECS = Family("selector", OPTIONS, valued=False, renamed=RENAMED)
DEFAULT = (
    "kv-error,kv-error-attn,draft,draft:rank=predicted,coin:seed=0,coin:seed=1,coin:seed=2,"
    "cacheblend,cacheblend:layer=3,cacheblend:layer=8,question,seams,window,ours,searched"
)


@dataclass
class Entry:
    """One selector in the arena, under its label."""

    label: str
    name: str
    options: dict
    rule: Callable[[CallContext], object]  # the selector that ranks a call (the coin's is made per call)
    row_rule: bool
    passes: int
    reads_exact: bool = False
    rank_rows: str = "all"
    searched: bool = False  # not a ranking: `arena.search` finds its rows on the measured KL

    def candidates(self, m: int, spans: list[dict]) -> torch.Tensor:
        if self.rank_rows == "all":
            return torch.arange(m)
        return torch.tensor(predicted_rows(spans, m), dtype=torch.long)

    def rank(self, bb, kv, ids, last_id, candidates, context: CallContext) -> Ranking:
        rows = None if self.rank_rows == "all" else candidates
        return self.rule(context).rank(bb, kv, ids, last_id, rows, context=context)


def current_label(label: str) -> str:
    """A stored selector label under today's name (`oracle:rank=predicted` -> `kv-error:rank=predicted`)."""
    head, colon, tail = label.partition(":")
    return RENAMED.get(head, head) + colon + tail


def evals_of(label: str) -> int:
    """A `searched` label's evaluation cap per call and budget."""
    return parse_spec(label).option("evals")


def parse_spec(spec: str) -> Spec:
    """The selector `spec` names (an old name read as today's); a coin's seed is at least 0."""
    selector = SELECTOR_SPECS.read(spec)
    if selector.name == "coin" and selector.options.get("seed", 0) < 0:
        raise UsageError(f"selector {spec!r}: a coin's seed is at least 0")
    return selector


def call_seed(seed: int, key: tuple[int, ...]) -> int:
    """The coin's seed on one call: (its seed, the call's place in the run), mixed by numpy."""
    return int(np.random.SeedSequence([seed, *key]).generate_state(1)[0])


def make_entry(text: str, chunk: int = paper.CHUNK_ROWS) -> Entry:
    spec = parse_spec(text)
    name, options = spec.name, dict(spec.options)
    if spec_grammar.is_coin(name):
        options.setdefault("seed", 0)  # a coin's label always shows its seed
    label = SELECTOR_SPECS.made(name, **options).label  # options at their defaults left out
    if name == "searched":
        return Entry(label, name, options, lambda c: None, False, 0, reads_exact=True, searched=True)
    cls = SELECTORS[name]
    if spec_grammar.is_coin(name):  # a fresh stream on every call, seeded by (its seed, the call's place in the run)
        seed = options["seed"]
        rule, passes = (lambda c: CoinSelector(call_seed(seed, c.key), unit=chunk)), cls.passes
    else:
        selector = cls(**{k: v for k, v in options.items() if k != "rank"})  # draft's k, cacheblend's layer
        rule, passes = (lambda c: selector), selector.passes
    return Entry(label, name, options, rule, cls.row_rule, passes, cls.reads_exact, options.get("rank", "all"))


def make_entries(text: str, chunk: int = paper.CHUNK_ROWS, seeds: list[int] | None = None) -> list[Entry]:
    """The selectors of a comma-separated list (options comma-separated too, as for conditions);
    a `coin` without a seed once per seed in `seeds`. A selector listed twice is refused."""
    specs = spec_grammar.expand_seeds(split_conditions(text), seeds)
    if not specs:
        raise UsageError(f"no selector given; known: {', '.join(OPTIONS)}")
    entries = [make_entry(s, chunk) for s in specs]
    labels = [e.label for e in entries]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise UsageError(f"selector {', '.join(twice)} is listed more than once; list each once")
    return entries
