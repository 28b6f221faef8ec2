"""Faults and mistakes, injected: every one gives a clear one-line error or the right result, and no
record is lost. Each test injects the fault (a corrupted line, a flipped byte, a held lock, a bad
argument) and asserts the exit code or exception and its message."""

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bcr_core
from bcr_core.cli import main
from bcr_core.data import datasets
from bcr_core.engine import models
from bcr_core.engine.architectures import ModelError
from bcr_core.engine.assets import AssetError
from bcr_core.errors import UsageError
from bcr_core.runs import run_writer, runner
from bcr_core.runs.cell import Cell
from bcr_core.runs.run_writer import RunFiles
from bcr_core.runs.runner import run_cell

CELL = Cell(
    benchmark="synthetic",
    agents=2,
    conditions=("dense", "kvcomm:gamma=1", "coin-single:gamma=1,skip=off,seed=3"),
    n=4,
    max_new_tokens=3,
    item_seed=7,
)


ROOT = Path(bcr_core.__file__).resolve().parent.parent  # the bcr_core under test, for subprocesses


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tiny_chat, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    run_cell(tiny_chat, CELL, out, progress=False)
    return out


@pytest.mark.parametrize(
    "name, line, damage",
    [
        ("calls.jsonl", 2, lambda line: line[: len(line) // 2]),  # a corrupted middle line
        ("items.jsonl", 1, lambda line: "{" + line),
        ("calls.jsonl", 3, lambda line: ""),  # one blank line
    ],
)
def test_an_unreadable_middle_line_stops_the_run_and_changes_nothing(tiny_chat, finished, tmp_path, name, line, damage):
    out = tmp_path / "run"
    out.mkdir()
    for f in finished.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    lines = (out / name).read_text().split("\n")
    lines[line - 1] = damage(lines[line - 1])
    (out / name).write_text("\n".join(lines))
    before = snapshot(out)
    with pytest.raises(UsageError, match=rf"{name}, line {line}: unreadable record .* nothing was changed on disk"):
        run_cell(tiny_chat, CELL, out, progress=False)
    assert snapshot(out) == before


def test_a_folder_with_records_but_no_settings_is_refused(tmp_path):
    (tmp_path / "items.jsonl").write_text('{"condition": "dense", "item_id": "0"}\n')
    with pytest.raises(UsageError, match="holds records but no cell.json"):
        RunFiles(tmp_path, CELL)


def test_a_resume_on_a_machine_that_rounds_otherwise_is_refused_and_changes_nothing(
    tiny_chat, finished, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    out.mkdir()
    for f in finished.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    recorded = json.loads((out / "arithmetic.json").read_text())
    assert recorded["device"] == "cpu" and recorded["products"] == "float32"  # the tiny model's, on this machine
    other = recorded | {"cpu kernels": "AMX", "cpu model": "another CPU"}
    monkeypatch.setattr(type(tiny_chat), "arithmetic", lambda self: other)
    before = snapshot(out)
    with pytest.raises(UsageError, match=r"rounds otherwise \(cpu kernels: '.+' there, 'AMX' now\)"):
        run_cell(tiny_chat, CELL, out, progress=False)
    assert snapshot(out) == before
    # Another CPU model with the same instruction set runs the same kernels: the resume goes on.
    monkeypatch.setattr(type(tiny_chat), "arithmetic", lambda self: recorded | {"cpu model": "another CPU"})
    run_cell(tiny_chat, CELL, out, progress=False)
    assert snapshot(out) == before


def test_a_folder_from_before_the_arithmetic_was_recorded_takes_this_machines(tmp_path):
    (tmp_path / "cell.json").write_text(json.dumps(run_writer.identity(CELL.record())))
    files = RunFiles(tmp_path, CELL)
    files.settle({"device": "cpu", "products": "bfloat16"})
    files.release()
    assert json.loads((tmp_path / "arithmetic.json").read_text()) == {"device": "cpu", "products": "bfloat16"}


def test_a_second_writer_is_refused_and_a_stale_lock_is_taken_over(tmp_path):
    first = RunFiles(tmp_path, CELL)
    with pytest.raises(UsageError, match=rf"being written by another process \(pid {os.getpid()}\)"):
        RunFiles(tmp_path, CELL)
    first.release()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".lock").write_text(dead.stdout.strip())  # the pid of a process that has exited: a killed run
    again = RunFiles(tmp_path, CELL)
    assert (tmp_path / ".lock").read_text() == str(os.getpid())
    again.release()
    assert not (tmp_path / ".lock").exists()


def test_a_bad_reference_fails_before_any_work_and_is_not_part_of_the_identity(tiny_chat, finished, tmp_path):
    with pytest.raises(UsageError, match="--reference: kvcomm@0.5 is not among the conditions"):
        Cell(benchmark="synthetic", agents=2, conditions=("dense", "kvcomm"), n=4, reference="kvcomm@0.5")
    out = tmp_path / "run"
    out.mkdir()
    for f in finished.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    other = Cell(**{**CELL.__dict__, "reference": "dense"})
    assert len(run_cell(tiny_chat, other, out, progress=False)) == 12  # resumed: the reference changes no record


def test_a_changed_data_file_is_refused_at_load(tmp_path, monkeypatch):
    for f in datasets.data_dir().iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    rows = (tmp_path / "gsm8k.jsonl").read_text().splitlines()
    first = json.loads(rows[0])
    first["answer"] = str(int(first["answer"]) + 1)
    rows[0] = json.dumps(first, ensure_ascii=False)
    (tmp_path / "gsm8k.jsonl").write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(datasets, "data_dir", lambda: tmp_path)
    with pytest.raises(AssetError, match="gsm8k.jsonl does not match data/manifest.json"):
        datasets.load_gsm8k()
    assert len(datasets.load_mmlu()) == 153  # the untouched files still load


@pytest.fixture
def fake_embedded(tmp_path, monkeypatch):
    """The embedded model's checksum guard on small stand-in files: a conversion that writes them."""
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"weights" * 100}
    monkeypatch.setattr(models, "EMBEDDED_FILES", {k: hashlib.sha256(v).hexdigest() for k, v in files.items()})
    monkeypatch.setenv("BCR_CACHE", str(tmp_path))
    conversions = []

    def convert(target, data=files):
        target.mkdir(parents=True, exist_ok=True)
        for name, content in data.items():
            (target / name).write_bytes(content)
        conversions.append(target)

    monkeypatch.setattr(models, "convert_embedded", convert)
    return tmp_path / "models" / "SmolLM2-135M-Instruct", files, conversions


def test_a_flipped_byte_in_the_converted_model_is_converted_again(fake_embedded):
    target, files, conversions = fake_embedded
    assert models.embedded_model_dir() == target and len(conversions) == 1  # first use converts
    assert models.embedded_model_dir() == target and len(conversions) == 1  # a good copy is used as it is
    weights = bytearray((target / "model.safetensors").read_bytes())
    weights[10] ^= 1
    (target / "model.safetensors").write_bytes(bytes(weights))
    assert models.embedded_mismatches(target) == ["model.safetensors"]
    assert models.embedded_model_dir() == target and len(conversions) == 2
    assert (target / "model.safetensors").read_bytes() == files["model.safetensors"]
    (target / "config.json").unlink()  # a deleted config is the same case
    assert models.embedded_model_dir() == target and len(conversions) == 3


def test_a_conversion_that_stays_corrupted_is_a_clear_error(fake_embedded, monkeypatch, capsys):
    target, files, conversions = fake_embedded
    bad = dict(files, **{"model.safetensors": b"garbage"})
    monkeypatch.setattr(
        models,
        "convert_embedded",
        lambda t: (t.mkdir(parents=True, exist_ok=True), [(t / k).write_bytes(v) for k, v in bad.items()]),
    )
    assert main(["verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not match its pinned checksums: model.safetensors" in err


@pytest.mark.real_model
def test_the_pinned_checksums_are_the_converted_models():
    assert models.embedded_mismatches(models.embedded_model_dir()) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--new-tokens", "0"], "--new-tokens must be at least 1, got 0"),
        (["demo", "--new-tokens", "-3"], "--new-tokens must be at least 1, got -3"),
        (["unit-curve", "--seeds", "0"], "--seeds is how many random selections"),
        (
            [
                "run",
                "--benchmark",
                "synthetic",
                "--conditions",
                "dense,kvcomm",
                "--seeds",
                "0,1",
                "--n",
                "2",
                "--out",
                "X",
            ],
            "no coin condition",
        ),
        (
            ["run", "--benchmark", "synthetic", "--conditions", "bcr-chunk:rho=1.0", "--n", "2", "--out", "X"],
            "takes no option 'rho'",
        ),
        (
            ["run", "--benchmark", "synthetic", "--conditions", "bcr-chunk,bcr-chunk@0.2", "--n", "2", "--out", "X"],
            "repeat one run",
        ),
        (
            [
                "run",
                "--benchmark",
                "synthetic",
                "--conditions",
                "dense,kvcomm",
                "--reference",
                "kvcomm@1",
                "--n",
                "2",
                "--out",
                "X",
            ],
            "--reference: kvcomm@1 is not among the conditions",
        ),
        (["ttft", "--lengths", "0"], "--lengths are segment lengths in tokens, each at least 1; got [0]"),
        (["unit-curve", "--prompts", "MISSING"], "--prompts MISSING: no such file"),
        (["unit-curve", "--prompts", "/dev/null"], "--prompts /dev/null holds no prompts; give a JSONL file"),
        (["ttft", "--lengths", ""], "--lengths is empty; give a comma-separated list of integers"),
        (["ttft", "--rho", "0.1,0.2,0.1"], "--rho lists 0.1 more than once; give each value once"),
        (["unit-curve", "--units", ""], "--units is empty; give a comma-separated list of integers"),
        (["unit-curve", "--units", "16,16"], "--units lists 16 more than once"),
        (["notebooks", "--only", ""], "bcr notebooks: error: --only is empty"),
        (
            ["run", "--benchmark", "synthetic", "--conditions", "coin-chunk", "--seeds", "", "--n", "2", "--out", "X"],
            "--seeds is empty",
        ),
        (
            ["run", "--benchmark", "synthetic", "--conditions", "dense,coin-chunk:seed=-1", "--n", "2", "--out", "X"],
            "condition coin-chunk:seed=-1: option seed is a coin stream's seed, at least 0; got -1",
        ),
        (
            ["run", "--benchmark", "synthetic", "--conditions", "cacheblend-reuse@1.5", "--n", "2", "--out", "X"],
            "condition cacheblend-reuse@1.5: r is the paired BCR-chunk reuse rate, in [0, 1]; got 1.5",
        ),
    ],
)
def test_mistaken_arguments_are_one_line_errors(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        runner, "run_cell", lambda *a, **k: pytest.fail("work started before the arguments were checked")
    )
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_several_options_of_one_condition_survive_the_command_line(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(runner, "run_cell", lambda bb, cell, out, **k: seen.setdefault("cell", cell) and pytest.skip())
    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", lambda model, dtype="auto": None)
    with pytest.raises(pytest.skip.Exception):
        main(
            [
                "run",
                "--benchmark",
                "synthetic",
                "--conditions",
                "dense,bcr-chunk:chunk=16,gamma=1,kvcomm",
                "--n",
                "2",
                "--out",
                str(tmp_path / "r"),
            ]
        )
    assert seen["cell"].conditions == ("dense", "bcr-chunk:chunk=16,gamma=1", "kvcomm")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: (p / "file").write_text("x") and p / "file", "cannot hold a run"),
        (lambda p: p / "file" / "below", "cannot hold a run"),
    ],
)
def test_an_out_that_cannot_hold_a_run_is_a_clear_error(make, message, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match=message):
        RunFiles(make(tmp_path) if callable(make) else make, CELL)


