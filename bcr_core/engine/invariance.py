"""Batch-invariant decoding: a sequence's tokens and logits are bit for bit the same whether it is decoded
alone (`Backbone.generate`, over a static slab) or in a batch of any size beside any other sequences
(`BatchDecoder`, over a left-padded cache), as a lane's fidelity reference, or after a resume.

Two things made a row's arithmetic depend on its batch (Thinking Machines, "Defeating Nondeterminism in LLM
Inference", 2025, and its batch_invariant_ops, whose kernels are GPU-only):
- the matrix products: a BLAS picks its kernel by the number of rows, so one row alone (a matrix-vector
  product) sums in another order than the same row among eight; measured here on an AMD EPYC, float32
  differs from 2 rows on and the 2-3-row kernel differs from the 4-row one. Every linear layer of a decode
  step therefore runs as products of exactly `ROWS` rows, the batch padded with zero rows and cut into
  blocks (`fixed_row_linear`): one shape, whatever the batch. A row's result in such a product does not
  depend on where it sits or what its companions hold (the tests check both on the real models);
- attention over a padded batch: a row's keys sit behind other rows' padding, at columns that move with
  its companions, and a masked kernel's blocking follows the columns. Each row attends instead over exactly
  its own visible keys, gathered into a tensor of their own (`row_by_row_sdpa`): the same tensor from a slab
  or from a left-padded batch.
The rest of a decode step works row by row (norms, rotary embeddings, activations) and needs nothing.

Prefills, repairs and teacher-forced passes are each one request's own forward, whose shapes never depend
on other requests: they are left as they were. On a GPU the serving step is a captured CUDA graph, which
cannot read the visible keys on the host; there decoding stays as it was (no invariance is promised).
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import AttentionInterface

from bcr_core.engine.kernels import DEFAULT_KERNEL, current_kernel, kernel

ROWS = 8  # rows of every matrix product in a float32 decode step


def decode_rows(dtype: torch.dtype) -> int:
    """The rows of a decode step's products for a model in `dtype`: 8 in float32, where a product is bound by
    reading the weights and eight rows cost about what one does (batching keeps most of its gain); 1 in half
    precision, whose products a CPU without bfloat16 matrix units computes row by row anyway (measured on an
    AMD EPYC: 1-row products kept 100% of the batch-1 decoder's speed where 8-row ones kept 12%). Either is
    invariant: what matters is that the shape never changes (docs/performance.md)."""
    return ROWS if dtype == torch.float32 else 1


ROW_BY_ROW = "bcr_row_by_row_sdpa"


def fixed_row_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block: int = ROWS
) -> torch.Tensor:
    """`F.linear` computed as products of exactly `block` rows (zero rows pad the last one)."""
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    padded = torch.cat([rows, rows.new_zeros(-m % block, rows.shape[1])]) if m % block else rows
    out = torch.cat([F.linear(part, weight, bias) for part in padded.split(block)])[:m]
    return out.reshape(*x.shape[:-1], out.shape[-1])


class DecodeStep(threading.local):
    """The rows of every product while this thread runs a batch-invariant decode step; None outside one."""

    rows: int | None = None


decode_step = DecodeStep()


def decode_step_rows() -> int | None:
    """The rows of every product of the decode step this thread is running (`FixedRowProducts`), or None."""
    return decode_step.rows


class FixedRowProducts(TorchFunctionMode):
    """Every `F.linear` (every `nn.Linear` of the model) inside the block runs as `fixed_row_linear`."""

    def __init__(self, block: int = ROWS):
        super().__init__()
        self.block = block
        self.outer = None

    def __enter__(self):
        self.outer, decode_step.rows = decode_step.rows, self.block
        return super().__enter__()

    def __exit__(self, *exc):
        decode_step.rows = self.outer
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            return fixed_row_linear(*args, **(kwargs or {}), block=self.block)
        return func(*args, **(kwargs or {}))


class VisibleColumns(threading.local):
    """Each batch row's visible key columns under one mask, found once per mask and thread: a step hands the
    same mask to every layer of a kind, and finding them is a host sync."""

    mask, columns = None, ()

    def __call__(self, mask: torch.Tensor) -> list[torch.Tensor]:
        if mask is not self.mask:
            self.columns = [(row[0] == 0).any(0).nonzero().squeeze(1) for row in mask]
            self.mask = mask
        return self.columns


visible_columns = VisibleColumns()


def row_by_row_sdpa(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs
):
    """SDPA for each batch row over only the key columns its additive mask leaves visible, gathered."""
    batch, heads, queries, dim = query.shape
    out = query.new_empty(batch, queries, heads, dim)
    gqa = heads != key.shape[1]
    columns = None if attention_mask is None else visible_columns(attention_mask)
    for b in range(batch):
        k, v, mask = key[b : b + 1], value[b : b + 1], None
        if columns is not None:
            k, v = k.index_select(2, columns[b]), v.index_select(2, columns[b])
            mask = attention_mask[b : b + 1, :, :, columns[b]] if queries > 1 else None
        attended = F.scaled_dot_product_attention(query[b : b + 1], k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)
        out[b] = attended[0].transpose(0, 1)
    return out, None


AttentionInterface.register(ROW_BY_ROW, row_by_row_sdpa)


def invariant(bb) -> bool:
    """Whether `bb` decodes batch-invariantly: on a CPU, through the plain step (module docstring), unless
    `bb.batch_invariant` was turned off to measure what invariance costs (benchmarks/batch_invariance.py)."""
    return bb.batch_invariant and bb.device.type == "cpu" and bb.steps.mode == "plain"


@contextlib.contextmanager
def invariant_decoding(bb):
    """The block's decode steps run batch-invariantly (`invariant`); a kernel the caller chose on purpose
    (eager, to compare kernels) is kept."""
    if not invariant(bb) or current_kernel() != DEFAULT_KERNEL:
        yield
        return
    with kernel(ROW_BY_ROW), FixedRowProducts(bb.decode_rows):
        yield
