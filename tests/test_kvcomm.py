"""KVComm's anchor pool, gate and assembly."""

import math

import pytest
import torch
from conftest import FAMILIES, ROTATION_ULPS, rounding_close, tiny_family_config, tiny_llama_config
from scipy.stats import entropy

from bcr_core.agents.pipeline import Pipeline
from bcr_core.engine.backbone import Backbone
from bcr_core.engine.kv import KV
from bcr_core.errors import UsageError
from bcr_core.reuse.anchors import (
    ENTROPY,
    NO_ANCHORS,
    ONE_ANCHOR,
    REUSE,
    TOO_SHORT,
    AnchorPool,
    Deviation,
    KVCommConfig,
    predict,
    top_p,
)
from bcr_core.reuse.segments import SegmentCaches, placeholder_spans, rows
from bcr_core.reuse.servers import DenseServer, KVCommServer

# --- the gate on hand-made caches ------------------------------------------------------------


def fake_kv(values: torch.Tensor) -> KV:
    return KV(values.clone(), values.clone(), torch.arange(values.shape[3]))


def make_pool(config: KVCommConfig, anchor_values: list[torch.Tensor], node="agent_1") -> AnchorPool:
    pool = AnchorPool(config)
    for i, values in enumerate(anchor_values):
        kv = fake_kv(values)
        pool.store("user_question", (i,), kv, node, Deviation(kv, None))
    return pool


def close_anchor_family(seed: int, n: int = 4, rows: int = 5):
    """A candidate and n anchors at small, different distances from it, so H(s) varies."""
    g = torch.Generator().manual_seed(seed)
    candidate = torch.randn(2, 1, 1, rows, 3, generator=g)
    scales = torch.rand(n, generator=g) * 3
    anchors = [candidate + s * torch.randn(candidate.shape, generator=g) / math.sqrt(candidate.numel()) for s in scales]
    return candidate, anchors


def expected_reason(candidate, anchors, gamma):
    d = torch.stack([(a - candidate).flatten().double().norm() for a in anchors])
    s = torch.softmax(-d, 0).numpy()
    return REUSE if entropy(s, base=2) <= gamma * math.log2(len(anchors)) else ENTROPY


@pytest.mark.parametrize("seed", range(6))
def test_gate_decision_matches_an_independent_computation(seed):
    candidate, anchors = close_anchor_family(seed)
    for gamma in (0.0, 0.3, 0.5, 0.7, 0.9, 1.0):
        decision = make_pool(KVCommConfig(gamma=gamma), anchors).decide("user_question", "agent_1", fake_kv(candidate))
        assert decision.reason == expected_reason(candidate, anchors, gamma)
        assert decision.n_eligible == 4


def test_entropy_rejections_fall_as_gamma_rises_and_vanish_at_one():
    families = [close_anchor_family(seed) for seed in range(30)]
    rejections = []
    for gamma in (0.1, 0.3, 0.5, 0.7, 1.0):
        pool = make_pool(KVCommConfig(gamma=gamma), families[0][1])
        for candidate, anchors in families:
            pool.pools["user_question"] = make_pool(pool.config, anchors).pools["user_question"]
            pool.decide("user_question", "agent_1", fake_kv(candidate))
        rejections.append(pool.counts[ENTROPY])
    assert rejections == sorted(rejections, reverse=True)
    assert rejections[0] > rejections[-2] > 0  # the sweep really moves the gate
    assert rejections[-1] == 0  # gamma = 1 never refuses


def test_one_or_no_anchor_falls_back_and_short_anchors_are_ineligible():
    candidate, anchors = close_anchor_family(0, rows=5)
    assert (
        make_pool(KVCommConfig(gamma=1.0), []).decide("user_question", "agent_1", fake_kv(candidate)).reason
        == NO_ANCHORS
    )
    assert (
        make_pool(KVCommConfig(gamma=1.0), anchors[:1]).decide("user_question", "agent_1", fake_kv(candidate)).reason
        == ONE_ANCHOR
    )
    short = [anchors[0], anchors[1][:, :, :, :4]]
    decision = make_pool(KVCommConfig(gamma=1.0), short).decide("user_question", "agent_1", fake_kv(candidate))
    assert (decision.reason, decision.n_pool, decision.n_eligible) == (TOO_SHORT, 2, 1)
    other_node = make_pool(KVCommConfig(gamma=1.0), anchors, node="agent_2")
    assert other_node.decide("user_question", "agent_1", fake_kv(candidate)).reason == NO_ANCHORS


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    chosen, weights = top_p(torch.tensor([0.05, 0.6, 0.3, 0.05]), 0.9)
    assert chosen.tolist() == [1, 2]
    assert torch.allclose(weights, torch.tensor([0.6, 0.3]) / 0.9)
    chosen, _ = top_p(torch.tensor([0.95, 0.05]), 0.9)
    assert chosen.tolist() == [0]


