"""The experiment runner: paired, incremental, resumable."""

import pandas as pd
import pytest
import torch

from bcr_core.analysis.reports.summary import condition_table, floor_note
from bcr_core.analysis.statistics.binary import mcnemar_exact
from bcr_core.errors import UsageError
from bcr_core.runs import run_writer, runner
from bcr_core.runs.cell import Cell, RunSettings
from bcr_core.runs.runner import run_cell
from bcr_core.setting_kinds import SettingError

CELL = Cell(
    benchmark="synthetic",
    agents=2,
    conditions=("dense", "kvcomm@1", "coin-single@0.3:gamma=1,seed=3"),
    n=4,
    max_new_tokens=4,
    item_seed=7,
)
TIMING = {"ttft_s_mean", "total_s", "ttft_s", "assembly_s"}


def strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_interrupted_run_resumes_to_the_same_records(tiny_chat, tmp_path, monkeypatch):
    whole = run_cell(tiny_chat, CELL, tmp_path / "whole", progress=False)
    assert len(whole) == 12 and set(whole["condition"]) == set(CELL.conditions)

    real_append, appended = run_writer.RunFiles.append, []

    def crash_after_five(self, item, calls):
        if len(appended) == 5:
            raise KeyboardInterrupt
        appended.append(item)
        real_append(self, item, calls)

    monkeypatch.setattr(run_writer.RunFiles, "append", crash_after_five)
    with pytest.raises(KeyboardInterrupt):
        run_cell(tiny_chat, CELL, tmp_path / "resumed", progress=False)
    monkeypatch.setattr(run_writer.RunFiles, "append", real_append)
    with open(tmp_path / "resumed" / "calls.jsonl", "a") as f:
        f.write('{"condition": "dense", "item_id": "torn')  # a write cut short by the crash
    resumed = run_cell(tiny_chat, CELL, tmp_path / "resumed", progress=False)

    read = lambda name, d: strip(run_writer.read_jsonl(tmp_path / d / name))
    key = lambda r: (r["condition"], r["item_id"], r.get("node", ""))
    assert sorted(read("items.jsonl", "resumed"), key=key) == sorted(read("items.jsonl", "whole"), key=key)
    assert sorted(read("calls.jsonl", "resumed"), key=key) == sorted(read("calls.jsonl", "whole"), key=key)
    assert len(resumed) == 12 and not resumed.duplicated(["condition", "item_id"]).any()


def test_summary_is_paired_and_reports_bc_before_p(tiny_chat, tmp_path):
    items = run_cell(tiny_chat, CELL, tmp_path, progress=False)
    table = condition_table(items, reference="kvcomm@1")
    assert list(table["condition"]) == list(CELL.conditions)
    columns = list(table.columns)
    assert columns.index("only_reference_right") < columns.index("only_condition_right") < columns.index("p_exact")
    dense = table.set_index("condition").loc["dense"]
    assert dense["agrees_dense"] == 1.0 and dense["reuse_rate"] == 0.0
    assert dense["answer_agreement"] == 1.0  # also where no answer could be extracted
    assert items["answer"].isna().any()  # (the tiny model's answers rarely name a record value)
    by = table.set_index("condition")
    assert pd.isna(by.loc["kvcomm@1", "only_reference_right"]) and (by["reference"] == "kvcomm@1").all()
    wide = items.pivot(index="item_id", columns="condition", values="correct")
    only_kvcomm = int((wide["kvcomm@1"] & ~wide["dense"]).sum())
    only_dense = int((~wide["kvcomm@1"] & wide["dense"]).sum())
    assert (by.loc["dense", "only_reference_right"], by.loc["dense", "only_condition_right"]) == (
        only_kvcomm,
        only_dense,
    )
    assert by.loc["dense", "p_exact"] == pytest.approx(mcnemar_exact(only_kvcomm, only_dense))


def test_fidelity_is_recorded_per_item(tiny_chat, tmp_path):
    cell = Cell(
        benchmark="synthetic",
        agents=2,
        conditions=("dense", "kvcomm@1"),
        n=6,
        max_new_tokens=3,
        item_seed=7,
        fidelity=True,
    )
    items = run_cell(tiny_chat, cell, tmp_path, progress=False).set_index(["condition", "item_id"])
    dense = items.loc["dense"]
    assert (dense["kl_mean"].abs() < 1e-6).all() and (dense["first_token_agree"] == 1.0).all()
    reused = items.loc["kvcomm@1"]
    assert (reused["kl_mean"] >= 0).all() and (reused["kl_mean"] > 1e-6).any()  # once warm, calls reuse


