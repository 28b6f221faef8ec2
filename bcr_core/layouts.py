"""The three layouts a repair budget is spent in (paper §3, "The layouts"; App. B).

A layout turns row scores (higher = more worth repairing) and a budget rho of the M cached rows
into the sorted rows to recompute. Ties go to the earlier row or chunk, so selections are
deterministic.

- chunk: fixed B-row chunks on a grid, each scored by the mean of its rows; the best
  round(rho * n_chunks) chunks, n_chunks = ceil(M / B). Algorithm 1 writes round(rho * M / B);
  the two agree when B divides M, and counting whole chunks (as Table 8 does) makes rho = 1
  cover every row. Skip rule: serve unrepaired if M < 2B or rho * M < B.
- grow: seed on the best unrepaired row, extend the span towards the better neighbour while that
  neighbour scores >= tau * the seed's score, up to a span cap, until round(rho * M) rows.
- single: the round(rho * M) best rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bcr_core.draft_scores import group_scores


@dataclass(frozen=True)
class LayoutConfig:
    chunk: int = 64  # B (App. B, Algorithm 1)
    tau: float = 0.25  # grow: a neighbour joins while it scores >= tau * seed (§3)
    span_cap: int = 64  # grow: longest span

    def __post_init__(self):
        if self.chunk < 1 or self.span_cap < 1 or not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"need chunk >= 1, span_cap >= 1 and tau in [0, 1]; got {self}")


def check_rho(rho: float) -> None:
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"the repair budget rho must lie in [0, 1], got {rho}")


def best(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` highest scores, ties to the lower index."""
    order = torch.sort(-scores.double(), stable=True).indices
    return order[:count]


class Layout:
    name = "layout"

    def __init__(self, config: LayoutConfig = LayoutConfig()):
        self.config = config

    def skip(self, m: int, rho: float) -> bool:
        """True when this budget buys no repair on an M-row cache."""
        return round(rho * m) == 0

    def select(self, scores: torch.Tensor, rho: float) -> torch.Tensor:
        raise NotImplementedError

    def rows(self, scores: torch.Tensor, rho: float) -> torch.Tensor:
        """The sorted rows to recompute (empty when the budget is skipped)."""
        check_rho(rho)
        if self.skip(scores.numel(), rho):
            return torch.empty(0, dtype=torch.long)
        return self.select(scores.detach().cpu(), rho).sort().values


class Single(Layout):
    name = "single"

    def select(self, scores, rho):
        return best(scores, round(rho * scores.numel()))


class Chunk(Layout):
    name = "chunk"

    def skip(self, m, rho):
        b = self.config.chunk
        return m < 2 * b or rho * m < b

    def select(self, scores, rho):
        b, m = self.config.chunk, scores.numel()
        count = round(rho * math.ceil(m / b))
        chosen = best(group_scores(scores, b), count)
        return torch.cat([torch.arange(c * b, min((c + 1) * b, m)) for c in chosen.tolist()])


class Grow(Layout):
    name = "grow"

    def select(self, scores, rho):
        m, target = scores.numel(), round(rho * scores.numel())
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
        raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}") from None
