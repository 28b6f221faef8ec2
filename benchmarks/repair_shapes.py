"""Does a repair cost more the first time its attention blocks take a new shape?

    python benchmarks/repair_shapes.py [--model config:llama-3.1-8b] [--length 4096] [--chunks 13]

Repairs `chunks` random 64-row chunks of a `length`-row cache, 15 timed times each way: the same
chunks every time, fresh random chunks every time (new (query block, key extent) shapes), both with
PyTorch's default attention backends and with cuDNN's excluded. On an H200 cuDNN's attention builds
an execution plan per new shape, which is what spreads coin-chunk's TTFT in results/ttft_h200.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bcr_core.engine.backbone import Backbone
from bcr_core.probes.bound import timed

NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="config:llama-3.1-8b")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--chunks", type=int, default=13)
    args = parser.parse_args()

    bb = Backbone.load(args.model)
    generator, chunk = torch.Generator().manual_seed(0), 64
    ids = torch.randint(100, 40000, (args.length,), generator=generator).tolist()
    cache = bb.prefill(ids)

    def random_rows() -> list[int]:
        chosen = torch.randperm(args.length // chunk, generator=generator)[: args.chunks].tolist()
        return sorted(r for c in chosen for r in range(c * chunk, (c + 1) * chunk))

    def run(label: str, fresh: bool, backends=None) -> None:
        fixed = random_rows()
        plans = iter([random_rows() if fresh else fixed for _ in range(16)])  # drawn before the clock starts
        with sdpa_kernel(backends) if backends else contextlib.nullcontext():
            times = [1000 * t for t in timed(lambda: bb.repair(cache, ids, next(plans)), 15, bb.device, reduce=list)]
        q = statistics.quantiles(times, n=10)
        print(f"{label:44s} median {statistics.median(times):7.1f} ms  p10 {q[0]:7.1f}  p90 {q[-1]:7.1f}")

    run("same chunks, default backends", fresh=False)
    run("fresh random chunks, default backends", fresh=True)
    run("same chunks, cuDNN excluded", fresh=False, backends=NO_CUDNN)
    run("fresh random chunks, cuDNN excluded", fresh=True, backends=NO_CUDNN)
    run("fresh random chunks, default backends again", fresh=True)


if __name__ == "__main__":
    main()
