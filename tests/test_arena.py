"""The selector arena: each selector's rule against a written-out version on a tiny random
model's cache, full budgets against token-matched Dense, the arena's draft against what `bcr run`
records for the same calls, the measures, and bad input refused before any work."""

from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest
import torch
from conftest import ROUNDING_ULPS, rounding_close

from bcr_core.arena import measures
from bcr_core.arena.copies import PAIRED, ArenaCall, DenseReference, run_call, spend
from bcr_core.arena.registry import OPTIONS, make_entries, make_entry
from bcr_core.arena.run import make_arena_cell, run_arena
from bcr_core.arena.search import runs
from bcr_core.cli import main
from bcr_core.conditions import parse, with_options
from bcr_core.engine.kv import KV
from bcr_core.errors import UsageError
from bcr_core.repair.call_context import CallContext
from bcr_core.repair.selectors import CacheBlendSelector
from bcr_core.run_folder import read_calls, read_jsonl
from bcr_core.runs.cell import Cell
from bcr_core.runs.runner import run_cell
from tests.conftest import random_ids, record_differences

# A 40-token prompt: an exact prefix [0, 10), then the question [10, 25) and the text after it
# [25, 28), an agent's output [28, 35) and the text after it [35, 40); 39 cached rows.
SPANS = [
    {"name": "prefix", "start": 0, "stop": 10, "placeholder": False},
    {"name": "user_question", "start": 10, "stop": 25, "placeholder": True},
    {"name": "after:user_question", "start": 25, "stop": 28, "placeholder": False},
    {"name": "agent_1_current", "start": 28, "stop": 35, "placeholder": True},
    {"name": "after:agent_1_current", "start": 35, "stop": 40, "placeholder": False},
]
IDS = random_ids(40, seed=5)
M = 39


@pytest.fixture(scope="module")
def assembled(tiny):
    """The exact cache of IDS[:-1] and a copy whose predicted rows (10..38) carry a deviation that
    grows with the row's distance from a few centres, keys and values both (layer 0 left exact)."""
    exact = tiny.prefill(IDS[:-1])
    generator = torch.Generator().manual_seed(1)
    keys, values = exact.keys.clone(), exact.values.clone()
    scale = torch.zeros(M)
    scale[10:] = torch.rand(M - 10, generator=generator) + 0.05
    noise = lambda t: torch.randn(t[1:].shape, generator=generator) * scale.view(1, 1, 1, M, 1)
    keys[1:] += noise(keys)
    values[1:] += noise(values)
    return exact, KV(keys, values, exact.positions)


def context(exact=None):
    return CallContext(SPANS, (0, 0), exact)


def ranked(scores: torch.Tensor) -> list[int]:
    """Rows by descending score, ties to the earlier row (written out)."""
    return sorted(range(len(scores)), key=lambda j: (-float(scores[j]), j))


# -- each rule against its written-out version -------------------------------------------------
def test_kv_error_orders_rows_by_their_true_deviation(tiny, assembled):
    exact, kv = assembled
    truth = []
    for j in range(M):  # sqrt(sum over layers, heads, dims of (K - K*)^2 + (V - V*)^2), in loops
        total = 0.0
        for layer in range(kv.num_layers):
            for head in range(kv.keys.shape[2]):
                total += float(((kv.keys[layer, 0, head, j] - exact.keys[layer, 0, head, j]) ** 2).sum())
                total += float(((kv.values[layer, 0, head, j] - exact.values[layer, 0, head, j]) ** 2).sum())
        truth.append(math.sqrt(total))
    entry = make_entry("kv-error")
    assert make_entry("oracle").label == "kv-error"  # the name records written before the rename hold
    scores = entry.rank(tiny, kv, IDS[:-1], IDS[-1], entry.candidates(M, SPANS), context(exact)).scores
    assert ranked(scores) == ranked(torch.tensor(truth))
    assert torch.allclose(scores.double(), torch.tensor(truth, dtype=torch.float64), rtol=1e-4, atol=1e-6)
    assert float(scores[:10].max()) < 1e-4  # the exact prefix has no error
    with pytest.raises(ValueError, match="reads the exact cache"):
        entry.rank(tiny, kv, IDS[:-1], IDS[-1], entry.candidates(M, SPANS), context())


def test_seams_take_every_segments_first_rows_in_turn(tiny, assembled):
    _, kv = assembled
    entry = make_entry("seams")
    scores = entry.rank(tiny, kv, IDS[:-1], IDS[-1], torch.arange(M), context()).scores
    # depth 0 of the four segments, then depth 1, ...; the last segment stops at row 38 (the cache's end)
    assert spend(entry, scores, torch.arange(M), 4, 16) == [10, 25, 28, 35]
    assert spend(entry, scores, torch.arange(M), 10, 16) == sorted([10, 25, 28, 35, 11, 26, 29, 36, 12, 27])
    assert spend(entry, scores, torch.arange(M), 14, 16) == sorted(
        [10, 25, 28, 35, 11, 26, 29, 36, 12, 27, 30, 37, 13, 31]  # the 3-row segment is used up at depth 3
    )
    everything = spend(entry, scores, torch.arange(M), 31, 16)
    assert set(range(10, M)) <= set(everything) and set(everything) - set(range(10, M)) == {0, 1}


