"""BCR and its controls on the tiny model with the real tokenizer."""

import math

import pytest
import torch
from conftest import rounding_close

from bcr_core.conditions import make_server, parse
from bcr_core.errors import UsageError
from bcr_core.repair.row_scores import row_scores
from bcr_core.repair.selectors import CacheBlendSelector, CoinSelector
from bcr_core.reuse.anchors import KVCommConfig
from bcr_core.reuse.servers import DenseServer, KVCommServer
from tests.helpers import QUESTIONS, run


def paper_row_scores(attention: torch.Tensor) -> torch.Tensor:
    """Paper §3 / Algorithm 2 written out with loops: row j scores the sum, over every layer but the
    first, of the mean over draft steps t and query heads h of the attention weight on row j."""
    layers, steps, heads, n = attention.shape
    weights = attention.double().tolist()
    scores = []
    for j in range(n):
        total = 0.0
        for layer in range(1, layers):  # the paper's l > 1, its layers counted from 1
            total += sum(weights[layer][t][h][j] for t in range(steps) for h in range(heads)) / (steps * heads)
        scores.append(total)
    return torch.tensor(scores, dtype=torch.float64)


def test_row_scores_follow_algorithm_2_on_attention_computed_by_hand():
    """Attention weights softmax(q k^T / sqrt(d)) built here from random q and k, in loops. The first
    layer's weights on row 0 are inflated: a score that counted that layer would differ by 100."""
    torch.manual_seed(3)
    layers, steps, heads, n, d = 3, 2, 2, 6, 4
    q, k = torch.randn(layers, steps, heads, d), torch.randn(layers, heads, n, d)
    attention = torch.empty(layers, steps, heads, n, dtype=torch.float64)
    for layer in range(layers):
        for t in range(steps):
            for h in range(heads):
                logits = [float(q[layer, t, h] @ k[layer, h, j]) / d**0.5 for j in range(n)]
                top = max(logits)
                exps = [math.exp(x - top) for x in logits]
                attention[layer, t, h] = torch.tensor([e / sum(exps) for e in exps])
    attention[0, :, :, 0] += 100.0  # layer 1 (counted from 1) is left out, so row 0 gains nothing
    scores = row_scores(attention)
    assert torch.allclose(scores, paper_row_scores(attention))
    assert float(scores.sum()) == pytest.approx(layers - 1)  # each kept layer's weights sum to 1 per row
    with pytest.raises(ValueError, match="layers >= 2"):
        row_scores(attention[:1])


@pytest.mark.parametrize(
    "condition",
    [
        "bcr-chunk@1",
        "bcr-grow@1",
        "bcr-single@1",
        "coin-chunk@1",
        "coin-single@1",
        "cacheblend-cost@1",
        "cacheblend-chunk@1",
        "ours-chunk@1",
        "question-chunk@1",
        "question-single@1",
        "seams-single@1",
        "window-single@1",
        "coin-chunk@1:match=bcr-chunk",
        "cacheblend-cost@1:match=bcr-chunk",
    ],
)
def test_full_budget_reproduces_token_matched_dense(tiny_chat, condition):
    server = make_server(tiny_chat, condition + (",gamma=1" if ":" in condition else ":gamma=1"))
    records = run(tiny_chat, server, QUESTIONS[:4])
    reference = run(tiny_chat, DenseServer(tiny_chat, token_matched=True), QUESTIONS[:4])
    repaired = [
        (c, r) for rec, ref in zip(records, reference) for c, r in zip(rec.calls, ref.calls) if c.mode == "reuse"
    ]
    assert repaired, "the warm-up never ended: no call was served from an assembled cache"
    for call, dense in repaired:
        assert call.rows_recomputed == len(call.merged_ids) - 1 >= 128
        assert rounding_close(call.served[0].values, dense.served[0].values)
        assert call.output_tokens == dense.output_tokens


