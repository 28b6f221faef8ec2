"""Shared fixtures: a tiny random-initialised Llama (GQA on) and, for a few tests, the real model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from bcr_core.backbone import Backbone

torch.set_num_threads(2)


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


@pytest.fixture(scope="session")
def tiny() -> Backbone:
    return Backbone.from_config(tiny_llama_config(), device="cpu", dtype=torch.float32, seed=0)


@pytest.fixture(scope="session")
def real() -> Backbone:
    return Backbone.load("default", device="cpu")


def random_ids(n: int, seed: int, vocab: int = 128) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (n,), generator=generator).tolist()


@pytest.fixture(scope="session")
def chat_tokenizer():
    """The embedded model's tokenizer (ChatML template), fetched with the model asset."""
    from transformers import AutoTokenizer

    from bcr_core.models import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


@pytest.fixture(scope="session")
def tiny_chat(chat_tokenizer) -> Backbone:
    """A tiny random Llama speaking the real tokenizer's vocabulary: fast multi-agent pipelines."""
    config = tiny_llama_config(
        vocab_size=len(chat_tokenizer),
        eos_token_id=chat_tokenizer.eos_token_id,
        bos_token_id=chat_tokenizer.bos_token_id,
        pad_token_id=chat_tokenizer.eos_token_id,
        initializer_range=0.05,
    )
    bb = Backbone.from_config(config, device="cpu", dtype=torch.float32, seed=0)
    bb.tokenizer = chat_tokenizer
    return bb
