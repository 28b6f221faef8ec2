"""The serving path's static cache (`engine.static`): bucketed capacities, fixed-shape steps, slabs reused
call after call, and a capture that fails falling back to the plain step."""

import pytest
import torch
from conftest import random_ids, rounding_close

from bcr_core.engine import static
from bcr_core.engine.static import capacity


@pytest.mark.parametrize(
    "rows, expected",
    # the buckets written out: 256 up to 256 rows, then four per octave, each a multiple of 64
    [
        (1, 256),
        (256, 256),
        (257, 320),
        (320, 320),
        (321, 384),
        (511, 512),
        (512, 512),
        (513, 640),
        (1025, 1280),
        (4095, 4096),
        (4097, 5120),
        (8200, 10240),
    ],
)
def test_capacity_is_the_smallest_bucket_that_holds_the_rows(rows, expected):
    assert capacity(rows) == expected


def test_the_idle_share_of_a_slab_stays_under_a_quarter():
    for rows in range(257, 20000, 37):
        assert rows <= capacity(rows) < 1.25 * rows + 64


def recorded_steps(monkeypatch):
    """Every step's (capacity, tokens fed) and its slab's buffer address."""
    seen, plain = [], static.step

    def recording(bb, slab, tokens, positions, write_rows, attentions, kernel):
        seen.append((slab.capacity, tokens.shape[1], slab.keys.data_ptr()))
        return plain(bb, slab, tokens, positions, write_rows, attentions, kernel)

    monkeypatch.setattr(static, "step", recording)
    return seen


def test_steps_have_one_shape_per_bucket_whatever_the_cache_length(tiny, monkeypatch):
    seen = recorded_steps(monkeypatch)
    for n in (20, 90, 200):
        tiny.generate(tiny.prefill(random_ids(n, seed=n)), 5, 4, stop_ids=())
        tiny.draft(tiny.prefill(random_ids(n, seed=n)), 5)
    assert {(c, q) for c, q, _ in seen} == {(256, 1)}  # one shape: three lengths, decode and draft alike
    assert len({ptr for _, _, ptr in seen}) == 1  # one slab, reused by every call


def test_a_longer_call_moves_to_a_larger_bucket(tiny, monkeypatch):
    seen = recorded_steps(monkeypatch)
    tiny.generate(tiny.prefill(random_ids(300, seed=3)), 5, 2, stop_ids=())
    assert {c for c, _, _ in seen} == {320}


def test_a_slab_reused_by_a_shorter_call_leaves_no_trace_of_the_longer_one(tiny):
    """Rows a longer call left in the slab are masked: the shorter call decodes as it does in a fresh slab."""
    short = tiny.prefill(random_ids(30, seed=4))
    fresh = tiny.generate(short, 9, 12, stop_ids=(), keep_logits=True)
    tiny.generate(tiny.prefill(random_ids(200, seed=5)), 9, 12, stop_ids=())
    again = tiny.generate(short, 9, 12, stop_ids=(), keep_logits=True)
    assert again.tokens == fresh.tokens
    assert all(torch.equal(a, b) for a, b in zip(again.logits, fresh.logits))


def test_a_failed_capture_falls_back_to_the_plain_step_with_a_warning(tiny):
    """Asked for graphs where none can be captured (no CUDA here), the steps warn once and run plainly,
    with the tokens of the plain path."""
    kv, last = tiny.prefill(random_ids(40, seed=6)), 11
    plain = tiny.generate(kv, last, 8, stop_ids=()).tokens
    tiny.steps.mode = "graphs"
    try:
        with pytest.warns(UserWarning, match="CUDA graph capture failed"):
            captured = tiny.generate(kv, last, 8, stop_ids=()).tokens
        assert tiny.steps.replayed_shapes == 0
    finally:
        tiny.steps.mode = "plain"
        tiny.steps.captured.clear()
    assert captured == plain


def test_the_draft_attention_matches_hf_eager_weights(tiny):
    """The draft's weights over the cached rows (the static step through the grouped eager kernel) equal
    HF's own eager attention on a concatenating cache: rows the slab holds past the cache get no weight."""
    kv, last = tiny.prefill(random_ids(50, seed=7)), 13
    draft = tiny.draft(kv, last, k=2)
    cache = kv.to_cache()
    with tiny.attention_implementation("eager"):
        out = tiny.model(
            input_ids=torch.tensor([[last, draft.tokens[0]]]),
            position_ids=torch.tensor([[kv.next_position, kv.next_position + 1]]),
            cache=cache,
            use_cache=True,
            output_attentions=True,
        )
    expected = torch.stack([a[0, :, :, : kv.length].transpose(0, 1) for a in out.attentions])  # (L, k, H, T)
    assert rounding_close(draft.attention, expected)
    assert draft.tokens[0] == int(out.logits[0, 0].argmax())


def test_reading_the_compiled_step_changes_no_dynamo_setting():
    """Dynamo's recompile limit is raised once, when `compiled` is chosen (never lowered), not each time
    the compiled step is read."""
    cpu = type("Bb", (), {"device": torch.device("cpu")})()
    with torch._dynamo.config.patch(recompile_limit=8):
        steps = static.Steps(cpu, mode="compiled")
        limit = torch._dynamo.config.recompile_limit
        assert steps.compiled is steps.compiled
        assert torch._dynamo.config.recompile_limit == limit == static.RECOMPILE_LIMIT
    with torch._dynamo.config.patch(recompile_limit=1000):
        static.Steps(cpu, mode="compiled")
        assert torch._dynamo.config.recompile_limit == 1000
