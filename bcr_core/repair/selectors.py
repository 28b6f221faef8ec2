"""Selectors: what ranks an assembled cache's rows for repair. One protocol (`Selector`), three rules.

`rank(bb, kv, ids, last_id, rows=None, *, context=None) -> Ranking`: the scores of the candidate
`rows` of the assembled cache (default every row; BCR may pass only the predicted ones), higher =
repair first, and the draft a selector ran to score them (kept for a call's trace); `context` (the
arena's `CallContext`) holds what the cache alone does not, for the selectors that read it. `replay(m)`: what ranking m
candidate rows did to the selector's own state, redone without the cache, for a call replayed when
a run resumes (nothing, unless the selector draws from a stream).

- DraftSelector (BCR, Algorithm 2): draft k = 2 tokens, score rows by the attention they got.
- CoinSelector (the random control): a seeded stream that advances once per repaired call and
  draws one uniform per unit of the layout (a chunk, or a row), so every chunk is equally likely;
  no draft, so it spends k fewer decode steps.
- CacheBlendSelector (App. D, ported): the deviation between fresh layer-1 values and the
  assembled cache's layer-1 values, row by row. Fresh values need layer 0 over every row, which
  is exact in an assembled cache, so two layers are run over the whole prompt.
- AttendedDeviationSelector (`ours`, this lab's pre-registered rule): the draft's score times CacheBlend's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from bcr_core import paper
from bcr_core.engine.backbone import Draft
from bcr_core.errors import UsageError
from bcr_core.repair.row_scores import row_scores


@dataclass
class Ranking:
    scores: torch.Tensor  # (len(rows),)
    draft: Draft | None = None


class Selector(ABC):
    """What ranks the rows of an assembled cache for repair; a subclass must define `rank`. Three
    class attributes say how a selector is spent and what it costs:

    - `row_rule`: False for a ranking the chunk layout turns into rows (whole chunks best first),
      True for a rule that names rows itself, whose scores the single layout takes best first.
    - `passes`: forward calls of the model the rule makes per call (a decode step, a prefill of the
      first layers and a full prefill each count one).
    - `reads_exact`: whether it reads the exact cache (`context.exact`), so it is not deployable.
    """

    name: str
    row_rule: bool = False
    passes: int = 0
    reads_exact: bool = False

    @abstractmethod
    def rank(self, bb, kv, ids, last_id, rows=None, *, context=None) -> Ranking:
        """Scores of the candidate `rows` of `kv` (every row when None), higher = repair first."""

    def replay(self, m: int) -> None:
        """Redo the state change of ranking m candidates on a call that repaired rows (none by default)."""
        return


class DraftSelector(Selector):
    """Its passes are its k decode steps (the class attribute is the paper's k)."""

    name, passes = "draft", paper.DRAFT_TOKENS

    def __init__(self, k: int = paper.DRAFT_TOKENS):
        self.k = self.passes = k

    def rank(self, bb, kv, ids, last_id, rows=None, *, context=None) -> Ranking:
        draft = bb.draft(kv, last_id, self.k)
        scores = row_scores(draft.attention)
        return Ranking(scores if rows is None else scores[rows], draft)


class CoinSelector(Selector):
    name, passes = "coin", 0

    def __init__(self, seed: int = 0, unit: int = 1):
        if unit < 1:
            raise UsageError(f"the coin's unit must be >= 1 row, got {unit}")
        self.seed, self.unit = seed, unit
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def rank(self, bb, kv, ids, last_id, rows=None, *, context=None) -> Ranking:
        return Ranking(self.draw(kv.length if rows is None else len(rows)))

    def replay(self, m: int) -> None:
        self.draw(m)  # the stream advanced once on the call

    def draw(self, m: int) -> torch.Tensor:
        """One draw of the stream over m rows: one uniform per unit of `unit` consecutive rows
        (the last unit may be shorter), repeated over its rows."""
        units = torch.from_numpy(self.rng.random(-(-m // self.unit)))
        return units.repeat_interleave(self.unit)[:m]


class CacheBlendSelector(Selector):
    """`layer` is the check layer (CacheBlend's is 1, the default): fresh values there need the
    layers up to it run over the whole prompt, layer + 1 of them."""

    name, passes = "cacheblend", 1  # the prefill of the first layer + 1 layers

    def __init__(self, layer: int = 1):
        if layer < 1:
            raise ValueError(f"CacheBlend's check layer must be >= 1 (layer 0 is exact when assembled), got {layer}")
        self.layer = layer

    def rank(self, bb, kv, ids, last_id, rows=None, *, context=None) -> Ranking:
        fresh, at = bb.prefill_layers(ids, kv.positions, layers=self.layer + 1), self.layer
        deviation = (fresh.values[at] - kv.values[at].to(fresh.values.dtype)).float().norm(dim=-1).mean(dim=(0, 1))
        return Ranking(deviation if rows is None else deviation[rows])


# The deployable selectors by name: a repair condition is one of them and a layout (`conditions`),
# and the arena's field holds them beside its own (`arena.registry`).
class AttendedDeviationSelector(Selector):
    """`ours` (this lab's, PRE-REGISTERED: rule fixed in `bcr_core/arena/context_selectors.py` before any arena item was
    run, moved here unchanged so that a run serves it too, and reported on the second half of the arena's items
    by `bcr_core.arena.measures`, whatever they say): rows both attended and wrong. Row j scores a_j x d_j, a_j
    the draft's Algorithm 2 score (`DraftSelector`, k = 2 tokens) and d_j CacheBlend's layer-1 value deviation
    (`CacheBlendSelector(layer=1)`): a row the answer reads but whose cache is right, or a wrong row nobody
    reads, scores low. Passes: the draft's two steps and a two-layer prefill."""

    name, row_rule, passes = "ours", False, 3

    def __init__(self):
        self.draft, self.cacheblend = DraftSelector(), CacheBlendSelector(layer=1)

    def rank(self, bb, kv, ids, last_id, rows=None, *, context=None) -> Ranking:
        drafted = self.draft.rank(bb, kv, ids, last_id)
        scores = drafted.scores.cpu() * self.cacheblend.rank(bb, kv, ids, last_id).scores.cpu()
        return Ranking(scores if rows is None else scores[rows], drafted.draft)


SELECTORS: dict[str, type[Selector]] = {
    cls.name: cls for cls in (DraftSelector, CoinSelector, CacheBlendSelector, AttendedDeviationSelector)
}
