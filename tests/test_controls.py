"""The controls exactly as the paper defines them, each rule written out here independently of the
code it checks: Algorithm 1's chunk count and skip rule, a fair coin over chunks, the exact-row
budget leak and the option that closes it, MMLU's two rules, and one orientation of every split."""

import math

import pandas as pd
import pytest
import torch
from scipy import stats as scipy_stats

from bcr_core import lab
from bcr_core.agents.pipeline import Pipeline, RequestRecord
from bcr_core.analysis.reports.summary import condition_table
from bcr_core.conditions import make_server, parse
from bcr_core.errors import UsageError
from bcr_core.repair.layouts import Chunk, LayoutConfig
from bcr_core.reuse.calls import CallRecord
from bcr_core.runs.cell import Cell
from bcr_core.runs.runner import item_record, run_cell
from tests.helpers import QUESTIONS, run


def algorithm1_rows(m: int, b: int, rho: float) -> int:
    """Rows Algorithm 1 recomputes when the best chunks are the first ones: line 1's skip rule, then
    round(rho M / B) chunks by Python's round (halves to even), every chunk at rho = 1."""
    if m < 2 * b or rho * m < b:
        return 0
    chunks = math.ceil(m / b) if rho == 1.0 else min(round(rho * m / b), math.ceil(m / b))
    return min(chunks * b, m)


@pytest.mark.parametrize("b", [8, 16, 64])
def test_chunk_count_is_algorithm_1s(b):
    for m in range(1, 700, 7):
        decreasing = torch.arange(m, 0, -1, dtype=torch.float64)  # the earliest chunks score best
        for rho in (0.05, 0.1, 0.2, 0.3, 0.5, 0.9, 1.0):
            rows = Chunk(LayoutConfig(chunk=b)).rows(decreasing, rho).tolist()
            assert rows == list(range(algorithm1_rows(m, b, rho))), (m, b, rho)


def test_chunk_count_rounds_halves_to_even():
    chunk = Chunk(LayoutConfig(chunk=16))
    assert chunk.rows(torch.rand(160), 0.25).numel() == 2 * 16  # rho M / B = 2.5 -> 2
    assert chunk.rows(torch.rand(224), 0.25).numel() == 4 * 16  # 3.5 -> 4
    assert chunk.rows(torch.rand(200), 1.0).numel() == 200  # 12.5 chunks: rho = 1 still takes the short tail


def test_coin_picks_every_chunk_equally_often(tiny_chat):
    """M = 200 rows in chunks of 16: twelve full chunks and an 8-row tail, two picked per call.
    Over 4000 calls each chunk must be picked 2/13 of the time, within a binomial test."""
    server = make_server(tiny_chat, "coin-chunk@0.2:chunk=16,seed=11")
    m, draws, per_call = 200, 4000, 2
    counts = torch.zeros(13)
    for _ in range(draws):
        scores = server.selector.rank(None, None, None, None, torch.arange(m)).scores
        rows = server.layout.rows(scores, server.rho, m)
        assert rows.numel() in (2 * 16, 16 + 8)
        counts[rows.div(16, rounding_mode="floor").unique()] += 1
    assert counts.sum() == per_call * draws
    for picked in counts.tolist():
        assert scipy_stats.binomtest(int(picked), draws, per_call / 13).pvalue > 1e-3, counts.tolist()
    # the same test finds the bias of a coin per row whose chunk scores the mean of its rows
    row_coin = make_server(tiny_chat, "coin-single@0.2:seed=11").selector
    tail = sum(
        int(16 * 12 in server.layout.rows(row_coin.rank(None, None, None, None, torch.arange(m)).scores, 0.2, m))
        for _ in range(draws)
    )
    assert scipy_stats.binomtest(tail, draws, per_call / 13).pvalue < 1e-6


def units_bought(spec: str, m: int, b: int, rho: float) -> int:
    """What a budget rho buys on an M-row cache (paper §3, Algorithm 1): B-row chunks for the chunk
    layouts, round(rho M / B) of them and every chunk at rho = 1; rows for the others, round(rho M)."""
    if spec.split("@")[0].endswith("-chunk"):
        return math.ceil(m / b) if rho == 1.0 else min(round(rho * m / b), math.ceil(m / b))
    return round(rho * m)