def test_window_takes_the_same_share_of_every_segment_from_its_seam(tiny, assembled):
    _, kv = assembled
    entry = make_entry("window")
    scores = entry.rank(tiny, kv, IDS[:-1], IDS[-1], torch.arange(M), context()).scores
    segments = [(10, 25), (25, 28), (28, 35), (35, 39)]
    predicted = sum(b - a for a, b in segments)
    for count in (4, 9, 15, 29):
        rows = set(spend(entry, scores, torch.arange(M), count, 16))
        assert len(rows) == count
        for a, b in segments:
            mine = sorted(rows & set(range(a, b)))
            assert mine == list(range(a, a + len(mine)))  # contiguous, right after the seam
            assert abs(len(mine) - count * (b - a) / predicted) <= 1.0  # its share of the count


def test_cacheblend_checks_the_layer_it_is_given(tiny):
    exact = tiny.prefill(IDS[:-1])
    values = exact.values.clone()
    values[2, :, :, [12, 30]] += 0.7  # only layer 2 is wrong, on rows 12 and 30
    kv = KV(exact.keys, values, exact.positions)
    at = lambda layer: CacheBlendSelector(layer).rank(tiny, kv, IDS[:-1], IDS[-1]).scores
    assert sorted(ranked(at(2))[:2]) == [12, 30]
    assert float(at(1).max()) < 1e-4  # layer 1 is exact: CacheBlend's default sees nothing
    assert make_entry("cacheblend:layer=2").label == "cacheblend:layer=2" and make_entry("cacheblend").label == (
        "cacheblend"
    )
    with pytest.raises(ValueError, match="check layer must be >= 1"):
        CacheBlendSelector(0)


def test_question_fuses_the_trailing_tokens_attention_over_every_layer(tiny, assembled):
    _, kv = assembled
    start = 35  # the text after the last placeholder; with the final prompt token, five queries
    trailing = IDS[start:]
    cache = kv.truncate(start).to_cache(room=len(trailing))
    with torch.inference_mode(), tiny.attention_implementation("eager"):  # Hugging Face's own kernel
        out = tiny.model(
            input_ids=torch.tensor([trailing]),
            position_ids=torch.arange(start, 40)[None],
            cache=cache,
            use_cache=True,
            output_attentions=True,
        )
    written = torch.zeros(M, dtype=torch.float64)
    for weights in out.attentions:  # every layer; mean over queries and heads of the weight on row j
        w = weights[0].double()
        for j in range(M):
            written[j] += float(w[:, :, j].mean())
    entry = make_entry("question")
    scores = entry.rank(tiny, kv, IDS[:-1], IDS[-1], torch.arange(M), context()).scores
    assert rounding_close(scores, written, ulps=ROUNDING_ULPS * 4)  # a mean of float32 weights


def test_ours_is_the_draft_score_times_cacheblends_deviation(tiny, assembled):
    _, kv = assembled
    entries = {e.label: e for e in make_entries("draft,cacheblend,ours")}
    score = lambda name: entries[name].rank(tiny, kv, IDS[:-1], IDS[-1], torch.arange(M), context()).scores
    assert torch.allclose(score("ours"), score("draft").cpu() * score("cacheblend").cpu())


def test_counts_are_equal_across_selectors_and_rank_predicted_spends_no_exact_row(tiny, assembled):
    exact, kv = assembled
    dense = SimpleNamespace(served=(exact, IDS[-1]), output_tokens=tiny.generate(exact, IDS[-1], 4).tokens)
    reference = DenseReference(tiny, dense, 4)
    entries = make_entries(",".join(OPTIONS) + ",draft:rank=predicted", chunk=8, seeds=[0, 1])
    result = run_call(tiny, ArenaCall(kv, IDS, SPANS, 16, (0, 0)), reference, entries, [0.1, 0.3], 8)
    by_budget = {}
    for e in result["entries"]:
        by_budget.setdefault(e["budget"], set()).add(e["rows"])
        if e["selector"] == "draft:rank=predicted":
            assert e["rows_wasted"] == 0
    assert by_budget == {PAIRED: {16}, "0.1": {round(0.1 * M)}, "0.3": {round(0.3 * M)}}
    assert {e["selector"] for e in result["entries"]} == {e.label for e in entries}
    assert result["cost"]["coin:seed=0"]["passes"] == 0 and result["cost"]["draft"]["passes"] == 2


