"""`KV`: the keys and values of a token span, every layer stacked into one tensor.

Rows are tokens. `positions[j]` is the absolute position row j was (or is claimed to be) encoded
at; keys carry RoPE at that position, values carry no position. Every operation returns a new
`KV` and never writes into its inputs, so a cache handed to a draft or a repair is never changed
behind the caller's back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

ROW_DIM = 3  # keys/values are (layers, batch, kv_heads, rows, head_dim)


@dataclass(frozen=True)
class KV:
    keys: torch.Tensor  # (L, B, H_kv, T, D), RoPE applied at `positions`
    values: torch.Tensor  # (L, B, H_kv, T, D)
    positions: torch.Tensor  # (T,) int64

    def __post_init__(self):
        if self.keys.shape != self.values.shape or self.keys.dim() != 5:
            raise ValueError(
                f"keys {tuple(self.keys.shape)} and values {tuple(self.values.shape)} must share a 5-D shape"
            )
        if self.positions.shape != (self.keys.shape[ROW_DIM],):
            raise ValueError(f"positions {tuple(self.positions.shape)} do not match {self.keys.shape[ROW_DIM]} rows")

    @property
    def length(self) -> int:
        return self.keys.shape[ROW_DIM]

    def __len__(self) -> int:
        return self.length

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def next_position(self) -> int:
        """The position of the token that would follow this span."""
        return int(self.positions[-1]) + 1 if self.length else 0

    def slice(self, start: int, stop: int | None = None) -> KV:
        """Rows [start, stop), as views."""
        stop = self.length if stop is None else stop
        return KV(self.keys[:, :, :, start:stop], self.values[:, :, :, start:stop], self.positions[start:stop])

    def truncate(self, length: int) -> KV:
        return self.slice(0, length)

    def select(self, rows: torch.Tensor) -> KV:
        """The given rows, in the given order."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.keys.device)
        return KV(
            self.keys.index_select(ROW_DIM, rows),
            self.values.index_select(ROW_DIM, rows),
            self.positions.index_select(0, rows.to(self.positions.device)),
        )

    def replace(self, rows: torch.Tensor, other: KV) -> KV:
        """A copy of this span with `rows` overwritten by `other`'s rows, in order."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.keys.device)
        if other.length != rows.numel():
            raise ValueError(f"replacing {rows.numel()} rows needs a span of {rows.numel()} rows, got {other.length}")
        return KV(
            self.keys.index_copy(ROW_DIM, rows, other.keys),
            self.values.index_copy(ROW_DIM, rows, other.values),
            self.positions.index_copy(0, rows.to(self.positions.device), other.positions),
        )

    def with_keys(self, keys: torch.Tensor, positions: torch.Tensor | None = None) -> KV:
        return KV(keys, self.values, self.positions if positions is None else positions)

    def clone(self) -> KV:
        return KV(self.keys.clone(), self.values.clone(), self.positions.clone())

    @staticmethod
    def cat(parts: list[KV]) -> KV:
        """Spans one after another, rows in order."""
        if not parts:
            raise ValueError("KV.cat needs at least one span")
        return KV(
            torch.cat([p.keys for p in parts], dim=ROW_DIM),
            torch.cat([p.values for p in parts], dim=ROW_DIM),
            torch.cat([p.positions for p in parts]),
        )

    @staticmethod
    def batch(copies: list[KV]) -> KV:
        """Caches of the same rows and positions (copies repaired differently) side by side along the batch
        dimension, for one forward over all of them (`Backbone.forced_logits_batch`)."""
        if not copies:
            raise ValueError("KV.batch needs at least one cache")
        keys, values = (torch.cat(parts, dim=1) for parts in zip(*[(c.keys, c.values) for c in copies]))
        return KV(keys, values, copies[0].positions)

    def to_cache(self, room: int = 0) -> DynamicCache:
        """A Hugging Face cache over these rows; a forward pass on it never writes into this span.

        With `room` = 0 the cache shares this span's storage and HF's dynamic layers grow by
        concatenation (every step copies the whole cache). With `room` > 0 the rows are copied once
        into buffers with room for that many more, and each step writes its rows in place (`GrowingLayer`).
        """
        if room > 0:
            return growing_cache(self.keys, self.values, room)
        return cache_over(list(self.keys), list(self.values))

    @staticmethod
    def from_cache(cache: DynamicCache, positions: torch.Tensor) -> KV:
        """The cache's first len(positions) rows, at those positions (later rows are not copied)."""
        n = len(positions)
        keys = torch.stack([layer.keys[:, :, :n] for layer in cache.layers])
        values = torch.stack([layer.values[:, :, :n] for layer in cache.layers])
        return KV(keys, values, torch.as_tensor(positions, dtype=torch.long, device=keys.device))


def cache_over(keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
    """A Hugging Face cache whose layers are the given (B, H, T, D) tensors, not copies of them."""
    empty = keys[0][:, :, :0]
    cache = DynamicCache(ddp_cache_data=[(empty, empty)] * len(keys))
    for layer, k, v in zip(cache.layers, keys, values):
        layer.keys, layer.values = k, v
    return cache


class RowWriteCache(DynamicCache):
    """The cache of a repair: each layer's fresh keys/values of the selected rows are written over
    their stale copies in `keys`/`values` (L, B, H, T, D), which the layer then attends to."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.rows = keys, values, rows

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.rows, key_states)
        values.index_copy_(2, self.rows, value_states)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.keys.shape[3]


class GrowingLayer(DynamicLayer):
    """A dynamic cache layer preallocated with room for more rows: `update` writes the new rows into
    the buffer and returns views of the filled part, instead of concatenating a new copy each step.
    Past its room it grows as HF's layer does."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int):
        super().__init__()
        self.lazy_initialization(keys, values)
        n = keys.shape[-2]
        shape = (*keys.shape[:-2], n + room, keys.shape[-1])
        self.key_buffer, self.value_buffer = keys.new_empty(shape), values.new_empty(shape)
        self.key_buffer[..., :n, :] = keys
        self.value_buffer[..., :n, :] = values
        self.keys, self.values = self.key_buffer[..., :n, :], self.value_buffer[..., :n, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n, new = self.keys.shape[-2], key_states.shape[-2]
        if n + new > self.key_buffer.shape[-2]:
            return super().update(key_states, value_states, *args, **kwargs)
        self.key_buffer[..., n : n + new, :] = key_states
        self.value_buffer[..., n : n + new, :] = value_states
        self.keys, self.values = self.key_buffer[..., : n + new, :], self.value_buffer[..., : n + new, :]
        return self.keys, self.values


def growing_cache(keys: torch.Tensor, values: torch.Tensor, room: int) -> DynamicCache:
    """A Hugging Face cache over (layers, B, H, T, D) keys and values, copied once into `GrowingLayer`s."""
    cache = cache_over(list(keys), list(values))
    cache.layers = [GrowingLayer(k, v, room) for k, v in zip(keys, values)]
    return cache
