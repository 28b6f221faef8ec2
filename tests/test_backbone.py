"""The engine's exactness on tiny random models of every supported family (grouped-query attention;
sliding windows shorter than the prompts where the family has them)."""

import pytest
import torch
from conftest import (
    DEVICE,
    FAMILIES,
    ROTATION_ULPS,
    ROUNDING_ULPS,
    SLIDING_WINDOW,
    random_ids,
    rounding_close,
    tiny_family_config,
)
from transformers import GPT2Config

from bcr_core.engine.architectures import ModelError, check_architecture
from bcr_core.engine.backbone import Backbone, repair_mask
from bcr_core.engine.batching import BatchDecoder
from bcr_core.engine.kernels import current_kernel, key_extents
from bcr_core.engine.kv import KV
from bcr_core.engine.windows import layer_windows, mask_argument

PREFIX_LEN = 9


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request) -> Backbone:
    """Overrides conftest's Llama: every test below runs once per family."""
    return Backbone.from_config(tiny_family_config(request.param), device=DEVICE, dtype=torch.float32, seed=0)


@pytest.fixture(scope="module")
def case(tiny):
    """A 40-row cache, its dense version, and a corrupted one computed behind a foreign prefix."""
    ids = random_ids(41, seed=1)
    cached, last = ids[:-1], ids[-1]
    prefix = random_ids(PREFIX_LEN, seed=2)
    dense = tiny.prefill(cached)
    corrupted = tiny.shift(tiny.prefill(prefix + cached).slice(PREFIX_LEN), -PREFIX_LEN)
    return cached, last, dense, corrupted


def close(a: KV, b: KV, ulps: float = ROUNDING_ULPS) -> bool:
    return rounding_close(a.keys, b.keys, ulps) and rounding_close(a.values, b.values, ulps)


def test_corruption_is_real_past_layer_zero(case):
    _, _, dense, corrupted = case
    assert rounding_close(corrupted.keys[0], dense.keys[0], ulps=ROTATION_ULPS)
    assert rounding_close(corrupted.values[0], dense.values[0])
    assert (corrupted.values[1:] - dense.values[1:]).abs().max() > 1e-2


def test_repairing_every_row_reproduces_the_dense_prefill(tiny, case):
    cached, last, dense, corrupted = case
    repaired = tiny.repair(corrupted, cached, range(len(cached)))
    assert close(repaired, dense)
    assert torch.equal(repaired.positions, dense.positions)
    reference = tiny.generate(dense, last, 24, stop_ids=()).tokens
    assert tiny.generate(repaired, last, 24, stop_ids=()).tokens == reference
    assert tiny.generate(corrupted, last, 24, stop_ids=()).tokens != reference


def test_repair_equals_dense_at_every_layer_and_hf_own_forward_agrees(tiny, case):
    """Full repair against our dense prefill layer by layer, and our prefill + decode against HF's own
    forward with its default cache (which keeps only the window's rows on sliding layers)."""
    cached, last, dense, corrupted = case
    repaired = tiny.repair(corrupted, cached, range(len(cached)))
    for layer in range(tiny.num_layers):
        assert rounding_close(repaired.keys[layer], dense.keys[layer]), layer
        assert rounding_close(repaired.values[layer], dense.values[layer]), layer
    tokens = tiny.generate(dense, last, 8, stop_ids=()).tokens
    with torch.inference_mode():
        hf = tiny.model(input_ids=torch.tensor([cached + [last] + tokens[:-1]])).logits[0, len(cached) :]
    assert rounding_close(tiny.forced_logits(dense, last, tokens), hf)