def test_bcr_cache_pointing_at_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("BCR_CACHE", str(tmp_path / "cache"))
    assert main(["verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BCR_CACHE" in err and "cannot be used" in err


def test_prompts_that_are_a_folder_or_malformed_name_the_file_and_line(tmp_path):
    from bcr_core.probes.unit_curve import read_prompts

    with pytest.raises(UsageError, match="is a folder"):
        read_prompts(tmp_path)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(UsageError, match=r"p.jsonl:2: each line must be a JSON object"):
        read_prompts(bad)


def test_model_folders_without_weights_with_a_small_vocabulary_or_broken_weights(tiny_chat, tmp_path):
    from conftest import tiny_llama_config
    from transformers import LlamaForCausalLM

    bare = tmp_path / "bare"
    tiny_llama_config().save_pretrained(bare)
    with pytest.raises(ModelError, match="has a config but no weights"):
        models.load_pretrained(str(bare))
    small = tmp_path / "small"
    LlamaForCausalLM(tiny_llama_config(vocab_size=1000)).save_pretrained(small)
    tiny_chat.tokenizer.save_pretrained(small)
    with pytest.raises(ModelError, match="tokenizer has 49152 tokens but the config's vocab_size is 1000"):
        models.load_pretrained(str(small))
    weights = small / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # truncated
    with pytest.raises(ModelError, match="could not load model"):
        models.load_pretrained(str(small))


def test_smoke_honours_explicit_parameters(monkeypatch):
    from bcr_core.lab import params

    monkeypatch.setenv("BCR_EXPLICIT_PARAMETERS", "n")
    p = params.check(n=7, agents=3, smoke=True).smoke()
    assert p.n == 7 and p.agents == 2  # n was set with -p; agents takes the smoke setting


def committed_reuse_call() -> dict:
    import gzip

    from bcr_core.paths import RESULTS

    with gzip.open(RESULTS / "claims" / "a" / "calls.jsonl.gz", "rt") as f:
        return next(c for c in map(json.loads, f) if c["reason"] == "reuse" and c["decisions"])


def nudged(value, by: float):
    """`value` with every float moved by the relative amount `by`."""
    if isinstance(value, dict):
        return {k: nudged(v, by) for k, v in value.items()}
    if isinstance(value, list):
        return [nudged(v, by) for v in value]
    return value * (1 + by) + by * 1e-3 if isinstance(value, float) else value


def test_records_from_another_cpu_compare_floats_with_a_tolerance_and_the_rest_exactly():
    from conftest import record_differences

    call = committed_reuse_call()
    assert record_differences(nudged(call, 1e-7), call) == []  # the last bits of entropy, weights, seconds
    assert record_differences(nudged(call, 1e-2), call)  # a real change in a float is still seen
    token = call["output_tokens"][0]
    other = nudged(call, 1e-7) | {"output_tokens": [token + 1, *call["output_tokens"][1:]]}
    assert record_differences(other, call) == [f".output_tokens[0]: {token + 1} != {token}"]
    other = nudged(call, 1e-7) | {"rows_recomputed": call["rows_recomputed"] + 1, "reason": "entropy"}
    assert [d.split(":")[0] for d in record_differences(other, call)] == [".reason", ".rows_recomputed"]
    other = json.loads(json.dumps(call))
    other["decisions"][0]["anchors"] = [float(a) for a in other["decisions"][0]["anchors"]]
    assert record_differences(other, call) == [
        f".decisions[0].anchors[0]: {other['decisions'][0]['anchors'][0]!r} != {call['decisions'][0]['anchors'][0]!r}"
    ]


def copied(finished, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for f in finished.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def edit_lines(path, change):
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(change(lines)))


def with_record(lines, at, **fields):
    """`lines` with the record on line `at` (1-based) changed by `fields` (None deletes a key)."""
    row = json.loads(lines[at - 1])
    row.update(fields)
    row = {k: v for k, v in row.items() if v is not None}
    return [*lines[: at - 1], json.dumps(row) + "\n", *lines[at:]]


FOREIGN = {"condition": "bcr-chunk"}  # a record of a condition that is not in cell.json


ITEMS, CALLS = "items.jsonl", "calls.jsonl"


@pytest.mark.parametrize(
    "changes, message",
    [  # the records run in order: item 0 under dense, kvcomm, coin (lines 1-3; calls 1-9), then item 1 ...
        ({CALLS: lambda ls: [*ls[:-1], ls[-1][:40]]}, r"items.jsonl, line 12: item .* has no call final in calls"),
        ({CALLS: lambda ls: ls[:12] + ls[15:]}, r"items.jsonl, line 5: item .* has no call agent_1, agent_2, final"),
        ({CALLS: lambda ls: ls[:4] + ls[3:]}, r"calls.jsonl, line 5: repeats call agent_1 of .* \(line 4\)"),
        ({CALLS: lambda ls: ls + ls[-1:]}, r"calls.jsonl, line 37: repeats call final"),
        ({ITEMS: lambda ls: ls + [ls[0]]}, r"items.jsonl, line 13: repeats the record of .* on line 1"),
        ({ITEMS: lambda ls: with_record(ls, 3, **FOREIGN)}, r"line 3: condition 'bcr-chunk' is not among cell.json"),
        ({CALLS: lambda ls: with_record(ls, 7, **FOREIGN)}, r"calls.jsonl, line 7: condition 'bcr-chunk' is not"),
        ({ITEMS: lambda ls: with_record(ls, 2, index="1")}, r"items.jsonl, line 2: index is '1', expected int"),
        ({ITEMS: lambda ls: with_record(ls, 2, item_id=None)}, r"line 2: not an item record: it has no 'item_id'"),
        ({CALLS: lambda ls: with_record(ls, 2, repaired_rows=0)}, r"line 2: repaired_rows is 0, expected list"),
        ({ITEMS: lambda ls: with_record(ls, 4, index=None)}, r"items.jsonl, line 4: not an item record: it has no"),
        ({ITEMS: lambda ls: with_record(ls, 3, index=3)}, r"item '\S+' at index 3 is not one of this cell's items"),
        ({ITEMS: lambda ls: ls[:1] + ls[2:]}, r"calls.jsonl, line 4: a call of .* has no item line, yet calls of"),
        (
            {ITEMS: lambda ls: ls[:1] + ls[2:], CALLS: lambda ls: ls[:3] + ls[6:]},
            r"items.jsonl, line \d+: kvcomm:gamma=1 has item 1 but not item 0",
        ),
    ],
)
def test_resume_trusts_only_complete_items_and_stops_on_anything_else(tiny_chat, finished, tmp_path, changes, message):
    out = copied(finished, tmp_path)
    for name, change in changes.items():
        edit_lines(out / name, change)
    before = snapshot(out)
    with pytest.raises(UsageError, match=message + r".*nothing was changed on disk"):
        run_cell(tiny_chat, CELL, out, progress=False)
    assert snapshot(out) == before


TIMING = {"ttft_s_mean", "total_s", "ttft_s", "assembly_s"}


def records(path):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in run_writer.read_jsonl(path)]


def test_a_torn_item_line_is_redone_and_records_are_written_through_symlinks(tiny_chat, finished, tmp_path):
    out = copied(finished, tmp_path)
    kept = tmp_path / "kept"
    kept.mkdir()
    for name in (ITEMS, CALLS):
        (out / name).rename(kept / name)
        (out / name).symlink_to(kept / name)
    edit_lines(out / ITEMS, lambda ls: [*ls[:-1], ls[-1][:30]])  # the last item line torn; its calls all written
    assert len(run_cell(tiny_chat, CELL, out, progress=False)) == 12
    for name in (ITEMS, CALLS):
        assert (out / name).is_symlink() and records(kept / name) == records(finished / name)


@pytest.mark.parametrize(
    "content, found",
    [
        (b"[1, 2]", "holds a list"),
        (b"", "holds text that is not JSON"),
        (b"{'n': 4", "holds text that is not JSON"),
    ],
)
def test_a_cell_json_that_is_not_settings_names_the_file(tmp_path, content, found):
    (tmp_path / "cell.json").write_bytes(content)
    with pytest.raises(UsageError, match=rf"cell.json should hold a run's settings as a JSON object, but {found}"):
        RunFiles(tmp_path, CELL)


def gzipped(path, text: str) -> None:
    import gzip

    path.write_bytes(gzip.compress(text.encode()))


def test_gzipd_records_grid_files_and_prompts_name_the_file(finished, tmp_path):
    from bcr_core.probes.unit_curve import read_prompts
    from bcr_core.runs.grid_file import read_grid

    gzipped(tmp_path / "cell.json", (finished / "cell.json").read_text())
    with pytest.raises(UsageError, match=r"cell.json is not UTF-8 text \(byte 1, it is gzip'd\); expected a run's"):
        RunFiles(tmp_path, CELL)
    out = copied(finished, tmp_path)
    gzipped(out / CALLS, (finished / CALLS).read_text())
    with pytest.raises(UsageError, match=r"run/calls.jsonl is not UTF-8 text \(byte 1, it is gzip'd\); expected rec"):
        run_writer.read_jsonl(out / CALLS)
    (tmp_path / "grid.toml").write_bytes(b"[defaults]\nn = 2 # \xe9t\xe9\n")  # Latin-1
    with pytest.raises(UsageError, match=r"grid.toml is not UTF-8 text \(byte 19\); expected a grid file in TOML"):
        read_grid(tmp_path / "grid.toml")
    gzipped(tmp_path / "p.jsonl", '{"text": "a"}\n')
    with pytest.raises(UsageError, match=r"p.jsonl is not UTF-8 text \(byte 1, it is gzip'd\); expected JSON lines"):
        read_prompts(tmp_path / "p.jsonl")


def test_a_condition_refused_while_building_leaves_the_folder_usable(tiny_chat, tmp_path):
    small = dict(n=1, max_new_tokens=2, item_seed=7)
    with pytest.raises(UsageError, match="cacheblend-reuse needs the paired BCR-chunk reuse rate"):
        run_cell(
            tiny_chat,
            Cell(benchmark="synthetic", agents=2, conditions=("dense", "cacheblend-reuse"), **small),
            tmp_path,
            progress=False,
        )
    assert not (tmp_path / "cell.json").exists() and not (tmp_path / ".lock").exists()
    assert (
        len(
            run_cell(
                tiny_chat,
                Cell(benchmark="synthetic", agents=2, conditions=("dense", "cacheblend-reuse@0.5"), **small),
                tmp_path,
            )
        )
        == 2
    )


@pytest.mark.parametrize(
    "condition, message",
    [
        ("coin-chunk:seed=-1", "condition coin-chunk:seed=-1: option seed is a coin stream's seed, at least 0; got -1"),
        (
            "cacheblend-reuse@1.5",
            "condition cacheblend-reuse@1.5: r is the paired BCR-chunk reuse rate, in [0, 1]; got 1.5",
        ),
        ("bcr-chunk@-0.2", "condition bcr-chunk@-0.2: rho is the share of rows repaired, in [0, 1]; got -0.2"),
    ],
)
def test_a_value_no_server_takes_names_the_condition(condition, message):
    with pytest.raises(UsageError) as refused:
        Cell(benchmark="synthetic", agents=2, conditions=("dense", condition), n=2)
    assert str(refused.value) == message


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])  # a full disk; a file past the size limit
def test_a_full_disk_says_so_and_keeps_every_finished_record(tiny_chat, finished, tmp_path, monkeypatch, code):
    real_append, appended = run_writer.append_jsonl, []

    def fill_up(path, rows):
        if len(appended) == 7:  # item 4's calls: half a line gets to disk, then the disk is full
            with open(path, "a") as f:
                f.write(json.dumps(rows[0])[:25])
            raise OSError(code, os.strerror(code))
        appended.append(path)
        real_append(path, rows)

    monkeypatch.setattr(run_writer, "append_jsonl", fill_up)
    with pytest.raises(UsageError, match=rf"the disk is full \({os.strerror(code)}\) while appending item .*intact"):
        run_cell(tiny_chat, CELL, tmp_path, progress=False)
    assert len(run_writer.read_jsonl(tmp_path / ITEMS)) == 3
    monkeypatch.setattr(run_writer, "append_jsonl", real_append)
    run_cell(tiny_chat, CELL, tmp_path, progress=False)
    assert records(tmp_path / ITEMS) == records(finished / ITEMS)
    assert records(tmp_path / CALLS) == records(finished / CALLS)


