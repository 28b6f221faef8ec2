"""Draft scoring (paper §3, Algorithm 2): rank cached rows by the attention the draft paid them.

Row j scores a_j = sum over layers l > 1 of the mean over draft steps t and query heads h of
softmax(Q_{t,h} K_h^T / sqrt(d))_j. Eager attention already expands grouped-query keys to query
heads, so `Backbone.draft`'s attention (layers, k, query_heads, rows) is scored as it comes.
A group of rows scores the mean of its rows, so a short trailing chunk is not penalised.
"""

from __future__ import annotations

import torch


def row_scores(attention: torch.Tensor) -> torch.Tensor:
    """(layers, steps, heads, rows) attention -> (rows,) scores; the first layer is left out."""
    if attention.dim() != 4 or attention.shape[0] < 2:
        raise ValueError(f"expected (layers >= 2, steps, heads, rows) attention, got {tuple(attention.shape)}")
    return attention[1:].mean(dim=(1, 2)).sum(dim=0)


def group_scores(scores: torch.Tensor, size: int) -> torch.Tensor:
    """Mean score of consecutive groups of `size` rows; the last group may be shorter."""
    if size < 1:
        raise ValueError(f"group size must be >= 1, got {size}")
    groups = -(-scores.numel() // size)
    padded = scores.new_zeros(groups * size)
    padded[: scores.numel()] = scores
    counts = (scores.numel() - torch.arange(groups, device=scores.device) * size).clamp(max=size)
    return padded.view(groups, size).sum(dim=1) / counts
