"""The TTFT benchmark's protocol (not its timings: no timing assertions in tests)."""

import random

import pandas as pd
import pytest

from bcr_core.errors import UsageError
from bcr_core.probes.bound import Rates, Shape, call_flops, call_passes
from bcr_core.probes.latency import summarize_ttft, symbol_segment, ttft_calls


def test_symbol_segments_have_the_requested_length(chat_tokenizer):
    text = symbol_segment(chat_tokenizer, 300, random.Random(0))
    assert len(chat_tokenizer(text, add_special_tokens=False)["input_ids"]) == 300


def test_every_call_is_served_every_way_and_paired(tiny_chat):
    calls = ttft_calls(tiny_chat, lengths=(300,), rhos=(0.25,), samples=1, progress=False)
    assert set(calls["method"]) == {"dense", "kvcomm", "bcr-chunk", "coin-chunk"}
    assert len(calls) == 5 * 4  # five agents, four methods, one timed request
    assert (calls.groupby("node")["dense_ttft_s"].nunique() == 1).all()  # one Dense reference per call
    repaired = calls[calls.method.isin(["bcr-chunk", "coin-chunk"])]
    m = calls["segment_tokens"].iloc[0]
    assert m == 300 and (repaired["rows"] > 0).all()
    assert (calls[calls.method == "kvcomm"]["rows"] == 0).all()
    table = summarize_ttft(calls)
    assert set(table.columns) >= {"length", "method", "rho", "ttft_ms", "speedup_vs_dense"}
    dense = table[table.method == "dense"].iloc[0]
    assert dense["speedup_vs_dense"] == pytest.approx(1.0) and pd.isna(dense["rho"])
    assert len(table) == 4


def test_samples_must_be_positive(tiny_chat):
    with pytest.raises(UsageError, match="samples"):
        ttft_calls(tiny_chat, lengths=(64,), samples=0)


