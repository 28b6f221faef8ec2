"""A code question's prose, found as the arena reads it: every bare string statement of HumanEval's prompts (a
function's docstring, HumanEval/115's string after `import math`), a string assigned to a name left as code, and
the rows of a reused question segment those characters were tokenized into."""

from __future__ import annotations

import pytest

from bcr_core.data import benchmarks, datasets
from bcr_core.data.code_text import prose_spans
from bcr_core.reuse.prompts import tokenize
from bcr_core.reuse.segments import text_rows

TASKS = {item["id"]: item["prompt"] for item in datasets.load_humaneval()}


def triple_quoted(prompt: str, first: int, count: int) -> list[tuple[int, int]]:
    """The spans from the `first`-th triple quote on, paired quote to quote, `count` of them: the rule written out."""
    at = [i for i in range(len(prompt)) if prompt.startswith('"""', i)]
    return [(at[first + 2 * k], at[first + 2 * k + 1] + 3) for k in range(count)]


@pytest.mark.parametrize(
    "task, first, count",
    [
        ("HumanEval/0", 0, 1),  # one function, one docstring
        ("HumanEval/10", 0, 2),  # a helper's docstring and the entry point's
        ("HumanEval/64", 2, 1),  # FIX = """...""" is an assignment: code, not prose
        ("HumanEval/115", 0, 1),  # a string standing after `import math` in the body
    ],
)
def test_the_prose_of_a_humaneval_prompt_is_its_bare_strings(task, first, count):
    prompt = TASKS[task]
    assert prose_spans(prompt) == triple_quoted(prompt, first, count)
    assert benchmarks.prose_spans("humaneval", prompt) == prose_spans(prompt)


def test_every_humaneval_task_has_prose_and_other_benchmarks_are_all_prose():
    assert all(prose_spans(prompt) for prompt in TASKS.values())
    assert prose_spans("def f(:\n") == []  # source that does not parse has none
    assert benchmarks.prose_spans("synthetic", 'x = 1\n"""a string"""\n') == []


def test_the_prose_spans_count_characters_past_non_ascii_text():
    source = 'x = "é…"\ndef f():\n    """naïve"""\n'
    [(start, stop)] = prose_spans(source)
    assert source[start:stop] == '"""naïve"""'


def test_a_question_segment_s_prose_rows_decode_to_its_docstring(chat_tokenizer):
    prompt = TASKS["HumanEval/0"]
    head, tail = tokenize(chat_tokenizer, "Solve this task:\n"), tokenize(chat_tokenizer, "\nAnswer in code.")
    question = tokenize(chat_tokenizer, prompt)
    ids = head + question + tail
    span = {"name": "user_question", "start": len(head), "stop": len(head) + len(question), "placeholder": True}
    [(start, stop)] = prose_spans(prompt)
    found = text_rows(chat_tokenizer, ids, span, prompt, [(start, stop)])
    first, last = found[0], found[-1] + 1
    assert found == list(range(first, last))  # one run of rows
    assert len(head) < first and last <= span["stop"]
    covered = chat_tokenizer.decode(ids[first:last])
    assert prompt[start:stop] in covered and "def has_close_elements" not in covered
    before = chat_tokenizer.decode(ids[span["start"] : first])
    assert '"""' not in before and before.strip().endswith("-> bool:")
    # a segment whose ids are not the text tokenized alone is not read
    assert text_rows(chat_tokenizer, ids, span | {"start": span["start"] + 1}, prompt, [(start, stop)]) == []