def test_rerun_with_other_settings_is_refused(tiny_chat, tmp_path):
    run_cell(
        tiny_chat,
        Cell(benchmark="synthetic", agents=2, conditions=("dense",), n=1, max_new_tokens=2),
        tmp_path,
        progress=False,
    )
    with pytest.raises(UsageError, match="other settings"):
        run_cell(
            tiny_chat,
            Cell(benchmark="synthetic", agents=2, conditions=("dense",), n=2, max_new_tokens=2),
            tmp_path,
            progress=False,
        )


def test_bad_cells_are_clear_errors():
    with pytest.raises(UsageError, match="repeat"):
        Cell(benchmark="gsm8k", agents=3, conditions=("kvcomm@0.5", "kvcomm@0.50"), n=2)
    with pytest.raises(UsageError, match="unknown condition"):
        Cell(benchmark="gsm8k", agents=3, conditions=("densest",), n=2)
    with pytest.raises(UsageError, match="exceeds the 100 items"):
        runner.benchmarks.load_items("gsm8k", 101)


BATCHED = Cell(
    benchmark="synthetic",
    agents=2,
    n=6,
    max_new_tokens=10,
    item_seed=11,
    conditions=(
        "dense",
        "kvcomm@1",
        "bcr-chunk@0.5:gamma=1",
        "coin-single@0.3:gamma=1,seed=3",
        "opengate@0.2",
        "token-matched-dense",
    ),
)


@pytest.mark.parametrize("batch", [3, 8])
def test_batched_runner_gives_the_tokens_of_batch_size_one(tiny_chat, tmp_path, batch):
    """Every call of every condition: same output tokens, gate decisions and repaired rows."""
    run_cell(tiny_chat, BATCHED, tmp_path / "one", progress=False)
    run_cell(tiny_chat, BATCHED, tmp_path / "many", progress=False, batch=batch)
    key = lambda r: (r["condition"], r["item_id"], r["node"])
    calls = {d: sorted(strip(run_writer.read_jsonl(tmp_path / d / "calls.jsonl")), key=key) for d in ("one", "many")}
    assert len(calls["one"]) == 6 * 6 * 3
    assert calls["many"] == calls["one"]
    assert any(c["reason"] == "reuse" and c["repaired_rows"] for c in calls["one"])  # repairs were batched too


def test_batched_runner_serves_a_stateful_condition_one_item_at_a_time(tiny_chat, tmp_path, monkeypatch):
    starts = []  # (unit started, units running beside it)
    original = runner.run_lanes

    def spy(bb, units, width, may_start, finished, *options):
        def recorded(unit, running):
            allowed = may_start(unit, running)  # run_lanes starts the first unit allowed
            if allowed:
                starts.append((unit.key, [r.key for r in running]))
            return allowed

        return original(bb, units, width, recorded, finished, *options)

    monkeypatch.setattr(runner, "run_lanes", spy)
    run_cell(tiny_chat, BATCHED, tmp_path, progress=False, batch=8)
    kvcomm = [(key, running) for key, running in starts if key[0] == "kvcomm@1"]
    assert [key[1] for key, _ in kvcomm] == list(range(6))
    assert all(r[0] != "kvcomm@1" for _, running in kvcomm for r in running)
    assert max(sum(r[0] == "dense" for r in running) for _, running in starts) >= 2  # Dense's items overlap


