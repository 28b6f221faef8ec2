"""Two attention kernels, registered with Hugging Face's AttentionInterface so the model's own
forward runs them in place of its default, and the switch between kernels.

The switch is per thread, not a setting of the shared model: every `Backbone`'s model runs
`DISPATCH`, which calls the kernel `kernel(name)` chose in the calling thread (or context), SDPA
by default, and builds that kernel's mask. So a worker thread decoding on the model (the explorer's
live answers) and a draft on another thread each get the kernel they asked for, and switches nest.

- `BLOCKED` (repair): queries are cut into blocks and each block attends only to the key prefix
  it can see. A repaired row sees every row at or before its position; with the default kernel a
  repair of a fifth of a 4096-row cache pays attention to all 4096 rows for every selected row,
  about twice the causal work. Same SDPA math per block, grouped-query heads not copied.
- `GROUPED_EAGER` (draft): softmax attention that returns its weights, like HF's eager kernel,
  but computes grouped-query heads by reshaping the queries instead of copying the keys and values
  once per query head. It is registered with HF's eager mask builder too, so a decode step through
  it gets the same causal and sliding-window masks HF builds for its own eager kernel (without one,
  HF would pass no mask at all, and a sliding-window layer would see every row).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from bcr_core import paper

BLOCKED, GROUPED_EAGER = "bcr_blocked_sdpa", "bcr_grouped_eager"
DISPATCH = "bcr_dispatch"  # the implementation every Backbone's model runs: this thread's kernel
DEFAULT_KERNEL = "sdpa"
_chosen = contextvars.ContextVar("bcr_attention_kernel", default=DEFAULT_KERNEL)
QUERY_BLOCK = paper.CHUNK_ROWS  # rows per query block: repair tiles its queries a chunk at a time
KEY_GRID_CUDA = 256  # a GPU's key extents, rounded up to this: few shapes, so attention plans are built once each


def key_grid(device: torch.device) -> int:
    """The grid key extents are rounded up to: `KEY_GRID_CUDA` on a GPU, whose attention kernels build a
    plan per shape (an unpadded repair's many extents made the coin's p90 3x its median at 4096 rows);
    1 on a CPU, which builds none. The rows added are masked, so the result is the same attention."""
    return KEY_GRID_CUDA if torch.device(device).type == "cuda" else 1


def key_extents(allowed: torch.Tensor, block: int = QUERY_BLOCK, grid: int = 1) -> list[tuple[int, int, int]]:
    """(first query, end query, end key) per block of `block` rows of a boolean (q, T) mask: no
    query of the block sees a key at or beyond `end key`, rounded up to a multiple of `grid` (at most T)."""
    plan, total = [], allowed.shape[1]
    for q0 in range(0, allowed.shape[0], block):
        q1 = min(q0 + block, allowed.shape[0])
        columns = allowed[q0:q1].any(0).nonzero()
        end = int(columns[-1]) + 1 if len(columns) else 1
        plan.append((q0, q1, min(-(-end // grid) * grid, total)))
    return plan


def blocked_sdpa(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    query_blocks: list[tuple[int, int, int]] | None = None,
    **kwargs,
):
    """SDPA block by block over `query_blocks` (from `key_extents`); without a plan, one block."""
    blocks = query_blocks or [(0, query.shape[2], key.shape[2])]
    gqa = query.shape[1] != key.shape[1]
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])
    for q0, q1, k_end in blocks:
        mask = None if attention_mask is None else attention_mask[:, :, q0:q1, :k_end]
        block = F.scaled_dot_product_attention(
            query[:, :, q0:q1], key[:, :, :k_end], value[:, :, :k_end], attn_mask=mask, scale=scaling, enable_gqa=gqa
        )
        out[:, q0:q1] = block.transpose(1, 2)
    return out, None


def grouped_eager(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs
):
    """Eager attention with weights (B, H_q, q, T); query head h reads key/value head h // groups."""
    b, h_q, q, d = query.shape
    h_kv, t = key.shape[1], key.shape[2]
    groups = h_q // h_kv
    scores = torch.matmul(query.reshape(b, h_kv, groups * q, d), key.transpose(2, 3)) * scaling
    scores = scores.view(b, h_kv, groups, q, t)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, :t]
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights.view(b, h_kv, groups * q, t), value).view(b, h_q, q, d)
    return out.transpose(1, 2).contiguous(), weights.view(b, h_q, q, t)


AttentionInterface.register(BLOCKED, blocked_sdpa)
AttentionInterface.register(GROUPED_EAGER, grouped_eager)
AttentionMaskInterface.register(GROUPED_EAGER, eager_mask)


def current_kernel() -> str:
    """The attention kernel the model runs in this thread (or context) now."""
    return _chosen.get()


@contextlib.contextmanager
def kernel(name: str) -> Iterator[None]:
    """Run the model's attention through `name` (`eager`, `sdpa`, `BLOCKED`, `GROUPED_EAGER`) in this
    thread until the block ends; other threads keep theirs."""
    token = _chosen.set(name)
    try:
        yield
    finally:
        _chosen.reset(token)


def dispatched_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    attention_kernel: str | None = None,
    attention_weights: list | None = None,
    **kwargs,
):
    """The kernel named by `attention_kernel`, else the one this thread chose; `eager` is the model's
    own eager function (HF keeps one per architecture). With `attention_weights` (a list), each
    layer's weights are appended to it in layer order. Both are forward keywords HF passes down to
    every layer.

    A step traced whole (`engine.static`) passes both: its kernel is then fixed when the step is built
    and its weights are a list the step owns, where the context variables of the kernel switch and of
    HF's `output_attentions` hooks are read per layer per call, which `torch.compile` cannot trace."""
    name = attention_kernel or _chosen.get()
    if name == "eager":
        forward = sys.modules[type(module).__module__].eager_attention_forward
    else:
        forward = ALL_ATTENTION_FUNCTIONS[name]
    out, weights = forward(module, query, key, value, attention_mask, **kwargs)
    if attention_weights is not None:
        if weights is None:
            raise ValueError(f"attention kernel {name!r} returns no weights: use {GROUPED_EAGER!r} or 'eager'")
        attention_weights.append(weights)
    return out, weights


def dispatched_mask(*args, **kwargs):
    """The chosen kernel's mask, as HF builds it for that kernel; None for one that builds none
    (`BLOCKED`, whose callers pass their own 4-D masks)."""
    build = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(_chosen.get())
    return None if build is None else build(*args, **kwargs)


AttentionInterface.register(DISPATCH, dispatched_attention)
AttentionMaskInterface.register(DISPATCH, dispatched_mask)
