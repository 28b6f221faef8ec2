"""The exactness checks a GPU must pass, and what replaying the serving steps as CUDA graphs buys.

    python benchmarks/gpu_exactness.py --model config:DIR [--dtypes float32,bfloat16,float16] [--length 4096]

Per dtype: `bcr verify` (full repair bit-identical to Dense through one kernel, token-identical greedy
output; the default kernel's distance reported beside), then the same greedy decode from a `--length`-row
cache with the steps run plainly, replayed as hand-captured CUDA graphs and compiled by `torch.compile`
(`mode="reduce-overhead"`, its CUDA graph trees): the tokens must be identical, and each path's
milliseconds per decode step and per two-token draft are printed; and each replayed step (decode and
draft, hand-captured and compiled) is run once under `torch.cuda.set_sync_debug_mode("error")`, which
fails on any host sync inside it. One JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bcr_core.engine.backbone import Backbone
from bcr_core.engine.kernels import GROUPED_EAGER
from bcr_core.engine.static import _Graph
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


def sync_free(bb: Backbone, length: int) -> dict:
    """Whether a replayed decode step and draft step (hand-captured graph, then compiled) run with no host
    sync: each is called under `torch.cuda.set_sync_debug_mode("error")`, which raises on any sync, with its
    inputs already on the device. {mode: "ok" or the error's first line}."""
    ids = torch.randint(100, 20000, (length,), generator=torch.Generator().manual_seed(1)).tolist()
    kv = bb.prefill(ids[:-1])
    fed = torch.tensor([[ids[-1]]], device=bb.device)
    positions = torch.tensor([[kv.next_position]], device=bb.device)
    rows = torch.tensor([kv.length], device=bb.device)
    found = {}
    for mode in ("graphs", "compiled"):
        for attentions, kernel in ((False, "sdpa"), (True, GROUPED_EAGER)):
            with bb.steps.lock:
                slab = bb.steps.slab(kv, room=1)
                if mode == "graphs":
                    graph = _Graph.capture(bb, slab, fed, positions, rows, attentions, kernel)
                    run = lambda: graph.replay(fed, positions, rows)  # noqa: E731, B023
                else:
                    compiled = bb.steps.compiled
                    run = lambda: compiled(bb, slab, fed, positions, rows, attentions, kernel)  # noqa: E731, B023
                    run()  # compiled and warmed outside the check
                    run()
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    run()
                    said = "ok"
                except RuntimeError as err:
                    said = str(err).splitlines()[0]
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                    torch.cuda.synchronize()
            found[f"{mode}_{'draft' if attentions else 'decode'}"] = said
    return found


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
        rows.append(
            {
                "dtype": dtype,
                "verify": report,
                "replay": replay_check(bb, args.length),
                "sync_free": sync_free(bb, args.length),
            }
        )
        del bb
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