def matmul_flops(run) -> int:
    """Operations torch itself counts in the matmuls of `run()` (attention kernels left out)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    counts = counter.get_flop_counts()["Global"]
    return sum(v for op, v in counts.items() if "attention" not in str(op))


def test_the_bound_counts_the_arithmetic_torch_counts(tiny):
    """The operation count of `bound`, checked against torch's own FlopCounterMode on real forwards:
    a prefill of n rows, a repair of some rows, and one decode step with its logits."""
    shape = Shape.of(tiny.config)
    ids = list(range(5, 69))
    assert matmul_flops(lambda: tiny.prefill(ids)) == shape.linear(len(ids))
    cache = tiny.prefill(ids)
    rows = [3, 10, 11, 40]
    assert matmul_flops(lambda: tiny.repair(cache, ids, rows)) == shape.linear(len(rows))
    # a decode step computes its products over `decode_rows` rows (batch invariance: 8 in float32), one of them its own
    rows_computed = tiny.decode_rows
    assert matmul_flops(lambda: tiny.generate(cache, 7, 1, stop_ids=())) == shape.linear(
        rows_computed, logits=rows_computed
    )
    n = len(ids)
    dense_linear, dense_attention = call_flops(shape, "dense", n, [])
    assert dense_linear == shape.linear(n) + shape.linear(1, logits=1)
    # attention: row i of the prefill sees i + 1 keys, the decode step n + 1, each pair 4 d_head per head
    per_pair = 4 * shape.layers * shape.heads * shape.head_dim
    assert dense_attention == per_pair * (sum(i + 1 for i in range(n)) + n + 1)
    bcr_linear, bcr_attention = call_flops(shape, "bcr-chunk", n, rows)
    draft_pairs = (n + 1) + (n + 2)  # two draft steps at positions n and n + 1
    assert bcr_attention == per_pair * (draft_pairs + sum(p + 1 for p in rows) + n + 1)
    assert bcr_linear == shape.linear(len(rows)) + shape.linear(2, logits=2) + shape.linear(1, logits=1)
    assert call_flops(shape, "kvcomm", n, []) == (shape.linear(1, logits=1), per_pair * (n + 1))
    with pytest.raises(ValueError, match="no operation count for method 'opengate'"):
        call_flops(shape, "opengate", n, [])


def test_each_pass_is_bounded_by_its_arithmetic_or_its_memory_traffic(tiny):
    """The roofline written out for a KVComm call: the assembly moves 2n cache rows and computes
    nothing; the decode step reads every weight, the LM head and n + 1 cached rows."""
    shape = Shape.of(tiny.config)
    c = tiny.config
    n, layers, kv_width = 100, c.num_hidden_layers, c.num_key_value_heads * c.head_dim
    params = sum(p.numel() for name, p in tiny.model.named_parameters() if "norm" not in name and "embed" not in name)
    row = 2 * layers * kv_width  # one cached row: keys and values of every layer
    assembly, decode = call_passes(shape, "kvcomm", n, [])
    assert (assembly.linear, assembly.attention, assembly.elements) == (0, 0, 2 * n * row)
    assert decode.elements == params + (n + 1) * row  # the LM head is among the parameters (untied)
    slow_memory = Rates(matmul=1e12, attention=1e12, bandwidth=1e6)
    assert slow_memory.seconds([assembly, decode]) == pytest.approx((2 * n * row + decode.elements) / 1e6)
    slow_arithmetic = Rates(matmul=1e3, attention=1e4, bandwidth=1e15)
    expected = decode.linear / 1e3 + decode.attention / 1e4 + 2 * n * row / 1e15
    assert slow_arithmetic.seconds([assembly, decode]) == pytest.approx(expected)


def test_ttft_reports_the_bound_and_peak_memory(tiny_chat):
    calls = ttft_calls(tiny_chat, lengths=(200,), rhos=(0.5,), samples=1, progress=False)
    assert (calls.loc[calls.method.isin(["bcr-chunk", "coin-chunk"]), "rows"] > 0).all()  # repaired, not skipped
    rates = calls[["matmul_tflops", "attention_tflops", "copy_gb_s"]]
    # every call's bound is taken at the length's one measurement
    assert (rates.nunique() == 1).all() and (rates > 0).all().all()
    table = summarize_ttft(calls).set_index("method")
    assert (table["bound_fraction"] > 0).all() and (table["peak_rss_mb"] > 0).all()
    # the same call's arithmetic orders the methods: Dense computes everything, KVComm one row
    assert table.loc["dense", "bound_ms"] > table.loc["bcr-chunk", "bound_ms"] > table.loc["kvcomm", "bound_ms"]
    # not bcr-chunk > coin-chunk: the two repair different rows, and where rows sit moves their attention by more
    # than the draft's two tokens cost (a near-tie); the operation-count test above counts the draft on equal rows


def test_a_call_the_skip_rule_serves_unrepaired_is_bounded_like_kvcomm(tiny_chat):
    """Under two chunks (M < 2B) Algorithm 1 neither drafts nor repairs: the bound is KVComm's."""
    calls = ttft_calls(tiny_chat, lengths=(20,), rhos=(0.2,), samples=1, progress=False)
    by_method = calls.set_index(["node", "method"])["bound_s"].unstack()
    assert (calls.loc[calls.method != "dense", "rows"] == 0).all()
    for method in ("bcr-chunk", "coin-chunk"):
        assert (by_method[method] == by_method["kvcomm"]).all()
    assert (by_method["dense"] > by_method["kvcomm"]).all()


def served_the_same(a, b) -> list[str]:
    """Where two calls' decisions, rows and tokens differ (floats of the gate to 1e-9 relative)."""
    fields = ("reason", "repaired_rows", "skipped", "output_tokens")
    out = [f"{f}: {getattr(a, f)} != {getattr(b, f)}" for f in fields if getattr(a, f) != getattr(b, f)]
    for da, db in zip(a.decisions, b.decisions, strict=True):
        for key, value in da.items():
            if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
                if db[key] != pytest.approx(value, rel=1e-9):
                    out.append(f"{key}: {value} != {db[key]}")
            elif db[key] != value:
                out.append(f"{key}: {value} != {db[key]}")
    return out


