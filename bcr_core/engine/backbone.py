"""`Backbone`: one Hugging Face causal LM with RoPE, and the four things the lab does with it.

- `prefill`: a span's KV computed densely; `extend` prefills only what follows a cached prefix.
- `repair`: the recompute path of Algorithm 1 (paper App. B). Only the selected rows run
  forward, at their true positions. Each layer writes their fresh keys/values over the stale
  copies (in a copy of the cache) before attending, and a 4-D mask lets row i see the rows at or
  before its position, so a repaired row attending to another repaired row sees the corrected
  value; HF's own forward runs the layers in order, so later layers read the corrections earlier
  ones made. Attention runs block by block over the visible key prefix
  (`bcr_core.engine.kernels.BLOCKED`). On a sliding-window layer the mask also hides the rows
  outside the window (`windows`).
  Cost O(selected x total), not a prefill.
- `draft`: k greedy tokens with an eager kernel that returns weights, giving the attention the k
  queries paid to the cached rows (Algorithm 2). The cache is never modified, so the draft is
  rolled back exactly.
- `generate`: greedy decoding, each step a fixed-shape step over a static cache (`static`: replayed
  CUDA graphs on a GPU); `batching` decodes many caches at once.

Conventions: a served cache stops one token short of the prompt (the paper's T = |x| - 1), and
decoding starts by feeding the prompt's final token, so Dense and every reuse method share one
decode path. Positions are explicit everywhere; row index and position need not agree, except on
sliding-window models in decoding, where HF windows by row (served caches are contiguous).

Every layer's cache is kept full length, also on sliding-window layers (see `windows`), and each
layer is re-rotated with its own rotary embedding (`rope.layer_rotations`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from bcr_core import paper
from bcr_core.engine.architectures import CONFIG_PREFIX, check_architecture, config_only, config_tokenizer_dir
from bcr_core.engine.capacity import kv_shape
from bcr_core.engine.chat import render_messages
from bcr_core.engine.invariance import decode_rows, invariant_decoding
from bcr_core.engine.kernels import BLOCKED, DISPATCH, QUERY_BLOCK, kernel, key_extents, key_grid
from bcr_core.engine.kv import KV, RowWriteCache
from bcr_core.engine.models import default_device, embedded_model_dir, load_pretrained, resolve_dtype
from bcr_core.engine.products import arithmetic, float32_products, needs_float32_products
from bcr_core.engine.rope import layer_rotations, rerotate_layers
from bcr_core.engine.static import Steps
from bcr_core.engine.stopping import StopRule
from bcr_core.engine.windows import mask_argument


@dataclass
class Generation:
    tokens: list[int]
    stopped: bool  # ended on a stop token (not included in `tokens`)
    first_token_at: float  # time.perf_counter() when the first token was known
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)  # per step, when kept
    cache: DynamicCache | None = field(default=None, repr=False)  # after decoding, prompt + output rows (when kept)


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


def recompute_block(bb, keys, values, ids, positions, rows, allowed, plan) -> None:
    """The repair's masked block: `rows` run forward at their positions and their fresh keys/values
    are written into `keys`/`values` (L, 1, H, T, D) layer by layer, each selected row seeing the rows
    `allowed` lets it (|rows|, T), through the blocked kernel over `plan` (`kernels.key_extents`).
    The plan is read on the host before the block, so the block itself is one graph with no host sync."""
    mask = mask_argument(bb.config, allowed[None], positions[rows][None], positions[None], bb.dtype)
    bb.model.base_model(
        input_ids=ids[rows][None],
        position_ids=positions[rows][None],
        attention_mask=mask,
        cache=RowWriteCache(keys, values, rows),
        use_cache=True,
        query_blocks=plan,
        attention_kernel=BLOCKED,
    )


class FirstLayersCached(Exception):
    """Raised by `FirstLayersCache` once the layers asked for are cached: the forward ends there."""


class FirstLayersCache(DynamicCache):
    """A prefill's cache that ends the forward at the first layer past `layers`: that layer's update
    raises `FirstLayersCached` before its attention runs, so only the first `layers` are computed."""

    def __init__(self, layers: int):
        super().__init__()
        self.stop_at = layers

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx >= self.stop_at:
            raise FirstLayersCached
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class Backbone:
    def __init__(self, model, tokenizer=None, name: str = "custom"):
        check_architecture(model.config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self.model.set_attn_implementation(DISPATCH)  # the kernel is chosen per thread (`kernels.kernel`)
        if needs_float32_products(self.device, self.dtype):  # half precision on a CPU without its matrix units
            float32_products(self.model)
        self.rotations = layer_rotations(model)
        self.steps = Steps(self)
        self.batch_invariant = True  # decode steps batch-invariant where they can be (`engine.invariance`)
        self.decode_rows = decode_rows(self.dtype)  # rows of each product in a decode step (`engine.invariance`)

    @classmethod
    def load(
        cls, model: str | None = None, device: str | None = None, dtype: str | torch.dtype | None = None
    ) -> Backbone:
        """The embedded default model, a local Hugging Face directory, a hub id, or a config-only
        model `config:NAME|PATH` with random weights (see `models`), in `dtype` (a torch dtype or a
        `--dtype` name; default `auto`, `models.resolve_dtype`)."""
        if model and model.startswith(CONFIG_PREFIX):
            from transformers import AutoTokenizer

            device = device or default_device()
            bb = cls.from_config(config_only(model), device=device, dtype=resolve_dtype(dtype, model, device))
            bb.tokenizer = AutoTokenizer.from_pretrained(config_tokenizer_dir(model) or embedded_model_dir())
            bb.name = model
            return bb
        hf_model, tokenizer = load_pretrained(model, device=device, dtype=dtype)
        return cls(hf_model, tokenizer, name=model or "default")

    @classmethod
    def from_config(
        cls, config, device: str | None = None, dtype: str | torch.dtype | None = None, seed: int = 0
    ) -> Backbone:
        """Random weights with a real model's shapes: enough for timing, and for tests. `auto` reads
        the config's model type as the model's name."""
        from transformers import AutoModelForCausalLM

        check_architecture(config)
        device = device or default_device()
        config._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        with torch.device(device):  # initialise in place: an 8B model need not pass through host memory
            model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype, config.model_type, device))
        return cls(model, None, name=f"random-{config.model_type}")

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def arithmetic(self) -> dict[str, str]:
        """What decides this backbone's rounding on this machine (`products.arithmetic`)."""
        return arithmetic(self.device, self.dtype)

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
        """The Dense path's ids: the whole conversation through the model's chat template, or the plain-text
        one where the tokenizer has none (`engine.chat.chat_template`)."""
        text = render_messages(self.tokenizer, messages, add_generation_prompt=add_generation_prompt)
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
    def reference_prefill(self, ids) -> KV:
        """Dense through the repair's own kernel: every row of an empty cache recomputed, the repair's
        recompute at rho = 1. What a full repair must equal bit for bit, in every dtype and on every
        device: `prefill` runs the model's default attention kernel (a causal flash kernel on a GPU),
        whose rounding in half precision differs from the repair's masked query blocks, so comparing a
        repair with it tests the kernels, not the repair."""
        ids = as_ids(ids, self.device)
        n = ids.numel()
        blank = torch.zeros(kv_shape(self.config, n), dtype=self.dtype, device=self.device)
        rows = torch.arange(n, device=self.device)
        return self._recompute(KV(blank, blank, rows), ids, rows)  # recompute writes into a copy

    @torch.inference_mode()
    def extend(self, kv: KV, ids) -> KV:
        """`kv`'s rows followed by `ids` prefilled after them, at positions from `kv.next_position`:
        a prefix cache extended instead of prefilling the whole prompt again (serving engines' prefix
        caching). `kv`'s rows are kept as they are, so where `kv` is `prefill(prefix)` this equals
        `prefill(prefix + ids)` up to float rounding in the new rows (their queries attend in one
        shorter pass); `kv` itself is never written."""
        ids = as_ids(ids, self.device)
        if ids.numel() == 0:
            return kv
        positions = self._positions(None, ids.numel(), start=kv.next_position)
        cache = kv.to_cache()  # HF's dynamic layers grow by concatenation: new tensors, kv untouched
        self.model.base_model(input_ids=ids[None], position_ids=positions[None], cache=cache, use_cache=True)
        return KV.from_cache(cache, torch.cat([kv.positions.to(self.device), positions]))

    @torch.inference_mode()
    def prefill_layers(self, ids, positions=None, layers: int = 2) -> KV:
        """A dense prefill through the first `layers` layers only (CacheBlend's layer-1 probe). The
        forward stops at the first layer past them (`FirstLayersCache`), so the model is never changed
        and calls may overlap."""
        total = self.config.num_hidden_layers
        if not 1 <= layers <= total:
            raise ValueError(f"layers must lie in [1, {total}], got {layers}")
        ids = as_ids(ids, self.device)
        if ids.numel() == 0:
            raise ValueError("prefill needs at least one token")
        positions = self._positions(positions, ids.numel(), start=0)
        cache = FirstLayersCache(layers)
        with contextlib.suppress(FirstLayersCached):
            self.model.base_model(input_ids=ids[None], position_ids=positions[None], cache=cache, use_cache=True)
        return KV.from_cache(cache, positions)

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
        return self._recompute(kv, ids, self._check_rows(rows, kv.length), query_block)

    def _recompute(self, kv: KV, ids: torch.Tensor, rows: torch.Tensor, query_block: int = QUERY_BLOCK) -> KV:
        positions = kv.positions.to(self.device)
        repaired = kv.clone()
        allowed = repair_mask(positions, rows)
        plan = key_extents(allowed, query_block, key_grid(self.device))  # read on the host, before the block
        recompute_block(self, repaired.keys, repaired.values, ids, positions, rows, allowed, plan)
        return repaired

    @torch.inference_mode()
    def draft(self, kv: KV, last_id: int, k: int = paper.DRAFT_TOKENS) -> Draft:
        """Generate k tokens greedily; return them and the k queries' attention over the cached rows.

        Step 1 feeds the prompt's final token, step t > 1 the (t-1)-th drafted one, so at k = 2 the
        queries are one prompt-side and one answer-side (paper App. A.2). Each step is the serving
        path's fixed-shape step (`engine.static`) through an eager kernel that returns weights; `kv` is
        copied into the step's slab, so it is left untouched.
        """
        if k < 1:
            raise ValueError(f"draft length k must be >= 1, got {k}")
        position, token = kv.next_position, int(last_id)
        tokens, attention = [], []
        with self.steps.lock:
            slab = self.steps.slab(kv, room=k)
            for _ in range(k):
                logits, weights = self.steps(slab, [token], position, attentions=True)
                attention.append(weights[:, -1, :, : kv.length].to(torch.float32, copy=True))
                token = int(logits[0].argmax())
                tokens.append(token)
                position += 1
        return Draft(tokens, torch.stack(attention, dim=1))

    @torch.inference_mode()
    def generate(
        self,
        kv: KV,
        last_id: int,
        max_new_tokens: int,
        stop_ids=None,
        keep_logits: bool = False,
        forced=None,
        stop_rule: StopRule | None = None,
        prior: Sequence[int] = (),
        keep_cache: bool = False,
    ) -> Generation:
        """Greedy decoding from a served cache, feeding `last_id` first.

        `stop_ids` default to the model's eos; pass () to never stop early. `stop_rule` (see
        `engine.stopping`) also stops after a token, judged on `prior` (the answer's tokens decoded
        before this request) and the tokens so far. `forced` teacher-forces the given continuation
        instead of the argmax (for next-token KL against a reference). `keep_cache` returns the cache
        after decoding (a copy of every row: only the callers that read it ask). Every step is the serving path's
        fixed-shape step over a static cache (`engine.static`): a replayed CUDA graph on a GPU.
        """
        stop = set(self.stop_ids if stop_ids is None else stop_ids)
        steps = max_new_tokens if forced is None else len(forced)
        position, token = kv.next_position, int(last_id)
        tokens, logits, first_token_at, stopped = [], [], None, False
        with self.steps.lock, invariant_decoding(self):
            slab = self.steps.slab(kv, room=steps)
            for step in range(steps):
                step_logits = self.steps(slab, [token], position)[0][0]
                token = int(step_logits.argmax()) if forced is None else int(forced[step])
                first_token_at = first_token_at or time.perf_counter()
                if keep_logits:
                    logits.append(step_logits.to(torch.float32, copy=True))
                if forced is None and token in stop:
                    stopped = True
                    break
                tokens.append(token)
                position += 1
                if forced is None and stop_rule is not None and stop_rule([*prior, *tokens]):
                    stopped = True
                    break
            cache = slab.rows().to_cache() if keep_cache else None
        return Generation(tokens, stopped, first_token_at or time.perf_counter(), logits, cache)

    def forced_logits(self, kv: KV, last_id: int, tokens: list[int]) -> torch.Tensor:
        """Next-token logits (len(tokens), vocab) with `tokens` teacher-forced after `last_id`: what
        `generate(kv, last_id, 0, forced=tokens, keep_logits=True)` gives step by step, in one forward."""
        return self.forced_logits_batch(kv, last_id, tokens)[0]

    @torch.inference_mode()
    def forced_logits_batch(self, kv: KV, last_id: int, tokens: list[int]) -> torch.Tensor:
        """`forced_logits` for every cache along `kv`'s batch dimension (copies of the same rows and
        positions, e.g. repaired differently), in one forward: (batch, len(tokens), vocab)."""
        if not tokens:
            raise ValueError("forced_logits needs at least one token")
        batch = kv.keys.shape[1]
        fed = torch.tensor([[int(last_id), *map(int, tokens[:-1])]], device=self.device).expand(batch, -1)
        positions = torch.arange(kv.next_position, kv.next_position + fed.shape[1], device=self.device)
        out = self.model(
            input_ids=fed, position_ids=positions[None].expand(batch, -1), cache=kv.to_cache(), use_cache=True
        )
        return out.logits.float()

    # -- positions ------------------------------------------------------------------------
    def rerotate(self, keys: torch.Tensor, delta, out: torch.Tensor | None = None) -> torch.Tensor:
        """Keys (L, B, H, T, D) moved by `delta` positions (a scalar, or one per row), into `out` if given.
        Layer l turns with layer l's rotary embedding; with fewer than all layers stacked (a probe of the
        first layers), the first ones."""
        return rerotate_layers(keys, delta, self.rotations[: keys.shape[0]], out=out)

    def shift(self, kv: KV, delta: int) -> KV:
        """The span moved `delta` positions later: keys re-rotated, values unchanged."""
        return kv.with_keys(self.rerotate(kv.keys, delta), kv.positions + delta)

    # -- helpers --------------------------------------------------------------------------
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

    def attention_implementation(self, name: str):
        """Run attention through kernel `name` in this thread until the block ends (eager is needed
        for attention weights); the shared model is not changed, so other threads keep their kernel."""
        return kernel(name)
