"""The three layouts a repair budget is spent in (paper §3, "The layouts"; App. B).

A layout turns row scores (higher = more worth repairing) and a budget rho of the M cached rows
into the sorted rows to recompute. Ties go to the earlier row or chunk, so selections are
deterministic. The budget always counts the whole cache; the scores may cover only some of its
rows (the candidates, e.g. the rows KVComm predicted), and then only those can be chosen.

- chunk: fixed B-row chunks on a grid over the candidates, each scored by the mean of its rows;
  the best round(rho * M / B) chunks (Algorithm 1), at most every chunk there is. rho = 1 takes
  every chunk, so it covers every row even when B does not divide M.
- grow: seed on the best unrepaired row, extend the span towards the better neighbour while that
  neighbour scores >= tau * the seed's score, up to a span cap, until round(rho * M) rows.
- single: the round(rho * M) best rows.

Row-matched (`exactly`): a control paired with a BCR condition recomputes exactly the rows that
condition recomputes on the call (App. D's "row for row"): the single layout takes that many best
rows; the chunk layout takes whole chunks in score order and cuts the last one it needs to its
first rows, so the count is exact and the unit stays the chunk.

Rounding is Python's round(): halves go to the even integer (round(2.5) = 2, round(3.5) = 4).
Skip rule (Algorithm 1, line 1), the same for every layout unless `skip="off"`: serve unrepaired
if M < 2B or rho * M < B, B the chunk size. With it off, a call is skipped only when the budget
buys nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bcr_core import paper
from bcr_core.errors import UsageError
from bcr_core.repair.row_scores import group_scores

SKIP_RULES = ("alg1", "off")
RANKS = ("all", "predicted")


@dataclass(frozen=True)
class LayoutConfig:
    chunk: int = paper.CHUNK_ROWS
    tau: float = paper.GROW_TAU
    span_cap: int = paper.GROW_SPAN_CAP
    skip: str = "alg1"  # Algorithm 1's skip rule on every layout, or "off"

    def __post_init__(self):
        if self.chunk < 1 or self.span_cap < 1 or not 0.0 <= self.tau <= 1.0:
            raise UsageError(f"need chunk >= 1, span_cap >= 1 and tau in [0, 1]; got {self}")
        if self.skip not in SKIP_RULES:
            raise UsageError(f"skip must be one of {', '.join(SKIP_RULES)}; got {self.skip!r}")


def check_rho(rho: float) -> None:
    if not 0.0 <= rho <= 1.0:
        raise UsageError(f"the repair budget rho must lie in [0, 1], got {rho}")


def best(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` highest scores, ties to the lower index."""
    order = torch.sort(-scores.double(), stable=True).indices
    return order[:count]


class Layout:
    name = "layout"

    def __init__(self, config: LayoutConfig = LayoutConfig()):
        self.config = config

    def count(self, m: int, rho: float) -> int:
        """Units (rows, or chunks for the chunk layout) the budget buys on an M-row cache."""
        return round(rho * m)

    def skip(self, m: int, rho: float) -> bool:
        """True when the call is served unrepaired (Algorithm 1, line 1, or a budget of nothing)."""
        b = self.config.chunk
        return (self.config.skip == "alg1" and (m < 2 * b or rho * m < b)) or self.count(m, rho) == 0

    def select(self, scores: torch.Tensor, count: int) -> torch.Tensor:
        """The rows of `count` units chosen by `scores` (at most what the scores cover)."""
        raise NotImplementedError

    def rows(self, scores: torch.Tensor, rho: float, m: int | None = None) -> torch.Tensor:
        """The sorted indices (into `scores`) of the rows to recompute; empty when skipped.
        `m` is the whole cache the budget counts (default: the rows the scores cover)."""
        check_rho(rho)
        m = scores.numel() if m is None else m
        if scores.numel() > m:
            raise ValueError(f"{scores.numel()} scores for a cache of {m} rows")
        if self.skip(m, rho) or scores.numel() == 0:
            return torch.empty(0, dtype=torch.long)
        return self.select(scores.detach().cpu(), self.count(m, rho)).sort().values

    def bounds(self, m: int, rho: float) -> tuple[int, int]:
        """(fewest, most) rows this layout recomputes on an M-row cache whose every row is a candidate."""
        if self.skip(m, rho):
            return 0, 0
        return self.count(m, rho), self.count(m, rho)

    def exactly(self, scores: torch.Tensor, rows: int) -> torch.Tensor:
        """The sorted indices (into `scores`) of exactly `rows` rows chosen in this layout's unit."""
        if not 0 <= rows <= scores.numel():
            raise ValueError(f"cannot choose {rows} rows out of {scores.numel()} candidates")
        return self.take(scores.detach().cpu(), rows).sort().values

    def take(self, scores: torch.Tensor, rows: int) -> torch.Tensor:
        raise ValueError(f"the {self.name} layout has no row-matched selection")


class Single(Layout):
    name = "single"

    def select(self, scores, count):
        return best(scores, min(count, scores.numel()))

    def take(self, scores, rows):
        return best(scores, rows)


class Chunk(Layout):
    name = "chunk"

    def count(self, m, rho):
        chunks = math.ceil(m / self.config.chunk)
        return chunks if rho == 1.0 else min(chunks, round(rho * m / self.config.chunk))

    def select(self, scores, count):
        b, n = self.config.chunk, scores.numel()
        chosen = best(group_scores(scores, b), count)
        return torch.cat([torch.arange(c * b, min((c + 1) * b, n)) for c in chosen.tolist()])

    def take(self, scores, rows):
        b, n = self.config.chunk, scores.numel()
        order = best(group_scores(scores, b), -(-n // b)).tolist()  # every chunk, best first
        ranked = [j for c in order for j in range(c * b, min((c + 1) * b, n))]
        return torch.tensor(ranked[:rows], dtype=torch.long)

    def bounds(self, m, rho):
        if self.skip(m, rho):
            return 0, 0
        count, b = self.count(m, rho), self.config.chunk
        short = m - (math.ceil(m / b) - 1) * b  # the trailing chunk's rows
        return (count - 1) * b + min(short, b), count * b


class Grow(Layout):
    name = "grow"

    def select(self, scores, count):
        m, target = scores.numel(), min(count, scores.numel())
        values = scores.double().tolist()
        taken = [False] * m
        order = best(scores, m).tolist()
        count = 0
        for seed in order:
            if count >= target:
                break
            if taken[seed]:
                continue
            taken[seed], count, lo, hi = True, count + 1, seed, seed
            floor = self.config.tau * values[seed]
            while count < target and hi - lo + 1 < self.config.span_cap:
                left = lo - 1 if lo > 0 and not taken[lo - 1] and values[lo - 1] >= floor else None
                right = hi + 1 if hi + 1 < m and not taken[hi + 1] and values[hi + 1] >= floor else None
                if left is None and right is None:
                    break
                step = left if right is None or (left is not None and values[left] >= values[right]) else right
                taken[step], count = True, count + 1
                lo, hi = min(lo, step), max(hi, step)
        return torch.tensor([j for j in range(m) if taken[j]], dtype=torch.long)


LAYOUTS = {cls.name: cls for cls in (Chunk, Grow, Single)}


def layout(name: str, config: LayoutConfig = LayoutConfig()) -> Layout:
    try:
        return LAYOUTS[name](config)
    except KeyError:
        raise UsageError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}") from None
