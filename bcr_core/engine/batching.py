"""Batched greedy decoding: several sequences, each from its own served cache, one token per step.

On a CPU a decode step costs about the same for one sequence as for several (it is bound by reading
the weights), so decoding waiting requests together is where the runner's throughput comes from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from bcr_core.engine.backbone import Backbone, Generation
from bcr_core.engine.invariance import invariant, invariant_decoding
from bcr_core.engine.kv import KV, cache_over
from bcr_core.engine.stopping import StopRule
from bcr_core.engine.windows import mask_argument


@dataclass
class _Row:
    key: object
    max_new_tokens: int
    length: int  # cache rows this sequence owns (its prompt rows and the tokens fed so far)
    stop_rule: StopRule | None = None  # `engine.stopping`, judged on `prior` + `tokens`
    prior: tuple[int, ...] = ()
    tokens: list[int] = field(default_factory=list)
    first_token_at: float | None = None

    def ended(self) -> bool:
        return self.stop_rule is not None and self.stop_rule([*self.prior, *self.tokens])


class BatchDecoder:
    """Greedy decoding of many sequences in one batch that they join and leave at any step
    (continuous batching). Caches of different lengths are left-padded to one width and the padding
    is masked; each sequence keeps its own positions. A finished sequence leaves at once with its
    `Generation`, whose cache holds its own rows only.

    Tokens equal `Backbone.generate` one sequence at a time up to float rounding in the batched
    matrix products and the masked padding (a near-tie between two logits can flip).
    """

    def __init__(self, bb: Backbone, stop_ids=None):
        self.bb = bb
        self.stop = set(bb.stop_ids if stop_ids is None else stop_ids)
        self.rows: list[_Row] = []
        self.keys: list[torch.Tensor] = []  # per layer (B, H, W, D)
        self.values: list[torch.Tensor] = []
        self.visible = torch.zeros(0, 0, dtype=torch.bool, device=bb.device)  # (B, W): not padding
        self.token = torch.zeros(0, dtype=torch.long, device=bb.device)  # (B,) the next id each row feeds
        self.position = torch.zeros(0, dtype=torch.long, device=bb.device)  # (B,) and its position

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return self.visible.shape[1]

    @torch.inference_mode()
    def add(self, key, kv: KV, last_id: int, max_new_tokens: int, stop_rule: StopRule | None = None, prior=()) -> None:
        """A sequence joins: its cache, the prompt's final id to feed first, its token budget, and the
        stop rule with the answer's tokens before this request (`Backbone.generate`'s)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 to join a batch, got {max_new_tokens}")
        if not self.rows:
            self.keys, self.values = list(kv.keys[:, :1]), list(kv.values[:, :1])
            self.visible = torch.ones(1, kv.length, dtype=torch.bool, device=self.bb.device)
        else:
            if kv.length > self.width:
                self._pad_left(kv.length - self.width)
            pad = self.width - kv.length
            for layer in range(kv.num_layers):
                self.keys[layer] = torch.cat([self.keys[layer], _left_pad(kv.keys[layer, :1], pad)])
                self.values[layer] = torch.cat([self.values[layer], _left_pad(kv.values[layer, :1], pad)])
            row = torch.arange(self.width, device=self.bb.device) >= pad
            self.visible = torch.cat([self.visible, row[None]])
        self.rows.append(_Row(key, max_new_tokens, kv.length, stop_rule, tuple(prior)))
        self.token = torch.cat([self.token, self.token.new_tensor([int(last_id)])])
        self.position = torch.cat([self.position, self.position.new_tensor([kv.next_position])])

    @torch.inference_mode()
    def step(self) -> list[tuple[object, Generation]]:
        """Feed every sequence one token; return (key, Generation) of those that finished."""
        cache = cache_over(self.keys, self.values)
        self.keys = self.values = []  # the cache owns them now: each layer's old copy is freed as it grows
        self.visible = torch.cat([self.visible, self.visible.new_ones(len(self.rows), 1)], dim=1)
        # the row-by-row kernel needs the mask always (HF builds none for it, so the windows would go);
        # the decoder before it passed none where no row was padded, and stays as it was
        mask = self._padding_mask() if invariant(self.bb) or not bool(self.visible.all()) else None
        with invariant_decoding(self.bb):
            out = self.bb.model(
                input_ids=self.token[:, None],
                position_ids=self.position[:, None],
                attention_mask=mask,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        now = time.perf_counter()
        self.keys = [layer.keys for layer in cache.layers]
        self.values = [layer.values for layer in cache.layers]
        self.token, self.position = out.logits[:, -1].argmax(-1), self.position + 1
        finished, keep = [], []
        for b, (row, token) in enumerate(zip(self.rows, self.token.tolist())):
            row.length += 1
            row.first_token_at = row.first_token_at or now
            stopped = token in self.stop
            if not stopped:
                row.tokens.append(token)
                stopped = row.ended()
            if stopped or len(row.tokens) == row.max_new_tokens:
                own = slice(self.width - row.length, self.width)
                kv = KV(
                    torch.stack([k[b : b + 1, :, own] for k in self.keys]),
                    torch.stack([v[b : b + 1, :, own] for v in self.values]),
                    torch.arange(row.length, device=self.bb.device),
                )
                finished.append((row.key, Generation(row.tokens, stopped, row.first_token_at, [], kv.to_cache())))
            else:
                keep.append(b)
        if len(keep) < len(self.rows):
            self._keep(keep)
        return finished

    def _padding_mask(self) -> torch.Tensor | dict[str, torch.Tensor]:
        """The padding hidden from each row's query; on sliding-window layers also the rows past the
        window. Each row's rows are contiguous and right-aligned, so column distance is position distance."""
        columns = torch.arange(self.width, device=self.bb.device)
        query = columns[-1:].expand(len(self.rows), 1)
        return mask_argument(self.bb.config, self.visible[:, None, :], query, columns, self.bb.dtype)

    def _keep(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.bb.device)
        self.rows = [self.rows[b] for b in keep]
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.visible, self.token, self.position = self.visible[index], self.token[index], self.position[index]
        if self.rows:  # drop padding columns no remaining row needs
            unused = self.width - max(row.length for row in self.rows)
            if unused:
                self.keys = [k[:, :, unused:] for k in self.keys]
                self.values = [v[:, :, unused:] for v in self.values]
                self.visible = self.visible[:, unused:]

    def _pad_left(self, n: int) -> None:
        self.keys = [_left_pad(k, n) for k in self.keys]
        self.values = [_left_pad(v, n) for v in self.values]
        self.visible = torch.cat([self.visible.new_zeros(len(self.rows), n), self.visible], dim=1)


def _left_pad(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, H, T, D) with n zero rows in front."""
    return torch.cat([x.new_zeros(*x.shape[:2], n, x.shape[3]), x], dim=2) if n else x
