"""Engine timings on the embedded model, measured side by side in one process.

    python benchmarks/engine_timings.py [--lengths 512,2048] [--rho 0.2] [--repeats 3]

Reports model load time, dense prefill time per length, the time to repair a fraction rho of the
rows of a cache of that length (rows spread over the whole span, so each attends to most of the
cache; the cost does not depend on how wrong the rows are), and repair / prefill as a ratio.
Medians over repeats; the first call of each kind is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.memory import keep_freed_memory


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--rho", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="default")
    args = parser.parse_args()

    keep_freed_memory()
    start = time.perf_counter()
    bb = Backbone.load(args.model)
    print(f"load: {time.perf_counter() - start:.2f} s  (threads: {torch.get_num_threads()})")
    generator = torch.Generator().manual_seed(0)
    for length in (int(x) for x in args.lengths.split(",")):
        ids = torch.randint(100, 40000, (length,), generator=generator).tolist()
        cache = bb.prefill(ids)  # repair cost does not depend on how wrong the rows are
        rows = torch.randperm(length, generator=generator)[: round(args.rho * length)].sort().values
        prefill_s = timed(lambda ids=ids: bb.prefill(ids), args.repeats)
        repair_s = timed(lambda cache=cache, ids=ids, rows=rows: bb.repair(cache, ids, rows), args.repeats)
        print(
            f"{length:5d} tokens: prefill {prefill_s:.3f} s, repair of {len(rows)} rows ({args.rho:.0%}) "
            f"{repair_s:.3f} s, repair / prefill = {repair_s / prefill_s:.3f}"
        )


if __name__ == "__main__":
    main()