def test_at_full_budget_every_selector_reproduces_token_matched_dense(tiny, assembled):
    exact, kv = assembled
    tokens = tiny.generate(exact, IDS[-1], 6).tokens  # token-matched Dense: the exact cache of the same ids
    assert tiny.generate(kv, IDS[-1], 6).tokens != tokens, "the deviation should change the output"
    reference = DenseReference(tiny, SimpleNamespace(served=(exact, IDS[-1]), output_tokens=tokens), 6)
    entries = make_entries(",".join(OPTIONS) + ",draft:rank=predicted", chunk=8)
    result = run_call(tiny, ArenaCall(kv, IDS, SPANS, 0, (0, 0)), reference, entries, [1.0], 8)
    full = [e for e in result["entries"] if e["budget"] == "1"]
    assert len(full) == len(entries)
    assert all(e["identical"] and e["first_token_agree"] and e["kl"] < 1e-6 for e in full)
    for entry in (e for e in entries if not e.searched):  # and the greedy decode, from each ranking's full repair
        candidates = entry.candidates(M, SPANS)
        scores = entry.rank(tiny, kv, IDS[:-1], IDS[-1], candidates, context(exact)).scores
        rows = spend(entry, scores, candidates, M, 8)
        assert tiny.generate(tiny.repair(kv, IDS[:-1], rows), IDS[-1], 6).tokens == tokens, entry.label


# -- the arena in a run ---------------------------------------------------------------------------
ARENA = make_arena_cell(n=3, agents=2, max_new_tokens=4, item_seed=34, gamma=1.0, selectors="draft")


@pytest.fixture(scope="module")
def arena_run(tiny_chat, tmp_path_factory):
    """A three-item arena of the draft alone on the tiny chat model (items 0 and 1 warm the pool)."""
    folder = tmp_path_factory.mktemp("arena")
    run_arena(tiny_chat, ARENA, folder, progress=False)
    return folder


def test_the_arenas_draft_at_the_paired_count_is_what_bcr_run_records(tiny_chat, arena_run, tmp_path):
    plain = Cell(
        benchmark="synthetic",
        agents=2,
        conditions=[ARENA.conditions[0]],
        n=3,
        max_new_tokens=4,
        item_seed=34,
        fidelity=True,
    )
    run_cell(tiny_chat, plain, tmp_path / "run", progress=False)
    arena = read_jsonl(arena_run / "calls.jsonl")
    recorded = read_calls(tmp_path / "run" / "calls.jsonl")
    assert len(arena) == len(recorded)
    compared = 0
    for mine, theirs in zip(arena, recorded):
        assert (mine["item_id"], mine["node"], mine["output_tokens"]) == (
            theirs["item_id"],
            theirs["node"],
            theirs["output_tokens"],
        )  # the arena leaves the run's serving unchanged
        if theirs["mode"] != "reuse":
            assert "arena" not in mine
            continue
        draft = next(e for e in mine["arena"]["entries"] if e["selector"] == "draft" and e["budget"] == PAIRED)
        assert draft["rows"] == theirs["rows_recomputed"] and draft["rows_wasted"] == theirs["rows_wasted"]
        assert draft["kl"] == pytest.approx(theirs["fidelity"]["kl"], rel=1e-3, abs=1e-7)
        assert draft["first_token_agree"] == theirs["fidelity"]["first_token_agree"]
        assert draft["identical"] == theirs["fidelity"]["identical"]
        compared += 1
    assert compared, "no call was served from an assembled cache"


# every deployable selector of the arena's field -> the condition that serves it at the paired count
SERVED = {
    "ours": "ours-chunk",
    "question": "question-chunk",
    "seams": "seams-single",
    "window": "window-single",
    "cacheblend": "cacheblend-chunk",
    "cacheblend:layer=2": "cacheblend-chunk:layer=2",
}


@pytest.fixture(scope="module")
def served_beside_the_arena(tiny_chat, tmp_path_factory):
    """The arena's calls for SERVED's selectors, and a run serving each of them at `match=bcr-chunk` on the same
    items: {selector: [(arena call, run call), ...]} over the calls served from an assembled cache in the same
    state. The arena measures copies of the BCR-chunk lane's calls, so a lane's call is that call only while every
    earlier call of the lane answered as BCR-chunk's did (later prompts and KVComm's anchor pool follow them)."""
    folder = tmp_path_factory.mktemp("served")
    arena_cell = make_arena_cell(n=3, agents=2, max_new_tokens=4, item_seed=34, gamma=1.0, selectors=",".join(SERVED))
    run_arena(tiny_chat, arena_cell, folder / "arena", progress=False)
    bcr = parse(arena_cell.conditions[0])
    served = {
        selector: with_options(name, chunk=bcr.option("chunk"), gamma=1.0, match="bcr-chunk")
        for selector, name in SERVED.items()
    }
    cell = Cell(
        benchmark="synthetic",
        agents=2,
        conditions=list(served.values()),
        n=3,
        max_new_tokens=4,
        item_seed=34,
        fidelity=True,
    )
    run_cell(tiny_chat, cell, folder / "run", progress=False)
    arena, recorded = read_jsonl(folder / "arena" / "calls.jsonl"), read_calls(folder / "run" / "calls.jsonl")
    return {
        selector: same_state(arena, [c for c in recorded if c["condition"] == label])
        for selector, label in served.items()
    }