def run_args(out, *more):
    settings = dict(benchmark="synthetic", agents=2, conditions=",".join(CELL.conditions), n=4, out=out)
    settings |= {"max-new-tokens": 3, "item-seed": 7}
    return ["run", *(a for k, v in settings.items() for a in (f"--{k}", str(v))), *more]


def test_ctrl_c_says_how_many_items_are_kept_and_how_to_resume(tiny_chat, tmp_path, monkeypatch, capsys):
    real_append = run_writer.RunFiles.append

    def interrupt_at_third(self, item, calls):
        if item["index"] == 1 and item["condition"] == "dense":
            raise KeyboardInterrupt
        real_append(self, item, calls)

    monkeypatch.setattr(run_writer.RunFiles, "append", interrupt_at_third)
    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", lambda model, dtype="auto": tiny_chat)
    assert main(run_args(tmp_path / "r")) == 130
    err = capsys.readouterr().err.strip()  # the progress bar's lines, then one line
    assert err.splitlines()[-1] == "bcr run: interrupted after 3 items; rerun the same command to resume"
    assert "Traceback" not in err
    assert len(run_writer.read_jsonl(tmp_path / "r" / ITEMS)) == 3


def test_a_run_that_reuses_nothing_says_why_beneath_its_table(tiny_chat, tmp_path, monkeypatch, capsys):
    """One item: no placeholder holds an anchor yet, so every condition serves what Dense serves."""
    from collections import Counter

    from bcr_core.analysis.reports.summary import no_reuse_note

    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", lambda model, dtype="auto": tiny_chat)
    args = run_args(tmp_path / "r")
    args[args.index("--n") + 1] = "1"
    assert main(args) == 0
    reasons = Counter(c["reason"] for c in run_writer.read_jsonl(tmp_path / "r" / CALLS) if c["reason"] != "dense")
    assert set(reasons) <= {"no_anchors", "one_anchor"} and reasons
    shown = ", ".join(f"{count} {reason}" for reason, count in reasons.most_common())
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"bcr run: no call of these 1 items reused a cache (the gate's reasons: {shown}): KVComm reuses a segment "
        "only once its placeholder holds 2 anchors at least as long (docs/design.md), laid down by earlier items' "
        "dense prefills, so every condition served what Dense serves and the rows are alike; run more items (--n)"
    )
    assert no_reuse_note([{"reason": "no_anchors"}, {"reason": "reuse"}], 9) is None  # one reused call: no note
    assert no_reuse_note([{"reason": "dense"}], 9) is None  # Dense alone has no gate


