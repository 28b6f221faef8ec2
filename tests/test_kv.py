import pytest
import torch
from conftest import rounding_close

from bcr_core.engine.kv import KV


def make_kv(rows: int, seed: int = 0, start: int = 0) -> KV:
    g = torch.Generator().manual_seed(seed)
    shape = (3, 1, 2, rows, 4)
    return KV(torch.randn(shape, generator=g), torch.randn(shape, generator=g), torch.arange(start, start + rows))


def test_slice_then_cat_is_identity():
    kv = make_kv(10)
    again = KV.cat([kv.slice(0, 4), kv.slice(4, 7), kv.slice(7)])
    assert torch.equal(again.keys, kv.keys) and torch.equal(again.values, kv.values)
    assert torch.equal(again.positions, kv.positions)


def test_batch_puts_copies_side_by_side_each_one_batch_row():
    copies = [make_kv(6, seed=s) for s in range(3)]
    batch = KV.batch(copies)
    assert batch.keys.shape[1] == 3 and torch.equal(batch.positions, copies[0].positions)
    for b, kv in enumerate(copies):
        assert torch.equal(batch.keys[:, b : b + 1], kv.keys) and torch.equal(batch.values[:, b : b + 1], kv.values)
    with pytest.raises(ValueError, match="at least one"):
        KV.batch([])


def test_truncate_and_next_position():
    kv = make_kv(10, start=5)
    short = kv.truncate(3)
    assert short.length == 3 and short.next_position == 8
    assert torch.equal(short.keys, kv.keys[:, :, :, :3])


def test_select_keeps_order_and_positions():
    kv = make_kv(8)
    picked = kv.select(torch.tensor([6, 1, 3]))
    assert picked.positions.tolist() == [6, 1, 3]
    assert torch.equal(picked.values[:, :, :, 0], kv.values[:, :, :, 6])


def test_replace_overwrites_only_the_given_rows_and_not_the_input():
    kv, other = make_kv(8, seed=0), make_kv(2, seed=1, start=100)
    before = kv.clone()
    out = kv.replace(torch.tensor([2, 5]), other)
    assert torch.equal(kv.keys, before.keys)  # input untouched
    assert torch.equal(out.keys[:, :, :, 5], other.keys[:, :, :, 1])
    assert out.positions.tolist() == [0, 1, 100, 3, 4, 101, 6, 7]
    untouched = torch.tensor([0, 1, 3, 4, 6, 7])
    assert torch.equal(out.keys.index_select(3, untouched), kv.keys.index_select(3, untouched))


def test_replace_with_wrong_row_count_is_an_error():
    with pytest.raises(ValueError, match="replacing 2 rows"):
        make_kv(8).replace(torch.tensor([1, 2]), make_kv(3))


def test_cache_round_trip_shares_storage_and_is_not_written_by_appends():
    kv = make_kv(6)
    before = kv.clone()
    cache = kv.to_cache()
    assert cache.get_seq_length() == 6
    back = KV.from_cache(cache, kv.positions)
    assert torch.equal(back.keys, kv.keys) and torch.equal(back.values, kv.values)
    new = torch.ones(1, 2, 1, 4)
    cache.update(new, new, layer_idx=0)  # what a forward pass does
    assert cache.layers[0].keys.shape[-2] == 7
    assert torch.equal(kv.keys, before.keys)
    first = KV.from_cache(kv.to_cache(), torch.arange(4))  # only the first len(positions) rows
    assert torch.equal(first.values, kv.values[:, :, :, :4])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="positions"):
        KV(torch.zeros(1, 1, 1, 3, 2), torch.zeros(1, 1, 1, 3, 2), torch.arange(4))


def test_decoding_over_the_static_cache_gives_the_tokens_of_concatenation(tiny):
    """Decode runs over a preallocated static cache (`engine.static`) and gives the tokens of HF's own
    concatenating cache, driven by hand below, with logits equal to float rounding (the static step
    attends over the whole slab, its empty rows masked)."""
    ids = list(range(3, 80))
    kv = tiny.prefill(ids[:-1])
    before = kv.keys.clone()
    grown = tiny.generate(kv, ids[-1], 20, stop_ids=(), keep_logits=True, keep_cache=True)
    cache, token, logits = kv.to_cache(), ids[-1], []
    for step in range(20):
        out = tiny.model(
            input_ids=torch.tensor([[token]]),
            position_ids=torch.tensor([[kv.next_position + step]]),
            cache=cache,
            use_cache=True,
        )
        logits.append(out.logits[0, -1].float())
        token = int(logits[-1].argmax())
    assert grown.tokens == [int(x.argmax()) for x in logits]
    assert all(rounding_close(a, b) for a, b in zip(grown.logits, logits))
    assert torch.equal(kv.keys, before)  # the served span is never written
    kept = grown.cache.layers[0].keys
    assert kept.shape[-2] == kv.length + 20  # the prompt's rows and every fed token, the last output not fed
    assert rounding_close(kept, cache.layers[0].keys[:, :, : kv.length + 20])


def test_a_growing_cache_past_its_room_falls_back_to_concatenation(tiny):
    kv = tiny.prefill(list(range(3, 20)))
    cache = kv.to_cache(room=1)
    extra = torch.randn_like(kv.keys[0][:, :, :2])
    keys, _ = cache.layers[0].update(extra, extra)
    assert keys.shape[-2] == kv.length + 2 and torch.equal(keys[:, :, -2:], extra)
    assert torch.equal(keys[:, :, : kv.length], kv.keys[0])
