"""Sliding-window attention: which cached rows each layer may see.

Some decoders limit some or all layers to a window of the most recent rows: Mistral and Phi-3 every
layer (`config.sliding_window`), Gemma 3 five layers in six, Qwen2/Qwen3 the layers past
`max_window_layers` when `use_sliding_window` is set. A query at position p on such a layer sees the
keys at positions p - window + 1 .. p (HF's `sliding_window_causal_mask_function`).

Hugging Face's default cache keeps only the window's rows on those layers, so there row index and
position part ways. The lab keeps every layer full length instead (one `KV` stacks all layers) and
applies each layer's window through the attention mask; attention over the masked rows is zero, so
the result is HF's own forward exactly. HF's forward accepts one 4-D mask for all layers, or, in the
families with per-layer types, a dict from layer type to mask: `mask_argument` builds whichever the
model's windows need.
"""

from __future__ import annotations

import torch

FULL, SLIDING = "full_attention", "sliding_attention"  # HF's layer type names


def layer_windows(config) -> dict[str, int | None]:
    """Each layer type's window in rows (None: global attention) for the types the model uses."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not types:  # one kind of layer: HF windows all of them when the config sets a window
        return {FULL: window}
    return {kind: (window if kind == SLIDING else None) for kind in set(types)}


def within_window(
    allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, window: int | None
) -> torch.Tensor:
    """`allowed` (..., q, T) narrowed to keys less than `window` positions behind each query."""
    if window is None:
        return allowed
    return allowed & (key_positions[..., None, :] > query_positions[..., :, None] - window)


def mask_argument(
    config, allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, dtype: torch.dtype
):
    """HF's `attention_mask` for a boolean "may attend" (B, q, T) that ignores windows: one additive
    4-D mask (B, 1, q, T) when every layer has the same window, else {layer type: mask}."""
    windows = layer_windows(config)
    masks = {
        kind: additive_mask(within_window(allowed, query_positions, key_positions, w), dtype)[:, None]
        for kind, w in windows.items()
    }
    if len(set(windows.values())) == 1:
        return next(iter(masks.values()))
    return masks


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "may attend" matrix as the additive float mask HF's attention adds to its scores."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)
