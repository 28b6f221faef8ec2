"""Table 10 at a model's shapes on this machine's device, beside the paper's A100 numbers, written as it goes.

    python benchmarks/table10.py --model config:llama-3.1-8b --out DIR [--lengths 64,512,2048,4096]
        [--rho 0.05,0.1,0.2,0.3,0.4] [--samples 3] [--dtype bfloat16]

The protocol is `bcr ttft`'s (bcr_core/probes/latency.py), one length at a time: after each
length its paired calls are appended to DIR/calls.csv and the summary so far is rewritten to
DIR/table.csv and DIR/table.json, so a run stopped by a time limit keeps every finished length.
DIR/machine.json names the device, the versions and the rates the bound is taken at.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import pandas as pd
import torch
import transformers

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.memory import keep_freed_memory
from bcr_core.engine.models import DTYPES
from bcr_core.probes.latency import summarize_ttft, ttft_calls

# The paper's Table 10 (Llama-3.1-8B, bf16, one A100 80GB): TTFT in ms by segment length.
PAPER_A100_MS = {
    ("dense", None): {64: 159.2, 512: 198.1, 2048: 341.2, 4096: 542.7},
    ("kvcomm", None): {64: 60.3, 512: 56.2, 2048: 64.7, 4096: 72.9},
    ("bcr-chunk", 0.05): {64: 89.0, 512: 100.3, 2048: 108.1, 4096: 119.2},
    ("bcr-chunk", 0.1): {64: 100.8, 512: 99.0, 2048: 111.1, 4096: 137.0},
    ("bcr-chunk", 0.2): {64: 102.4, 512: 112.1, 2048: 155.2, 4096: 229.8},  # the SDPA kernel's row
    ("bcr-chunk", 0.3): {64: 113.8, 512: 124.6, 2048: 173.4, 4096: 255.1},
    ("bcr-chunk", 0.4): {64: 126.1, 512: 144.8, 2048: 212.8, 4096: 304.3},
}
PAPER_A100_SPEEDUP = {
    ("kvcomm", None): {64: 2.48, 512: 3.26, 2048: 5.25, 4096: 7.63},
    ("bcr-chunk", 0.05): {64: 1.80, 512: 1.97, 2048: 3.16, 4096: 4.54},
    ("bcr-chunk", 0.1): {64: 1.59, 512: 2.00, 2048: 3.08, 4096: 3.96},
    ("bcr-chunk", 0.2): {64: 1.56, 512: 1.77, 2048: 2.20, 4096: 2.35},  # SDPA
    ("bcr-chunk", 0.3): {64: 1.41, 512: 1.59, 2048: 1.97, 4096: 2.13},
    ("bcr-chunk", 0.4): {64: 1.27, 512: 1.37, 2048: 1.61, 4096: 1.78},
}


def beside_the_paper(table: pd.DataFrame) -> pd.DataFrame:
    """The summary with the paper's A100 TTFT and speedup for the same method, rho and length."""

    def paper(numbers, row):
        rho = None if pd.isna(row["rho"]) else round(float(row["rho"]), 2)
        return numbers.get((row["method"], rho), {}).get(int(row["length"]))

    return table.assign(
        paper_ttft_ms=[paper(PAPER_A100_MS, r) for _, r in table.iterrows()],
        paper_speedup=[paper(PAPER_A100_SPEEDUP, r) for _, r in table.iterrows()],
    )


def machine(bb: Backbone, calls: pd.DataFrame) -> dict:
    """The device, the versions, and the rates the bound of each length was taken at."""
    device = bb.device
    rates = calls.groupby("length")[["matmul_tflops", "attention_tflops", "copy_gb_s"]].first()
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(bb.dtype),
        "threads": torch.get_num_threads(),
        "rates_at_length": {int(n): row.to_dict() for n, row in rates.iterrows()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="as `bcr --dtype`")
    parser.add_argument("--model", default="config:llama-3.1-8b")
    parser.add_argument("--lengths", default="64,512,2048,4096")
    parser.add_argument("--rho", default="0.05,0.1,0.2,0.3,0.4")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rhos = [float(x) for x in args.rho.split(",")]

    keep_freed_memory()
    args.out.mkdir(parents=True, exist_ok=True)
    bb = Backbone.load(args.model, dtype=args.dtype)
    calls = []
    for seed, length in enumerate(lengths):
        started = time.perf_counter()
        calls.append(ttft_calls(bb, (length,), rhos, args.samples, seed=seed, progress=False))
        print(f"{length} tokens: {time.perf_counter() - started:.0f} s", flush=True)
        every = pd.concat(calls, ignore_index=True)
        every.to_csv(args.out / "calls.csv", index=False)
        (args.out / "machine.json").write_text(json.dumps({"model": args.model, **machine(bb, every)}, indent=2))
        table = beside_the_paper(summarize_ttft(every))
        table.to_csv(args.out / "table.csv", index=False)
        table.to_json(args.out / "table.json", orient="records", indent=2)
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(table[table.length == length].to_string(index=False, float_format=lambda x: f"{x:.3g}"), flush=True)


if __name__ == "__main__":
    main()
