"""Re-rotating RoPE-encoded keys to a new position.

RoPE rotates each key pair by an angle proportional to its position, so R(p + d) = R(d) R(p):
a key cached at position p moves to p + d by one more rotation by d. Values carry no position
and never rotate. The angles come from the model's own rotary module, so rope scaling variants
(llama3, dynamic, linear) are honoured; its `attention_scaling` factor is divided out because it
was already applied once when the key was first encoded.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The Llama-family pairing: (x1, x2) -> (-x2, x1) over the two halves of the head dim."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotation(rotary_emb: torch.nn.Module, delta: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (float32) of the rotation by `delta` positions (shape (T,) or scalar), shaped (T, D)."""
    delta = torch.as_tensor(delta, device=like.device).reshape(1, -1)
    cos, sin = rotary_emb(like.float(), delta)
    scale = getattr(rotary_emb, "attention_scaling", 1.0)
    return cos[0] / scale, sin[0] / scale


def rerotate(keys: torch.Tensor, delta: int | torch.Tensor, rotary_emb: torch.nn.Module) -> torch.Tensor:
    """Shift keys (..., T, D) by `delta` positions: one shift for all rows, or one per row (T,)."""
    cos, sin = rotation(rotary_emb, delta, keys)
    exact = keys.float()
    return (exact * cos + rotate_half(exact) * sin).to(keys.dtype)
