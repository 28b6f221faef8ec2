"""The benchmark registry: for each benchmark, where its items come from, the text of the shared
task segment, how an answer is graded, and the agents' roles. Every list of benchmarks in the
package (the CLI's choices, notebook parameters, grids) reads `NAMES`.

The question segment (`{user_question}`) is what every agent reads and what KVComm reuses, so
everything the item gives the agents goes into it: an MMLU question with its lettered options,
a HumanEval function stub, a synthetic record list with its question.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bcr_core.data import code_text, datasets, grading, roles, sandbox, synthetic
from bcr_core.data.roles import RoleSet
from bcr_core.errors import UsageError


@dataclass(frozen=True)
class Benchmark:
    name: str
    load: Callable[..., list[dict]]  # every item, in the fixed order every condition sees
    question: Callable[[dict], str]  # the text of the shared task segment
    grade: Callable[[str, dict], dict]  # an answer's verdict: `correct`, `pred`, ...
    roles: RoleSet
    check_grader: Callable[[], None] = lambda: None  # raises, before a run scores anything, if grading cannot run
    prose: Callable[[str], list[tuple[int, int]]] = lambda question: []  # the question's prose within its code


def check_grader(name: str) -> None:
    """Raise a UsageError naming why `name`'s grader cannot run here (HumanEval's sandbox), before a run
    spends anything on its items; a grader that cannot run would score every item failed."""
    get(name).check_grader()


def mmlu_question(item: dict) -> str:
    options = "\n".join(f"{letter}) {choice}" for letter, choice in zip(grading.LETTERS, item["choices"]))
    return f"{item['question']}\n{options}"


REGISTRY = {
    b.name: b
    for b in (
        Benchmark("gsm8k", datasets.load_gsm8k, lambda item: item["question"], grading.score_gsm8k, roles.GSM8K),
        Benchmark("mmlu", datasets.load_mmlu, mmlu_question, grading.score_mmlu, roles.MMLU),
        Benchmark(
            "humaneval",
            datasets.load_humaneval,
            lambda item: item["prompt"],
            grading.score_humaneval,
            roles.HUMANEVAL,
            sandbox.check_sandbox,
            code_text.prose_spans,
        ),
        Benchmark(
            "synthetic", synthetic.make_items, lambda item: item["question"], synthetic.score_answer, roles.SYNTHETIC
        ),
    )
}
NAMES = tuple(REGISTRY)


def get(name: str) -> Benchmark:
    try:
        return REGISTRY[name.strip().lower()]
    except KeyError:
        raise UsageError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(sorted(NAMES))}") from None


def item_draw(benchmark: str, item_seed: int, first_item: int = 0) -> dict:
    """The load options that draw a benchmark's items: the synthetic task's seed (nothing for the fixed
    data sets, whose items are the same whatever the seed), and where the items start when not at 0."""
    draw = {"seed": item_seed} if benchmark == "synthetic" else {}
    return draw | ({"first": first_item} if first_item else {})


def load_items(benchmark: str, n: int | None = None, first: int = 0, **options) -> list[dict]:
    """n items of a benchmark from index `first` (default the first n), in the fixed order every condition sees."""
    if get(benchmark).name == "synthetic":
        options.setdefault("n", first + (n or 100))
    items = get(benchmark).load(**options)
    end = len(items) if n is None else first + n
    if end > len(items):
        where = f"from item {first} " if first else ""
        raise UsageError(f"--n {n} {where}exceeds the {len(items)} items of {benchmark}")
    return items[first:end]


def question_text(benchmark: str, item: dict) -> str:
    return get(benchmark).question(item)


def prose_spans(benchmark: str, question: str) -> list[tuple[int, int]]:
    """[start, stop) characters of a code question's prose (HumanEval's docstrings); [] where the whole
    question is prose (every other benchmark)."""
    return get(benchmark).prose(question)


def score(benchmark: str, text: str, item: dict, **options) -> dict:
    """The grader's verdict plus `answer`, the extracted answer (for Dense-agreement by answer)."""
    verdict = get(benchmark).grade(text, item, **options)
    return verdict | {"answer": verdict.get("pred")}
