"""`Backbone`: one Hugging Face causal LM with RoPE, and the four things the lab does with it.

- `prefill`: a span's KV computed densely.
- `repair`: the recompute path of Algorithm 1 (paper App. B). Only the selected rows run
  forward, at their true positions. Each layer appends their fresh keys/values to the cache and
  a 4-D mask hides the stale copies, so a repaired row attending to another repaired row sees
  the corrected value; HF's own forward runs the layers in order, so later layers read the
  corrections earlier ones made. Cost O(selected x total), not a prefill.
- `draft`: k greedy tokens with eager attention, returning the attention the k queries paid to
  the cached rows (Algorithm 2). The cache is never modified, so the draft is rolled back exactly.
- `generate`: greedy decoding.

Conventions: a served cache stops one token short of the prompt (the paper's T = |x| - 1), and
decoding starts by feeding the prompt's final token, so Dense and every reuse method share one
decode path. Positions are explicit everywhere; row index and position need not agree.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from bcr_core.attention import BLOCKED, GROUPED_EAGER, QUERY_BLOCK, key_extents
from bcr_core.kv import KV
from bcr_core.models import check_architecture, default_device, default_dtype, load_pretrained
from bcr_core.rope import rerotate


@dataclass
class Generation:
    tokens: list[int]
    stopped: bool  # ended on a stop token (not included in `tokens`)
    first_token_at: float  # time.perf_counter() when the first token was known
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)  # per step, when kept
    cache: DynamicCache | None = field(default=None, repr=False)  # the cache after decoding: prompt + output rows


@dataclass
class Draft:
    tokens: list[int]  # the k greedy tokens
    attention: torch.Tensor  # (layers, k, query_heads, cached_rows): softmax weights over the cache


def as_ids(ids, device) -> torch.Tensor:
    return torch.as_tensor(ids, dtype=torch.long, device=device).reshape(-1)


def repair_mask(positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Which cache rows each recomputed row sees: (|rows|, T) bool, row j iff position_j <= p_i.

    The recomputed rows overwrite their stale copies layer by layer before attention
    (`RowWriteCache`), so a row that sees another selected row sees its corrected value.
    """
    return positions[None, :] <= positions[rows][:, None]


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


def row_cache(cache: DynamicCache, row: int, start: int) -> DynamicCache:
    """Batch row `row` of a batched cache from column `start` on (its padding dropped), as its own cache."""
    keys = torch.stack([layer.keys[row : row + 1, :, start:] for layer in cache.layers])
    values = torch.stack([layer.values[row : row + 1, :, start:] for layer in cache.layers])
    return KV(keys, values, torch.arange(keys.shape[3], device=keys.device)).to_cache()


