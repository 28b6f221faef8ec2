"""Work the batched runner does once for many conditions: decodes of the same cache
(`lanes.SharedDecodes`), the fidelity KL's teacher-forced measurements (`fidelity.ForcedLogProbs`),
and prefix-extended prefills (`segments.PrefixPrefills`). Each must leave every record as it was
without it: tokens, routes, gate decisions, repaired rows exactly, floats within the suite's tolerance."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import random_ids, record_differences

from bcr_core.engine.batching import BatchDecoder
from bcr_core.reuse.calls import Cached, Decode
from bcr_core.reuse.fidelity import ForcedLogProbs, teacher_forced_kl
from bcr_core.runs import run_writer
from bcr_core.runs.cell import Cell
from bcr_core.runs.lanes import Unit, run_lanes
from bcr_core.runs.runner import run_cell

TIMING = {"ttft_s_mean", "total_s", "ttft_s", "assembly_s"}

CELL = Cell(
    benchmark="synthetic",
    agents=3,
    n=5,
    max_new_tokens=6,
    item_seed=11,
    fidelity=True,
    conditions=("dense", "token-matched-dense", "kvcomm@1", "bcr-chunk@0.5:gamma=1", "coin-chunk@0.5:gamma=1,seed=3"),
)


def counted(monkeypatch, owner, name):
    """Count the calls of `owner.name` from now on."""
    calls, method = [], getattr(owner, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return method(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def records(folder):
    key = lambda r: (r["condition"], r["item_id"], r["node"])  # noqa: E731
    rows = run_writer.read_jsonl(folder / "calls.jsonl")
    return sorted(({k: v for k, v in r.items() if k not in TIMING} for r in rows), key=key)


def test_sharing_leaves_every_record_as_it_was_and_saves_work(tiny_chat, tmp_path, monkeypatch):
    from bcr_core.engine.backbone import Backbone

    decodes = counted(monkeypatch, BatchDecoder, "add")
    forwards = counted(monkeypatch, Backbone, "forced_logits_batch")
    run_cell(tiny_chat, CELL, tmp_path / "alone", progress=False, batch=8, share_decodes=False, share_log_probs=False)
    alone = (len(decodes), len(forwards))
    run_cell(tiny_chat, CELL, tmp_path / "shared", progress=False, batch=8)
    shared = (len(decodes) - alone[0], len(forwards) - alone[1])
    run_cell(tiny_chat, CELL, tmp_path / "prefix", progress=False, batch=8, prefix_prefills=True)
    before, after = records(tmp_path / "alone"), records(tmp_path / "shared")
    dense_calls = 5 * 4  # five items, three agents and the final node
    assert len(before) == 5 * dense_calls and any(c["reason"] == "reuse" and c["repaired_rows"] for c in before)
    print("decodes, forwards alone", alone, "shared", shared)
    assert after == before  # tokens, routes, rows, and the fidelity floats bit for bit
    assert record_differences(records(tmp_path / "prefix"), before) == []
    # without sharing every call is measured twice (the reference's cache and its own); a Dense call's
    # cache is the reference's own prefill, measured just before it: a lookup
    assert alone[1] == 2 * len(before) and shared[1] <= alone[1] - dense_calls
    assert shared[0] < alone[0]


def test_a_cache_measured_again_is_looked_up_and_a_copy_of_it_is_not(tiny):
    ids = random_ids(20, seed=3)
    kv, tokens = tiny.prefill(ids[:-1]), random_ids(5, seed=4)
    log_probs = ForcedLogProbs(tiny)
    first = log_probs(Cached(kv, ids[-1]), tokens)
    assert log_probs(Cached(kv, ids[-1]), tokens) is first and (log_probs.computed, log_probs.looked_up) == (1, 1)
    copy = log_probs(Cached(kv.clone(), ids[-1]), tokens)  # equal numbers, another cache: measured again
    assert copy is not first and torch.equal(copy, first) and log_probs.computed == 2
    assert log_probs(Cached(kv, ids[-2]), tokens) is not first  # another last id is another measurement
    other = tiny.prefill(random_ids(19, seed=5))
    fresh = teacher_forced_kl(tiny, (kv, ids[-1]), (other, ids[-1]), tokens)
    assert fresh > 1e-3 and teacher_forced_kl(tiny, (kv, ids[-1]), (other, ids[-1]), tokens, log_probs) == fresh


def test_measurements_are_kept_within_their_byte_budget_the_latest_always(tiny):
    ids, tokens = random_ids(20, seed=3), random_ids(5, seed=4)
    caches = [tiny.prefill(ids[:-1]), tiny.prefill(ids[:-2])]
    one = 5 * tiny.config.vocab_size * 4  # five steps of float32 log-probabilities
    log_probs = ForcedLogProbs(tiny, max_bytes=one)
    first = log_probs(Cached(caches[0], ids[-1]), tokens)
    log_probs(Cached(caches[1], ids[-1]), tokens)  # the budget holds one: the first is dropped
    assert len(log_probs.kept) == 1 and log_probs.bytes == one
    assert log_probs(Cached(caches[0], ids[-1]), tokens) is not first and log_probs.computed == 3
    roomy = ForcedLogProbs(tiny, max_bytes=2 * one)
    kept = [roomy(Cached(kv, ids[-1]), tokens) for kv in caches]
    assert [roomy(Cached(kv, ids[-1]), tokens) for kv in caches] == kept and roomy.looked_up == 2


def decode_unit(key, kv, last_id, results):
    def steps():
        generation = yield Decode(kv, last_id, 6)
        results[key] = generation.tokens

    return Unit(key, steps)


@pytest.mark.parametrize("share", [True, False])
def test_identical_decode_requests_are_decoded_once(tiny, monkeypatch, share):
    ids = random_ids(20, seed=3)
    kv = tiny.prefill(ids[:-1])
    adds = counted(monkeypatch, BatchDecoder, "add")
    results = {}
    units = [decode_unit("a", kv, ids[-1], results), decode_unit("b", kv, ids[-1], results)]
    units += [decode_unit("copy", kv.clone(), ids[-1], results), decode_unit("other", kv, ids[-2], results)]
    run_lanes(tiny, units, 4, lambda unit, running: True, lambda unit, value: None, share_decodes=share)
    alone = tiny.generate(kv, ids[-1], 6).tokens
    assert results["a"] == results["b"] == results["copy"] == alone
    assert results["other"] == tiny.generate(kv, ids[-2], 6).tokens
    assert results["a"] is not results["b"]  # each request its own list
    assert len(adds) == (3 if share else 4)  # the same cache object and request once; a copy is another cache


def test_the_committed_cell_a_items_come_out_the_same_with_all_sharing_on(real, tmp_path):
    """The first five items of the claims grid's cell a (the fifth is the first served from an
    assembled cache) at batch size 8 with --fidelity, decodes and measurements shared and prefills
    extended from the longest kept prefix: every call's tokens, route, gate decisions, repaired rows
    and fidelity as committed (floats within the suite's tolerance)."""
    from bcr_core import run_folder
    from bcr_core.paths import RESULTS

    folder = RESULTS / "claims" / "a"
    committed = json.loads((folder / "cell.json").read_text())
    conditions = ("dense", "kvcomm", "bcr-chunk:chunk=16", "coin-chunk:chunk=16,seed=0")
    assert set(conditions) <= set(committed["conditions"])
    cell = replace(Cell.from_record(committed), conditions=conditions, n=5, fidelity=True)
    run_cell(real, cell, tmp_path, progress=False, batch=8, prefix_prefills=True)
    fresh = [run_folder.committed(c) for c in run_folder.read_records(tmp_path / "calls.jsonl")]
    wanted = {
        (c["condition"], c["item_id"], c["node"]): c
        for c in run_folder.read_records(folder / "calls.jsonl")
        if c["condition"] in conditions
    }
    keys = ("reason", "output_tokens", "rows_recomputed", "rows_wasted", "skipped", "decisions", "segment_map")
    keys += ("cached_rows", "ids_match", "fidelity")
    assert len(fresh) == 4 * 5 * 4 and any(c["reason"] == "reuse" and c["rows_recomputed"] for c in fresh)
    for call in fresh:
        where = (call["condition"], call["item_id"], call["node"])
        assert record_differences({k: call[k] for k in keys}, {k: wanted[where][k] for k in keys}) == [], where


def test_a_lane_that_joins_a_running_decode_after_its_first_token_never_knew_it_earlier(tiny):
    """A second request for the same decode, made after the first token came out, shares the tokens; its
    first token is known when it joins, never before its own call started (a negative time to first token)."""
    import time

    ids = random_ids(20, seed=5)
    kv, other = tiny.prefill(ids[:-1]), tiny.prefill(random_ids(12, seed=6)[:-1])
    got = {}

    def leader():
        got["leader"] = yield Decode(kv, ids[-1], 6)

    def late():
        yield Decode(other, 7, 1)  # finishes after the first batched step, when the leader has its first token
        got["started"] = time.perf_counter()
        got["late"] = yield Decode(kv, ids[-1], 6)

    units = [Unit("a", leader), Unit("b", late)]
    run_lanes(tiny, units, width=2, may_start=lambda u, r: True, finished=lambda u, v: None)
    assert got["late"].tokens == got["leader"].tokens
    assert got["leader"].first_token_at < got["started"] <= got["late"].first_token_at