def same_state(arena: list[dict], lane: list[dict]) -> list[tuple[dict, dict]]:
    """The (arena call, lane call) pairs served from an assembled cache, up to the first call whose answer differs
    from the arena's (that one included: its own state was the same)."""
    pairs = []
    for mine, theirs in zip(arena, lane, strict=True):
        assert (mine["item_id"], mine["node"], mine["merged_ids"]) == (
            theirs["item_id"],
            theirs["node"],
            theirs["merged_ids"],
        )
        if "arena" in mine:
            pairs.append((mine, theirs))
        if mine["output_tokens"] != theirs["output_tokens"]:
            break
    return pairs


@pytest.mark.parametrize("selector", SERVED)
def test_a_run_serves_each_selector_at_the_paired_count_choosing_the_arenas_rows(served_beside_the_arena, selector):
    """`SELECTOR-LAYOUT:match=bcr-chunk` in `bcr run` recomputes, on every call served from an assembled cache,
    exactly the rows the arena's same selector chooses at the paired budget on that call (the same row set, so
    the same rows wasted on the exact prefix and the same KL to Dense)."""
    repaired = 0
    for arena_call, served in served_beside_the_arena[selector]:
        entry = next(e for e in arena_call["arena"]["entries"] if e["selector"] == selector and e["budget"] == PAIRED)
        assert entry["runs"] == runs(served["repaired_rows"]), (selector, served["item_id"], served["node"])
        assert entry["rows_wasted"] == served["rows_wasted"]
        assert entry["kl"] == pytest.approx(served["fidelity"]["kl"], rel=1e-3, abs=1e-7)
        repaired += entry["rows"] > 0
    assert repaired, "no call repaired a row"


def test_an_arena_on_humaneval_records_each_calls_docstring_rows(tiny_chat, chat_tokenizer, tmp_path):
    """On a code question the arena keeps, per measured call, the rows the question's docstrings were tokenized
    into: they decode to the docstring of the task the call read, and lie inside its question segment."""
    from bcr_core.data import datasets

    prompts = {item["id"]: item["prompt"] for item in datasets.load_humaneval()}
    cell = make_arena_cell(benchmark="humaneval", n=4, agents=2, max_new_tokens=4, gamma=1.0, selectors="draft")
    run_arena(tiny_chat, cell, tmp_path, progress=False)
    measured = [c for c in read_jsonl(tmp_path / "calls.jsonl") if "arena" in c]
    assert measured, "no call was served from an assembled cache"
    for call in measured:
        question = next(s for s in call["segment_map"] if s["name"] == "user_question")
        [(first, last)] = call["arena"]["docstring"]  # HumanEval/0 to /3: one docstring each
        assert question["start"] < first < last <= question["stop"]
        docstring = prompts[call["item_id"]].split('"""')[1]
        assert docstring.strip() in chat_tokenizer.decode(call["merged_ids"][first:last])


def test_an_arena_cut_short_resumes_to_the_same_records(tiny_chat, arena_run, tmp_path):
    folder = tmp_path / "arena"
    shutil.copytree(arena_run, folder)
    arena, items = read_jsonl(folder / "calls.jsonl"), read_jsonl(folder / "items.jsonl")
    before = (folder / "calls.jsonl").read_text()
    run_arena(tiny_chat, ARENA, folder, progress=False)  # finished: nothing is redone
    assert (folder / "calls.jsonl").read_text() == before
    # cut after two items: the pool is replayed, the coins need no stream, the last item is redone alike
    kept = [c for c in arena if c["item_id"] != arena[-1]["item_id"]]
    (folder / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in kept))
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items[:-1]))
    run_arena(tiny_chat, ARENA, folder, progress=False)
    untimed = lambda c: (
        {k: v for k, v in c.items() if k not in ("ttft_s", "total_s", "assembly_s", "arena")}
        | {"arena": c.get("arena", {}).get("entries")}
    )
    resumed = [untimed(c) for c in read_jsonl(folder / "calls.jsonl")]
    assert record_differences(resumed, [untimed(c) for c in arena]) == []


