"""Benchmarks as the pipeline sees them: items, the text of the shared task segment, and a score.

The question segment (`{user_question}`) is what every agent reads and what KVComm reuses, so
everything the item gives the agents goes into it: an MMLU question with its lettered options,
a HumanEval function stub, a synthetic record list with its question.
"""

from __future__ import annotations

from bcr_core import datasets, scorers

LETTERS = "ABCD"
BENCHMARKS = ("gsm8k", "mmlu", "humaneval", "synthetic")


def load_items(benchmark: str, n: int | None = None, **options) -> list[dict]:
    """The first n items of a benchmark, in the fixed order every condition sees."""
    if benchmark == "synthetic":
        options.setdefault("n", n or 100)
    items = datasets.load(benchmark, **options)
    if n is not None and n > len(items):
        raise ValueError(f"--n {n} exceeds the {len(items)} items of {benchmark}")
    return items[:n]


def question_text(benchmark: str, item: dict) -> str:
    if benchmark == "mmlu":
        options = "\n".join(f"{letter}) {choice}" for letter, choice in zip(LETTERS, item["choices"]))
        return f"{item['question']}\n{options}"
    if benchmark == "humaneval":
        return item["prompt"]
    return item["question"]


def score(benchmark: str, text: str, item: dict) -> dict:
    """The scorer's verdict plus `answer`, the extracted answer (for Dense-agreement by answer)."""
    verdict = scorers.score(benchmark, text, item)
    return verdict | {"answer": verdict.get("pred")}