def test_eviction_drops_the_least_activated_of_the_oldest():
    config = KVCommConfig(max_anchors=4, eviction_window=3)
    values = [torch.full((2, 1, 1, 3, 2), float(i)) for i in range(4)]
    pool = make_pool(config, values)
    for anchor, activations in zip(pool.anchors("user_question"), [5, 1, 2, 0]):
        anchor.activations = activations
    # the 4th anchor has the fewest activations, but only the 3 oldest are candidates: evict #2 (1 activation)
    pool.store("user_question", (100,), fake_kv(values[0]), "agent_1", Deviation(fake_kv(values[0]), None))
    assert [a.key for a in pool.anchors("user_question")] == [(0,), (2,), (3,), (100,)]
    for anchor in pool.anchors("user_question"):
        anchor.activations = 0
    pool.store("user_question", (101,), fake_kv(values[0]), "agent_1", Deviation(fake_kv(values[0]), None))
    assert [a.key for a in pool.anchors("user_question")][0] == (2,)  # tie: the oldest goes


def test_eviction_finds_its_victim_among_anchors_of_the_same_segment():
    """The same segment stored again for a node that already has it makes a second anchor with the
    same key: eviction must drop the victim itself, not the first anchor equal to it (on Gemma 3 270M
    the gate sweep crashed here, comparing two anchors' tensors)."""
    config = KVCommConfig(max_anchors=3, eviction_window=3)
    pool = AnchorPool(config)
    values = [torch.full((2, 1, 1, 3, 2), float(i)) for i in range(4)]
    for v in values[:3]:
        pool.store("user_question", (7, 7, 7), fake_kv(v), "agent_1", Deviation(fake_kv(v), None))
    first, second, third = pool.anchors("user_question")
    first.activations, second.activations, third.activations = 2, 0, 1
    pool.store("user_question", (7, 7, 7), fake_kv(values[3]), "agent_1", Deviation(fake_kv(values[3]), None))
    kept = pool.anchors("user_question")
    assert [a.serial for a in kept] == [first.serial, third.serial, third.serial + 1]
    assert all(a is not second for a in kept)


def test_config_rejects_out_of_range_values():
    with pytest.raises(UsageError, match="gamma"):
        KVCommConfig(gamma=1.5)
    with pytest.raises(UsageError, match="top_p"):
        KVCommConfig(top_p=0.0)


# --- the server on a tiny model with the real tokenizer ----------------------------------------

QUESTIONS = [
    "Ann has 12 marbles and gives away 5. How many are left?",
    "A train travels 60 miles per hour for 3 hours. How far does it go?",
    "Sam reads 15 pages a day. How many pages does he read in a week?",
    "A box holds 8 pens. How many pens are in 6 boxes?",
]


def run_all(bb, server, questions, tokens=6):
    pipeline = Pipeline(bb, "gsm8k", n_agents=2, max_new_tokens=tokens)
    return [pipeline.run(server, str(i), q, keep_caches=True) for i, q in enumerate(questions)]


def test_warm_up_then_reuse_and_gamma_one_never_refuses(tiny_chat):
    server = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    records = run_all(tiny_chat, server, QUESTIONS)
    first_two = [c for r in records[:2] for c in r.calls]
    assert all(c.mode == "dense" and c.reason in (NO_ANCHORS, ONE_ANCHOR) for c in first_two)
    assert server.pool.counts[ENTROPY] == 0
    decided = [d for r in records for c in r.calls for d in c.decisions]
    assert all(d["reason"] == REUSE for d in decided if d["n_eligible"] >= 2)
    assert any(c.mode == "reuse" for c in records[3].calls)