# -- the measures ----------------------------------------------------------------------------------
def fake_calls(kl: dict[str, list[float]], item_id=lambda i: f"synth-s0-r8-{i:04d}") -> list[dict]:
    """One assembled call per item, at the paired budget and one sweep point, with the given KLs."""
    calls, n = [], len(next(iter(kl.values())))
    for i in range(n):
        entries = [
            {"selector": s, "budget": b, "rows": 8, "rows_wasted": 0, "kl": v[i] * (1 if b == PAIRED else 0.5)}
            | {"first_token_agree": True, "identical": v[i] < 0.5}
            for s, v in kl.items()
            for b in (PAIRED, "0.4")
        ]
        cost = {s: {"passes": 0, "ms": 1.0} for s in kl}
        arena = {"cached_rows": 40, "entries": entries, "cost": cost, "item_index": i, "items": n}
        calls.append({"item_id": item_id(i), "node": "agent_1", "arena": arena})
    return calls


def test_gap_share_and_coin_seeds_as_one_control():
    kl = {"oracle": [0.1, 0.2, 0.1, 0.3], "coin:seed=0": [1.0, 1.2, 0.9, 1.1], "coin:seed=1": [0.8, 1.0, 1.1, 1.3]}
    kl["draft"] = [0.55, 0.7, 0.6, 0.8]
    frame = measures.arena_frame(fake_calls(kl))
    table = measures.per_item(frame)
    assert sorted(table.columns) == ["coin", "draft", "kv-error"]  # stored as `oracle`: read under its name
    assert table["coin"].tolist() == pytest.approx([0.9, 1.1, 1.0, 1.2])
    per, overall = measures.gap_share(frame)
    assert per["draft"].tolist() == pytest.approx([(0.9 - 0.55) / 0.8, (1.1 - 0.7) / 0.9, 0.4 / 0.9, 0.4 / 0.9])
    share = overall.set_index("selector").loc["draft", "gap_share"]
    assert share == pytest.approx((1.05 - 0.6625) / (1.05 - 0.175))
    assert overall.set_index("selector").loc["kv-error", "gap_share"] == pytest.approx(1.0)
    front = measures.frontier(frame)
    assert set(front["rho"]) == {0.4} and front.set_index("selector").loc["draft", "kl_per_item"] == pytest.approx(
        0.6625 / 2
    )