def test_the_static_serving_path_decodes_as_hf_own_cache_does(tiny, case):
    """Greedy decoding over the static slab (`engine.static`) against HF's own decode loop with its default
    cache, in every family (sliding layers windowed by HF by row, by the slab's mask by position): the
    same tokens, logits equal to float rounding."""
    cached, last, _, _ = case
    ours = tiny.generate(tiny.prefill(cached), last, 24, stop_ids=(), keep_logits=True)
    with torch.inference_mode():
        out = tiny.model(input_ids=torch.tensor([cached]), use_cache=True)
        cache, token, tokens = out.past_key_values, last, []
        for step in range(24):
            out = tiny.model(
                input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[len(cached) + step]]), cache=cache
            )
            cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
            assert rounding_close(ours.logits[step], out.logits[0, -1].float()), step
            tokens.append(token)
    assert ours.tokens == tokens


def test_sliding_windows_shape_the_cache(tiny, case):
    """Where a family has windows, they are shorter than the prompt and change the layers they apply to."""
    cached, _, dense, _ = case
    windows = layer_windows(tiny.config)
    if all(w is None for w in windows.values()):
        pytest.skip(f"{tiny.config.model_type} has no sliding-window layers here")
    assert SLIDING_WINDOW in windows.values() and len(cached) > SLIDING_WINDOW
    tiny.config.sliding_window = 10**6
    try:
        unwindowed = tiny.prefill(cached)
    finally:
        tiny.config.sliding_window = SLIDING_WINDOW
    assert (unwindowed.values[1:] - dense.values[1:]).abs().max() > 1e-3


def test_repairing_a_subset_leaves_every_other_row_bit_identical(tiny, case):
    cached, _, _, corrupted = case
    rows = torch.tensor([3, 4, 5, 17, 30, 39])
    repaired = tiny.repair(corrupted, cached, rows)
    others = torch.tensor([j for j in range(len(cached)) if j not in rows.tolist()])
    assert torch.equal(repaired.select(others).keys, corrupted.select(others).keys)
    assert torch.equal(repaired.select(others).values, corrupted.select(others).values)
    assert not torch.allclose(repaired.select(rows).values, corrupted.select(rows).values, atol=1e-3)


def test_repaired_rows_see_each_others_corrected_values(tiny, case):
    """One batched repair equals repairing the same rows one at a time in position order."""
    cached, _, _, corrupted = case
    rows = [2, 3, 11, 12, 13, 25]
    batched = tiny.repair(corrupted, cached, rows)
    sequential = corrupted
    for row in rows:
        sequential = tiny.repair(sequential, cached, [row])
    assert close(batched, sequential)
    # ...and differs from repairing each row against the unrepaired cache only.
    isolated = KV.cat([tiny.repair(corrupted, cached, [r]).select([r]) for r in rows])
    assert not torch.allclose(batched.select(rows).values[1:], isolated.values[1:], atol=1e-4)


def test_repairing_exactly_the_wrong_rows_restores_dense(tiny, case):
    cached, _, dense, _ = case
    rows = torch.tensor([5, 6, 20, 33])
    noise = torch.randn_like(dense.select(rows).values)
    broken = dense.replace(rows, KV(dense.select(rows).keys + noise, dense.select(rows).values - noise, rows))
    assert close(tiny.repair(broken, cached, rows), dense)


def test_row_order_and_duplicates_do_not_matter(tiny, case):
    cached, _, _, corrupted = case
    a = tiny.repair(corrupted, cached, [30, 2, 17])
    b = tiny.repair(corrupted, cached, [2, 17, 30, 17])
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_repair_honours_positions_that_are_not_row_indices(tiny):
    """A span prefilled at positions 100.. is repaired at those positions, not at 0.."""
    ids = random_ids(20, seed=5)
    dense = tiny.prefill(ids, positions=torch.arange(100, 120))
    broken = dense.replace(torch.tensor([4, 9]), dense.select([0, 1]))  # wrong content and positions
    broken = KV(broken.keys, broken.values, dense.positions)
    assert close(tiny.repair(broken, ids, [4, 9]), dense)


