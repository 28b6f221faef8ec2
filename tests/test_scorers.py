"""Scorers on hand-written answers."""

import pytest

from bcr_core.data import benchmarks, datasets, grading
from bcr_core.errors import UsageError

GSM = {"id": "g", "question": "?", "answer": "1200"}


@pytest.mark.parametrize(
    "text",
    [
        "The total is 1200.",
        "She pays $1,200.",
        "Step 1: 3 * 400 = 1200\n#### 1200",
        "#### 1,200",
        "So the final answer is \\boxed{1200}.",
        "\\boxed{1,200.00}",
        "The answer is 1200. I hope step 2 helps.",
        "**1200**",
        "First 600, then 600 more makes 1200",
    ],
)
def test_gsm8k_accepts_formats(text):
    assert benchmarks.score("gsm8k", text, GSM)["correct"], benchmarks.score("gsm8k", text, GSM)


@pytest.mark.parametrize(
    "text",
    [
        "The total is 1200 dollars, plus 5 for the tip.",  # last number rule
        "#### 120",
        "\\boxed{12000}",
        "I cannot tell.",
        "1200 or 1300, the answer is 1300",
    ],
)
def test_gsm8k_rejects_wrong_answers(text):
    assert not benchmarks.score("gsm8k", text, GSM)["correct"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("it drops to -17 degrees", "-17"),
        ("x = -3.5.", "-3.5"),
        ("10-5 = 5", "5"),
        ("#### -4", "-4"),
        ("\\boxed{\\frac{7}{2}} so 3.5", "2"),
        ("nothing here", None),
        ("costs $0.75", "0.75"),
    ],
)
def test_gsm8k_extraction(text, expected):
    assert grading.extract_gsm8k_number(text) == expected


def test_gsm8k_negative_and_decimal_gold():
    assert benchmarks.score("gsm8k", "It is -2.50.", {"answer": "-2.5"})["correct"]
    assert not benchmarks.score("gsm8k", "It is 2.5.", {"answer": "-2.5"})["correct"]


MMLU = {"id": "m", "question": "?", "choices": ["w", "x", "y", "z"], "answer": "A"}


def test_mmlu_lenient_and_strict_disagree():
    result = benchmarks.score("mmlu", "It is not A, the answer is B", MMLU)
    assert result["correct_lenient"] is True
    assert result["correct_strict"] is False and result["pred"] == "B"
    assert result["correct"] is True  # the paper's rule is the lenient one (App. E); strict is kept beside it


def test_mmlu_lenient_is_case_sensitive_substring():
    assert grading.mmlu_lenient("Answer: B", "A")  # the capital A of "Answer"
    assert not grading.mmlu_lenient("the answer is b", "A")
    assert not grading.mmlu_lenient("A is right. The output is: B", "A")


@pytest.mark.parametrize(
    "text, letter",
    [
        ("The answer is (B).", "B"),
        ("answer is C", "C"),
        ("Answer: D", "D"),
        ("The correct answer is: **A**", "A"),
        ("B", "B"),
        ("B) Paris", "B"),
        ("(C) because ...", "C"),
        ("A. Paris is the capital", "A"),
        ("Option B: Paris", "B"),
        ("C is the correct answer.", "C"),
        ("I would pick (D) here.", "D"),
    ],
)
def test_mmlu_strict_extracts(text, letter):
    assert grading.extract_mmlu_letter(text) == letter


@pytest.mark.parametrize(
    "text",
    [
        "A bat is a mammal.",  # article, not an option
        "The answer is (B). Answer: C",  # conflicting statements
        "Either (A) or (C) could be right.",
        "the answer is a function of x",
        "I do not know.",
    ],
)
def test_mmlu_strict_returns_none_when_absent_or_ambiguous(text):
    assert grading.extract_mmlu_letter(text) is None


@pytest.fixture(scope="module")
def task0():
    return datasets.load_humaneval()[0]


def test_humaneval_correct_body(task0):
    result = benchmarks.score("humaneval", task0["canonical_solution"], task0)
    assert result["correct"] and result["mode"] == "body"


def test_humaneval_wrong_body(task0):
    result = benchmarks.score("humaneval", "    return False\n", task0)
    assert not result["correct"] and result["result"].startswith("failed")


def test_humaneval_full_definition_in_a_fence(task0):
    text = (
        "Sure:\n```python\nfrom typing import List\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold\n"
        "               for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)\n"
        "```\nDone."
    )
    result = benchmarks.score("humaneval", text, task0)
    assert result["correct"] and result["mode"] == "full_definition"
    wrong = text.replace("< threshold", "> threshold")
    assert not benchmarks.score("humaneval", wrong, task0)["correct"]


def test_humaneval_infinite_loop_times_out(task0):
    result = benchmarks.score("humaneval", "    while True:\n        pass\n", task0, timeout=1.0)
    assert not result["correct"] and result["result"] == "timed out"


def test_score_rejects_unknown_benchmark():
    with pytest.raises(UsageError, match="known benchmarks: gsm8k, humaneval, mmlu, synthetic"):
        benchmarks.score("arc", "A", MMLU)


def test_every_verdict_has_correct_and_pred(task0):
    cases = [
        ("gsm8k", "#### 1200", GSM),
        ("mmlu", "The answer is A", MMLU),
        ("humaneval", task0["canonical_solution"], task0),
    ]
    for benchmark, text, item in cases:
        verdict = benchmarks.score(benchmark, text, item)
        assert verdict["correct"] is True and verdict["pred"] is not None, benchmark
