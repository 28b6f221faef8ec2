"""The arithmetic a timed call cannot avoid, and the time it takes at this machine's measured rates.

Counted per call of the Table 10 protocol (one new token), in floating-point operations:
- every row a method computes goes through every layer's projections (q, k, v, o) and gated MLP:
  2 x the layer's weights per row; logits (the LM head) only for rows whose next token is needed
  (each draft step and the first decode step; a prefill or repair keeps none);
- attention, 4 x head_dim x query heads per (query row, visible key row) pair and layer (QK^T and
  the weighted sum of V): a row at position p sees p + 1 keys.

Dense prefills the n cached rows and decodes one; KVComm decodes one (its anchor matching and cache
assembly move memory, they compute nothing the bound counts); BCR-chunk drafts k steps, repairs its
rows and decodes one; the coin repairs and decodes. The bound is that arithmetic at the machine's
measured matmul rate (the model's own projection shape) and attention rate (SDPA, causal): what a
method would take if it did nothing else. Sliding windows are not modelled (the embedded model has
none), so on a windowed model the bound overstates attention.
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


def call_flops(shape: Shape, method: str, n: int, repaired: list[int], k: int = paper.DRAFT_TOKENS) -> tuple[int, int]:
    """(linear, attention) operations of one call with n cached rows: see the module docstring."""
    linear, pairs = shape.linear(1, logits=1), n + 1  # the first decode step: the prompt's last token
    if method == "dense":
        linear += shape.linear(n)
        pairs += n * (n + 1) // 2
    elif method in ("bcr-chunk", "coin-chunk"):
        linear += shape.linear(len(repaired))
        pairs += sum(p + 1 for p in repaired)
        if method == "bcr-chunk":
            linear += shape.linear(k, logits=k)
            pairs += sum(n + 1 + t for t in range(k))
    elif method != "kvcomm":
        raise ValueError(f"no operation count for method {method!r}")
    return linear, shape.attention(pairs)


@dataclass(frozen=True)
class Rates:
    """Measured operations per second: matmuls of the model's projection shape, and causal SDPA."""

    matmul: float
    attention: float

    def seconds(self, linear: int, attention: int) -> float:
        return linear / self.matmul + attention / self.attention


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def measure_rates(shape: Shape, rows: int = 1024, dtype=torch.float32, repeats: int = 5) -> Rates:
    """The machine's best matmul and attention rates on this model's shapes, in this process (the
    threads it runs with); the bound is taken at the best, so a fraction of 1 is the ceiling."""
    x = torch.randn(rows, shape.hidden, dtype=dtype)
    w = torch.randn(shape.intermediate, shape.hidden, dtype=dtype)
    matmul = 2 * rows * shape.hidden * shape.intermediate / best_time(lambda: F.linear(x, w), repeats)
    q = torch.randn(1, shape.heads, rows, shape.head_dim, dtype=dtype)
    kv = torch.randn(1, shape.heads, rows, shape.head_dim, dtype=dtype)
    causal_pairs = rows * (rows + 1) // 2
    seconds = best_time(lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=True), repeats)
    return Rates(matmul, 4 * causal_pairs * shape.heads * shape.head_dim / seconds)