def test_mask_argument_is_one_mask_or_one_per_layer_type():
    positions = torch.arange(6)
    allowed = repair_mask(positions, torch.tensor([5]))[None]
    one = mask_argument(tiny_family_config("phi3"), allowed, positions[None, 5:], positions[None], torch.float32)
    assert torch.is_tensor(one) and one.shape == (1, 1, 1, 6) and bool((one == 0).all())  # window 24 > 6 rows
    mixed = mask_argument(
        tiny_family_config("gemma3_text", sliding_window=2),
        allowed,
        positions[None, 5:],
        positions[None],
        torch.float32,
    )
    assert (mixed["full_attention"] == 0).int().tolist() == [[[[1, 1, 1, 1, 1, 1]]]]
    assert (mixed["sliding_attention"] == 0).int().tolist() == [[[[0, 0, 0, 0, 1, 1]]]]


def test_repair_mask_pattern():
    positions = torch.tensor([0, 1, 2, 3])
    allowed = repair_mask(positions, torch.tensor([1, 3])).int().tolist()
    assert allowed == [[1, 1, 0, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize("query_block", [1, 2, 5])
def test_blocked_attention_gives_the_same_repair_as_one_block(tiny, case, query_block):
    """Each query block attends only to the key prefix it can see; the result must not change."""
    cached, last, _, corrupted = case
    rows = [1, 2, 3, 11, 12, 25, 26, 27, 39]
    one_block = tiny.repair(corrupted, cached, rows, query_block=len(cached))
    blocked = tiny.repair(corrupted, cached, rows, query_block=query_block)
    assert close(blocked, one_block)  # float rounding only (~4e-6): the sums are split differently
    assert (
        tiny.generate(blocked, last, 16, stop_ids=()).tokens == tiny.generate(one_block, last, 16, stop_ids=()).tokens
    )


def test_key_extents_cover_exactly_the_visible_prefix():
    positions = torch.arange(10)
    plan = key_extents(repair_mask(positions, torch.tensor([1, 2, 6, 9])), block=2)
    assert plan == [(0, 2, 3), (2, 4, 10)]
    assert key_extents(repair_mask(positions, torch.tensor([1, 2, 6, 9])), block=2, grid=4) == [(0, 2, 4), (2, 4, 10)]


def test_extents_padded_to_a_grid_give_the_same_repair_to_rounding(tiny, case, monkeypatch):
    """A GPU pads each block's keys to a grid (masked rows): the repair is the same to float rounding, and
    exact against Dense through the same padded kernel."""
    cached, last, dense, corrupted = case
    plain = tiny.repair(corrupted, cached, range(0, len(cached), 3))
    monkeypatch.setattr("bcr_core.engine.backbone.key_grid", lambda device: 16)
    padded = tiny.repair(corrupted, cached, range(0, len(cached), 3))
    assert close(padded, plain)
    full = tiny.repair(corrupted, cached, range(len(cached)))
    assert torch.equal(full.keys, tiny.reference_prefill(cached).keys)


def test_draft_leaves_the_cache_exactly_as_before(tiny, case):
    _, last, _, corrupted = case
    before = corrupted.clone()
    tiny.draft(corrupted, last, k=2)
    assert torch.equal(corrupted.keys, before.keys) and torch.equal(corrupted.values, before.values)
    assert torch.equal(corrupted.positions, before.positions)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_a_prefill_through_the_first_layers_is_the_full_prefills_first_layers_and_leaves_the_model_alone(
    tiny, case, layers
):
    """Layer i's keys and values depend only on the layers below it, so the first `layers` of a dense
    prefill are the reference; while and after it runs, the model's config and layer list are its own."""
    cached = case[0]
    base = tiny.model.base_model
    modules, total = list(base.layers), tiny.config.num_hidden_layers
    seen = []
    hook = base.layers[0].register_forward_hook(
        lambda *_: seen.append((tiny.config.num_hidden_layers, len(base.layers)))
    )
    try:
        first = tiny.prefill_layers(cached, layers=layers)
    finally:
        hook.remove()
    full = tiny.prefill(cached)
    assert first.keys.shape[0] == layers
    assert torch.equal(first.keys, full.keys[:layers]) and torch.equal(first.values, full.values[:layers])
    assert torch.equal(first.positions, full.positions)
    assert seen == [(total, total)]  # the model was whole while the probe ran
    assert tiny.config.num_hidden_layers == total and all(a is b for a, b in zip(base.layers, modules))
    assert len(base.layers) == total


def test_a_prefill_through_the_first_layers_refuses_a_count_outside_the_model(tiny, case):
    total = tiny.config.num_hidden_layers
    for bad in (0, total + 1):
        with pytest.raises(ValueError, match=rf"layers must lie in \[1, {total}\], got {bad}"):
            tiny.prefill_layers(case[0], layers=bad)


def test_draft_tokens_and_attention_match_an_independent_dense_pass(tiny, case):
    cached, last, dense, _ = case
    draft = tiny.draft(dense, last, k=2)
    assert draft.tokens == tiny.generate(dense, last, 2, stop_ids=()).tokens
    layers, heads, m = tiny.num_layers, tiny.config.num_attention_heads, len(cached)
    assert draft.attention.shape == (layers, 2, heads, m)
    full = torch.tensor([cached + [last, draft.tokens[0]]])
    with tiny.attention_implementation("eager"), torch.inference_mode():
        out = tiny.model(input_ids=full, output_attentions=True)
    expected = torch.stack([a[0, :, m : m + 2, :m] for a in out.attentions]).transpose(1, 2)
    assert rounding_close(draft.attention, expected)
    assert current_kernel() == "sdpa"  # switched back


def test_a_kernel_switch_holds_in_its_own_thread_only(tiny, case):
    """A thread decoding under eager (which returns attention weights) leaves another thread's forward
    on SDPA (which returns none): the switch is per thread, never a change of the shared model."""
    import threading

    ids = torch.tensor([case[0][:12]])
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def eager_worker():
        with tiny.attention_implementation("eager"), torch.inference_mode():
            seen["worker"] = tiny.model(input_ids=ids, output_attentions=True).attentions[0]
            inside.set()
            done.wait(timeout=60)

    worker = threading.Thread(target=eager_worker)
    worker.start()
    try:
        assert inside.wait(timeout=60)
        with torch.inference_mode():
            seen["main"] = tiny.model(input_ids=ids, output_attentions=True).attentions or ()
    finally:
        done.set()
        worker.join()
    assert seen["worker"] is not None and seen["worker"].shape[-1] == 12
    assert all(a is None for a in seen["main"])  # SDPA returns no weights


def test_rerotation_round_trip(tiny, case):
    _, _, dense, _ = case
    there_and_back = tiny.rerotate(tiny.rerotate(dense.keys, 4096), -4096)
    assert rounding_close(there_and_back, dense.keys, ulps=ROTATION_ULPS)
    assert not torch.allclose(tiny.rerotate(dense.keys, 7), dense.keys, atol=1e-2)


def test_shifting_a_cache_equals_prefilling_it_at_the_new_positions(tiny):
    """RoPE attention depends on relative position only, so every layer agrees after the shift."""
    ids = random_ids(30, seed=3)
    moved = tiny.shift(tiny.prefill(ids), 250)
    there = tiny.prefill(ids, positions=torch.arange(250, 280))
    assert torch.equal(moved.positions, there.positions)
    assert close(moved, there, ulps=ROTATION_ULPS)


def test_per_row_shift(tiny):
    ids = random_ids(6, seed=4)
    kv = tiny.prefill(ids)
    deltas = torch.tensor([0, 1, 2, 3, 4, 5])
    per_row = tiny.rerotate(kv.keys, deltas)
    assert rounding_close(per_row[:, :, :, 3], tiny.rerotate(kv.keys, 3)[:, :, :, 3])


def test_generate_stops_at_eos_and_can_be_told_not_to(tiny, case):
    _, last, dense, _ = case
    free = tiny.generate(dense, last, 12, stop_ids=())
    assert len(free.tokens) == 12 and not free.stopped
    stop_on = free.tokens[3]
    stopped = tiny.generate(dense, last, 12, stop_ids=(stop_on,))
    assert stopped.stopped and stopped.tokens == free.tokens[: free.tokens.index(stop_on)]


def test_teacher_forcing_returns_the_logits_of_a_given_continuation(tiny, case):
    _, last, dense, corrupted = case
    reference = tiny.generate(dense, last, 5, stop_ids=(), keep_logits=True)
    forced = tiny.generate(corrupted, last, 0, forced=reference.tokens, keep_logits=True)
    assert forced.tokens == reference.tokens and len(forced.logits) == 5
    assert not torch.allclose(forced.logits[0], reference.logits[0], atol=1e-3)


@pytest.mark.parametrize(
    "rows, message",
    [([], "at least one row"), ([0, 40], r"\[0, 40\)"), ([-1], r"\[0, 40\)")],
)
def test_bad_rows_are_clear_errors(tiny, case, rows, message):
    cached, _, _, corrupted = case
    with pytest.raises(ValueError, match=message):
        tiny.repair(corrupted, cached, rows)


def test_ids_must_match_rows(tiny, case):
    cached, _, _, corrupted = case
    with pytest.raises(ValueError, match="one token id per cache row"):
        tiny.repair(corrupted, cached[:-1], [1])


def test_non_rope_architecture_is_refused():
    with pytest.raises(ModelError, match="gpt2.*not supported.*gemma3_text.*llama.*phi3.*qwen3"):
        Backbone.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2), device="cpu")


