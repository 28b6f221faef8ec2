"""Which models the engine drives: the RoPE decoders whose Hugging Face modules it runs unchanged,
the checks a config passes before any weights load, and config-only models (`config:NAME` or
`config:PATH`: random weights with a real model's published shapes, for timing at the paper's
shapes without downloading them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bcr_core.errors import UsageError


class ModelError(UsageError):
    """The model could not be resolved or is not one the lab supports."""


# RoPE decoders whose Hugging Face modules the engine drives unchanged (see `check_architecture`).
SUPPORTED_ARCHITECTURES = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text"}


CONFIG_PREFIX = "config:"


# Published shapes (the models' config.json files), for config-only timing runs.
CONFIG_SHAPES = {
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "phi-3-mini": dict(  # Phi-3-mini-4k-instruct: fused qkv and gate-up, every layer a 2047-row sliding window
        model_type="phi3",
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32064,
        max_position_embeddings=4096,
        original_max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        sliding_window=2047,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=32000,
        pad_token_id=32000,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    "gemma-3-4b": dict(  # gemma-3-4b's text model: five 1024-row sliding layers (local RoPE) per global one
        model_type="gemma3_text",
        hidden_size=2560,
        intermediate_size=10240,
        num_hidden_layers=34,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        query_pre_attn_scalar=256,
        vocab_size=262208,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        sliding_window=1024,
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=[1, 106],
        pad_token_id=0,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
}


def check_shapes(settings: dict, where: str) -> None:
    """Refuse, before any weights load, attention shapes no model can have (naming the fields)."""
    hidden, heads = settings.get("hidden_size"), settings.get("num_attention_heads")
    kv = settings.get("num_key_value_heads") or heads
    if not all(isinstance(v, int) and v > 0 for v in (hidden, heads, kv)):
        return  # not a decoder config this check reads; transformers and check_architecture decide
    if settings.get("head_dim") is None and hidden % heads:
        raise ModelError(
            f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} and no head_dim "
            "is given; set head_dim, or make hidden_size a multiple of the heads"
        )
    if heads % kv:
        raise ModelError(
            f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}; each "
            "key/value head must serve a whole group of query heads"
        )


MIN_LAYERS = 2
WHY_TWO_LAYERS = (
    "BCR needs at least 2 decoder layers: its draft score sums attention over layers 1 and up "
    "(Algorithm 2) and CacheBlend's deviation is read at layer 1"
)


def check_layers(layers, where: str) -> None:
    """Refuse a model too shallow for the draft's score (a layer count that is not an int is left to transformers)."""
    if isinstance(layers, int) and not isinstance(layers, bool) and layers < MIN_LAYERS:
        raise ModelError(f"{where}: num_hidden_layers is {layers}; {WHY_TWO_LAYERS}")


def check_config_file(settings: dict, where: str) -> None:
    """Refuse, from a config.json as written and before any weights load, what no later step could use:
    a missing or null model_type, too few layers, impossible attention shapes. {} (unreadable, or a hub
    id not fetched yet) is left to transformers."""
    if not settings:
        return
    if settings.get("model_type") is None:
        state = "is null" if "model_type" in settings else "is missing"
        raise ModelError(
            f"{where}: model_type {state}; set it to one of the supported decoders "
            f"({', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )
    check_layers(settings.get("num_hidden_layers"), where)
    check_shapes(settings, where)


def first_line(err: BaseException) -> str:
    """An exception's first non-empty line (transformers' messages run over several)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def raw_config(path: Path) -> dict:
    """A config.json as written (before transformers fills or validates anything); {} if unreadable."""
    try:
        settings = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return settings if isinstance(settings, dict) else {}


def config_only(name: str):
    """The Hugging Face config of `config:NAME` or `config:PATH` (a config.json or a model directory)."""
    from transformers import AutoConfig

    spec = name[len(CONFIG_PREFIX) :].strip()
    if spec.lower() in CONFIG_SHAPES:
        shape = dict(CONFIG_SHAPES[spec.lower()])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelError(
            f"config-only model {name!r}: {spec!r} is neither a config.json, a model directory, "
            f"nor a named shape ({', '.join(sorted(CONFIG_SHAPES))})"
        )
    check_config_file(raw_config(path), str(path))
    try:
        return AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise ModelError(f"config-only model {name!r}: cannot read {path}: {first_line(err)}") from err


def config_tokenizer_dir(name: str) -> Path | None:
    """The directory of a `config:PATH` model when it holds a tokenizer beside its config, else None."""
    path = Path(os.path.expanduser(name[len(CONFIG_PREFIX) :].strip()))
    folder = path if path.is_dir() else path.parent
    if path.exists() and any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return folder
    return None


def check_architecture(config) -> None:
    """Refuse models the reuse arithmetic does not cover: the RoPE decoders in `SUPPORTED_ARCHITECTURES`,
    without the options the engine's attention kernels do not implement."""
    kind = getattr(config, "model_type", None)
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    if kind == "gemma3":
        raise ModelError(
            "model type 'gemma3' (the multimodal Gemma 3) is not supported: use its text model, "
            f"model type 'gemma3_text' (the config's text_config). Supported: {supported}"
        )
    if kind not in SUPPORTED_ARCHITECTURES:
        raise ModelError(f"model type {kind!r} is not supported: BCR lab needs one of the RoPE decoders {supported}")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ModelError(
            f"{kind} with attn_logit_softcapping is not supported: the repair and draft attention "
            "kernels do not cap logits; set it to null"
        )
    check_shapes(
        {k: getattr(config, k, None) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")}
        | {"head_dim": getattr(config, "head_dim", None) or 0},  # a built config has its head_dim
        f"the {kind} config",
    )
    check_layers(getattr(config, "num_hidden_layers", None), f"the {kind} config")
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelError(f"{kind} with use_bidirectional_attention is an encoder, not a causal decoder: not supported")