@pytest.mark.parametrize(
    "spec",
    ["bcr-chunk", "bcr-grow", "bcr-single", "coin-chunk", "coin-single", "cacheblend-cost", "cacheblend-reuse@0.8"],
)
def test_every_layout_and_both_cacheblend_pairings_skip_by_algorithm_1(tiny_chat, spec):
    for b in (16, 64):
        server = make_server(tiny_chat, f"{spec}:chunk={b}")
        assert server.rho == pytest.approx(0.2)  # the default budget; 1 - 0.8 for the reuse pairing
        for m in range(1, 600, 3):
            rule = m < 2 * b or server.rho * m < b or units_bought(spec, m, b, server.rho) == 0
            assert server.layout.skip(m, server.rho) == rule, (spec, b, m)
    alg1, off = make_server(tiny_chat, f"{spec}:chunk=64"), make_server(tiny_chat, f"{spec}:chunk=64,skip=off")
    assert alg1.layout.skip(300, 0.2) and not off.layout.skip(300, 0.2)  # rho M = 60 < B, but buys a chunk


def test_skip_is_counted_in_the_summary(tiny_chat, tmp_path):
    cell = Cell(
        benchmark="synthetic",
        agents=2,
        conditions=("dense", "kvcomm:gamma=1", "bcr-single:gamma=1", "bcr-single:gamma=1,skip=off"),
        n=4,
        max_new_tokens=3,
        item_seed=7,
    )
    table = condition_table(run_cell(tiny_chat, cell, tmp_path, progress=False)).set_index("condition")
    reused = table.loc["kvcomm:gamma=1", "reuse_rate"] * 4 * 3  # calls KVComm served from cache
    assert reused > 0
    assert table.loc["bcr-single:gamma=1", "skipped_calls"] == reused  # every prompt is under 2B = 128 rows
    assert table.loc["bcr-single:gamma=1", "rows_per_call"] == 0
    assert table.loc["bcr-single:gamma=1,skip=off", "skipped_calls"] == 0
    assert table.loc["bcr-single:gamma=1,skip=off", "rows_per_call"] > 0
    assert table.loc["dense", "skipped_calls"] == 0


def prefix_stop(call) -> int:
    """The agent's own prefix, the one exact segment of an assembled cache, ends where the first
    placeholder begins."""
    return next(s["start"] for s in call.segment_map if s["placeholder"])


@pytest.mark.parametrize("name", ["bcr-chunk", "coin-chunk", "bcr-single", "coin-single", "cacheblend-cost"])
def test_wasted_rows_are_counted_and_rank_predicted_wastes_none(tiny_chat, name):
    spec = f"{name}@0.5:gamma=1,skip=off,chunk=8"
    default = [c for r in run(tiny_chat, make_server(tiny_chat, spec), QUESTIONS[:4]) for c in r.calls]
    explicit = [c for r in run(tiny_chat, make_server(tiny_chat, spec + ",rank=all"), QUESTIONS[:4]) for c in r.calls]
    assert [(c.output_tokens, c.repaired_rows) for c in default] == [
        (c.output_tokens, c.repaired_rows) for c in explicit
    ]
    for call in default:
        assert call.rows_wasted == sum(row < prefix_stop(call) for row in call.repaired_rows)
    predicted = [
        c for r in run(tiny_chat, make_server(tiny_chat, spec + ",rank=predicted"), QUESTIONS[:4]) for c in r.calls
    ]
    repaired = [c for c in predicted if c.repaired_rows]
    assert repaired and sum(c.rows_wasted for c in default) > 0 or name == "cacheblend-cost"
    for call in repaired:
        m = len(call.merged_ids) - 1
        assert call.rows_wasted == 0 and min(call.repaired_rows) >= prefix_stop(call)
        budget = round(0.5 * m) if "single" in name or "cacheblend" in name else round(0.5 * m / 8) * 8
        assert len(call.repaired_rows) <= budget  # the whole cache sets the budget
        if m - prefix_stop(call) >= budget:
            assert len(call.repaired_rows) >= budget - 7  # (the chunk grid's short tail)


def test_unknown_and_repeated_condition_options_are_refused():
    with pytest.raises(UsageError, match=r"takes no option 'chunks'.*its options: assembly, chunk, gamma, rank, skip"):
        parse("bcr-chunk:chunks=16")
    with pytest.raises(UsageError, match=r"takes no option 'rho'"):
        parse("bcr-chunk:rho=1.0")
    with pytest.raises(UsageError, match=r"option rank: expected str \(one of 'all', 'predicted'\), got 'everything'"):
        parse("coin-chunk:rank=everything")
    with pytest.raises(UsageError, match="repeat one run"):
        Cell(benchmark="synthetic", agents=2, conditions=("bcr-chunk", "bcr-chunk@0.2"), n=3)
    assert parse("bcr-chunk:chunk=16,rank=predicted").option("rank") == "predicted"


