"""Engine operations at a model's shapes, timed side by side in one process against their bound.

    python benchmarks/engine_timings.py [--model default] [--lengths 512,2048] [--rho 0.2]
                                        [--repeats 3] [--profile] [--json]

Per length, on a cache of that many rows: a dense prefill, a repair of a fraction rho of the rows
(spread over the whole span, so each attends to most of the cache; the cost does not depend on how
wrong the rows are), BCR's two-token draft, and one decode step. Each reports its median time over
`repeats` (after a warm-up), GFLOP/s, GB/s moved (weights read once per forward pass, cached rows
read and written: what bounds a decode step), and the fraction of its bound: each forward pass at
its arithmetic or its memory traffic, whichever is slower, at the rates this process measures at
this length (bcr_core/probes/bound.py). `--profile` adds torch.profiler's top entries for each
operation at the last length, and how much of its wall time the device was busy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pandas as pd
import torch

from bcr_core import paper
from bcr_core.engine.backbone import Backbone
from bcr_core.engine.memory import keep_freed_memory
from bcr_core.engine.models import DTYPES
from bcr_core.probes.bound import Shape, decode_pass, draft_passes, forward_pass, measure_rates, timed

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")  # the profiler's names for a launch


def operations(bb: Backbone, length: int, rho: float, generator: torch.Generator) -> dict:
    """name -> (run it once, its forward passes) on a fresh cache of `length` rows."""
    shape = Shape.of(bb.config)
    ids = torch.randint(100, min(bb.config.vocab_size, 40000), (length,), generator=generator).tolist()
    cache = bb.prefill(ids)
    rows = torch.randperm(length, generator=generator)[: max(1, round(rho * length))].sort().values.tolist()
    last = ids[-1]
    return {
        "prefill": (lambda: bb.prefill(ids), [forward_pass(shape, list(range(length)), length, logits=False)]),
        f"repair {len(rows)} rows": (
            lambda: bb.repair(cache, ids, rows),
            [forward_pass(shape, rows, length, logits=False)],
        ),
        "draft (2 steps)": (lambda: bb.draft(cache, last), draft_passes(shape, length)),
        "decode step": (lambda: bb.generate(cache, last, 1, stop_ids=()), [decode_pass(shape, length)]),
    }


def profile(bb: Backbone, name: str, run) -> None:
    """torch.profiler's top entries for one run, and the device's busy share of its wall time."""
    from torch.profiler import ProfilerActivity

    cuda = bb.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    run()
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"\n== {name}: {1000 * wall:.1f} ms under the profiler")
    if cuda:
        busy = sum(e.self_device_time_total for e in events) / 1e6
        launches = sum(e.count for e in events if e.key in LAUNCHES)
        print(f"device busy {1000 * busy:.1f} ms ({busy / wall:.0%} of wall), {launches} kernel launches")
    print(events.table(sort_by=sort, row_limit=12, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--rho", type=float, default=paper.RHO)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="as `bcr --dtype`")
    parser.add_argument("--model", default="default")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    keep_freed_memory()
    start = time.perf_counter()
    bb = Backbone.load(args.model, dtype=args.dtype)
    load_s = time.perf_counter() - start
    shape, itemsize = Shape.of(bb.config), bb.dtype.itemsize
    generator = torch.Generator().manual_seed(0)
    rows, ops = [], {}
    for length in (int(x) for x in args.lengths.split(",")):
        rates = measure_rates(shape, rows=length, dtype=bb.dtype, device=bb.device)
        ops = operations(bb, length, args.rho, generator)
        for name, (run, passes) in ops.items():
            seconds = timed(run, args.repeats, bb.device, reduce=statistics.median)
            flops = sum(p.flops for p in passes)
            moved = sum(p.elements for p in passes) * itemsize
            rows.append(
                {
                    "length": length,
                    "operation": name,
                    "ms": 1000 * seconds,
                    "gflops": flops / seconds / 1e9,
                    "gb_per_s": moved / seconds / 1e9,
                    "bound_ms": 1000 * rates.seconds(passes),
                    "bound_fraction": rates.seconds(passes) / seconds,
                }
            )
    table = pd.DataFrame(rows)
    if args.json:
        print(json.dumps({"model": args.model, "device": str(bb.device), "load_s": load_s, "rows": rows}, indent=2))
    else:
        print(f"{args.model} on {bb.device} ({bb.dtype}, {torch.get_num_threads()} threads): load {load_s:.2f} s")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if args.profile:
        for name, (run, _) in ops.items():
            profile(bb, f"{name} at {length} rows", run)


if __name__ == "__main__":
    main()