def test_budget_and_skip_rule_in_the_records(tiny_chat):
    records = run(tiny_chat, make_server(tiny_chat, "bcr-single@0.2:gamma=1,skip=off"), QUESTIONS[:4])
    for call in (c for r in records for c in r.calls):
        m = len(call.merged_ids) - 1
        expected = round(0.2 * m) if call.mode == "reuse" else 0
        assert call.rows_recomputed == expected == len(call.repaired_rows) and not call.skipped
    for spec in ("bcr-chunk@0.2:gamma=1", "bcr-single@0.2:gamma=1", "cacheblend-cost@0.2:gamma=1"):
        calls = [c for r in run(tiny_chat, make_server(tiny_chat, spec), QUESTIONS[:4]) for c in r.calls]
        assert all(c.rows_recomputed == 0 for c in calls)  # rho * M < 64: every layout skips alike
        assert [c.skipped for c in calls] == [c.mode == "reuse" for c in calls]


def test_repair_at_partial_budget_moves_the_cache_towards_dense(tiny_chat):
    records = run(tiny_chat, make_server(tiny_chat, "bcr-single@0.5:gamma=1"), QUESTIONS[:4])
    plain = run(tiny_chat, KVCommServer(tiny_chat, KVCommConfig(gamma=1.0)), QUESTIONS[:4])
    call, unrepaired = next(
        (c, p) for r, q in zip(records, plain) for c, p in zip(r.calls, q.calls) if c.mode == "reuse"
    )
    dense = tiny_chat.prefill(call.merged_ids[:-1])
    err = lambda kv: float((kv.values - dense.values).norm())
    assert err(call.served[0]) < err(unrepaired.served[0])
    assert call.merged_ids == unrepaired.merged_ids  # the first reuse call: the same prompt both ways
    kept = torch.tensor([j for j in range(len(call.merged_ids) - 1) if j not in call.repaired_rows])
    assert torch.equal(call.served[0].select(kept).values, unrepaired.served[0].select(kept).values)


def test_coin_stream_is_reproducible_and_seeded():
    a, b, c = CoinSelector(seed=1), CoinSelector(seed=1), CoinSelector(seed=2)
    first = a.draw(100)
    assert torch.equal(first, b.draw(100))
    assert not torch.equal(first, c.draw(100))
    assert not torch.equal(first, a.draw(100))  # the stream advances


def test_coin_condition_repeats_under_the_same_seed_only(tiny_chat):
    rows = lambda spec: [
        c.repaired_rows for r in run(tiny_chat, make_server(tiny_chat, spec), QUESTIONS[:4]) for c in r.calls
    ]
    same = rows("coin-single@0.3:gamma=1,seed=4,skip=off")
    assert any(same) and same == rows("coin-single@0.3:gamma=1,seed=4,skip=off")
    assert same != rows("coin-single@0.3:gamma=1,seed=5,skip=off")


def test_cacheblend_ranks_rows_by_their_layer_one_value_deviation(tiny_chat):
    ids = tiny_chat.tokenizer(QUESTIONS[0])["input_ids"]
    dense = tiny_chat.prefill(ids)
    broken_rows = torch.tensor([7, 30, 31])
    values = dense.values.clone()
    values[1, :, :, broken_rows] += 0.5
    scores = CacheBlendSelector().rank(tiny_chat, type(dense)(dense.keys, values, dense.positions), ids, 0).scores
    assert sorted(scores.argsort(descending=True)[:3].tolist()) == broken_rows.tolist()
    assert float(scores[torch.tensor([0, 1, 2])].max()) < 1e-4  # untouched rows: fresh == cached


def test_opengate_at_theta_zero_is_plain_reuse(tiny_chat):
    """App. I's plumbing control: draft-then-continue equals single-pass decoding."""
    gate = run(tiny_chat, make_server(tiny_chat, "opengate@0"), QUESTIONS, tokens=8)
    plain = run(tiny_chat, make_server(tiny_chat, "kvcomm@1"), QUESTIONS, tokens=8)
    assert any(c.mode == "reuse" for r in gate for c in r.calls)
    for a, b in zip(gate, plain):
        assert [(c.mode, c.output_tokens) for c in a.calls] == [(c.mode, c.output_tokens) for c in b.calls]