def test_a_copied_warm_pool_gives_every_server_the_decisions_it_gets_alone(tiny_chat, monkeypatch):
    """Each server warmed on its own (every warm-up call served by itself) against the same servers
    whose pools one of them filled: every later call has the same gate decisions (anchors, weights,
    entropy), the same repaired rows and the same tokens, and the fill prefilled each warm-up prompt
    once for all four servers, not once per server."""
    from bcr_core.conditions import make_server
    from bcr_core.probes.latency import WARM_UP_FILL, copy_templates, fill_pools, request_prompts
    from bcr_core.reuse.segments import share_segment_caches

    specs = ["kvcomm@1", "bcr-chunk@0.25:gamma=1", "coin-chunk@0.25:gamma=1", "bcr-chunk@0.5:gamma=1"]
    rng = random.Random(5)
    requests = [request_prompts(tiny_chat, copy_templates(), 300, rng) for _ in range(WARM_UP_FILL + 2)]
    fill, later = requests[:WARM_UP_FILL], requests[WARM_UP_FILL:]

    alone = {}
    for spec in specs:
        server = make_server(tiny_chat, spec)
        for prompt in [p for r in fill for p in r]:
            assert server.serve(prompt, 2).mode == "dense"  # under two anchors the gate never passes
        alone[spec] = [server.serve(prompt, 2) for r in later for prompt in r]

    servers = {spec: make_server(tiny_chat, spec) for spec in specs}
    share_segment_caches(tiny_chat, servers.values())
    full_length = len(fill[0][0].merged_ids) - 1
    prefills = []
    prefill = tiny_chat.prefill
    monkeypatch.setattr(tiny_chat, "prefill", lambda ids, *a, **k: prefills.append(len(ids)) or prefill(ids, *a, **k))
    fill_pools(servers.values(), [p for r in fill for p in r])
    monkeypatch.undo()
    assert prefills.count(full_length) == WARM_UP_FILL * len(copy_templates())  # 10 dense calls, not 40
    pools = [s.pool for s in servers.values()]
    assert len({id(p) for p in pools}) == len(specs)  # copies, not one pool shared by reference
    assert all(p.counts == pools[0].counts for p in pools)
    shared = {spec: [] for spec in specs}
    for request in later:
        for prompt in request:
            for spec, server in servers.items():
                shared[spec].append(server.serve(prompt, 2))

    repaired = 0
    for spec in specs:
        for i, (a, b) in enumerate(zip(alone[spec], shared[spec], strict=True)):
            assert a.mode == "reuse" and not served_the_same(a, b), (spec, i, served_the_same(a, b))
            repaired += len(a.repaired_rows)
        assert servers[spec].pool.counts == expected_counts(alone[spec], fill)
    assert repaired > 0  # the repair servers repaired: their calls could have differed


def expected_counts(calls, fill):
    """A pool's decision counts by its calls: every warm-up call's gate refused (no anchor or one),
    every later call's passed."""
    from collections import Counter

    counts = Counter(reuse=sum(len(c.decisions) for c in calls))
    counts["no_anchors"] = len(fill[0])
    counts["one_anchor"] = len(fill[1])
    return counts


def test_a_pool_copy_goes_on_on_its_own_and_shares_the_tensors():
    """Activating or storing in a copy leaves the original as it was; the cached tensors are not copied."""
    import torch

    from bcr_core.engine.kv import KV
    from bcr_core.reuse.anchors import AnchorPool, Deviation, GateDecision

    def kv(n, fill):
        t = torch.full((2, 1, 1, n, 4), fill)
        return KV(t, t.clone(), torch.arange(n))

    pool = AnchorPool()
    first = pool.store("q", (1, 2, 3), kv(3, 0.0), "a", Deviation(kv(3, 1.0), None))
    twin = pool.copy()
    copied = twin.anchors("q")[0]
    assert copied is not first and copied.base_values is first.base_values
    assert copied.deviations["a"] is first.deviations["a"]
    twin.activate(GateDecision("q", "reuse", 1, 1, chosen=[(copied, 1.0)]))
    twin.store("q", (1, 2, 3), kv(3, 0.0), "b", Deviation(kv(3, 2.0), None))
    twin.store("q", (4, 5, 6), kv(3, 0.5), "a", Deviation(kv(3, 3.0), None))
    assert (first.activations, copied.activations) == (0, 1)
    assert set(first.deviations) == {"a"} and set(copied.deviations) == {"a", "b"}
    assert len(pool.anchors("q")) == 1 and len(twin.anchors("q")) == 2
    assert twin.anchors("q")[1].serial == 2 and pool._serial == 1


def test_speedups_carry_their_spread_over_the_paired_calls():
    """Five paired calls whose Dense/method ratios are 1..5: mean 3, median 3, and the central 95%
    by linear interpolation between order statistics, 1 + 0.025 * 4 = 1.1 and 5 - 0.1 = 4.9."""
    ratios = [2.0, 5.0, 1.0, 4.0, 3.0]
    calls = pd.DataFrame(
        {
            "length": 64,
            "method": "bcr-chunk",
            "rho": 0.2,
            "ttft_s": [10.0 / r for r in ratios],
            "dense_ttft_s": 10.0,
            "assembly_s": 0.0,
            "rows": 8,
            "flops": 1e9,
            "bound_s": 1.0,
            "peak_rss_mb": 1.0,
        }
    )
    row = summarize_ttft(calls).iloc[0]
    assert row["speedup_vs_dense"] == pytest.approx(3.0)
    assert row["speedup_median"] == pytest.approx(3.0)
    assert (row["speedup_p2_5"], row["speedup_p97_5"]) == (pytest.approx(1.1), pytest.approx(4.9))