def test_mmlu_items_keep_both_rules_and_correct_is_lenient(tiny_chat):
    call = CallRecord(
        node="final",
        role="r",
        condition="dense",
        reason="dense",
        dense_ids=[1],
        merged_ids=[1],
        output_tokens=[2],
        output_text="It is not A; the answer is B",
        ttft_s=0.1,
        total_s=0.2,
    )
    request = RequestRecord("q1", "mmlu", "dense", [call])
    item = {"id": "q1", "question": "?", "choices": ["a", "b", "c", "d"], "answer": "A"}
    record = item_record(Cell(benchmark="mmlu", agents=2, conditions=("dense",), n=1), "dense", 0, item, request)
    assert (record["correct"], record["correct_lenient"], record["correct_strict"]) == (True, True, False)


def test_bcr_run_and_the_notebooks_split_one_way(tiny_chat, tmp_path):
    cell = Cell(
        benchmark="synthetic", agents=2, conditions=("dense", "kvcomm:gamma=1"), n=8, max_new_tokens=3, item_seed=5
    )
    items = run_cell(tiny_chat, cell, tmp_path, progress=False)
    items.loc[items["condition"] == "dense", "correct"] = [True, True, True, False, True, False, False, False]
    items.loc[items["condition"] == "kvcomm:gamma=1", "correct"] = [True, False, False, False, True, True, False, False]
    assert lab.condition_table is condition_table  # the notebooks print the table `bcr run` prints
    table = condition_table(items, reference="dense").set_index("condition")
    row = table.loc["kvcomm:gamma=1"]  # only Dense right: items 1, 2; only KVComm right: item 5
    assert (row["only_reference_right"], row["only_condition_right"]) == (2, 1)
    assert pd.isna(table.loc["dense", "only_reference_right"])


def test_pipeline_records_rows_wasted_for_dense_calls_as_zero(tiny_chat):
    records = Pipeline(tiny_chat, "gsm8k", 2, 3).run(make_server(tiny_chat, "dense"), "0", QUESTIONS[0])
    assert all(c.rows_wasted == 0 and not c.skipped for c in records.calls)


def test_row_matched_chunk_selection_cuts_one_chunk_at_its_first_rows():
    """App. D's row for row in the chunk layout: whole chunks by mean score, the last one needed cut
    to its first rows. 30 rows in chunks of 8 (a 6-row tail); the chunks score 1, 4, 2, 3 (best: the
    second, then the tail, then the third), so 20 rows are chunk 1, the tail, and chunk 2's first 6."""
    scores = torch.tensor([1.0] * 8 + [4.0] * 8 + [2.0] * 8 + [3.0] * 6)
    rows = Chunk(LayoutConfig(chunk=8)).exactly(scores, 20).tolist()
    assert rows == list(range(8, 16)) + list(range(16, 22)) + list(range(24, 30))
    assert Chunk(LayoutConfig(chunk=8)).exactly(scores, 0).tolist() == []
    with pytest.raises(ValueError, match="cannot choose 31 rows out of 30"):
        Chunk(LayoutConfig(chunk=8)).exactly(scores, 31)


def test_row_matched_controls_recompute_exactly_bcr_chunks_rows_on_each_call(tiny_chat):
    """On every call served from the same prompt, the row-matched coin (each seed) and CacheBlend
    recompute exactly as many rows as BCR-chunk does, and the coin's rows are whole chunks but one."""
    specs = {
        "bcr-chunk": "bcr-chunk@0.3:gamma=1,chunk=8",
        "coin seed 0": "coin-chunk@0.3:gamma=1,chunk=8,match=bcr-chunk,seed=0",
        "coin seed 5": "coin-chunk@0.3:gamma=1,chunk=8,match=bcr-chunk,seed=5",
        "cacheblend": "cacheblend-cost@0.3:gamma=1,chunk=8,match=bcr-chunk",
    }
    calls = {
        name: [c for r in run(tiny_chat, make_server(tiny_chat, spec), QUESTIONS[:4]) for c in r.calls]
        for name, spec in specs.items()
    }
    draft = calls.pop("bcr-chunk")
    compared = 0
    for control, served in calls.items():
        for mine, theirs in zip(served, draft):
            if mine.merged_ids != theirs.merged_ids or "reuse" not in (mine.mode, theirs.mode):
                continue
            assert mine.mode == theirs.mode and len(mine.repaired_rows) == len(theirs.repaired_rows), control
            compared += bool(theirs.repaired_rows)
            if control.startswith("coin"):
                touched = {}
                for row in mine.repaired_rows:
                    touched.setdefault(row // 8, []).append(row)
                m = len(mine.merged_ids) - 1
                partial = [c for c, rows in touched.items() if len(rows) != min(8, m - 8 * c)]
                assert len(partial) <= 1
                for c in partial:
                    assert touched[c] == list(range(8 * c, 8 * c + len(touched[c])))
    assert compared >= 6  # the check ran on repaired calls of every control
