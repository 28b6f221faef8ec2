"""The work a timed call cannot avoid, and the time it takes at this machine's measured rates.

A call of the Table 10 protocol (one new token) is a few forward passes, and each pass is bounded
by its arithmetic or by the memory it must move, whichever takes longer (a roofline per pass):
- arithmetic: every row a pass computes goes through every layer's projections (q, k, v, o) and
  gated MLP, 2 x the layer's weights per row; logits (the LM head) only for rows whose next token
  is needed (each draft step and the first decode step; a prefill or repair keeps none); attention,
  4 x head_dim x query heads per (query row, visible key row) pair and layer (QK^T and the weighted
  sum of V): a row at position p sees p + 1 keys;
- memory: every pass reads the weights once (the LM head too when it keeps logits), reads the
  cached keys and values its rows attend to, and writes the rows it computes.

Dense prefills the n cached rows and decodes one; KVComm assembles its cache (at least: reads n
stored rows and writes n) and decodes one; BCR-chunk assembles, drafts k steps, repairs its rows
and decodes one; the coin assembles, repairs and decodes. The rates are measured in this process
at the call's length: matmuls of the model's projection shape, causal SDPA, and a tensor copy for
memory. The bound is what a method would take if it did nothing else. Sliding windows are not
modelled (the embedded model has none), so on a windowed model the bound overstates attention.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bcr_core import paper


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config) -> Shape:
        config = getattr(config, "text_config", config)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            config.intermediate_size,
            config.vocab_size,
        )

    @property
    def weights_per_layer(self) -> int:
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_and_o + k_and_v + 3 * self.hidden * self.intermediate

    def linear(self, rows: int, logits: int = 0) -> int:
        """Projections and MLP of `rows` rows through every layer, plus the LM head of `logits` rows."""
        return 2 * rows * self.layers * self.weights_per_layer + 2 * logits * self.hidden * self.vocab

    def attention(self, pairs: int) -> int:
        """`pairs` (query, visible key) pairs in every layer and query head."""
        return 4 * pairs * self.layers * self.heads * self.head_dim

    def weights(self, logits: bool) -> int:
        """Weights a pass reads (elements): every layer's, and the LM head's when it keeps logits."""
        return self.layers * self.weights_per_layer + (self.hidden * self.vocab if logits else 0)

    def cache_rows(self, rows: int) -> int:
        """Elements of `rows` rows of the KV cache, every layer's keys and values."""
        return 2 * rows * self.layers * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Pass:
    """One forward pass (or the cache assembly): operations, and elements it must read or write."""

    linear: int
    attention: int
    elements: int

    @property
    def flops(self) -> int:
        return self.linear + self.attention


def forward_pass(shape: Shape, rows: list[int], n_keys: int, logits: bool) -> Pass:
    """Rows at the given positions computed against a cache of `n_keys` keys (the rows' own included)."""
    pairs = sum(p + 1 for p in rows)
    moved = shape.weights(logits) + shape.cache_rows(n_keys)
    return Pass(shape.linear(len(rows), logits=len(rows) if logits else 0), shape.attention(pairs), moved)


def decode_pass(shape: Shape, n: int) -> Pass:
    """The first decode step over n cached rows: the prompt's last token, with its logits."""
    return forward_pass(shape, [n], n + 1, logits=True)


def draft_passes(shape: Shape, n: int, k: int = paper.DRAFT_TOKENS) -> list[Pass]:
    """BCR's k draft steps over n cached rows, each keeping its logits."""
    return [forward_pass(shape, [n + t], n + t + 1, logits=True) for t in range(k)]


def call_passes(shape: Shape, method: str, n: int, repaired: list[int], k: int = paper.DRAFT_TOKENS) -> list[Pass]:
    """The passes of one call with n cached rows: see the module docstring."""
    if method == "dense":
        return [forward_pass(shape, list(range(n)), n, logits=False), decode_pass(shape, n)]
    if method not in ("kvcomm", "bcr-chunk", "coin-chunk"):
        raise ValueError(f"no operation count for method {method!r}")
    passes = [Pass(0, 0, 2 * shape.cache_rows(n))]  # assembly: read n stored rows, write n
    if method == "bcr-chunk":
        passes += draft_passes(shape, n, k)
    if method != "kvcomm":
        passes.append(forward_pass(shape, list(repaired), n, logits=False))
    return passes + [decode_pass(shape, n)]


def call_flops(shape: Shape, method: str, n: int, repaired: list[int], k: int = paper.DRAFT_TOKENS) -> tuple[int, int]:
    """(linear, attention) operations of one call with n cached rows."""
    passes = call_passes(shape, method, n, repaired, k)
    return sum(p.linear for p in passes), sum(p.attention for p in passes)


@dataclass(frozen=True)
class Rates:
    """Measured rates: operations per second of matmuls of the model's projection shape and of causal
    SDPA, and elements per second of a tensor copy."""

    matmul: float
    attention: float
    bandwidth: float  # elements of the model's dtype moved per second (read + written)

    def seconds(self, passes: list[Pass]) -> float:
        """Each pass at its own ceiling: its arithmetic or its memory traffic, whichever is slower."""
        return sum(max(self.arithmetic(p), p.elements / self.bandwidth) for p in passes)

    def arithmetic(self, p: Pass) -> float:
        return p.linear / self.matmul + p.attention / self.attention

    def readable(self, itemsize: int) -> dict[str, float]:
        """The rates in the units a datasheet uses: TFLOP/s, and GB/s for `itemsize`-byte elements."""
        return {
            "matmul_tflops": self.matmul / 1e12,
            "attention_tflops": self.attention / 1e12,
            "copy_gb_s": self.bandwidth * itemsize / 1e9,
        }


def timed(fn, repeats: int, device: torch.device | str = "cpu", reduce=min) -> float:
    """`reduce` (the fastest, by default) of `repeats` timed runs after a warm-up, each waiting
    for the device's queue to drain."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return reduce(times)


@torch.inference_mode()
def measure_rates(shape: Shape, rows: int = 1024, dtype=torch.float32, repeats: int = 5, device="cpu") -> Rates:
    """The machine's best matmul and attention rates on this model's shapes, in this process (the
    threads it runs with); the bound is taken at the best, so a fraction of 1 is the ceiling."""
    x = torch.randn(rows, shape.hidden, dtype=dtype, device=device)
    w = torch.randn(shape.intermediate, shape.hidden, dtype=dtype, device=device)
    matmul = 2 * rows * shape.hidden * shape.intermediate / timed(lambda: F.linear(x, w), repeats, device)
    q = torch.randn(1, shape.heads, rows, shape.head_dim, dtype=dtype, device=device)
    kv = torch.randn(1, shape.heads, rows, shape.head_dim, dtype=dtype, device=device)
    causal_pairs = rows * (rows + 1) // 2
    seconds = timed(lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=True), repeats, device)
    attention = 4 * causal_pairs * shape.heads * shape.head_dim / seconds
    source = torch.empty(shape.layers * shape.weights_per_layer // 4, dtype=dtype, device=device)  # a quarter model
    target = torch.empty_like(source)
    bandwidth = 2 * source.numel() / timed(lambda: target.copy_(source), repeats, device)
    return Rates(matmul, attention, bandwidth)