def test_unsupported_options_of_supported_families_are_refused():
    from transformers import Gemma3Config

    with pytest.raises(ModelError, match="multimodal.*gemma3_text"):
        check_architecture(Gemma3Config())
    with pytest.raises(ModelError, match="softcapping"):
        check_architecture(tiny_family_config("gemma3_text", attn_logit_softcapping=50.0))


@pytest.mark.parametrize("name", ["/no/such/model", "./missing-dir", "not-a-hub-id"])
def test_unknown_model_is_a_clear_error(name):
    with pytest.raises(ModelError, match="unknown model"):
        Backbone.load(name)


def generate_batch(bb, requests, stop_ids) -> list:
    """Every (cache, last id, max new tokens) decoded at once by one `BatchDecoder`, in request order."""
    decoder, results = BatchDecoder(bb, stop_ids), {}
    for i, (kv, last_id, max_new_tokens) in enumerate(requests):
        decoder.add(i, kv, last_id, max_new_tokens)
    while decoder:
        results.update(decoder.step())
    return [results[i] for i in range(len(requests))]


def test_batched_generation_equals_one_at_a_time(tiny):
    """Caches of different lengths, positions not starting at 0, one row stopping early."""
    requests = []
    for i, n in enumerate([5, 17, 40, 33]):
        ids = random_ids(n + 1, seed=10 + i)
        requests.append((tiny.prefill(ids[:-1], positions=torch.arange(7 * i, 7 * i + n)), ids[-1], 6 + 3 * i))
    free = tiny.generate(*requests[2], stop_ids=()).tokens
    at = next(i for i in range(2, len(free)) if free[i] not in free[:i])  # row 2 stops there, after >= 2 tokens
    stop = free[at]
    single = [tiny.generate(*r, stop_ids=(stop,), keep_cache=True) for r in requests]
    batch = generate_batch(tiny, requests, stop_ids=(stop,))
    assert single[2].stopped and len(single[2].tokens) == at
    for (kv, _, _), s, b in zip(requests, single, batch):
        assert b.tokens == s.tokens and b.stopped == s.stopped
        assert b.cache.get_seq_length() == s.cache.get_seq_length()
        rows = torch.arange(kv.length + 1)
        assert close(KV.from_cache(b.cache, rows), KV.from_cache(s.cache, rows))


