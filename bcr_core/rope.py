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
    probe = torch.empty(0, dtype=torch.float32, device=like.device)  # the module reads only dtype and device
    cos, sin = rotary_emb(probe, delta)
    scale = getattr(rotary_emb, "attention_scaling", 1.0)
    return cos[0] / scale, sin[0] / scale


def rerotate(keys: torch.Tensor, delta: int | torch.Tensor, rotary_emb: torch.nn.Module,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Shift keys (..., T, D) by `delta` positions: one shift for all rows, or one per row (T,).

    Computed in float32 as x cos + rotate_half(x) sin, half by half, written into `out` (which
    may be a view into a larger cache) without intermediate full-size tensors.
    """
    cos, sin = rotation(rotary_emb, delta, keys)
    exact = keys.float()
    rotated = torch.empty_like(exact) if out is None or out.dtype != torch.float32 else out
    half = keys.shape[-1] // 2
    x1, x2, r1, r2 = exact[..., :half], exact[..., half:], rotated[..., :half], rotated[..., half:]
    torch.mul(x1, cos[..., :half], out=r1).addcmul_(x2, sin[..., :half], value=-1)
    torch.mul(x2, cos[..., half:], out=r2).addcmul_(x1, sin[..., half:])
    if out is None:
        return rotated.to(keys.dtype)
    if rotated is not out:
        out.copy_(rotated)
    return out