def test_shared_prefills_compute_each_prompt_once_and_never_change_it(tiny_chat):
    """Three servers on one prompt: each distinct prefill is computed once, every call gets the
    tokens of its own prefill, and decoding from the shared cache leaves it as computed."""
    from bcr_core.probes.latency import copy_templates
    from bcr_core.reuse.anchors import KVCommConfig
    from bcr_core.reuse.prompts import QUESTION, build_prompt
    from bcr_core.reuse.segments import SharedPrefills
    from bcr_core.reuse.servers import DenseServer, KVCommServer

    prompt = build_prompt(tiny_chat.tokenizer, copy_templates(1)[0], {QUESTION: "Ann has 12 marbles."})
    make = lambda: [DenseServer(tiny_chat), *(KVCommServer(tiny_chat, KVCommConfig(gamma=1.0)) for _ in range(2))]
    alone = [s.serve(prompt, 8) for s in make()]
    servers, shared = make(), SharedPrefills(tiny_chat)
    for server in servers:
        server.prefills = shared
    together = [s.serve(prompt, 8) for s in servers]
    distinct = {tuple(prompt.dense_ids[:-1]), tuple(prompt.merged_ids[:-1])}
    assert (shared.computed, shared.shared) == (len(distinct), 3 - len(distinct))
    assert [c.output_tokens for c in together] == [c.output_tokens for c in alone]
    assert together[1].served[0] is together[2].served[0]  # the KVComm fallbacks share one cache
    fresh = tiny_chat.prefill(prompt.merged_ids[:-1])
    kept = shared(prompt.merged_ids[:-1])
    assert torch.equal(kept.keys, fresh.keys) and torch.equal(kept.values, fresh.values)


def test_prompt_and_stop_are_a_runs_identity_and_committed_folders_keep_theirs(tmp_path):
    """A folder written before `prompt` and `stop` existed holds neither key and still is the default cell's;
    a cell with another prompt or stop rule writes them and is refused by that folder."""
    import json
    import shutil

    from bcr_core.errors import UsageError
    from bcr_core.paths import RESULTS
    from bcr_core.setting_kinds import SettingError

    committed = json.loads((RESULTS / "claims-gemma-3-270m" / "gate" / "cell.json").read_text())
    assert "prompt" not in committed and "stop" not in committed
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(RESULTS / "claims-gemma-3-270m" / "gate" / "cell.json", old / "cell.json")
    conditions = committed["conditions"]
    same = Cell(benchmark="synthetic", agents=3, conditions=conditions, n=100, max_new_tokens=8, model="gemma-3-270m")
    run_writer.check_folder(old, same)  # the same run: no error
    for changed in (dict(stop="line"), dict(prompt="one-shot")):
        with pytest.raises(UsageError, match="holds a run with other settings"):
            run_writer.check_folder(
                old,
                Cell(
                    benchmark="synthetic",
                    agents=3,
                    conditions=conditions,
                    n=100,
                    max_new_tokens=8,
                    model="gemma-3-270m",
                    **changed,
                ),
            )

    new = Cell(
        benchmark="synthetic", agents=2, conditions=["dense"], n=2, max_new_tokens=4, prompt="one-shot", stop="line"
    )
    files = run_writer.RunFiles(tmp_path / "new", new)
    files.settle({"device": "cpu"})
    files.release()
    written = json.loads((tmp_path / "new" / "cell.json").read_text())
    assert (written["prompt"], written["stop"]) == ("one-shot", "line")
    with pytest.raises(SettingError, match="stop"):
        Cell(benchmark="synthetic", agents=2, conditions=["dense"], n=2, max_new_tokens=4, stop="para")


def test_run_settings_are_taken_by_keyword_at_their_defaults_and_the_cell_leaves_out_how_it_runs():
    run = RunSettings(benchmark="synthetic", conditions="dense,coin-chunk", n=2, seeds=[0, 1], batch=4)
    cell = run.cell()
    assert (run.batch, run.conditions) == (4, ["dense", "coin-chunk"])
    assert (cell.agents, cell.max_new_tokens, cell.model, cell.extra) == (3, 512, "default", {"seed": 0})
    assert (cell.prompt, cell.stop, cell.fidelity, cell.reference) == ("standard", "eos", False, None)
    assert cell.conditions == ("dense", "coin-chunk:seed=0", "coin-chunk:seed=1")
    assert not hasattr(cell, "batch") and not hasattr(cell, "seeds")
    with pytest.raises(SettingError, match="missing") as err:
        RunSettings(benchmark="synthetic", conditions=["dense"])
    assert err.value.key == "n"
    with pytest.raises(SettingError, match="expected int") as err:
        Cell(benchmark="synthetic", conditions=("dense",), n=2, agents="3")
    assert err.value.key == "agents"
    with pytest.raises(TypeError, match="colour"):
        RunSettings(benchmark="synthetic", conditions=["dense"], n=2, colour="red")


