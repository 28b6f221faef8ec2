"""Every serving step is one graph: the decode step, the draft step that returns attention weights and
the repair's masked block each trace whole under `torch.compile(fullgraph=True)` in all six families, so
nothing between their kernels runs Python or reads a tensor's value on the host (a graph break or an
`.item()` would fail the trace), and the compiled step gives the plain step's tokens, logits and weights."""

import pytest
import torch
from conftest import FAMILIES, random_ids, tiny_family_config
from conftest import rounding_close as close  # a traced graph decomposes SDPA: 12 ulps measured

from bcr_core.engine import static
from bcr_core.engine.backbone import Backbone, recompute_block, repair_mask
from bcr_core.engine.kernels import BLOCKED, GROUPED_EAGER, key_extents


@pytest.fixture(scope="module", params=FAMILIES)
def family_bb(request) -> Backbone:
    return Backbone.from_config(tiny_family_config(request.param), device="cpu", dtype=torch.float32, seed=3)


def step_inputs(bb: Backbone, n: int = 76):
    kv = bb.prefill(random_ids(n, seed=n))
    fed = torch.tensor([[7]])
    positions = torch.tensor([[kv.next_position]])
    write_rows = torch.tensor([kv.length])
    return kv, fed, positions, write_rows


@pytest.mark.parametrize("attentions, kernel", [(False, "sdpa"), (True, GROUPED_EAGER)], ids=["decode", "draft"])
def test_a_decode_and_a_draft_step_compile_as_one_graph_and_match_the_plain_step(family_bb, attentions, kernel):
    torch._dynamo.reset()
    kv, fed, positions, write_rows = step_inputs(family_bb)
    with torch.inference_mode():
        plain_slab, traced_slab = static.Slab.empty(kv, 256), static.Slab.empty(kv, 256)
        plain_slab.load(kv)
        traced_slab.load(kv)
        compiled = torch.compile(static.step, fullgraph=True, backend="aot_eager")
        want = static.step(family_bb, plain_slab, fed, positions, write_rows, attentions, kernel)
        got = compiled(family_bb, traced_slab, fed, positions, write_rows, attentions, kernel)
    assert int(got[0].argmax()) == int(want[0].argmax())
    assert close(got[0], want[0])
    if attentions:
        assert got[1].shape == (family_bb.num_layers, 1, family_bb.config.num_attention_heads, 256)
        assert close(got[1], want[1])
    assert close(traced_slab.keys, plain_slab.keys) and close(traced_slab.values, plain_slab.values)
    assert torch.equal(traced_slab.row_positions, plain_slab.row_positions)


def test_the_repair_block_compiles_as_one_graph_and_matches_the_plain_repair(family_bb):
    torch._dynamo.reset()
    kv, *_ = step_inputs(family_bb, 60)
    corrupted = family_bb.shift(family_bb.prefill(random_ids(60, seed=1)), 0)  # another text's rows: stale everywhere
    ids = torch.tensor(random_ids(60, seed=60))
    rows = torch.tensor([0, 5, 17, 30, 31, 59])
    positions = corrupted.positions
    allowed = repair_mask(positions, rows)
    plan = key_extents(allowed, 4)  # several blocks, so the blocked kernel's loop is traced too
    assert len(plan) > 1
    with torch.inference_mode():
        want, got = corrupted.clone(), corrupted.clone()
        recompute_block(family_bb, want.keys, want.values, ids, positions, rows, allowed, plan)
        compiled = torch.compile(recompute_block, fullgraph=True, backend="aot_eager")
        compiled(family_bb, got.keys, got.values, ids, positions, rows, allowed, plan)
    assert close(got.keys, want.keys) and close(got.values, want.values)
    untouched = torch.ones(60, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(got.keys[:, :, :, untouched], corrupted.keys[:, :, :, untouched])
    assert not torch.equal(want.keys[:, :, :, rows], corrupted.keys[:, :, :, rows])  # the block did recompute


def test_the_kernel_is_part_of_the_step_not_read_from_the_thread(tiny):
    """A step names its kernel: inside `kernel(...)` blocks that chose other kernels it still runs the one
    it was given, so the compiled graph (specialised on the name) cannot be run with another kernel."""
    from bcr_core.engine.kernels import kernel

    kv, fed, positions, write_rows = step_inputs(tiny)
    with torch.inference_mode():
        results = []
        for chosen in ("sdpa", BLOCKED, GROUPED_EAGER):
            slab = static.Slab.empty(kv, 256)
            slab.load(kv)
            with kernel(chosen):
                results.append(static.step(tiny, slab, fed, positions, write_rows, True, GROUPED_EAGER))
    for logits, weights in results[1:]:
        assert torch.equal(logits, results[0][0]) and torch.equal(weights, results[0][1])


def test_compiled_steps_serve_the_plain_steps_tokens(tiny):
    """`Steps` in compiled mode (inductor on the CPU) decodes and drafts the plain mode's tokens."""
    kv, last = tiny.prefill(random_ids(40, seed=6)), 11
    plain = tiny.generate(kv, last, 6, stop_ids=(), keep_logits=True)
    plain_draft = tiny.draft(kv, last)
    tiny.steps.mode = "compiled"
    try:
        compiled = tiny.generate(kv, last, 6, stop_ids=(), keep_logits=True)
        compiled_draft = tiny.draft(kv, last)
    finally:
        tiny.steps.mode = "plain"
    assert compiled.tokens == plain.tokens and compiled_draft.tokens == plain_draft.tokens
    assert all(close(a, b) for a, b in zip(compiled.logits, plain.logits))
    assert close(compiled_draft.attention, plain_draft.attention)


def test_an_unknown_step_mode_is_refused_by_name(tiny):
    with pytest.raises(ValueError, match="unknown step mode 'fast'"):
        tiny.steps.mode = "fast"
