"""Templates, the two tokenization paths, and the FullConnected graph (real tokenizer, no model)."""

import copy

import pytest

from bcr_core.agents.graph import FINAL, full_connected
from bcr_core.data import roles, synthetic
from bcr_core.errors import UsageError
from bcr_core.reuse.prompts import Template, base_prefix, begin_of_text, build_prompt, tokenization_diff
from bcr_core.setting_kinds import SettingError

VALUES = {
    "user_question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "agent_1_current": "3 + 4 = 7. The answer is 7.",
    "agent_2_current": "The answer is 7.",
}


def test_clean_segments_tokenize_identically_on_both_paths(chat_tokenizer):
    template = full_connected("gsm8k", 2)[1]
    prompt = build_prompt(chat_tokenizer, template, VALUES)
    assert prompt.tokenization_matches
    assert tokenization_diff(chat_tokenizer, prompt.dense_ids, prompt.merged_ids) == []
    assert chat_tokenizer.decode(prompt.merged_ids) == prompt.text


def test_a_newline_at_a_boundary_is_reported(chat_tokenizer):
    """A value ending in a newline, followed by template text starting with one: the Dense path
    merges the two newlines into one token, the reuse path cannot."""
    template = full_connected("gsm8k", 2)[1]
    prompt = build_prompt(chat_tokenizer, template, VALUES | {"agent_1_current": "The answer is 7.\n"})
    assert not prompt.tokenization_matches
    assert len(prompt.merged_ids) == len(prompt.dense_ids) + 1
    (diff,) = tokenization_diff(chat_tokenizer, prompt.dense_ids, prompt.merged_ids)
    assert diff["op"] == "replace"
    assert diff["dense_tokens"] == ["ĊĊ"] and diff["merged_tokens"] == ["Ċ", "Ċ"]
    value = next(s for s in prompt.segment_map() if s["name"] == "agent_1_current")
    assert value["stop"] == diff["merged_rows"][0] + 1  # the value's own newline starts the diff


def test_segment_maps_tile_the_rows(chat_tokenizer):
    prompt = build_prompt(chat_tokenizer, full_connected("gsm8k", 2)[1], VALUES)
    for dense in (False, True):
        spans = prompt.segment_map(dense=dense)
        assert spans[0]["start"] == 0 and spans[-1]["stop"] == len(prompt.dense_ids)
        assert all(a["stop"] == b["start"] for a, b in zip(spans, spans[1:]))
    names = [s["name"] for s in prompt.segment_map()]
    assert names == ["prefix", "user_question", "after:user_question", "agent_1_current", "after:agent_1_current"]
    question = prompt.segment_map()[1]
    rows = prompt.merged_ids[question["start"] : question["stop"]]
    assert chat_tokenizer.decode(rows) == VALUES["user_question"]


def test_full_connected_wiring():
    templates = full_connected("gsm8k", 3)
    assert [t.node for t in templates] == ["agent_1", "agent_2", "agent_3", FINAL]
    assert [t.role for t in templates[:3]] == ["Math Solver", "Mathematical Analyst", "Programming Expert"]
    assert templates[2].placeholders == ["user_question", "agent_1_current", "agent_2_current"]
    assert templates[3].placeholders == ["user_question", "agent_1_current", "agent_2_current", "agent_3_current"]
    assert {t.role for t in full_connected("gsm8k", 5, pinned="Inspector")[:5]} == {"Inspector"}
    assert [t.role for t in full_connected("gsm8k", 5)[:5]][4] == "Math Solver"  # roles cycle


@pytest.mark.parametrize("n", [1, 6])
def test_agent_count_outside_range_is_an_error(n):
    with pytest.raises(UsageError, match="between 2 and 5"):
        full_connected("gsm8k", n)


def test_unknown_role_and_benchmark_are_errors():
    with pytest.raises(UsageError, match="unknown role"):
        full_connected("gsm8k", 2, pinned="Poet")
    with pytest.raises(UsageError, match="unknown benchmark"):
        full_connected("chess", 2)


def test_unknown_placeholder_is_an_error():
    with pytest.raises(ValueError, match=r"unknown placeholder.*user_questoin"):
        Template("agent_1", "x", "sys", "Task: {user_questoin}")


def test_empty_or_missing_value_is_an_error(chat_tokenizer):
    template = full_connected("gsm8k", 2)[1]
    with pytest.raises(ValueError, match="agent_1_current.*empty"):
        build_prompt(chat_tokenizer, template, VALUES | {"agent_1_current": "  \n"})
    with pytest.raises(ValueError, match="no value for placeholder"):
        build_prompt(chat_tokenizer, template, {"user_question": "q"})


# A Llama 3-shaped chat template: one begin-of-text token, then header-delimited turns.
LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_base_caches_sit_behind_begin_of_text_where_prompts_open_with_it(chat_tokenizer, gemma_tokenizer):
    """The released code's anchors: begin-of-text + user header + segment. ChatML's `<|im_start|>` (SmolLM2's
    "BOS") opens every turn, so the header (which already ends in it) stands alone; a Llama 3-shaped template
    and Gemma's plain-text one open once with their BOS, which goes first."""
    assert chat_tokenizer.bos_token == "<|im_start|>"
    assert begin_of_text(chat_tokenizer) == ""
    assert base_prefix(chat_tokenizer) == "<|im_end|>\n<|im_start|>user\n"

    assert gemma_tokenizer.bos_token == "<bos>"
    assert base_prefix(gemma_tokenizer) == "<bos>\n\n"
    ids = gemma_tokenizer(base_prefix(gemma_tokenizer), add_special_tokens=False)["input_ids"]
    assert ids[0] == gemma_tokenizer.bos_token_id and len(ids) == 2

    llama3 = copy.deepcopy(chat_tokenizer)
    llama3.chat_template = LLAMA3_STYLE
    llama3.bos_token = "<|endoftext|>"  # a special token of this vocabulary standing in for <|begin_of_text|>
    assert base_prefix(llama3) == "<|endoftext|><|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"


def test_the_one_shot_prompt_puts_the_worked_example_before_the_user_turn(gemma_tokenizer):
    """Rendered with the plain-text template: system text, the example's task and its answer after the cue,
    then the real turn; the example lies in the exact prefix, and the standard prompt has none of it."""
    agent_1 = full_connected("synthetic", 2, prompt="one-shot")[0]
    prompt = build_prompt(gemma_tokenizer, agent_1, {"user_question": "Ann lives in Oslo.\n\nWhere does Ann live?"})
    prefix = prompt.segments[0].text
    task, answer = roles.SYNTHETIC.example
    assert prefix.startswith("<bos>" + agent_1.system + "\n\n")
    assert prefix.endswith(f"Task:\n{task}\n\nAnswer with the value only.\n\nAnswer: {answer}\n\nTask:\n")
    standard = build_prompt(gemma_tokenizer, full_connected("synthetic", 2)[0], {"user_question": "Ann."})
    assert "Lena" not in standard.text and standard.segments[0].text == "<bos>" + agent_1.system + "\n\nTask:\n"
    values = {v.lower() for *_, pool in synthetic.FIELDS for v in pool}
    assert not {"hammer", "violin", "nimbus"} & values and "Lena" not in synthetic.NAMES


def test_an_unknown_prompt_or_one_without_an_example_is_refused():
    with pytest.raises(SettingError, match="unknown prompt 'few-shot'"):
        full_connected("synthetic", 2, prompt="few-shot")
    with pytest.raises(SettingError, match="gsm8k has no worked example"):
        full_connected("gsm8k", 2, prompt="one-shot")
