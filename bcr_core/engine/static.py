"""The serving path's decode and draft steps: fixed-shape functions over a preallocated static cache.

A served cache is copied once into a `Slab`: key/value buffers with room for every layer's rows up to a
bucketed capacity (`capacity`), and the position each buffer row holds (`row_positions`, a sentinel
past any position where a row is still empty). A step (`step`) feeds tokens at explicit positions,
writes their keys/values into the slab's next rows (`write_rows`), and attends over
the whole buffer through a mask that hides empty and later rows: its shapes depend only on the
capacity and the number of tokens fed, never on how full the slab is (gpt-fast's `KVCache`, vLLM's
batch buckets). Slabs are kept per capacity and reused call after call (a graph reads fixed
addresses); a lock serialises the calls that use them.

A step runs in one of three modes (`Steps`, `STEP_MODES`), all the same function:

- plain (`"plain"`): `step` called eagerly, the CPU path and its default; it is kept because it is the
  reference the other two must match, and the mode the CPU tests cover.
- inductor-compiled (`"compiled"`): `torch.compile(step, fullgraph=True)`; it is kept because it fuses
  the step's kernels and, on CUDA (`mode="reduce-overhead"`), replays its graphs without hand-written
  capture code.
- hand-captured CUDA graphs (`"graphs"`): one `torch.cuda.CUDAGraph` per shape, captured at first use and
  replayed after, the CUDA default; it is kept because it pays the step's host cost (Python through every
  layer of Hugging Face's forward) once per shape instead of once per token, with no compiler in the way.

All three stay until a GPU has measured them against each other: none has been, as no GPU is available
to this project now, so which is fastest is not known and none is retired.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass

import torch

from bcr_core.engine.kernels import DEFAULT_KERNEL, GROUPED_EAGER, current_kernel
from bcr_core.engine.kv import KV, RowWriteCache
from bcr_core.engine.windows import mask_argument

MIN_CAPACITY = 256  # the smallest slab: a short prompt and its answer
BUCKETS_PER_OCTAVE = 4  # capacities 256, 320, 384, 448, 512, 640, ...: at most 25% of a slab's rows idle
ROW_GRID = 64  # every capacity is a multiple of this
EMPTY = 2**62  # the position of an empty buffer row: after every query, so no causal mask lets it through
RECOMPILE_LIMIT = 64  # dynamo's recompiles per compiled step: one per capacity bucket x (decode, draft)


def capacity(rows: int) -> int:
    """The slab capacity for `rows` rows: the smallest bucket at or above it (a few buckets per octave)."""
    if rows <= MIN_CAPACITY:
        return MIN_CAPACITY
    octave = 2 ** math.floor(math.log2(rows))
    step = max(octave // BUCKETS_PER_OCTAVE, ROW_GRID)
    return -(-rows // step) * step


@dataclass
class Slab:
    """One capacity's static cache: keys and values (L, 1, H_kv, C, D), the position each row holds
    (`row_positions`, `EMPTY` where none), and `filled`, the rows a served cache and the steps after it hold."""

    keys: torch.Tensor
    values: torch.Tensor
    row_positions: torch.Tensor
    filled: int = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @classmethod
    def empty(cls, like: KV, rows: int) -> Slab:
        shape = (*like.keys.shape[:3], rows, like.keys.shape[4])
        positions = torch.full((rows,), EMPTY, dtype=torch.long, device=like.keys.device)
        return cls(like.keys.new_zeros(shape), like.values.new_zeros(shape), positions)

    def load(self, kv: KV) -> None:
        """Hold `kv`'s rows (and nothing after them): copied into the buffers' first rows."""
        n = kv.length
        self.keys[:, :, :, :n] = kv.keys
        self.values[:, :, :, :n] = kv.values
        self.row_positions[:n] = kv.positions.to(self.row_positions.device)
        self.row_positions[n:] = EMPTY
        self.filled = n

    def fits(self, kv: KV) -> bool:
        return tuple(self.keys.shape[:3]) == tuple(kv.keys.shape[:3]) and self.keys.dtype == kv.keys.dtype

    def rows(self) -> KV:
        """The filled rows as a `KV` of their own (copies: the slab is reused)."""
        n = self.filled
        return KV(self.keys[:, :, :, :n].clone(), self.values[:, :, :, :n].clone(), self.row_positions[:n].clone())


def step(
    bb,
    slab: Slab,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    write_rows: torch.Tensor,
    attentions: bool,
    kernel: str = DEFAULT_KERNEL,
):
    """One forward of `tokens` (1, q) at `positions` (1, q) over `slab`, written into `write_rows` (q,),
    through attention kernel `kernel`: the last token's logits (1, vocab), and with `attentions` every
    layer's weights of the q queries over the buffer (layers, q, heads, C). Shapes depend only on
    (capacity, q), and nothing in it reads a tensor's value on the host: `torch.compile(fullgraph=True)`
    traces it as one graph, and a CUDA graph can replay it."""
    slab.row_positions.index_copy_(0, write_rows, positions[0])
    allowed = slab.row_positions[None, :] <= positions[0][:, None]
    mask = mask_argument(bb.config, allowed[None], positions, slab.row_positions[None], bb.dtype)
    layer_weights = [] if attentions else None  # filled by the kernel layer by layer (`kernels.dispatched_attention`)
    out = bb.model(
        input_ids=tokens,
        position_ids=positions,
        attention_mask=mask,
        cache=RowWriteCache(slab.keys, slab.values, write_rows),
        use_cache=True,
        logits_to_keep=1,
        attention_kernel=kernel,
        attention_weights=layer_weights,
    )
    weights = torch.stack([a[0].transpose(0, 1) for a in layer_weights]) if attentions else None
    return out.logits[:, -1], weights


STEP_MODES = ("plain", "compiled", "graphs")


def allow_bucket_recompiles() -> None:
    """Let dynamo keep a graph per capacity bucket x (decode, draft): more than its default 8 recompiles.
    Only ever raises the limit, so a higher one set elsewhere is kept; called when `Steps.mode` becomes `compiled`."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