def test_assembled_cache_is_exact_at_layer_zero_and_predicted_above(tiny_chat):
    server = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    records = run_all(tiny_chat, server, QUESTIONS)
    call = next(c for c in records[3].calls if c.mode == "reuse")
    served, last = call.served
    dense = tiny_chat.prefill(call.merged_ids[:-1])
    assert last == call.merged_ids[-1] and served.length == len(call.merged_ids) - 1
    assert torch.equal(served.positions, dense.positions)
    assert rounding_close(served.keys[0], dense.keys[0], ulps=ROTATION_ULPS)
    assert rounding_close(served.values[0], dense.values[0])
    assert not torch.allclose(served.values[1:], dense.values[1:], atol=1e-3)
    assert call.rows_recomputed == 0


@pytest.fixture(scope="module", params=FAMILIES)
def family_chat(request, chat_tokenizer):
    """`tiny_chat` in each supported family."""
    if request.param == "llama":
        return request.getfixturevalue("tiny_chat")
    config = tiny_family_config(
        request.param,
        vocab_size=len(chat_tokenizer),
        eos_token_id=chat_tokenizer.eos_token_id,
        bos_token_id=chat_tokenizer.bos_token_id,
        pad_token_id=chat_tokenizer.eos_token_id,
        initializer_range=0.1,
    )  # at 0.05 some families repeat one output across questions
    bb = Backbone.from_config(config, device="cpu", dtype=torch.float32, seed=0)
    bb.tokenizer = chat_tokenizer
    return bb


def test_replaying_a_seen_request_reproduces_token_matched_dense(family_chat):
    """The anchor of an identical segment carries its exact deviation; distances to other
    questions are large, so its softmax weight is ~1 and the prediction is the real cache."""
    tiny_chat = family_chat
    server = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    seen = run_all(tiny_chat, server, [QUESTIONS[0], QUESTIONS[1], QUESTIONS[3]])
    for node in range(2):  # precondition: no two requests share an agent output, so no anchor is ambiguous
        assert len({r.calls[node].output_text for r in seen}) == 3
    (replay,) = run_all(tiny_chat, server, QUESTIONS[:1])
    token_matched = run_all(tiny_chat, DenseServer(tiny_chat, token_matched=True), QUESTIONS[:1])[0]
    for call, reference in zip(replay.calls, token_matched.calls):
        assert call.mode == "reuse"
        served, _ = call.served
        exact, _ = reference.served
        assert rounding_close(served.keys, exact.keys, ulps=ROTATION_ULPS)
        assert rounding_close(served.values, exact.values)
        assert call.output_tokens == reference.output_tokens


def test_replaying_records_restores_the_pool_exactly(tiny_chat):
    """Resuming a run: a fresh server fed the recorded calls continues as the original would."""
    import json

    original = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    records = run_all(tiny_chat, original, QUESTIONS[:3] + [QUESTIONS[0]])
    resumed = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    for record in records:
        for call in record.calls:
            resumed.replay(json.loads(json.dumps(call.to_dict())))
    assert resumed.pool.counts == original.pool.counts
    state = lambda s: [
        (p, a.serial, a.key, a.activations, sorted(a.deviations)) for p, pool in s.pool.pools.items() for a in pool
    ]
    assert state(resumed) == state(original)
    assert any(activations for _, _, _, activations, _ in state(original))  # the replay had reuse to restore
    (a,) = run_all(tiny_chat, original, QUESTIONS[3:])
    (b,) = run_all(tiny_chat, resumed, QUESTIONS[3:])
    assert [c.to_dict() | {"ttft_s": 0, "total_s": 0, "assembly_s": 0} for c in a.calls] == [
        c.to_dict() | {"ttft_s": 0, "total_s": 0, "assembly_s": 0} for c in b.calls
    ]


def reference_assembly(server, call) -> KV:
    """Equation 1's prediction the slow way: predict, shift, concatenate (the written-out spec)."""
    ids, spans, node = call.merged_ids, call.segment_map, call.node
    parts = [server.caches.prefix(rows(ids, spans[0]))]
    for (value, after), decision in zip(placeholder_spans(spans), call.decisions):
        chosen = [next(a for a in server.pool.anchors(value["name"]) if a.serial == s) for s in decision["anchors"]]
        found = [a.deviations[node] for a in chosen]
        for span, deviations in [(value, [d.segment for d in found])] + (
            [(after, [d.after for d in found])] if after else []
        ):
            predicted = predict(server.caches.base(rows(ids, span)), deviations, decision["weights"])
            parts.append(server.bb.shift(predicted, span["start"]))
    return KV.cat(parts).truncate(len(ids) - 1)


