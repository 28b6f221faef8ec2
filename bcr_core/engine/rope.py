"""Re-rotating RoPE-encoded keys to a new position.

RoPE rotates each key pair by an angle proportional to its position, so R(p + d) = R(d) R(p):
a key cached at position p moves to p + d by one more rotation by d. Values carry no position
and never rotate. The angles come from the model's own rotary module, so rope scaling variants
(llama3, dynamic, linear, longrope) are honoured; its `attention_scaling` factor is divided out
because it was already applied once when the key was first encoded.

What the families add:
- Gemma 3 has one rotary module with a base per layer type (local layers 10k, global 1M): each
  layer is re-rotated with its own (`layer_rotations`).
- Phi-3 variants with a `partial_rotary_factor` rotate only the first part of the head dim; the
  rest passes through unchanged, as in their `apply_rotary_pos_emb`.
- Qwen3 and Gemma 3 normalise keys per head before RoPE: cached keys are post-norm, post-RoPE, so a
  rotation by d stays exact.
Longrope picks its short or long frequencies from the largest position it is called with; a
rotation by d is computed with the set |d| selects, which is the short one for any shift inside
the original context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The Llama-family pairing: (x1, x2) -> (-x2, x1) over the two halves of the head dim."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


@dataclass(frozen=True)
class Rotation:
    """One kind of layer's rotary embedding: the module, and the layer type it takes (Gemma 3)."""

    module: torch.nn.Module
    layer_type: str | None = None

    @property
    def scale(self) -> float:
        name = "attention_scaling" if self.layer_type is None else f"{self.layer_type}_attention_scaling"
        return getattr(self.module, name, 1.0)

    def angles(self, delta: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (float32) of the rotation by `delta` (shape (T,) or scalar), shaped (T, rotary dim)."""
        delta = torch.as_tensor(delta, device=like.device).reshape(1, -1)
        probe = torch.empty(0, dtype=torch.float32, device=like.device)  # the module reads only dtype and device
        extra = () if self.layer_type is None else (self.layer_type,)
        cos, sin = self.module(probe, delta, *extra)
        return cos[0] / self.scale, sin[0] / self.scale


def layer_rotations(model) -> list[Rotation]:
    """The rotation each decoder layer of a Hugging Face causal LM applies to its keys."""
    base = model.base_model
    types = getattr(base.rotary_emb, "layer_types", None)  # set only by per-layer-type modules (Gemma 3)
    if types is None:
        return [Rotation(base.rotary_emb)] * model.config.num_hidden_layers
    return [Rotation(base.rotary_emb, kind) for kind in model.config.layer_types]


def rotation(rotary_emb: torch.nn.Module, delta: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (float32) of the rotation by `delta` positions of a single-kind rotary module."""
    return Rotation(rotary_emb).angles(delta, like)


def rerotate(
    keys: torch.Tensor,
    delta: int | torch.Tensor,
    rotary_emb: torch.nn.Module | Rotation,
    out: torch.Tensor | None = None,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Shift keys (..., T, D) by `delta` positions: one shift for all rows, or one per row (T,).

    Computed in float32 as x cos + rotate_half(x) sin, half by half over the rotary part of the head
    dim, written into `out` (which may be a view into a larger cache) without intermediate
    full-size tensors. `angles` reuses cos and sin already computed for this delta.
    """
    rot = rotary_emb if isinstance(rotary_emb, Rotation) else Rotation(rotary_emb)
    cos, sin = angles if angles is not None else rot.angles(delta, keys)
    exact = keys.float()
    rotated = torch.empty_like(exact) if out is None or out.dtype != torch.float32 else out
    dim = cos.shape[-1]  # < head dim under a partial rotary factor
    half = dim // 2
    x1, x2, r1, r2 = exact[..., :half], exact[..., half:dim], rotated[..., :half], rotated[..., half:dim]
    torch.mul(x1, cos[..., :half], out=r1).addcmul_(x2, sin[..., :half], value=-1)
    torch.mul(x2, cos[..., half:], out=r2).addcmul_(x1, sin[..., half:])
    if dim < keys.shape[-1]:
        rotated[..., dim:].copy_(exact[..., dim:])
    if out is None:
        return rotated.to(keys.dtype)
    if rotated is not out:
        out.copy_(rotated)
    return out


def rerotate_layers(
    keys: torch.Tensor, delta: int | torch.Tensor, rotations: list[Rotation], out: torch.Tensor | None = None
) -> torch.Tensor:
    """`rerotate` for keys (L, ..., T, D) stacked over layers, each layer with its own rotation."""
    if keys.shape[0] != len(rotations):
        raise ValueError(
            f"keys stack {keys.shape[0]} layers but the model has {len(rotations)}: "
            "re-rotate a whole cache's keys (layers first)"
        )
    if len(set(rotations)) == 1:
        return rerotate(keys, delta, rotations[0], out=out)
    out = torch.empty_like(keys) if out is None else out
    angles = {rot: rot.angles(delta, keys) for rot in set(rotations)}
    for layer, rot in enumerate(rotations):
        rerotate(keys[layer], delta, rot, out=out[layer], angles=angles[rot])
    return out