SLOW_APPEND = """
import time
from bcr_core.runs import run_writer
real_append = run_writer.RunFiles.append

def wait_then_append(self, item, calls):
    time.sleep(0.3)  # a run long enough to be stopped in the middle
    real_append(self, item, calls)

run_writer.RunFiles.append = wait_then_append
"""


@pytest.mark.parametrize("command", ["run", "grid"])
def test_sigterm_stops_a_run_as_ctrl_c_does_and_the_rerun_gives_the_uninterrupted_records(
    tiny_config, tmp_path, command
):
    """What `kill`, systemd and SLURM send: the run keeps its finished items, says how to resume,
    exits 143; the same command then finishes it with the records an uninterrupted run writes."""
    from bcr_core.run_folder import count_lines

    model = f"config:{tiny_config}"
    (tmp_path / "grid.toml").write_text(GRID.replace("[defaults]\n", f'[defaults]\nmodel = "{model}"\n'))
    args = {
        "run": lambda out: run_args(out, "--model", model),
        "grid": lambda out: ["grid", str(tmp_path / "grid.toml"), "--out", str(out)],
    }[command]
    folder = {"run": lambda out: out, "grid": lambda out: out / "a"}[command]
    code = f"import sys\nfrom bcr_core import cli\n{SLOW_APPEND}\nsys.exit(cli.main(sys.argv[1:]))"
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    stopped = tmp_path / "stopped"
    process = subprocess.Popen([sys.executable, "-c", code, *args(stopped)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while count_lines(folder(stopped) / ITEMS) < 2:
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    kept = len(run_writer.read_jsonl(folder(stopped) / ITEMS))
    assert process.returncode == 143 and 2 <= kept < 12
    assert err.splitlines()[-1] == f"bcr {command}: interrupted after {kept} items; rerun the same command to resume"
    assert "Traceback" not in err

    assert main(args(stopped)) == 0
    assert main(args(tmp_path / "whole")) == 0
    for name in (ITEMS, CALLS):
        assert records(folder(stopped) / name) == records(folder(tmp_path / "whole") / name)


@pytest.mark.parametrize(
    "command, said",
    [
        (["ttft"], "interrupted; it keeps nothing, so rerun the same command to start again"),
        (["unit-curve"], "interrupted; it keeps nothing, so rerun the same command to start again"),
        (["calibrate", "--out", "{out}"], "interrupted; rerun the same command to resume"),
        (["arena", "--n", "2", "--out", "{out}"], "interrupted; rerun the same command to resume"),
    ],
)
def test_sigterm_in_any_long_command_is_one_line_and_exit_143(tmp_path, monkeypatch, capsys, command, said):
    def terminated_while_loading(model, dtype="auto"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", terminated_while_loading)
    before = signal.getsignal(signal.SIGTERM)
    assert main([part.format(out=tmp_path / "out") for part in command]) == 143
    assert capsys.readouterr().err == f"bcr {command[0]}: {said}\n"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the command's alone


GRID = """
[defaults]
benchmark = "synthetic"
agents = 2
n = 4
max_new_tokens = 3
item_seed = 7
conditions = ["dense", "kvcomm:gamma=1", "coin-single:gamma=1,skip=off,seed=3"]

[cells.a]
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "out, more, message",
    [
        ("file", [], r"--out \S+file cannot hold a grid: it is a file; give a folder"),
        (
            "dir",
            ["--ray", "127.0.0.1:{port}"],
            r"--ray 127.0.0.1:\d+: cannot reach the Ray cluster \(Connection refused",
        ),
    ],
)
def test_a_grid_out_that_is_a_file_or_a_ray_address_that_does_not_answer_is_one_line(
    tmp_path, capsys, out, more, message
):
    import time

    (tmp_path / "grid.toml").write_text(GRID)
    (tmp_path / "file").write_text("x")
    more = [m.format(port=free_port()) for m in more]
    began = time.monotonic()
    assert main(["grid", str(tmp_path / "grid.toml"), "--out", str(tmp_path / out), *more]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert time.monotonic() - began < 30


def test_a_grid_cell_with_a_bad_record_is_named_before_any_work(finished, tmp_path, monkeypatch):
    from bcr_core.runs import grid, grid_file, grid_task

    (tmp_path / "grid.toml").write_text(GRID)
    cells = grid_file.read_grid(tmp_path / "grid.toml")
    assert cells[0].cell == CELL
    (tmp_path / "out").mkdir()
    copied(finished, tmp_path / "out").rename(tmp_path / "out" / "a")
    edit_lines(tmp_path / "out" / "a" / ITEMS, lambda ls: with_record(ls, 12, index="3"))
    monkeypatch.setattr(grid_task, "shared_backbone", lambda model, dtype="auto": pytest.fail("work started"))
    with pytest.raises(grid_file.GridError, match=r"cell a: \S+items.jsonl, line 12: index is '3', expected int"):
        grid.run_grid(cells, tmp_path / "out", progress=False)


def test_an_empty_model_or_a_hub_id_without_network_is_one_line_at_once(tmp_path, capsys, monkeypatch):
    import time

    assert main(["verify", "--model", ""]) == 2
    assert capsys.readouterr().err.strip() == (
        "bcr verify: error: --model is empty: give 'default', a local Hugging Face directory, or a hub id"
    )
    for key in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # a hub that does not answer
    began = time.monotonic()
    assert main(["verify", "--model", "nobody/no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and time.monotonic() - began < 5
    assert "'nobody/no-such-model' is not in the local Hugging Face cache and the hub (127.0.0.1) cannot" in err


@pytest.mark.parametrize(
    "shape, message",
    [
        (dict(num_attention_heads=5, num_key_value_heads=5, head_dim=None), "hidden_size 64 is not a multiple of "),
        (dict(num_key_value_heads=3), "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ],
)
def test_a_config_whose_attention_shapes_cannot_work_is_refused_before_loading(tmp_path, shape, message):
    from conftest import tiny_llama_config

    from bcr_core.engine.backbone import Backbone

    settings = {k: v for k, v in (tiny_llama_config().to_dict() | shape).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(settings))
    (tmp_path / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ModelError, match=rf"{tmp_path}/config.json: {message}"):
        models.load_pretrained(str(tmp_path))
    with pytest.raises(ModelError, match=message):
        Backbone.load(f"config:{tmp_path}")
    if "head_dim" not in shape:  # a config built in Python (transformers itself refuses the other)
        with pytest.raises(ModelError, match=rf"the llama config: {message}"):
            Backbone.from_config(tiny_llama_config(**shape))


@pytest.mark.parametrize(
    "damage, load, message",
    [
        (lambda d: (d / "manifest.json").unlink(), "load_gsm8k", r"manifest.json is missing"),
        (
            lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:300]),
            "load_mmlu",
            r"manifest.json is unreadable \(JSONDecodeError: .*\): restore it",
        ),
        (lambda d: (d / "gsm8k.jsonl").unlink(), "load_gsm8k", r"gsm8k.jsonl is missing: restore it"),
        (lambda d: (d / "humaneval.jsonl.gz").unlink(), "load_humaneval", r"humaneval.jsonl.gz is missing: restore"),
    ],
)
def test_missing_or_truncated_data_names_the_file(tmp_path, monkeypatch, capsys, damage, load, message):
    for f in datasets.data_dir().iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    damage(tmp_path)
    monkeypatch.setattr(datasets, "_package_data_dir", lambda: tmp_path)
    with pytest.raises(AssetError, match=message):
        getattr(datasets, load)()
    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", lambda model, dtype="auto": None)
    benchmark = {"load_gsm8k": "gsm8k", "load_mmlu": "mmlu", "load_humaneval": "humaneval"}[load]
    argv = ["run", "--benchmark", benchmark, "--agents", "2", "--conditions", "dense", "--n", "1"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


RUN = ["run", "--benchmark", "synthetic", "--conditions", "dense", "--n", "2"]


@pytest.mark.parametrize(
    "argv, free, message",
    [
        (
            ["ttft", "--lengths", "64,100000"],
            None,
            r"--lengths 100000: a call is \d+ tokens .* context of 8192 .* fits is \d+",
        ),
        (
            [*RUN, "--max-new-tokens", "1000000000"],
            None,
            r"--max-new-tokens 1000000000 does not fit the model's context of 8192 tokens",
        ),
        # within the context, but with 1 MB free (faked) the calls' caches cannot fit
        (["ttft", "--lengths", "64,4000"], 10**6, r"--lengths 4000: calls of \d+ cached rows need about .* GB is free"),
        (
            [*RUN, "--max-new-tokens", "4000"],
            10**6,
            r"--max-new-tokens 4000: calls of 4000 cached rows need about .* GB is free on cpu; give fewer",
        ),
    ],
)
def test_calls_past_the_models_context_or_the_free_memory_are_refused_before_any_work(
    tiny_chat, tmp_path, capsys, monkeypatch, argv, free, message
):
    from bcr_core.engine import capacity
    from bcr_core.probes import latency

    if free is not None:
        monkeypatch.setattr(capacity, "available_bytes", lambda device: free)
    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", lambda model, dtype="auto": tiny_chat)
    monkeypatch.setattr(latency, "ttft_calls", lambda *a, **k: pytest.fail("work started"))
    monkeypatch.setattr(runner, "make_server", lambda *a, **k: pytest.fail("work started"))
    assert main([*argv, *(["--out", str(tmp_path / "r")] if argv[0] == "run" else [])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "r" / "cell.json").exists()


def test_a_cache_row_is_what_a_prefill_holds_per_row(tiny_chat):
    from bcr_core.engine import capacity

    kv = tiny_chat.prefill(list(range(5, 45)))
    held = kv.keys.element_size() * (kv.keys.numel() + kv.values.numel()) / kv.length
    assert capacity.row_bytes(tiny_chat.config, tiny_chat.dtype) == held
    capacity.check_rows_fit(tiny_chat, 1, "--lengths 1")  # and one such row fits in the free memory here


def test_notebooks_out_that_is_a_file_and_smoke_given_as_a_parameter(tmp_path, monkeypatch, capsys):
    from bcr_core.lab import notebooks

    (tmp_path / "file").write_text("x")
    assert main(["notebooks", "--only", "00", "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "file cannot hold the reports: it is a file" in err
    seen = []

    def run_notebook(path, out, parameters, kernel):
        seen.append(parameters["smoke"])
        return notebooks.NotebookResult(path.stem, 0.0, str(out / path.name), None)

    monkeypatch.setattr(notebooks, "run_notebook", run_notebook)
    monkeypatch.setattr(notebooks, "kernel_name", lambda: "bcr-lab")
    assert main(["notebooks", "--only", "00", "--out", str(tmp_path / "r"), "-p", "smoke=true"]) == 0
    assert seen == [True]  # it was overwritten with smoke = False
    assert main(["notebooks", "--only", "00", "--out", str(tmp_path / "r"), "--smoke", "-p", "smoke=false"]) == 2
    assert capsys.readouterr().err.strip().endswith("--smoke and -p smoke=false disagree; give one of them")
