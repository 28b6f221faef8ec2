"""The serving steps plain against compiled (`torch.compile`, inductor), and float32 against bfloat16,
side by side in one process on this machine.

    python benchmarks/step_modes.py [--model default] [--lengths 160,512,2048] [--dtypes float32,bfloat16]
                                    [--repeats 5] [--item N] [--json]

Per dtype and length, on a cache of that many rows: one decode step and one two-token draft, each in
`Steps`' plain and compiled modes (`engine.static`), medians over `repeats` after a warm-up; the compiled
mode's first call (tracing and inductor's code generation for that shape) is reported as its compile
time. `--item N` adds the first N items of the claims grid's cell a (synthetic, 3 agents, the six
conditions, fidelity, batch 8; the first items only warm KVComm's pool) served end to end in each mode,
compile time included, in fresh folders, plain first; prefill is timed too, per dtype (it does not depend
on the mode). Each mode's tokens are checked equal to the plain mode's. Ratios are compiled / plain and
bfloat16 / float32 (below 1: faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from bcr_core.engine.backbone import Backbone

CELL_A = [
    "dense",
    "token-matched-dense",
    "kvcomm",
    "bcr-chunk:chunk=16",
    "coin-chunk:chunk=16",
    "cacheblend-cost:chunk=16",
]


def median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def step_rows(bb: Backbone, length: int, repeats: int) -> list[dict]:
    """Decode step and draft at `length` cached rows, plain then compiled."""
    ids = torch.randint(100, min(bb.config.vocab_size, 40000), (length,), generator=torch.Generator().manual_seed(0))
    kv, last = bb.prefill(ids[:-1].tolist()), int(ids[-1])
    prefill_ms = median_ms(lambda: bb.prefill(ids[:-1].tolist()), max(1, repeats // 2))
    operations = {
        "decode step": lambda: bb.generate(kv, last, 1, stop_ids=()).tokens,
        "draft (2 steps)": lambda: bb.draft(kv, last).tokens,
    }
    rows = []
    for name, run in operations.items():
        found = {}
        for mode in ("plain", "compiled"):
            bb.steps.mode = mode
            started = time.perf_counter()
            tokens = run()  # the compiled mode traces and generates code for this shape here
            first_ms = 1000 * (time.perf_counter() - started)
            found[mode] = (median_ms(run, repeats), first_ms, tokens)
        bb.steps.mode = "plain"
        (plain, _, want), (compiled, first, got) = found["plain"], found["compiled"]
        rows.append(
            {
                "dtype": str(bb.dtype).removeprefix("torch."),
                "rows": length,
                "operation": name,
                "plain_ms": plain,
                "compiled_ms": compiled,
                "compiled_over_plain": compiled / plain,
                "compile_s": (first - compiled) / 1000,
                "same_tokens": got == want,
                "prefill_ms": prefill_ms,
            }
        )
    return rows


def item_rows(model: str, dtype: str, n: int) -> list[dict]:
    """The first `n` items of the claims cell a, end to end, plain then compiled (a fresh backbone each);
    the first items warm KVComm's anchor pool (served densely, no draft), so `n` must pass the warm-up
    for a draft step to run at all."""
    from bcr_core.runs.cell import RunSettings
    from bcr_core.runs.runner import run_cell

    rows = []
    for mode in ("plain", "compiled"):
        bb = Backbone.load(model, dtype=dtype)
        bb.steps.mode = mode
        cell = RunSettings(
            model=model,
            dtype=dtype,
            benchmark="synthetic",
            agents=3,
            n=n,
            max_new_tokens=8,
            fidelity=True,
            conditions=CELL_A,
            seeds=[0],
        ).cell()
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            table = run_cell(bb, cell, Path(out), progress=False, batch=8)
            seconds = time.perf_counter() - started
        reused = float(table.loc[table["condition"] != "dense", "reuse_rate"].mean())
        rows.append({"dtype": dtype, "mode": mode, "items": n, "seconds": seconds, "reuse_rate": reused})
        rows[-1]["answers"] = table["answer"].tolist()
    plain, compiled = rows
    compiled["same_answers"] = compiled["answers"] == plain["answers"]
    compiled["compiled_over_plain"] = compiled["seconds"] / plain["seconds"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--lengths", default="160,512,2048")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--item", type=int, default=0, help="also this many items of the claims cell a, end to end")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    steps, items = [], []
    for dtype in args.dtypes.split(","):
        bb = Backbone.load(args.model, dtype=dtype)
        for length in map(int, args.lengths.split(",")):
            steps.extend(step_rows(bb, length, args.repeats))
        del bb
        if args.item:
            items.extend(item_rows(args.model, dtype, args.item))
    table = pd.DataFrame(steps)
    fp32 = table[table.dtype == "float32"].set_index(["rows", "operation"])
    for dtype in table.dtype.unique():
        if dtype != "float32" and len(fp32):
            other = table[table.dtype == dtype].set_index(["rows", "operation"])
            table.loc[table.dtype == dtype, "plain_over_float32"] = (other.plain_ms / fp32.plain_ms).to_numpy()
            table.loc[table.dtype == dtype, "prefill_over_float32"] = (other.prefill_ms / fp32.prefill_ms).to_numpy()
    if args.json:
        print(json.dumps({"threads": torch.get_num_threads(), "steps": table.to_dict("records"), "items": items}))
        return
    print(f"torch threads: {torch.get_num_threads()}")
    print(table.round(3).to_string(index=False))
    for row in items:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "answers"})


if __name__ == "__main__":
    main()
