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
- QuestionSelector, SeamsSelector, WindowSelector: the rules that read the segment map (the prompt's own
  trailing text run over the cache; the first rows after every seam; a window after every seam in
  proportion to its segment).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from bcr_core import paper
from bcr_core.engine.backbone import Draft
from bcr_core.engine.kernels import GROUPED_EAGER
from bcr_core.errors import UsageError
from bcr_core.repair.call_context import CallContext
from bcr_core.repair.row_scores import row_scores

EXACT_ROW = -1.0e9  # a row rule's score for a row KVComm did not predict: chosen only after every predicted row


@dataclass
class Ranking:
    scores: torch.Tensor  # (len(rows),)
    draft: Draft | None = None


def candidate_scores(scores: torch.Tensor, rows) -> torch.Tensor:
    return scores if rows is None else scores[torch.as_tensor(rows, dtype=torch.long)]


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


class AttendedDeviationSelector(Selector):
    """`ours` (this lab's, PRE-REGISTERED: rule fixed in the arena's selector module before any arena item was
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


def trailing_attention(bb, kv, ids, last_id, start: int) -> torch.Tensor:
    """(layers, queries, query heads, M): the attention the prompt's trailing tokens (rows
    `start`..M-1 of the prompt and its last token) pay to the cache's rows when run forward over
    the assembled rows before `start`, causally among themselves. The cache is not modified."""
    m = kv.length
    trailing = [int(t) for t in ids[start:m]] + [int(last_id)]
    cache = kv.truncate(start).to_cache(room=len(trailing))
    fed = torch.tensor([trailing], device=bb.device)
    positions = torch.arange(start, start + len(trailing), device=bb.device)[None]
    with torch.inference_mode(), bb.attention_implementation(GROUPED_EAGER):
        out = bb.model(
            input_ids=fed, position_ids=positions, cache=cache, use_cache=True, output_attentions=True, logits_to_keep=1
        )
    return torch.stack([a[0, :, :, :m].transpose(0, 1) for a in out.attentions]).float()


class QuestionSelector(Selector):
    """`question` (the A3 / ProphetKV family in its plainest form, no draft): the prompt's own
    trailing tokens, the template text after the last placeholder (the instruction after the last
    shared segment) and the prompt's final token, are run forward over the assembled cache before
    them. Kept: their softmax attention weights on every cached row, at every layer (layer 1
    included) and query head. Fused: row j scores the sum over layers of the mean over those
    queries and query heads. Their own rows are scored by the attention among themselves. The
    forward is discarded (one pass)."""

    name, row_rule, passes = "question", False, 1

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        context = context or CallContext([])
        attention = trailing_attention(bb, kv, ids, last_id, context.trailing_start(kv.length))
        return Ranking(candidate_scores(attention.mean(dim=(1, 2)).sum(dim=0).cpu(), rows))


class SeamsSelector(Selector):
    """`seams` (EPIC's LegoLink, the attention sink at every seam): the first rows of every reused
    segment (each placeholder's value and the text after it, `CallContext.segments`), spread
    evenly: every segment's first row, then every segment's second row, and so on, in prompt order
    at each depth, until the count; rows KVComm did not predict only after every predicted row.
    Row j of a segment starting at s scores -(j - s)."""

    name, row_rule, passes = "seams", True, 0

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        scores = torch.full((kv.length,), EXACT_ROW, dtype=torch.float64)
        for start, stop in (context or CallContext([])).segments(kv.length):
            scores[start:stop] = -torch.arange(stop - start, dtype=torch.float64)
        return Ranking(candidate_scores(scores, rows))


class WindowSelector(Selector):
    """`window` (arXiv 2609.17983, "Contiguity, Not Importance"): a contiguous window right after
    each seam, every segment's window the same share of its length. Row j of a segment [s, e)
    scores -(j - s + 1/2) / (e - s), so the count is apportioned over the segments by their lengths
    as Webster's (Sainte-Lague's) divisor method does: a segment of L rows gets about R x L / P of
    R rows (P the predicted rows), each window contiguous from its seam, ties to the earlier row;
    rows KVComm did not predict only after every predicted row. Where `seams` gives every segment
    the same number of rows, `window` gives every segment the same fraction."""

    name, row_rule, passes = "window", True, 0

    def rank(self, bb, kv, ids, last_id, rows=None, *, context: CallContext | None = None) -> Ranking:
        scores = torch.full((kv.length,), EXACT_ROW, dtype=torch.float64)
        for start, stop in (context or CallContext([])).segments(kv.length):
            scores[start:stop] = -(torch.arange(stop - start, dtype=torch.float64) + 0.5) / (stop - start)
        return Ranking(candidate_scores(scores, rows))


# The deployable selectors by name: a repair condition is one of them and a layout (`conditions`),
# and the arena's field holds them beside its own (`arena.registry`).
SELECTORS: dict[str, type[Selector]] = {
    cls.name: cls
    for cls in (
        DraftSelector,
        CoinSelector,
        CacheBlendSelector,
        AttendedDeviationSelector,
        QuestionSelector,
        SeamsSelector,
        WindowSelector,
    )
}