def test_config_only_names_resolve_to_published_shapes_or_fail_clearly(tmp_path):
    from bcr_core.engine.architectures import config_only

    llama = config_only("config:llama-3.1-8b")
    assert (llama.num_hidden_layers, llama.num_key_value_heads, llama.head_dim, llama.vocab_size) == (
        32,
        8,
        128,
        128256,
    )
    assert llama.rope_parameters["rope_type"] == "llama3"
    qwen3 = config_only("config:qwen3-8b")
    assert (qwen3.model_type, qwen3.num_hidden_layers, qwen3.num_key_value_heads, qwen3.head_dim) == (
        "qwen3",
        36,
        8,
        128,
    )
    phi3 = config_only("config:phi-3-mini")
    assert (phi3.model_type, phi3.hidden_size, phi3.num_hidden_layers, phi3.sliding_window) == ("phi3", 3072, 32, 2047)
    gemma = config_only("config:gemma-3-4b")
    assert (gemma.model_type, gemma.num_hidden_layers, gemma.head_dim, gemma.sliding_window) == (
        "gemma3_text",
        34,
        256,
        1024,
    )
    assert gemma.layer_types.count("full_attention") == 5 and gemma.layer_types[5] == "full_attention"
    assert gemma.rope_parameters["full_attention"]["rope_type"] == "linear"
    for config in (qwen3, phi3, gemma):
        check_architecture(config)
    with pytest.raises(ModelError, match="named shape"):
        config_only("config:llama-9000")
    with pytest.raises(ModelError, match="named shape"):
        config_only(f"config:{tmp_path}")  # a directory without config.json


