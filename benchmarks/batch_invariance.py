"""What batch-invariant decoding costs (`engine.invariance`): decode tokens per second of the batch decoder at
batch 1, 4 and 8, invariant against the decoder before it (`Backbone.batch_invariant = False`), side by side
in one process, the two alternating so that load drifts hit both; and whether each kept its tokens.

    OMP_NUM_THREADS=2 python benchmarks/batch_invariance.py [--model qwen2.5-coder-0.5b] [--dtype bfloat16]
                                                           [--tokens 64] [--repeats 2] [--json]

Each measurement decodes `--tokens` tokens (no early stop) for `batch` HumanEval prompts (the Programming
Expert's user turn is not needed for timing: each task's prompt as the user turn), prefills excluded, and
reports tokens per second (rows x tokens / seconds) as the median over repeats. It also says, per batch, how
many of the invariant run's sequences equal the same sequences decoded alone (all of them, by the tests'
claim) and how many of the old decoder's do.
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
from bcr_core.engine.batching import BatchDecoder
from bcr_core.engine.invariance import decode_rows

BATCHES = (1, 4, 8)


def caches(bb: Backbone, n: int) -> list:
    found = []
    for task in datasets.load_humaneval()[:n]:
        ids = bb.chat_ids([{"role": "user", "content": f"Complete this function.\n{task['prompt']}"}])
        found.append((bb.prefill(ids[:-1]), ids[-1]))
    return found


def decode(bb: Backbone, chosen: list, tokens: int) -> tuple[float, list[list[int]]]:
    decoder, done = BatchDecoder(bb, stop_ids=()), {}
    for i, (kv, last) in enumerate(chosen):
        decoder.add(i, kv, last, tokens)
    started = time.perf_counter()
    while decoder:
        done.update(decoder.step())
    return time.perf_counter() - started, [done[i].tokens for i in range(len(chosen))]


# each arm: (batch-invariant, rows of a decode step's products)
ARMS = {"before": (False, 8), "invariant, 8-row products": (True, 8), "invariant, 1-row products": (True, 1)}


def arm(bb: Backbone, name: str) -> None:
    bb.batch_invariant, bb.decode_rows = ARMS[name]


def measure(bb: Backbone, tokens: int, repeats: int) -> pd.DataFrame:
    prompts = caches(bb, max(BATCHES))
    alone = {}
    for name in ARMS:
        arm(bb, name)
        alone[name] = [decode(bb, [c], tokens)[1][0] for c in prompts]
    rows = []
    for batch in BATCHES:
        seconds, kept = {name: [] for name in ARMS}, {}
        for _ in range(repeats):
            for name in ARMS:
                arm(bb, name)
                took, got = decode(bb, prompts[:batch], tokens)
                seconds[name].append(took)
                kept[name] = sum(g == a for g, a in zip(got, alone[name]))
        for name in ARMS:
            rows.append(
                {
                    "decoder": name,
                    "batch": batch,
                    "tokens_per_s": batch * tokens / statistics.median(seconds[name]),
                    "sequences_equal_to_alone": f"{kept[name]}/{batch}",
                }
            )
    bb.batch_invariant, bb.decode_rows = True, decode_rows(bb.dtype)
    table = pd.DataFrame(rows)
    before = table[table.decoder == "before"].set_index("batch")["tokens_per_s"]
    table["vs_before"] = [r.tokens_per_s / before[r.batch] for r in table.itertuples()]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bb = Backbone.load(args.model, device="cpu", dtype=args.dtype)
    table = measure(bb, args.tokens, args.repeats)
    meta = {"model": args.model, "dtype": args.dtype, "threads": torch.get_num_threads(), "tokens": args.tokens}
    if args.json:
        print(json.dumps({**meta, "rows": table.to_dict("records")}))
    else:
        print(meta)
        print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
