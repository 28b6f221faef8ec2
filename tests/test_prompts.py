"""Templates, the two tokenization paths, and the FullConnected graph (real tokenizer, no model)."""

import pytest

from bcr_core.agents.graph import FINAL, full_connected
from bcr_core.reuse.prompts import Template, build_prompt, tokenization_diff

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
    with pytest.raises(ValueError, match="between 2 and 5"):
        full_connected("gsm8k", n)


def test_unknown_role_and_benchmark_are_errors():
    with pytest.raises(ValueError, match="unknown role"):
        full_connected("gsm8k", 2, pinned="Poet")
    with pytest.raises(ValueError, match="unknown benchmark"):
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
