"""Whether the caches a command will make fit the machine's memory, checked before any allocation.

A cached row holds keys and values of every layer: 2 x layers x KV heads x head_dim elements. A call
holds up to `COPIES` caches of its rows at once (the served cache, KVComm's assembled copy, BCR's
repaired copy, the decode buffers with room for the new tokens), so a command whose calls reach R
rows needs about COPIES x R x row bytes free: on a GPU in device memory, on Linux in MemAvailable.
Elsewhere, or when the amount cannot be read, nothing is refused.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from bcr_core.errors import UsageError

COPIES = 4


def kv_shape(config, rows: int) -> tuple[int, int, int, int, int]:
    """The shape of a `KV` of `rows` rows for a model of this config: (layers, 1, KV heads, rows, head_dim)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return (config.num_hidden_layers, 1, kv_heads, rows, head_dim)


def row_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of one cached row (keys and values, every layer) for a model of this config and dtype."""
    return 2 * math.prod(kv_shape(config, 1)) * torch.empty(0, dtype=dtype).element_size()


def available_bytes(device: torch.device) -> int | None:
    """Free memory where the caches live: the GPU's free memory, or Linux's MemAvailable."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if device.type != "cpu" or not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def check_rows_fit(bb, rows: int, option: str) -> None:
    """Refuse, naming `option`, calls of `rows` cached rows whose caches cannot fit in free memory."""
    need = COPIES * rows * row_bytes(bb.config, bb.dtype)
    free = available_bytes(bb.device)
    if free is not None and need > free:
        raise UsageError(
            f"{option}: calls of {rows} cached rows need about {need / 1e9:.1f} GB for their caches "
            f"({COPIES} copies of {row_bytes(bb.config, bb.dtype) / 1024:.0f} KiB a row), and "
            f"{free / 1e9:.1f} GB is free on {bb.device.type}; give fewer"
        )
