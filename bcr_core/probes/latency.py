"""Time to first token, the Table 10 protocol (paper App. C): Dense, KVComm, BCR-chunk and its
coin control on synthetic symbol segments, every call served every way in one process.

Five CopyMachine agents each read one random symbol string of `length` tokens. Every method
has its own server over one shared store of exact caches (node prefixes and base caches, built
when a segment appears, outside any TTFT, as in serving). Warm-up requests are not timed: two fill
the anchor pools, once per distinct pool (`fill_pools`: servers whose pools would hold the same
anchors take copies of one warm pool, so the fill costs the same whatever the number of rhos), and
one more, served by every server, warms every timed path. KVComm's gate is forced open (gamma = 1)
so every timed call is served from an assembled cache. TTFT runs from before anchor matching to the
first token, so it includes matching, assembly, BCR's two-token draft and the repair; the coin
variant spends the same budget without the draft. Speedups are means of per-call ratios against Dense on the same call,
reported with their spread over the paired calls (median, and the central 95% of the ratios).

Beside each time: the arithmetic the call cannot avoid and the time that takes at the machine's
measured rates (`bound`), the achieved fraction of that bound, the GFLOP/s achieved, and the
process's peak resident memory once the length was done.
"""

from __future__ import annotations

import random
import resource
import time

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from bcr_core.conditions import condition, make_server
from bcr_core.data.roles import COPY
from bcr_core.engine.capacity import check_rows_fit
from bcr_core.errors import UsageError
from bcr_core.probes.bound import Shape, call_passes, measure_rates
from bcr_core.reuse.anchors import KVCommConfig
from bcr_core.reuse.prompts import QUESTION, Template, build_prompt
from bcr_core.reuse.segments import share_segment_caches
from bcr_core.reuse.servers import KVCommServer

N_AGENTS = 5
WARM_UP_FILL = 2  # requests that fill the anchor pools: with under two anchors every call is dense
WARM_UP_PATHS = 1  # one more request, served by every server, warms every timed path


def copy_templates(n_agents: int = N_AGENTS) -> list[Template]:
    system = COPY.roles["Copy Machine"]
    user = "Text:\n{" + QUESTION + "}\n\n" + COPY.instruction
    return [Template(f"agent_{i}", "Copy Machine", system, user) for i in range(1, n_agents + 1)]


def symbol_ids(tokenizer) -> list[int]:
    """Token ids of single symbols (' a', ' 7', ...) that tokenize to exactly one token."""
    symbols = [f" {c}" for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
    ids = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in symbols]
    return [i[0] for i in ids if len(i) == 1]


def symbol_segment(tokenizer, length: int, rng: random.Random) -> str:
    """A random symbol string of `length` tokens."""
    alphabet = symbol_ids(tokenizer)
    return tokenizer.decode([rng.choice(alphabet) for _ in range(length)]).strip()


def check_settings(lengths, samples: int) -> None:
    if samples < 1:
        raise UsageError(f"--samples must be >= 1, got {samples}")
    short = [n for n in lengths if n < 1]
    if short:
        raise UsageError(f"--lengths are segment lengths in tokens, each at least 1; got {short}")


def check_lengths(bb, lengths) -> None:
    """Refuse, before any work, a length whose calls do not fit the model's context (one decoded
    token after the template and the segment) or whose caches do not fit the free memory."""
    segment = symbol_segment(bb.tokenizer, 1, random.Random(0))
    template = len(build_prompt(bb.tokenizer, copy_templates(1)[0], {QUESTION: segment}).dense_ids) - 1
    context = getattr(bb.config, "max_position_embeddings", None)
    for length in lengths:
        if isinstance(context, int) and template + length + 1 > context:
            raise UsageError(
                f"--lengths {length}: a call is {template + length + 1} tokens with its template and one "
                f"decoded token, more than the model's context of {context} (config max_position_embeddings); "
                f"the longest length that fits is {context - template - 1}"
            )
        check_rows_fit(bb, template + length + 1, f"--lengths {length}")


def request_prompts(bb, templates: list[Template], length: int, rng: random.Random) -> list:
    """One request: a fresh symbol segment of `length` tokens, and every agent's prompt over it."""
    question = symbol_segment(bb.tokenizer, length, rng)
    return [build_prompt(bb.tokenizer, template, {QUESTION: question}) for template in templates]


