"""Experiment throughput: items per hour of one runner cell at batch size 1 and at larger batches.

    python benchmarks/throughput.py [--benchmark gsm8k] [--agents 3] [--n 6] [--batches 1,4,8]
                                    [--conditions C1,C2,...] [--max-new-tokens 128]

The default cell is the layouts comparison of notebook 05 (seven conditions).

Each batch size runs the same cell from scratch in its own folder, one after another in this
process. Items per hour counts an item once all conditions have served it. Also reports KVComm's
anchor matching + cache assembly per reuse call (batch 1) against Dense's TTFT on the same prompt. Every call's output
tokens, gate decisions and repaired rows are compared with batch size 1 and any differing call is
reported (a difference can only come from a float near-tie in batched decoding).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.memory import keep_freed_memory
from bcr_core.runs.cell import Cell
from bcr_core.runs.run_files import read_jsonl
from bcr_core.runs.runner import run_cell

COMPARED = ("output_tokens", "mode", "reason", "decisions", "repaired_rows")


def call_outputs(folder: Path) -> dict:
    return {
        (c["condition"], c["item_id"], c["node"]): [c[k] for k in COMPARED] for c in read_jsonl(folder / "calls.jsonl")
    }


def assembly_costs(folder: Path, condition: str = "kvcomm") -> dict:
    """Anchor matching + cache assembly of `condition`'s reuse calls, in ms and as a share of the
    TTFT of the Dense call on the same item and node (measured at batch size 1)."""
    calls = pd.DataFrame(read_jsonl(folder / "calls.jsonl"))
    reuse = calls[(calls["condition"] == condition) & (calls["mode"] == "reuse")]
    dense = calls[calls["condition"] == "dense"].set_index(["item_id", "node"])["ttft_s"]
    if reuse.empty or dense.empty:
        return {}
    share = reuse["assembly_s"].to_numpy() / dense.loc[list(zip(reuse["item_id"], reuse["node"]))].to_numpy()
    return {
        "reuse_calls": len(reuse),
        "assembly_ms_median": 1000 * reuse["assembly_s"].median(),
        "assembly_ms_p90": 1000 * reuse["assembly_s"].quantile(0.9),
        "share_of_dense_ttft_median": float(pd.Series(share).median()),
        "share_of_dense_ttft_max": float(share.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="gsm8k")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--conditions", default="dense,kvcomm,bcr-chunk,bcr-grow,bcr-single,coin-chunk,cacheblend-cost")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--model", default="default")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    keep_freed_memory()
    bb = Backbone.load(args.model)
    cell = Cell(args.benchmark, args.agents, tuple(args.conditions.split(",")), args.n, args.max_new_tokens)
    batches = [int(b) for b in args.batches.split(",")]
    if batches[0] != 1:
        batches.insert(0, 1)
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches:
            folder = Path(tmp) / f"batch{batch}"
            start = time.perf_counter()
            run_cell(bb, cell, folder, progress=not args.json, batch=batch)
            seconds = time.perf_counter() - start
            outputs = call_outputs(folder)
            if reference is None:
                reference, assembly = outputs, assembly_costs(folder)
            differing = sorted(k for k in reference if outputs.get(k) != reference[k])
            rows.append(
                {
                    "batch": batch,
                    "seconds": seconds,
                    "items_per_hour": 3600 * args.n / seconds,
                    "calls": len(outputs),
                    "calls_differing_from_batch_1": len(differing),
                    "first_differing": " ".join(map(str, differing[0])) if differing else "",
                }
            )
    table = pd.DataFrame(rows)
    table["speedup_vs_batch_1"] = table["items_per_hour"] / table["items_per_hour"].iloc[0]
    if args.json:
        print(
            json.dumps(
                {
                    "cell": {
                        "benchmark": cell.benchmark,
                        "agents": cell.n_agents,
                        "n": cell.n,
                        "conditions": list(cell.conditions),
                        "max_new_tokens": cell.max_new_tokens,
                    },
                    "rows": table.to_dict(orient="records"),
                    "kvcomm_assembly": assembly,
                },
                indent=2,
            )
        )
    else:
        print(
            f"{cell.benchmark} x{cell.n_agents} agents, {cell.n} items, conditions {', '.join(cell.conditions)}, "
            f"{cell.max_new_tokens} new tokens per call"
        )
        print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
        if assembly:
            print(
                f"kvcomm, {assembly['reuse_calls']} reuse calls at batch 1: anchor matching + assembly "
                f"{assembly['assembly_ms_median']:.1f} ms median, {assembly['assembly_ms_p90']:.1f} ms p90; "
                f"share of the Dense call's TTFT on the same prompt {assembly['share_of_dense_ttft_median']:.1%} "
                f"median, {assembly['share_of_dense_ttft_max']:.1%} max"
            )


if __name__ == "__main__":
    main()