def test_opengate_at_theta_one_refuses_and_leaves_no_activation(tiny_chat):
    server = make_server(tiny_chat, "opengate@1")
    records = run(tiny_chat, server, QUESTIONS, tokens=4)
    calls = [c for r in records for c in r.calls]
    assert all(c.mode == "dense" for c in calls)
    assert any(c.reason == "low_confidence" for c in calls)
    assert all(a.activations == 0 for pool in server.pool.pools.values() for a in pool)


def test_allocation_policies_force_dense_where_they_say(tiny_chat):
    root = run(tiny_chat, make_server(tiny_chat, "protect-root:gamma=1"), QUESTIONS)
    leaf = run(tiny_chat, make_server(tiny_chat, "protect-leaf:gamma=1"), QUESTIONS)
    assert all(r.calls[0].mode == "dense" for r in root) and any(r.calls[-1].mode == "reuse" for r in root)
    assert all(r.calls[-1].mode == "dense" for r in leaf) and any(r.calls[0].mode == "reuse" for r in leaf)
    never = run(tiny_chat, make_server(tiny_chat, "random-alloc@1:gamma=1"), QUESTIONS)
    assert all(c.mode == "dense" for r in never for c in r.calls)
    assert any(c.reason == "coin" for r in never for c in r.calls)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bcr-chunk@1.5", r"rho must lie in \[0, 1\]"),
        ("cacheblend-reuse", "paired BCR-chunk reuse rate"),
        ("opengate@2", r"theta must lie in \[0, 1\]"),
        ("kvcomm@-1", r"gamma must lie in \[0, 1\]"),
        ("bcr-tile", "unknown condition 'bcr-tile'"),
    ],
)
def test_bad_conditions_are_clear_errors(tiny_chat, spec, message):
    with pytest.raises(UsageError, match=message):
        make_server(tiny_chat, spec)


def test_condition_labels_round_trip():
    assert parse("kvcomm@0.5").label == "kvcomm@0.5"
    assert parse("coin-chunk@0.3:seed=2").label == "coin-chunk@0.3:seed=2"


def test_a_trace_is_kept_only_when_asked_and_reuses_the_selectors_draft(tiny_chat, monkeypatch):
    spec = "bcr-single@0.3:gamma=1,skip=off"
    plain = [c for r in run(tiny_chat, make_server(tiny_chat, spec), QUESTIONS[:4]) for c in r.calls]
    assert all(c.trace is None for c in plain)
    drafts = []
    draft = tiny_chat.draft
    monkeypatch.setattr(tiny_chat, "draft", lambda *a, **k: drafts.append(1) or draft(*a, **k))
    traced_server = make_server(tiny_chat, spec)
    traced_server.trace = True
    traced = [c for r in run(tiny_chat, traced_server, QUESTIONS[:4]) for c in r.calls]
    reused = [c for c in traced if c.mode == "reuse"]
    assert reused and len(drafts) == len(reused)  # one draft per repaired call: the trace holds the selector's
    untimed = lambda c: c.to_dict() | {"ttft_s": 0, "total_s": 0, "assembly_s": 0}
    assert [untimed(c) for c in traced] == [untimed(c) for c in plain]  # tracing changes no record
    for call in reused:
        trace = call.trace
        assert trace.assembled.length == len(call.merged_ids) - 1
        k = round(0.3 * trace.assembled.length)  # single layout: the k best-scored rows, written out here
        best = sorted(range(len(trace.scores)), key=lambda j: (-float(trace.scores[j]), j))[:k]
        assert sorted(int(trace.candidates[j]) for j in best) == call.repaired_rows
        assert torch.allclose(paper_row_scores(trace.draft.attention), trace.scores.double())  # Algorithm 2
    assert all(c.trace is None for c in traced if c.mode == "dense")


def test_a_kvcomm_trace_drafts_once_on_the_unrepaired_cache(tiny_chat):
    server = KVCommServer(tiny_chat, KVCommConfig(gamma=1.0))
    server.trace = True
    call = next(c for r in run(tiny_chat, server, QUESTIONS[:4]) for c in r.calls if c.mode == "reuse")
    assert call.trace.scores is None and call.repaired_rows == [] and len(call.trace.draft.tokens) == 2
    alone = tiny_chat.draft(call.trace.assembled, call.merged_ids[-1])
    assert alone.tokens == call.trace.draft.tokens and torch.equal(alone.attention, call.trace.draft.attention)