def pool_groups(servers) -> list[list[KVCommServer]]:
    """The KVComm-based servers grouped by pool settings (`KVCommConfig`): servers whose pools
    would hold the same anchors after the same dense calls. A dense call stores the same anchors
    whatever the server (the servers differ only in what they do with an assembled cache), and
    while a pool holds fewer than two anchors of a placeholder for a node, every gate sends that
    node's call to a dense prefill."""
    groups: dict[KVCommConfig, list[KVCommServer]] = {}
    for server in servers:
        if isinstance(server, KVCommServer):
            groups.setdefault(server.config, []).append(server)
    return list(groups.values())


def fill_pools(servers, prompts: list) -> int:
    """Fill the anchor pools with `prompts` (not timed): in each group of `pool_groups` the first
    server serves every prompt, the others take copies of its warm pool, so each server holds what
    serving the prompts itself would have left it. Refuses a prompt the pool already serves from an
    assembled cache: what a server does with one differs, so that call would not be the same in
    every server of the group. Returns the number of calls served (dense prefills)."""
    served = 0
    for first, *rest in pool_groups(servers):
        for prompt in prompts:
            call = first.serve(prompt, 1)
            served += 1
            if call.mode != "dense":
                raise RuntimeError(
                    f"warm-up call {served} of {first.name} was served from its anchor pool ({call.reason}), "
                    "not densely: the pool cannot be copied to servers that would treat that call differently"
                )
        for server in rest:
            server.pool = first.pool.copy()
    return served