def test_a_config_directory_with_a_tokenizer_speaks_its_own(tmp_path, chat_tokenizer):
    """`config:DIR` takes DIR's tokenizer when one is saved beside the config (a model downloaded
    without weights), and the embedded one otherwise."""
    from conftest import tiny_llama_config

    tiny_llama_config(vocab_size=len(chat_tokenizer) + 1).save_pretrained(tmp_path / "own")
    tiny_llama_config(vocab_size=len(chat_tokenizer)).save_pretrained(tmp_path / "bare")
    own = chat_tokenizer.__class__.from_pretrained(chat_tokenizer.name_or_path)
    own.add_tokens(["<|only-here|>"])
    own.save_pretrained(tmp_path / "own")
    for spec in (tmp_path / "own", tmp_path / "own" / "config.json"):
        assert "<|only-here|>" in Backbone.load(f"config:{spec}", device="cpu").tokenizer.get_vocab()
    bare = Backbone.load(f"config:{tmp_path / 'bare'}", device="cpu").tokenizer
    assert "<|only-here|>" not in bare.get_vocab() and len(bare) == len(chat_tokenizer)


def test_sequences_joining_a_running_batch_decode_as_if_alone(tiny):
    from bcr_core.engine.batching import BatchDecoder

    prompts = [random_ids(n + 1, seed=30 + n) for n in (12, 30, 7)]
    caches = [(tiny.prefill(ids[:-1]), ids[-1]) for ids in prompts]
    alone = [tiny.generate(kv, last, 9, stop_ids=()).tokens for kv, last in caches]
    decoder, done = BatchDecoder(tiny, stop_ids=()), {}
    decoder.add(0, *caches[0], 9)
    for join in (1, 2):  # a longer cache joins after two steps, a shorter one after four
        for _ in range(2):
            done.update(decoder.step())
        decoder.add(join, *caches[join], 9)
    while decoder:
        done.update(decoder.step())
    assert [done[i].tokens for i in range(3)] == alone