class Backbone:
    def __init__(self, model, tokenizer=None, name: str = "custom"):
        check_architecture(model.config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config

    @classmethod
    def load(cls, model: str | None = None, device: str | None = None, dtype: torch.dtype | None = None) -> Backbone:
        """The embedded default model, a local Hugging Face directory, or a hub id (see `models`)."""
        hf_model, tokenizer = load_pretrained(model, device=device, dtype=dtype)
        return cls(hf_model, tokenizer, name=model or "default")

    @classmethod
    def from_config(cls, config, device: str | None = None, dtype: torch.dtype | None = None, seed: int = 0) -> Backbone:
        """Random weights with a real model's shapes: enough for timing, and for tests."""
        from transformers import AutoModelForCausalLM

        check_architecture(config)
        device = device or default_device()
        config._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or default_dtype(device))
        return cls(model.to(device), None, name=f"random-{config.model_type}")

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def stop_ids(self) -> tuple[int, ...]:
        eos = self.config.eos_token_id
        ids = eos if isinstance(eos, (list, tuple)) else [eos]
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids = [*ids, self.tokenizer.eos_token_id]
        return tuple(sorted({i for i in ids if i is not None}))

    # -- text -------------------------------------------------------------------------------
    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The Dense path's ids: the whole conversation through the model's chat template."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # -- the four operations ----------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, ids, positions=None) -> KV:
        """The span's KV computed densely from scratch, at `positions` (default 0..n-1)."""
        ids = as_ids(ids, self.device)
        if ids.numel() == 0:
            raise ValueError("prefill needs at least one token")
        positions = self._positions(positions, ids.numel(), start=0)
        cache = DynamicCache()
        self.model.base_model(input_ids=ids[None], position_ids=positions[None], cache=cache, use_cache=True)
        return KV.from_cache(cache, positions)

    @torch.inference_mode()
    def prefill_layers(self, ids, positions=None, layers: int = 2) -> KV:
        """A dense prefill through the first `layers` layers only (CacheBlend's layer-1 probe)."""
        with self.first_layers(layers):
            return self.prefill(ids, positions)

    @torch.inference_mode()
    def repair(self, kv: KV, ids, rows, query_block: int = QUERY_BLOCK) -> KV:
        """Recompute `rows` of `kv` exactly (Algorithm 1); every other row is returned bit-identical.

        `ids` are the token ids of all of `kv`'s rows, in row order. One forward over the selected
        rows, on a copy of the cache; attention runs in blocks of `query_block` selected rows, each
        over only the key rows it can see.
        """
        ids = as_ids(ids, self.device)
        if ids.numel() != kv.length:
            raise ValueError(f"repair needs one token id per cache row: got {ids.numel()} ids for {kv.length} rows")
        rows = self._check_rows(rows, kv.length)
        positions = kv.positions.to(self.device)
        repaired = kv.clone()
        allowed = repair_mask(positions, rows)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        with self.attention_implementation(BLOCKED):
            self.model.base_model(
                input_ids=ids[rows][None], position_ids=positions[rows][None], attention_mask=mask[None, None],
                cache=RowWriteCache(repaired.keys, repaired.values, rows), use_cache=True,
                query_blocks=key_extents(allowed, query_block),
            )
        return repaired

    @torch.inference_mode()
    def draft(self, kv: KV, last_id: int, k: int = 2) -> Draft:
        """Generate k tokens greedily; return them and the k queries' attention over the cached rows.

        Step 1 feeds the prompt's final token, step t > 1 the (t-1)-th drafted one, so at k = 2 the
        queries are one prompt-side and one answer-side (paper App. A.2). `kv` is left untouched.
        """
        if k < 1:
            raise ValueError(f"draft length k must be >= 1, got {k}")
        cache, position, token = kv.to_cache(), kv.next_position, int(last_id)
        tokens, attention = [], []
        with self.attention_implementation(GROUPED_EAGER):
            for _ in range(k):
                out = self._step(cache, token, position, output_attentions=True)
                attention.append(torch.stack([a[0, :, -1, : kv.length] for a in out.attentions]))
                token = int(out.logits[0, -1].argmax())
                tokens.append(token)
                position += 1
        return Draft(tokens, torch.stack(attention, dim=1).float())

    @torch.inference_mode()
    def generate(
        self, kv: KV, last_id: int, max_new_tokens: int, stop_ids=None, keep_logits: bool = False, forced=None
    ) -> Generation:
        """Greedy decoding from a served cache, feeding `last_id` first.

        `stop_ids` default to the model's eos; pass () to never stop early. `forced` teacher-forces
        the given continuation instead of the argmax (for next-token KL against a reference).
        """
        stop = set(self.stop_ids if stop_ids is None else stop_ids)
        cache, position, token = kv.to_cache(), kv.next_position, int(last_id)
        tokens, logits, first_token_at = [], [], None
        steps = max_new_tokens if forced is None else len(forced)
        for step in range(steps):
            out = self._step(cache, token, position)
            step_logits = out.logits[0, -1]
            token = int(step_logits.argmax()) if forced is None else int(forced[step])
            if first_token_at is None:
                first_token_at = time.perf_counter()
            if keep_logits:
                logits.append(step_logits.float())
            if forced is None and token in stop:
                return Generation(tokens, True, first_token_at, logits, cache)
            tokens.append(token)
            position += 1
        return Generation(tokens, False, first_token_at or time.perf_counter(), logits, cache)

    @torch.inference_mode()
    def generate_batch(self, requests: list[tuple[KV, int, int]], stop_ids=None) -> list[Generation]:
        """`generate` for several (cache, last id, max new tokens) at once, caches of any lengths.

        Caches are left-padded to one length and the padding is masked; each row keeps its own
        positions. A row leaves the batch when it stops, and its `Generation.cache` holds its own
        rows only. One request takes `generate`'s path unchanged. Greedy tokens equal batch-size-1
        decoding up to float rounding in the batched matrix products (a near-tie can flip).
        """
        if len(requests) == 1:
            kv, last_id, max_new_tokens = requests[0]
            return [self.generate(kv, last_id, max_new_tokens, stop_ids)]
        if min(n for _, _, n in requests) < 1:
            raise ValueError("generate_batch needs max_new_tokens >= 1 for every request")
        stop = set(self.stop_ids if stop_ids is None else stop_ids)
        lengths = [kv.length for kv, _, _ in requests]
        width = max(lengths)
        first = requests[0][0]
        shape = (first.num_layers, len(requests), first.keys.shape[2], width, first.keys.shape[4])
        keys, values = first.keys.new_zeros(shape), first.values.new_zeros(shape)
        visible = torch.zeros(len(requests), width, dtype=torch.bool, device=self.device)
        for i, (kv, _, _) in enumerate(requests):
            keys[:, i, :, width - kv.length :] = kv.keys[:, 0]
            values[:, i, :, width - kv.length :] = kv.values[:, 0]
            visible[i, width - kv.length :] = True
        cache = KV(keys, values, torch.arange(width)).to_cache()
        rows = list(range(len(requests)))  # batch row -> request
        token = torch.tensor([last_id for _, last_id, _ in requests], device=self.device)
        position = torch.tensor([kv.next_position for kv, _, _ in requests], device=self.device)
        tokens, results, first_token_at = [[] for _ in requests], [None] * len(requests), None
        while rows:
            visible = torch.cat([visible, visible.new_ones(len(rows), 1)], dim=1)
            mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
            out = self.model(input_ids=token[:, None], position_ids=position[:, None], attention_mask=mask[:, None, None],
                             cache=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1)
            first_token_at = first_token_at or time.perf_counter()
            keep = []
            for b, (r, t) in enumerate(zip(rows, token.tolist())):
                stopped = t in stop
                if not stopped:
                    tokens[r].append(t)
                if stopped or len(tokens[r]) == requests[r][2]:
                    results[r] = Generation(tokens[r], stopped, first_token_at, [], row_cache(cache, b, width - lengths[r]))
                else:
                    keep.append(b)
            if len(keep) < len(rows):
                index = torch.tensor(keep, dtype=torch.long, device=self.device)
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[index], layer.values[index]
                rows, visible, token, position = [rows[b] for b in keep], visible[index], token[index], position[index]
            position = position + 1
        return results

    # -- positions ------------------------------------------------------------------------
    def rerotate(self, keys: torch.Tensor, delta, out: torch.Tensor | None = None) -> torch.Tensor:
        """Keys (..., T, D) moved by `delta` positions (a scalar, or one per row), into `out` if given."""
        return rerotate(keys, delta, self.model.base_model.rotary_emb, out=out)

    def shift(self, kv: KV, delta: int) -> KV:
        """The span moved `delta` positions later: keys re-rotated, values unchanged."""
        return kv.with_keys(self.rerotate(kv.keys, delta), kv.positions + delta)

    # -- helpers --------------------------------------------------------------------------
    def _step(self, cache, token: int, position: int, **kwargs):
        ids = torch.tensor([[token]], device=self.device)
        pos = torch.tensor([[position]], device=self.device)
        return self.model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1, **kwargs)

    def _positions(self, positions, n: int, start: int) -> torch.Tensor:
        if positions is None:
            return torch.arange(start, start + n, device=self.device)
        positions = torch.as_tensor(positions, dtype=torch.long, device=self.device).reshape(-1)
        if positions.numel() != n:
            raise ValueError(f"got {positions.numel()} positions for {n} tokens")
        return positions

    def _check_rows(self, rows, length: int) -> torch.Tensor:
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device).reshape(-1)
        if rows.numel() == 0:
            raise ValueError("repair needs at least one row to recompute; serve the cache unrepaired instead")
        if int(rows.min()) < 0 or int(rows.max()) >= length:
            raise ValueError(f"rows to repair must lie in [0, {length}); got {int(rows.min())}..{int(rows.max())}")
        rows = rows.unique(sorted=True)
        return rows

    @contextlib.contextmanager
    def first_layers(self, n: int):
        """Temporarily run only the first n decoder layers (HF's forward reads config.num_hidden_layers)."""
        base, total = self.model.base_model, self.config.num_hidden_layers
        if not 1 <= n <= total:
            raise ValueError(f"layers must lie in [1, {total}], got {n}")
        layers = base.layers
        base.layers, self.config.num_hidden_layers = layers[:n], n
        try:
            yield
        finally:
            base.layers, self.config.num_hidden_layers = layers, total

    @contextlib.contextmanager
    def attention_implementation(self, name: str):
        """Temporarily switch attention kernels (eager is needed for attention weights)."""
        previous = self.config._attn_implementation
        if previous == name:
            yield
            return
        self.model.set_attn_implementation(name)
        try:
            yield
        finally:
            self.model.set_attn_implementation(previous)