class Steps:
    """Runs `step` for a backbone in one of three modes, kept side by side until a GPU has measured them
    against each other (see the module's docstring):

    - `plain`: called eagerly, as it is (the CPU path, and the default there); the reference the others
      must match;
    - `compiled`: inductor through `torch.compile(step, fullgraph=True)`, one graph per (capacity, tokens
      fed, weights or not, kernel): on a CPU plain inductor, on CUDA `mode="reduce-overhead"` (its CUDA
      graph trees); kept for its fused kernels without hand-written capture;
    - `graphs`: one CUDA graph per such shape captured by hand at first use and replayed with the
      inputs copied into its static buffers (the default on CUDA); kept because it pays the host cost
      once per shape with no compiler involved. A shape whose capture fails runs plainly from then on,
      with one warning naming the cause.

    Choosing `compiled` raises dynamo's recompile limit once, there (`allow_bucket_recompiles`), not when
    the compiled step is read. The kernel is read from the calling thread once per call, outside the
    step, and is part of its key."""

    def __init__(self, bb, mode: str | None = None):
        self.bb = bb
        self.mode = mode or ("graphs" if bb.device.type == "cuda" else "plain")
        self.captured: dict[tuple, _Graph | None] = {}
        self.slabs: dict[int, Slab] = {}
        self.lock = threading.RLock()
        self._compiled = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in STEP_MODES:
            raise ValueError(f"unknown step mode {mode!r}: one of {', '.join(STEP_MODES)}")
        if mode == "compiled":
            allow_bucket_recompiles()
        self._mode = mode

    def slab(self, kv: KV, room: int) -> Slab:
        """The slab of `kv.length + room` rows' capacity, holding `kv` (the lock must be held)."""
        rows = capacity(kv.length + room)
        slab = self.slabs.get(rows)
        if slab is None or not slab.fits(kv):
            slab = self.slabs[rows] = Slab.empty(kv, rows)
            for buffer in (slab.keys, slab.values, slab.row_positions):  # CUDA graph trees then replay over
                torch._dynamo.mark_static_address(buffer)  # them in place instead of copying them in
            self.captured = {key: g for key, g in self.captured.items() if key[0] != rows}
        slab.load(kv)
        return slab

    def __call__(self, slab: Slab, tokens: list[int], position: int, attentions: bool = False):
        """Feed `tokens` at positions from `position` into the slab's next rows; (logits, weights).
        With `attentions` the step runs the grouped eager kernel, which returns weights; else the
        kernel this thread chose (`kernels.kernel`)."""
        device = slab.keys.device
        fed = torch.tensor([tokens], dtype=torch.long, device=device)
        positions = torch.arange(position, position + len(tokens), device=device)[None]
        write_rows = torch.arange(slab.filled, slab.filled + len(tokens), device=device)
        slab.filled += len(tokens)
        kernel = GROUPED_EAGER if attentions else current_kernel()
        if self.mode == "compiled":
            return self.compiled(self.bb, slab, fed, positions, write_rows, attentions, kernel)
        if self.mode == "plain":
            return step(self.bb, slab, fed, positions, write_rows, attentions, kernel)
        key = (slab.capacity, len(tokens), attentions, kernel)
        if key not in self.captured:
            self.captured[key] = _Graph.capture(self.bb, slab, fed, positions, write_rows, attentions, kernel)
        graph = self.captured[key]
        if graph is None:
            return step(self.bb, slab, fed, positions, write_rows, attentions, kernel)
        return graph.replay(fed, positions, write_rows)

    @property
    def compiled(self):
        """`step` under `torch.compile(fullgraph=True)`, built on first use; a shape is compiled on its
        first call (seconds), so a run's first steps pay that once per capacity bucket. Reading it changes
        no global setting: dynamo's limit was raised when `compiled` was chosen (`mode`)."""
        if self._compiled is None:
            cuda = self.bb.device.type == "cuda"
            self._compiled = torch.compile(
                step, fullgraph=True, dynamic=False, mode="reduce-overhead" if cuda else None
            )
        return self._compiled

    @property
    def replayed_shapes(self) -> int:
        """How many shapes run as hand-captured graphs (0 on a CPU)."""
        return sum(g is not None for g in self.captured.values())