def test_a_server_or_selector_missing_its_required_method_fails_when_built():
    """The protocols name what a server and a selector must define; leaving it out is refused at
    construction, with the method's name, not on the first call that needs it."""
    from bcr_core.repair.bcr import BCRServer
    from bcr_core.repair.layouts import layout
    from bcr_core.repair.selectors import Selector
    from bcr_core.reuse.calls import Server

    class NoSteps(Server):
        name = "no-steps"

    class NoRank(Selector):
        name = "no-rank"

    with pytest.raises(TypeError, match="steps"):
        NoSteps()
    with pytest.raises(TypeError, match="rank"):
        NoRank()

    class DuckSelector:  # ranks, but does not declare itself a Selector
        def rank(self, bb, kv, ids, last_id, rows=None): ...

    with pytest.raises(TypeError, match="Selector"):
        BCRServer(None, DuckSelector(), layout("single"))


def test_a_refusal_sends_the_call_dense_with_its_reason_and_activates_nothing(tiny_chat):
    """`serve_assembled` returning Refused(reason): the call is prefilled densely, its record carries
    that reason, and the anchors the gate chose are not activated."""
    from bcr_core.reuse.calls import Refused

    class Refuser(KVCommServer):
        def serve_assembled(self, kv, ids, max_new_tokens, started, spans):
            return Refused("declined")
            yield  # a generator, as every serve_assembled is

    refuser = Refuser(tiny_chat, KVCommConfig(gamma=1.0))
    calls = [c for r in run(tiny_chat, refuser, QUESTIONS, tokens=4) for c in r.calls]
    assert all(c.mode == "dense" for c in calls)
    # declined exactly where every placeholder passed the gate; elsewhere the gate's own reason
    for c in calls:
        passed = bool(c.decisions) and all(d["reason"] == "reuse" for d in c.decisions)
        assert (c.reason == "declined") == passed
    assert any(c.reason == "declined" for c in calls)
    assert all(a.activations == 0 for pool in refuser.pool.pools.values() for a in pool)


def test_aligned_assembly_serves_denses_ids_and_full_repair_reproduces_dense_itself(tiny_chat):
    """With segments cut at Dense's token boundaries (`assembly=aligned`) the reuse path's ids are Dense's on
    every call, so a repair at rho = 1 reproduces Dense's own greedy tokens, not only token-matched Dense's;
    under the released assembly the same questions do have seams (the tax the option removes)."""
    questions = [q + "\n" for q in QUESTIONS[:4]]  # the question's newline meets the template's: a seam
    released = run(tiny_chat, make_server(tiny_chat, "kvcomm:gamma=1"), questions)
    assert any(c.merged_ids != c.dense_ids for r in released for c in r.calls)
    records = run(tiny_chat, make_server(tiny_chat, "bcr-chunk@1:gamma=1,assembly=aligned"), questions)
    reference = run(tiny_chat, DenseServer(tiny_chat), questions)
    assert all(c.merged_ids == c.dense_ids for r in records for c in r.calls)
    repaired = [
        (c, d) for rec, ref in zip(records, reference) for c, d in zip(rec.calls, ref.calls) if c.mode == "reuse"
    ]
    assert repaired, "the warm-up never ended: no call was served from an assembled cache"
    for call, dense in repaired:
        assert call.rows_recomputed == len(call.dense_ids) - 1
        assert call.output_tokens == dense.output_tokens


def test_the_assembly_option_is_a_condition_option_with_its_choices_named():
    assert parse("kvcomm@1:assembly=aligned").settings != parse("kvcomm@1").settings
    assert parse("kvcomm@1:assembly=released").settings == parse("kvcomm@1").settings
    assert parse("bcr-chunk:assembly=aligned").label == "bcr-chunk:assembly=aligned"
    with pytest.raises(UsageError, match="assembly"):
        parse("kvcomm:assembly=joined")
