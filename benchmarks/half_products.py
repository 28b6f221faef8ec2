"""What float32 products buy a half-precision model on a CPU without half-precision matrix units
(`engine.products`): seconds of each operation a HumanEval run spends its time in, with the products
computed by PyTorch's generic half-precision kernels ("generic") and in float32 ("float32"), side by side
in one process, the two alternating so that load drifts hit both; and how far their outputs differ.

    OMP_NUM_THREADS=2 python benchmarks/half_products.py [--model qwen2.5-coder-0.5b] [--dtype bfloat16]
                                                        [--repeats 2] [--json]

The operations, on a user turn of HumanEval prompts (one task's, about 150 tokens, as a first agent reads; six
tasks', about 650, the length of a third agent's prompt): a prefill; a repair of a fifth of the rows in 16-row
chunks (BCR at rho 0.2); a teacher-forced pass of 8 copies of the cache over 128 tokens (the arena's batch); 32
greedy decode steps (one-row products: the same kernel in both arms, a control). Every operation reads the same
cache. Seconds are the median over repeats; "differ" is the largest difference of the operation's output between
the arms relative to its largest magnitude ("equal" where bit-identical; for decoding, whether the tokens are).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pandas as pd
import torch

from bcr_core.data import datasets
from bcr_core.engine.backbone import Backbone
from bcr_core.engine.kv import KV
from bcr_core.engine.products import float32_products

ARMS = ("generic", "float32")
PROMPTS = {"first agent (1 task)": 1, "third agent (6 tasks)": 6}


def prompt_ids(bb: Backbone, tasks: int) -> list[int]:
    text = "\n\n".join(t["prompt"] for t in datasets.load_humaneval()[:tasks])
    return bb.chat_ids([{"role": "user", "content": f"Complete these functions.\n{text}"}])


def operations(bb: Backbone, ids: list[int]) -> dict:
    """Each operation as a function returning the tensor it computes (decode: its tokens)."""
    kv = bb.prefill(ids[:-1])
    m = kv.length
    rows = [r for start in range(0, m, 80) for r in range(start, min(start + 16, m))]  # every fifth 16-row chunk
    forced = list(ids[1:129]) if len(ids) > 129 else list(ids[1:])
    return {
        "prefill": lambda: bb.prefill(ids[:-1]).keys,
        "repair, rho 0.2": lambda: bb.repair(kv, ids[:-1], rows).keys,
        "teacher-forced, 8 copies x 128 tokens": lambda: bb.forced_logits_batch(KV.batch([kv] * 8), ids[-1], forced),
        "32 decode steps": lambda: torch.tensor(bb.generate(kv, ids[-1], 32, stop_ids=()).tokens),
    }


def timed(run) -> tuple[float, torch.Tensor]:
    started = time.perf_counter()
    out = run()
    return time.perf_counter() - started, out


def measure(bb: Backbone, repeats: int) -> pd.DataFrame:
    rows = []
    for prompt, tasks in PROMPTS.items():
        ids = prompt_ids(bb, tasks)
        float32_products(bb.model, enabled=False)
        ops = operations(bb, ids)  # the cache every operation reads: the generic arm's prefill in both arms
        for op, run in ops.items():
            seconds, outputs = {arm: [] for arm in ARMS}, {}
            for _ in range(repeats):
                for arm in ARMS:
                    float32_products(bb.model, enabled=arm == "float32")
                    took, outputs[arm] = timed(run)
                    seconds[arm].append(took)
            generic, fast = (outputs[a].float() for a in ARMS)
            same = torch.equal(generic, fast)
            differ = "equal" if same else ((generic - fast).abs().max() / generic.abs().max()).item()
            rows.append(
                {
                    "prompt": f"{prompt}, {len(ids)} tokens",
                    "operation": op,
                    **{f"{arm}_s": statistics.median(seconds[arm]) for arm in ARMS},
                    "speedup": statistics.median(seconds["generic"]) / statistics.median(seconds["float32"]),
                    "differ": differ,
                }
            )
    float32_products(bb.model, enabled=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bb = Backbone.load(args.model, device="cpu", dtype=args.dtype)
    table = measure(bb, args.repeats)
    meta = {"model": args.model, "dtype": args.dtype, "threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps({**meta, "rows": table.to_dict("records")}))
    else:
        print(meta)
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))


if __name__ == "__main__":
    main()