def test_fused_assembly_matches_predict_shift_concatenate(tiny_chat):
    server = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    records = run_all(tiny_chat, server, QUESTIONS, tokens=12)
    reused = [c for r in records for c in r.calls if c.mode == "reuse"]
    assert len(reused) >= 3
    for call in reused:
        served, last = call.served
        expected = reference_assembly(server, call)
        assert torch.equal(served.positions, expected.positions)
        assert rounding_close(served.keys, expected.keys)
        assert rounding_close(served.values, expected.values)
        assert tiny_chat.generate(expected, last, 12).tokens == call.output_tokens


def test_a_deviation_prefilled_from_the_same_ids_is_held_once(tiny_chat):
    """Two servers on one segment-cache store, and two nodes whose prompts are the same text (the
    TTFT protocol's five CopyMachines): one deviation object per distinct prefilled text, equal to
    Equation 1 computed alone, and forgotten once no anchor holds it."""
    import gc

    from bcr_core.probes.latency import copy_templates
    from bcr_core.reuse.calls import drive
    from bcr_core.reuse.prompts import QUESTION, build_prompt
    from bcr_core.reuse.segments import share_segment_caches

    servers = [KVCommServer(tiny_chat, KVCommConfig(gamma=1.0), name=f"kvcomm{i}") for i in range(2)]
    caches = share_segment_caches(tiny_chat, servers)
    twins = copy_templates(2)  # agent_1 and agent_2: different nodes, the same prompt text
    for question in QUESTIONS[:2]:
        for template in twins:
            prompt = build_prompt(tiny_chat.tokenizer, template, {QUESTION: question})
            for server in servers:
                caches.prepare(prompt)
                assert drive(tiny_chat, server.steps(prompt, 2)).mode == "dense"  # < 2 anchors: all dense
    held = {
        id(d.segment)
        for s in servers
        for pool in s.pool.pools.values()
        for anchor in pool
        for d in anchor.deviations.values()
    }
    assert len(held) == 2 == len(caches.deviations)  # 2 questions x 2 nodes x 2 servers: 2 texts
    alone = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    prompt = build_prompt(tiny_chat.tokenizer, twins[1], {QUESTION: QUESTIONS[0]})
    alone.caches.prepare(prompt)
    drive(tiny_chat, alone.steps(prompt, 2))
    mine, shared = (s.pool.anchors(QUESTION)[0].deviations["agent_2"] for s in (alone, servers[1]))
    assert torch.equal(mine.segment.keys, shared.segment.keys) and torch.equal(mine.after.values, shared.after.values)
    for server in servers:
        server.pool.pools.clear()
    del mine, shared, alone
    gc.collect()
    assert len(caches.deviations) == 0


def test_a_base_cache_is_its_segment_behind_bos_and_the_header_moved_to_position_zero(gemma_tokenizer):
    """With the plain-text template (Gemma's) a base cache holds the segment's rows as a prefill of
    <bos> "\\n\\n" + segment computes them, moved two positions back: values as computed, keys turned by
    RoPE; behind the header alone (the segment where the attention sink should be) every row differs."""
    tok = gemma_tokenizer
    config = tiny_llama_config(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=0
    )
    bb = Backbone.from_config(config, device="cpu", dtype=torch.float32, seed=0)
    bb.tokenizer = tok
    ids = tok("Ann lives in Oslo.\n\nWhere does Ann live?", add_special_tokens=False)["input_ids"]
    newlines = tok.convert_tokens_to_ids("\n\n")
    base = SegmentCaches(bb).base(ids)
    behind = bb.prefill([tok.bos_token_id, newlines, *ids])
    assert base.positions.tolist() == list(range(len(ids)))
    torch.testing.assert_close(base.values, behind.values[:, :, :, 2:], rtol=0, atol=0)
    assert rounding_close(bb.shift(base, 2).keys, behind.keys[:, :, :, 2:], ulps=ROTATION_ULPS)
    header_alone = bb.prefill([newlines, *ids])
    row_gap = (base.values[1:] - header_alone.values[1:, :, :, 1:]).abs().amax(dim=(0, 1, 2, 4))
    assert bool((row_gap > 1e-4).all())  # above layer 0, whose values read only the token itself
