"""Prefix-extended prefills (`Backbone.extend`, `segments.PrefixPrefills`): a cached prefix's rows
followed by only the new rows, against a fresh prefill of the whole prompt, on tiny random models of
every supported family (sliding windows shorter than the prompts where the family has them).

The stated tolerance: in float32 every key and value of an extended prefill lies within 1e-5 of the
fresh prefill's (the new rows' queries attend in one shorter pass, so their sums round
differently), its prefix rows are the cached rows bit for bit, and greedy decoding from it gives the
same tokens."""

import pytest
import torch
from conftest import FAMILIES, random_ids, tiny_family_config

from bcr_core.engine.backbone import Backbone
from bcr_core.reuse.segments import PrefixPrefills, SharedPrefills, common_prefix

ATOL = 1e-5  # float32; what `Backbone.extend` promises against a fresh prefill
PROMPT, SHARED = 40, 27  # a 40-id prompt whose first 27 ids another prompt shares


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request) -> Backbone:
    return Backbone.from_config(tiny_family_config(request.param), device="cpu", dtype=torch.float32, seed=0)


def biggest_gap(a, b) -> float:
    return max(float((a.keys - b.keys).abs().max()), float((a.values - b.values).abs().max()))


def test_an_extended_prefill_equals_a_fresh_one_within_the_tolerance(tiny):
    ids = random_ids(PROMPT, seed=3)
    prefix = tiny.prefill(ids[:SHARED])
    before = prefix.clone()
    extended, fresh = tiny.extend(prefix, ids[SHARED:]), tiny.prefill(ids)
    assert extended.length == PROMPT and extended.positions.tolist() == list(range(PROMPT))
    assert torch.equal(extended.keys[:, :, :, :SHARED], prefix.keys)  # the cached rows as they were
    assert torch.equal(prefix.keys, before.keys) and torch.equal(prefix.values, before.values)  # never written
    assert biggest_gap(extended, fresh) < ATOL
    last = random_ids(1, seed=4)[0]
    assert tiny.generate(extended, last, 12, stop_ids=()).tokens == tiny.generate(fresh, last, 12, stop_ids=()).tokens


def test_extending_from_a_wrong_prefix_is_caught_by_the_tolerance(tiny):
    """The check above can fail: a prefix cached from other ids is far outside it."""
    ids, other = random_ids(PROMPT, seed=3), random_ids(SHARED, seed=5)
    assert biggest_gap(tiny.extend(tiny.prefill(other), ids[SHARED:]), tiny.prefill(ids)) > 100 * ATOL


def test_the_store_extends_the_longest_shared_prefix_and_serves_repeats_whole(tiny):
    first, unrelated = random_ids(PROMPT, seed=3), random_ids(PROMPT, seed=6)
    second = first[:SHARED] + random_ids(PROMPT - SHARED, seed=7)
    store = PrefixPrefills(tiny, min_rows=16)
    kept = store(first)
    assert store(unrelated) is not None and store.extended == 0  # no prefix shared: prefilled whole
    extended = store(second)
    assert (store.extended, store.rows_reused, store.computed) == (1, SHARED, 2)
    assert torch.equal(extended.keys[:, :, :, :SHARED], kept.keys[:, :, :, :SHARED])
    assert biggest_gap(extended, tiny.prefill(second)) < ATOL
    assert store(second) is extended and store.shared == 1  # the same ids: the same cache
    shorter = store(first[:30])  # a prompt that ends inside a kept one: its first rows
    assert shorter.length == 30 and torch.equal(shorter.keys, kept.keys[:, :, :, :30])


def test_a_short_shared_prefix_is_prefilled_from_scratch_bit_identical(tiny):
    first = random_ids(PROMPT, seed=3)
    second = first[:8] + random_ids(PROMPT - 8, seed=8)
    store = PrefixPrefills(tiny, min_rows=16)
    store(first)
    served = store(second)
    assert store.extended == 0 and torch.equal(served.keys, tiny.prefill(second).keys)
    assert torch.equal(SharedPrefills(tiny)(second).keys, served.keys)


def test_common_prefix_counts_leading_equal_ids():
    pairs = (((1, 2, 3), (1, 2, 4)), ((1, 2), (1, 2, 3)), ((5,), (6,)), ((), (1,)))
    assert [common_prefix(a, b) for a, b in pairs] == [2, 2, 0, 0]