def test_every_committed_cell_json_reads_back_to_the_record_it_holds():
    """`cell.json` keeps its committed names (`n_agents`, the item draw as `extra`) while the cell's
    fields are the run settings' (`agents`, `item_seed`): reading a committed record and writing it
    again gives what the folder holds, so every committed run still resumes and is still found."""
    import json

    from bcr_core.arena.run import ArenaCell
    from bcr_core.paths import RESULTS

    paths = sorted(RESULTS.rglob("cell.json"))
    assert len(paths) >= 15
    for path in paths:
        found = json.loads(path.read_text())
        cell = (ArenaCell if "selectors" in found else Cell).from_record(found)
        written = json.loads(json.dumps(run_writer.identity(cell.record())))
        # an arena's selectors are relabelled by the registry (`oracle`, its old name, is `kv-error`)
        assert written.pop("selectors", None) is None or "selectors" in found
        assert written == {k: v for k, v in run_writer.identity(found).items() if k != "selectors"}, path


def test_first_item_serves_a_later_slice_and_older_folders_keep_their_identity(tmp_path):
    """`first_item` serves items first_item .. first_item+n-1 of the benchmark's order (a calibration reads
    tasks its cell never does); a folder written before the setting existed is still the cell at 0, and a
    cell at another first item is refused by it."""
    import json
    import shutil

    from bcr_core.data import benchmarks
    from bcr_core.paths import RESULTS

    later = benchmarks.load_items("humaneval", 24, first=140)
    assert [t["task_id"] for t in later] == [f"HumanEval/{i}" for i in range(140, 164)]
    assert [it["id"] for it in benchmarks.load_items("synthetic", 3, first=2, seed=5)] == [
        it["id"] for it in benchmarks.load_items("synthetic", 5, seed=5)[2:]
    ]
    with pytest.raises(UsageError, match="--n 25 from item 140 exceeds the 164 items of humaneval"):
        benchmarks.load_items("humaneval", 25, first=140)
    cell = Cell(benchmark="humaneval", agents=3, conditions=["dense"], n=24, first_item=140)
    assert cell.extra == {"first": 140}
    committed = json.loads((RESULTS / "claims-gemma-3-270m" / "gate" / "cell.json").read_text())
    assert "first_item" not in committed
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(RESULTS / "claims-gemma-3-270m" / "gate" / "cell.json", old / "cell.json")
    settings = dict(benchmark="synthetic", agents=3, conditions=committed["conditions"], n=100, max_new_tokens=8)
    run_writer.check_folder(old, Cell(**settings, model="gemma-3-270m"))
    with pytest.raises(UsageError, match="holds a run with other settings"):
        run_writer.check_folder(old, Cell(**settings, model="gemma-3-270m", first_item=5))


def test_dense_served_again_as_the_serial_conditions_are_is_dense_token_for_token(tiny_chat, tmp_path):
    """`dense-again` is Dense recomputed (its own prefills and decodes, never Dense's shared ones) in the
    serial conditions' arrangement; under batch-invariant decoding its every call is Dense's, so the floor of
    every agreement measure reads 100%."""
    cell = Cell(
        benchmark="synthetic",
        agents=2,
        n=5,
        max_new_tokens=10,
        item_seed=3,
        conditions=("dense", "kvcomm@1", "dense-again", "coin-single@0.3:gamma=1,seed=1"),
    )
    items = run_cell(tiny_chat, cell, tmp_path, progress=False, batch=3)
    calls = run_writer.read_jsonl(tmp_path / "calls.jsonl")
    tokens = {(c["condition"], c["item_id"], c["node"]): c["output_tokens"] for c in calls}
    again = {key[1:]: value for key, value in tokens.items() if key[0] == "dense-again"}
    assert len(again) == 5 * 3 and again == {key[1:]: v for key, v in tokens.items() if key[0] == "dense"}
    table = condition_table(items, reference="kvcomm@1")
    assert table.set_index("condition").loc["dense-again", "agrees_dense"] == 1.0
    assert floor_note(table).endswith("agrees with Dense on 100.0%")
    assert floor_note(table[table["condition"] != "dense-again"]).startswith("no dense-again in this cell")
    servers, _ = runner.make_servers(tiny_chat, cell, 3, prefix_prefills=False, share_log_probs=True)
    assert servers["dense-again"].prefills is None and servers["dense"].prefills is not None