def ttft_calls(
    bb,
    lengths=(64, 512, 2048, 4096),
    rhos=(0.05, 0.1, 0.2, 0.3, 0.4),
    samples: int = 3,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per timed call and method: length, sample, node, method, rho, ttft_s, the paired
    Dense call's ttft, the bound with the rates it was taken at (measured once per length), and
    the length's warm-up seconds (pool fill and path warm-up)."""
    check_settings(lengths, samples)
    shape = Shape.of(bb.config)
    methods = [("dense", None, "dense"), ("kvcomm", None, condition("kvcomm", 1.0))]
    methods += [(m, rho, condition(m, rho, gamma=1.0)) for rho in rhos for m in ("bcr-chunk", "coin-chunk")]
    rng = random.Random(seed)
    templates = copy_templates()
    rows = []
    for length in lengths:
        rates = measure_rates(shape, rows=max(length, 64), dtype=bb.dtype, device=bb.device)
        servers = {(m, r): make_server(bb, spec) for m, r, spec in methods}
        caches = share_segment_caches(bb, servers.values())
        bar = tqdm(total=WARM_UP_FILL + WARM_UP_PATHS + samples, desc=f"ttft {length} tokens", disable=not progress)
        started = time.perf_counter()
        fill = [request_prompts(bb, templates, length, rng) for _ in range(WARM_UP_FILL)]
        fill_pools(servers.values(), [prompt for request in fill for prompt in request])
        bar.update(WARM_UP_FILL)
        warm_up_s = time.perf_counter() - started
        for request in range(WARM_UP_PATHS + samples):
            for prompt in request_prompts(bb, templates, length, rng):
                caches.prepare(prompt)
                timed = [timed_call(server, prompt, method, shape, rates) for (method, _), server in servers.items()]
                if request < WARM_UP_PATHS:
                    continue
                for (method, rho), call in zip(servers, timed):
                    if method != "dense" and call["mode"] != "reuse":
                        raise RuntimeError(f"{method} fell back to a dense prefill after warm-up ({call['reason']})")
                    sample, readable = request - WARM_UP_PATHS, rates.readable(bb.dtype.itemsize)
                    rows.append(call_row(length, sample, method, rho, prompt, call, timed[0], readable))
            if request == WARM_UP_PATHS - 1:
                warm_up_s = time.perf_counter() - started
            bar.update(1)
        bar.close()
        del servers, caches  # the next length's servers are built after these are freed
        peak = peak_memory_mb(bb.device)
        for row in rows:
            row.setdefault("warm_up_s", warm_up_s)
            for key, value in peak.items():
                row.setdefault(key, value)
    return pd.DataFrame(rows)


def call_row(length: int, sample: int, method: str, rho, prompt, call: dict, dense: dict, rates: dict) -> dict:
    """One timed call's row: where it was timed, its segment, its TTFT beside Dense's, its bound."""
    where = {"length": length, "sample": sample, "node": prompt.template.node}
    where |= {"segment_tokens": len(prompt.segments[1].ids), "method": method, "rho": rho}
    measured = {"ttft_s": call["ttft_s"], "dense_ttft_s": dense["ttft_s"]}
    measured |= {key: call[key] for key in ("assembly_s", "rows", "flops", "bound_s")}
    return where | measured | rates


def timed_call(server, prompt, method: str, shape: Shape, rates) -> dict:
    """One call's timings and bound. Only these numbers outlive the call: its record holds the
    served cache, and a length's worth of them held at once would dominate the peak memory."""
    call = server.serve(prompt, 1)
    served_as = "kvcomm" if call.skipped else method  # the skip rule serves the assembled cache as it is
    passes = call_passes(shape, served_as, len(call.merged_ids) - 1, call.repaired_rows)
    return {
        "mode": call.mode,
        "reason": call.reason,
        "ttft_s": call.ttft_s,
        "assembly_s": call.assembly_s,
        "rows": call.rows_recomputed,
        "flops": sum(p.flops for p in passes),
        "bound_s": rates.seconds(passes),
    }


def peak_memory_mb(device) -> dict[str, float]:
    """The process's peak resident memory so far, and on a GPU its peak allocated device memory."""
    peak = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux reports KiB
    if torch.device(device).type == "cuda":
        peak["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peak


def summarize_ttft(calls: pd.DataFrame) -> pd.DataFrame:
    """Per length, method and rho: median TTFT, its spread, the mean of paired speedups with their
    spread over the paired calls (median, and the 2.5% and 97.5% quantiles of the per-call
    Dense/method ratios, linearly interpolated), and the anchor matching + cache assembly inside
    the TTFT (median ms, and its largest share of the paired Dense call's TTFT)."""
    calls = calls.assign(
        ratio=calls["dense_ttft_s"] / calls["ttft_s"],
        assembly_share=calls["assembly_s"] / calls["dense_ttft_s"],
        bound_fraction=calls["bound_s"] / calls["ttft_s"],
        gflops=calls["flops"] / calls["ttft_s"] / 1e9,
    )
    return (
        calls.groupby(["length", "method", "rho"], sort=False, dropna=False)
        .agg(
            ttft_ms=("ttft_s", lambda s: 1000 * float(np.median(s))),
            ttft_ms_p10=("ttft_s", lambda s: 1000 * float(np.quantile(s, 0.1))),
            ttft_ms_p90=("ttft_s", lambda s: 1000 * float(np.quantile(s, 0.9))),
            speedup_vs_dense=("ratio", "mean"),
            speedup_median=("ratio", "median"),
            speedup_p2_5=("ratio", lambda s: float(np.quantile(s, 0.025))),
            speedup_p97_5=("ratio", lambda s: float(np.quantile(s, 0.975))),
            assembly_ms=("assembly_s", lambda s: 1000 * float(np.median(s))),
            assembly_share_max=("assembly_share", "max"),
            rows_recomputed=("rows", "mean"),
            bound_ms=("bound_s", lambda s: 1000 * float(np.median(s))),
            bound_fraction=("bound_fraction", "median"),
            gflops=("gflops", "median"),
            peak_rss_mb=("peak_rss_mb", "max"),
            **({"peak_gpu_mb": ("peak_gpu_mb", "max")} if "peak_gpu_mb" in calls else {}),
            **({"warm_up_s": ("warm_up_s", "max")} if "warm_up_s" in calls else {}),
            calls=("ratio", "size"),
        )
        .reset_index()
    )


def ttft_table(
    bb,
    lengths=(64, 512, 2048, 4096),
    rhos=(0.05, 0.1, 0.2, 0.3, 0.4),
    samples: int = 3,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
    return summarize_ttft(ttft_calls(bb, lengths, rhos, samples, seed, progress))
