"""The exactness checks a GPU must pass, and what replaying the serving steps as CUDA graphs buys.

    python benchmarks/gpu_exactness.py --model config:DIR [--dtypes float32,bfloat16,float16] [--length 4096]

Per dtype: `bcr verify` (full repair bit-identical to Dense through one kernel, token-identical greedy
output; the default kernel's distance reported beside), then the same greedy decode from a `--length`-row
cache with the steps run plainly, replayed as hand-captured CUDA graphs and compiled by `torch.compile`
(`mode="reduce-overhead"`, its CUDA graph trees): the tokens must be identical, and each path's
milliseconds per decode step and per two-token draft are printed. One JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bcr_core.engine.backbone import Backbone
from bcr_core.probes.verify import verify

STEPS = 32


def timed_ms(run, device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda device: None
    sync(device)
    started = time.perf_counter()
    run()
    sync(device)
    return 1000 * (time.perf_counter() - started)


def replay_check(bb: Backbone, length: int) -> dict:
    """Greedy tokens and step times from a `length`-row cache, plain, replayed by hand and compiled."""
    ids = torch.randint(100, 20000, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    kv, last = bb.prefill(ids[:-1]), ids[-1]
    found = {}
    for mode in ("plain", "graphs", "compiled"):
        bb.steps.mode = mode
        bb.generate(kv, last, STEPS, stop_ids=())  # warm-up (and capture, where replayed)
        bb.draft(kv, last)
        generated = []
        decode_ms = timed_ms(lambda: generated.append(bb.generate(kv, last, STEPS, stop_ids=())), bb.device)  # noqa: B023
        draft_ms = timed_ms(lambda: bb.draft(kv, last), bb.device)
        found[mode] = {
            "tokens": generated[0].tokens,
            "ms_per_decode_step": decode_ms / STEPS,
            "ms_per_draft": draft_ms,
        }
    return {
        "length": length,
        "token_identical": found["plain"]["tokens"] == found["graphs"]["tokens"],
        "compiled_token_identical": found["plain"]["tokens"] == found["compiled"]["tokens"],
        "replayed_shapes": bb.steps.replayed_shapes,
        **{f"{path}_{key}": value for path, row in found.items() for key, value in row.items() if key != "tokens"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--length", type=int, default=4096)
    args = parser.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        bb = Backbone.load(args.model, dtype=dtype)
        report = verify(bb).to_dict()
        rows.append({"dtype": dtype, "verify": report, "replay": replay_check(bb, args.length)})
        del bb
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