class _Graph:
    """One captured `step` and the static tensors it reads and writes."""

    def __init__(self, graph, inputs, outputs):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs

    @classmethod
    def capture(cls, bb, slab: Slab, fed, positions, write_rows, attentions: bool, kernel: str) -> _Graph | None:
        """Warm up on a side stream, then capture. The slab's rows are saved and restored around both,
        so capturing leaves the slab as the plain step would (the step is then run plainly once)."""
        inputs = (fed.clone(), positions.clone(), write_rows.clone())
        saved = (slab.keys.clone(), slab.values.clone(), slab.row_positions.clone())
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                step(bb, slab, *inputs, attentions, kernel)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = step(bb, slab, *inputs, attentions, kernel)
        except Exception as err:  # a forward that syncs with the host cannot be captured: run it plainly
            warnings.warn(f"CUDA graph capture failed for a step at capacity {slab.capacity}: {err}", stacklevel=2)
            graph = None
        finally:
            slab.keys.copy_(saved[0])
            slab.values.copy_(saved[1])
            slab.row_positions.copy_(saved[2])
        return None if graph is None else cls(graph, inputs, outputs)

    def replay(self, fed, positions, write_rows):
        for static, value in zip(self.inputs, (fed, positions, write_rows)):
            static.copy_(value)
        self.graph.replay()
        return self.outputs