def test_verdicts_are_one_holm_family_and_ours_is_read_on_the_second_half():
    n = 12
    kl = {
        "oracle": [0.1] * n,
        "draft": [0.5 + 0.01 * i for i in range(n)],
        "coin:seed=0": [1.0 + 0.02 * i for i in range(n)],
        "ours": [0.9] * (n // 2) + [0.2] * (n // 2),
    }
    table = measures.verdicts(measures.arena_frame(fake_calls(kl)))
    assert (table["p_holm"] >= table["p"] - 1e-12).all()
    ours = table[table["claim"] == "ours beats draft"].iloc[0]
    assert ours["n"] == n // 2 and ours["read_on"] == measures.HELD_OUT
    assert ours["effect"] == pytest.approx(sum(0.5 + 0.01 * i for i in range(6, 12)) / 6 - 0.2)
    assert table[table["claim"] == "draft beats coin"].iloc[0]["verdict"] == "holds"


def test_each_pair_is_asked_once_so_holm_counts_five_questions_not_six():
    n = 12  # 2^12 sign patterns: scipy enumerates them, so a split all one way has p = 2 / 4096
    kl = {
        "oracle": [0.1] * n,
        "draft": [0.5 + 0.01 * i for i in range(n)],
        "coin:seed=0": [1.0 + 0.02 * i for i in range(n)],
        "ours": [0.9] * (n // 2) + [0.2] * (n // 2),
    }
    table = measures.verdicts(measures.arena_frame(fake_calls(kl))).set_index("claim")
    asked = {"kv-error beats draft", "ours beats draft", "kv-error beats coin", "draft beats coin", "ours beats coin"}
    assert set(table.index) == asked  # "coin beats draft" is "draft beats coin" read backwards: not asked again
    # Holm over five p's, three of them 2/4096 (every item one way) and two 2/64 (ours, on six items)
    assert table.loc["draft beats coin", "p"] == pytest.approx(2 / 4096)
    assert table.loc["draft beats coin", "p_holm"] == pytest.approx(5 * 2 / 4096)
    assert table.loc["ours beats coin", "p_holm"] == pytest.approx(max(2 * 2 / 64, 5 * 2 / 4096))


def test_an_arena_p_near_its_holm_threshold_is_refined_like_the_claims():
    from bcr_core.analysis.statistics import monte_carlo

    n, rng = 200, np.random.default_rng(3)
    d = rng.normal(0, 1, n)
    gain = d - d.mean() + 1.96 * d.std(ddof=1) / np.sqrt(n)  # p about 0.05, the threshold of a family of one
    coin = 5.0 + rng.uniform(0, 1, n)
    table = measures.verdicts(measures.arena_frame(fake_calls({"draft": list(coin - gain), "coin:seed=0": list(coin)})))
    row = table.set_index("claim").loc["draft beats coin"]
    assert len(table) == 1 and row["resamples"] > monte_carlo.RESAMPLES


def test_a_p_at_the_sign_flip_floor_is_printed_as_the_floor_not_as_a_value():
    from bcr_core.arena.report import verdict_markdown

    n = 30  # too many items to enumerate: 20,000 random flips, none as far out as every item one way
    kl = {"draft": [0.5 + 0.01 * i for i in range(n)], "coin:seed=0": [1.0 + 0.02 * i for i in range(n)]}
    line = verdict_markdown(measures.arena_frame(fake_calls(kl)))
    assert line.startswith("- draft beats coin: **holds**") and "p < 5e-05, Holm < 5e-05)" in line


@pytest.mark.parametrize(
    ("ids", "read"),
    [
        (lambda i: f"synth-s2-r8-{i:04d}", measures.FRESH),  # a fresh item seed: its confirmation, every item
        (lambda i: f"synth-s0-r8-{i:04d}", measures.HELD_OUT),  # the seed `ours` was designed on: the second half
        (lambda i: f"synth-s2-r8-{i:04d}" if i else f"synth-s0-r8-{i:04d}", measures.HELD_OUT),  # one design item
        (lambda i: f"HumanEval/{i}", measures.OTHER_BENCHMARK),  # another benchmark: no item was seen in design
        (lambda i: f"gsm8k-{i}", measures.OTHER_BENCHMARK),
    ],
)
def test_ours_is_read_on_every_item_it_was_not_designed_on_and_on_the_second_half_otherwise(ids, read):
    """`ours` was designed on the synthetic task's seed-0 items (SmolLM2's arena, first half): every item of
    another seed or another benchmark is one it never saw, so all are read; a run holding a design item reads
    the second half, as pre-registered."""
    n = 10
    kl = {"draft": [0.5] * n, "coin:seed=0": [1.0] * n, "ours": [0.1 * (i + 1) for i in range(n)]}
    calls = fake_calls(kl)
    for i, call in enumerate(calls):
        call["item_id"] = ids(i)
    frame = measures.arena_frame(calls)
    table = measures.verdicts(frame).set_index("claim")
    read_items = range(n // 2, n) if read == measures.HELD_OUT else range(n)
    expected_ours = sum(0.1 * (i + 1) for i in read_items) / len(read_items)
    assert table.loc["ours beats draft", "n"] == len(read_items)
    assert table.loc["ours beats draft", "effect"] == pytest.approx(0.5 - expected_ours)
    assert table.loc["ours beats draft", "read_on"] == read
    assert table.loc["draft beats coin", "n"] == n  # the others on every item, whatever the seed
    ours = measures.selector_table(frame).set_index("selector").loc["ours"]
    assert ours["items"] == len(read_items) and ours["kl_per_item"] == pytest.approx(expected_ours)


# -- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--rho", "1.5"], "--rho: expected float (a number) in [0, 1], got 1.5"),
        (["--rhos", "0.1,-0.2"], "--rhos: entry 1: -0.2 is outside in [0, 1]"),
        (["--chunk", "0"], "--chunk: expected int >= 1, got 0"),
        (["--gamma", "2"], "--gamma: expected float (a number) in [0, 1] or None, got 2.0"),
        (["--selectors", "draft,oracel"], "unknown selector 'oracel'; known: kv-error, kv-error-attn, draft"),
        (
            ["--selectors", "cacheblend:depth=2"],
            "selector 'cacheblend' takes no option 'depth' (in 'cacheblend:depth=2'); its options: layer, rank",
        ),
        (["--selectors", "draft:rank=some"], "option rank: expected str (one of 'all', 'predicted'), got 'some'"),
        (["--selectors", "seams,seams"], "seams is listed more than once"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, args, message):
    out = tmp_path / "arena"
    assert main(["arena", "--n", "2", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_records_are_json_and_settings_are_the_folders_identity(tiny_chat, tmp_path):
    cell = make_arena_cell(n=1, agents=2, max_new_tokens=2, item_seed=34, gamma=1.0, selectors="seams")
    run_arena(tiny_chat, cell, tmp_path, progress=False)
    settings = json.loads((tmp_path / "cell.json").read_text())
    assert settings["selectors"] == ["seams"] and settings["rhos"] == [0.05, 0.1, 0.2, 0.4]
    deep = make_arena_cell(n=1, agents=2, max_new_tokens=2, item_seed=34, gamma=1.0, selectors="cacheblend:layer=3")
    with pytest.raises(UsageError, match="the model has 3 layers, so check layers 1 to 2"):
        run_arena(tiny_chat, deep, tmp_path / "deep", progress=False)
    assert not (tmp_path / "deep").exists()
    other = make_arena_cell(n=1, agents=2, max_new_tokens=2, item_seed=34, gamma=1.0, selectors="window")
    with pytest.raises(UsageError, match="holds a run with other settings"):
        run_arena(tiny_chat, other, tmp_path, progress=False)


@pytest.mark.notebooks
@pytest.mark.real_model
def test_notebook_11_runs_headless_in_smoke_mode(tmp_path):
    out = tmp_path / "reports"
    assert main(["notebooks", "--smoke", "--only", "11", "--out", str(out)]) == 0
    nb = nbformat.read(out / "11_arena.ipynb", as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert "checks passed" in "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "Plotly.newPlot" in (out / "11_arena.html").read_text()


@pytest.mark.parametrize(
    "folder",
    [
        "arena",
        "arena-gemma-3-270m",
        "arena-gemma-3-270m-bos",
        "arena-qwen2.5-coder-0.5b-humaneval",
        "ours-confirmation/smollm2-135m",
        "ours-confirmation/gemma-3-270m",
    ],
)
def test_the_committed_arena_gives_the_documented_table(folder):
    """results/arena (SmolLM2-135M), Gemma 3 270M's arenas (behind `<bos>`, and the one made before
    that fix), the Qwen coder's on HumanEval and the confirmation of `ours` on fresh items hold the arena's
    records; every line docs/results.md shows of each is what `bcr_core.arena.report` computes from them, and every
    selector spent the paired rows. The docs part is a drift check: it holds the report's lines on the
    committed records equal to the lines pasted into docs/results.md, so it catches a change to the code or
    to either committed file without judging which is right; the verdicts and gap shares themselves are
    checked on hand-made records by test_verdicts_are_one_holm_family_and_ours_is_read_on_the_second_half
    and test_gap_share_and_coin_seeds_as_one_control."""
    from bcr_core.arena import report
    from bcr_core.paths import RESULTS

    frame = measures.read_arena(RESULTS / folder)
    paired = frame[(frame["budget"] == PAIRED) & ~frame["selector"].str.contains("rank=predicted")]
    assert (paired.groupby(["item_id", "node"])["rows"].nunique() == 1).all()
    shown_in = (RESULTS.parent / "docs" / "results.md").read_text()
    for line in report.markdown(RESULTS / folder).splitlines():
        assert line in shown_in, line
    if folder.startswith("ours-confirmation"):  # items of seed 2 only: `ours` is read on every one of them
        assert frame["item_id"].str.startswith("synth-s2-").all() and measures.fresh_items(frame)
        verdict = measures.verdicts(frame).set_index("claim").loc["ours beats coin"]
        assert verdict["n"] == frame["item_id"].nunique() and verdict["read_on"] == measures.FRESH


def test_the_documented_arena_transfer_table_compares_like_with_like():
    """The two arenas of the transfer table differ in model, item count and the prompt and stop rule
    each model answers under only (same task, agents, serving condition, verdicts' selectors and
    budgets; both hold the searched ceiling, in no verdict), and docs/results.md's transfer table
    is what they give. That last part is a drift check: it holds `report.transfer_lines` on the committed
    arenas equal to the table pasted into docs/results.md, so it catches a change to the code or to either
    committed file without judging which is right."""
    from bcr_core.arena import report
    from bcr_core.arena.registry import current_label
    from bcr_core.paths import RESULTS

    folders = [RESULTS / "arena", RESULTS / "arena-gemma-3-270m-bos"]
    cells = [json.loads((f / "cell.json").read_text()) for f in folders]
    assert [c.pop("model") for c in cells] == ["default", "gemma-3-270m"]
    assert [c.pop("n") for c in cells] == [200, 100]
    assert [(c.pop("prompt", None), c.pop("stop", None)) for c in cells] == [(None, None), ("one-shot", "line")]
    selectors = [[current_label(s) for s in c.pop("selectors") if s != "searched"] for c in cells]
    assert selectors[0] == selectors[1] and cells[0] == cells[1]
    table = report.transfer_table(folders)
    shown = table[["SmolLM2-135M: verdict", "Gemma 3 270M: verdict"]]
    assert "transfers" not in table and "diff_p" not in table  # no test across two models' KL scales
    for (a, b), said in zip(shown.itertuples(index=False), table["same verdict"]):
        assert said == ("yes" if a == b else "no"), (a, b, said)
    with pytest.raises(UsageError, match="same model"):
        report.transfer_table([folders[0], folders[0]])
    shown_in = (RESULTS.parent / "docs" / "results.md").read_text()
    for line in report.transfer_lines(folders).splitlines():
        assert line in shown_in, line


def test_the_answer_table_is_the_arenas_own_numbers_written_out_from_their_call_records():
    """Which rows to recompute, per arena, computed here from the raw `arena` fields of the committed calls
    without the measures module: per item the mean over its assembled calls, coin seeds averaged; a share is
    (coin - selector) / (coin - searched) as a ratio of means over items; the best deployable selector is the
    largest share among those reading no exact cache (`ours` apart: its own column). The docs part is a drift
    check of the lines pasted into docs/results.md."""
    import numpy as np
    import pandas as pd

    from bcr_core.arena import report
    from bcr_core.arena.registry import current_label
    from bcr_core.paths import RESULTS
    from bcr_core.run_folder import RunFolder

    folders = [RESULTS / "arena", RESULTS / "arena-gemma-3-270m-bos", RESULTS / "arena-qwen2.5-coder-0.5b-humaneval"]
    table = report.answer_table(folders).set_index("arena")
    assert list(table.index) == [
        "SmolLM2-135M, synthetic",
        "Gemma 3 270M, synthetic",
        "Qwen2.5-Coder-0.5B, humaneval",
    ]
    exact_readers = {"kv-error", "kv-error-attn", "searched"}
    for folder, (_, row) in zip(folders, table.iterrows()):
        rows, base = [], []
        designed_on = json.loads((folder / "cell.json").read_text())["benchmark"] == "synthetic"
        for call in RunFolder(folder).calls():
            arena = call.get("arena")
            if not arena:
                continue
            # `ours` is read on the synthetic arenas' second half only, on any other benchmark on every item
            held = not designed_on or arena["item_index"] >= arena["items"] / 2
            for entry in arena["entries"]:
                label = current_label(entry["selector"])
                label = "coin" if label.startswith("coin") else label
                if entry["budget"] == "paired" and (label != "ours" or held):
                    rows.append((call["item_id"], call["node"], label, entry["kl"]))
            base.append((call["item_id"], arena["unrepaired"]["kl"], arena["token_matched"]["kl"]))
        kl = pd.DataFrame(rows, columns=["item", "node", "selector", "kl"])
        kl = kl.groupby(["item", "node", "selector"])["kl"].mean().groupby(["item", "selector"]).mean().unstack()
        if "ours" in kl:  # each share on the items where both sides were read
            ours = kl[["coin", "searched", "ours"]].dropna()
            gain = (ours["coin"] - ours["ours"]).mean() / (ours["coin"] - ours["searched"]).mean()
            assert row["ours"][0] == pytest.approx(gain, rel=1e-9)
        deployable = [s for s in kl.columns if s not in exact_readers | {"coin", "ours"}]
        gain = np.nanmean(kl["coin"] - kl["searched"])
        shares = {s: np.nanmean(kl["coin"] - kl[s]) / gain for s in deployable}
        assert row["best"] == max(shares, key=shares.get)
        assert row["best_share"][0] == pytest.approx(shares[row["best"]], rel=1e-9)
        assert row["draft"][0] == pytest.approx(shares["draft"], rel=1e-9)
        per_item = pd.DataFrame(base, columns=["item", "unrepaired", "tm"]).groupby("item").mean()
        searched = kl["searched"].reindex(per_item.index)
        reached = (per_item["unrepaired"] - searched).mean() / (per_item["unrepaired"] - per_item["tm"]).mean()
        assert row["reached"][0] == pytest.approx(reached, rel=1e-9)
        assert row["of_kvcomm"][0] == pytest.approx(1 - searched.mean() / per_item["unrepaired"].mean(), rel=1e-9)
        assert row["reached"][1] < row["reached"][0] < row["reached"][2]  # its interval holds it
    shown_in = (RESULTS.parent / "docs" / "results.md").read_text()
    for line in report.answer_lines(folders).splitlines():
        assert line in shown_in, line


def test_every_selector_shares_one_protocol_and_the_registry_reads_its_costs_from_the_class():
    """One protocol: `rank(bb, kv, ids, last_id, rows=None, *, context=None)`, and `row_rule`,
    `passes`, `reads_exact` as class attributes; the entry's costs are the class's (the paper's k = 2
    draft steps; a two-layer prefill for CacheBlend; the exact prefill for the K/V-error rankings)."""
    import inspect

    from bcr_core.arena.registry import SELECTORS
    from bcr_core.repair.selectors import Selector

    expected = {  # name: (row_rule, passes, reads_exact)
        "kv-error": (False, 1, True),
        "kv-error-attn": (False, 2, True),
        "draft": (False, 2, False),
        "coin": (False, 0, False),
        "cacheblend": (False, 1, False),
        "question": (False, 1, False),
        "seams": (True, 0, False),
        "window": (True, 0, False),
        "ours": (False, 3, False),
    }
    assert set(SELECTORS) == set(expected) == set(OPTIONS) - {"searched"}
    for name, cls in SELECTORS.items():
        assert issubclass(cls, Selector) and cls.name == name
        assert (cls.row_rule, cls.passes, cls.reads_exact) == expected[name], name
        context = inspect.signature(cls.rank).parameters["context"]
        assert context.kind is inspect.Parameter.KEYWORD_ONLY and context.default is None, name
        entry = make_entry(name)
        assert (entry.row_rule, entry.passes, entry.reads_exact) == expected[name], name
    assert make_entry("draft:k=3").passes == 3 and make_entry("draft").passes == 2
