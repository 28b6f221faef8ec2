"""An arena split across lanes (`--shard K/M`) and merged: the merged folder holds the records one
process writes, each lane measures exactly its share, and lanes that served an item otherwise, or
that are not the M shares of one run, are refused."""

from __future__ import annotations

import json
import shutil

import pytest

from bcr_core.arena.run import make_arena_cell, run_arena
from bcr_core.arena.shards import merge
from bcr_core.cli import main
from bcr_core.errors import UsageError
from bcr_core.run_folder import read_jsonl
from tests.conftest import record_differences

SETTINGS = dict(agents=2, max_new_tokens=4, item_seed=34, gamma=1.0, selectors="draft,coin:seed=0")
N = 4  # items 0 and 1 warm KVComm's pool; 2 and 3 are served from assembled caches, one per lane


TIMED = {"ttft_s", "total_s", "assembly_s", "ttft_s_mean", "ms", "seconds"}  # clocks differ run to run


def untimed(record):
    if isinstance(record, dict):
        return {k: untimed(v) for k, v in record.items() if k not in TIMED}
    return [untimed(v) for v in record] if isinstance(record, list) else record


@pytest.fixture(scope="module")
def runs(tiny_chat, tmp_path_factory):
    """The run in one process, and the same run as two lanes."""
    root = tmp_path_factory.mktemp("split")
    run_arena(tiny_chat, make_arena_cell(n=N, **SETTINGS), root / "whole", progress=False)
    for k in (0, 1):
        run_arena(tiny_chat, make_arena_cell(n=N, **SETTINGS, shard=f"{k}/2"), root / f"lane{k}", progress=False)
    return root


def measured_items(folder) -> set[int]:
    index = {r["item_id"]: r["index"] for r in read_jsonl(folder / "items.jsonl")}
    return {index[c["item_id"]] for c in read_jsonl(folder / "calls.jsonl") if "arena" in c}


def test_each_lane_measures_the_items_of_its_share_and_serves_every_item(runs):
    whole = measured_items(runs / "whole")
    assert whole == {2, 3}, "the fixture needs an assembled call in each lane's share"
    assert measured_items(runs / "lane0") == {2} and measured_items(runs / "lane1") == {3}
    for k in (0, 1):
        assert [r["index"] for r in read_jsonl(runs / f"lane{k}" / "items.jsonl")] == list(range(N))


def test_merged_lanes_hold_the_records_one_process_writes(runs, tmp_path):
    assert merge([runs / "lane1", runs / "lane0"], tmp_path / "merged") == N  # lanes in any order
    for name in ("items.jsonl", "calls.jsonl"):
        merged = [untimed(r) for r in read_jsonl(tmp_path / "merged" / name)]
        whole = [untimed(r) for r in read_jsonl(runs / "whole" / name)]
        assert record_differences(merged, whole) == []
    assert json.loads((tmp_path / "merged" / "cell.json").read_text()) == json.loads(
        (runs / "whole" / "cell.json").read_text()
    )  # no shard: the merged folder is an ordinary arena run, resumable as one


def test_a_lane_behind_the_other_merges_the_items_both_shares_reach(runs, tmp_path):
    lane = tmp_path / "lane1"
    shutil.copytree(runs / "lane1", lane)
    items = read_jsonl(lane / "items.jsonl")
    (lane / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items[:3]))  # item 3 not yet done
    assert merge([runs / "lane0", lane], tmp_path / "merged") == 3
    assert [r["index"] for r in read_jsonl(tmp_path / "merged" / "items.jsonl")] == [0, 1, 2]


def test_a_lane_that_served_an_item_otherwise_is_refused(runs, tmp_path):
    lane = tmp_path / "lane1"
    shutil.copytree(runs / "lane1", lane)
    calls = read_jsonl(lane / "calls.jsonl")
    served = next(c for c in calls if c["item_id"] == read_jsonl(lane / "items.jsonl")[2]["item_id"])
    served["output_tokens"][0] += 1  # an item lane 0 measures, served otherwise by lane 1
    (lane / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    with pytest.raises(UsageError, match=r"item 2 \(call .*output_tokens\[0\]"):
        merge([runs / "lane0", lane], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_lanes_that_are_not_the_shares_of_one_run_are_refused(runs, tmp_path):
    with pytest.raises(UsageError, match="2 lanes need shards 0/2 to 1/2, got 0/2, 0/2"):
        merge([runs / "lane0", runs / "lane0"], tmp_path / "merged")
    with pytest.raises(UsageError, match="1 lanes need shards 0/1"):
        merge([runs / "lane0"], tmp_path / "merged")
    with pytest.raises(UsageError, match="got 0/2, none"):
        merge([runs / "lane0", runs / "whole"], tmp_path / "merged")
    other = tmp_path / "other"
    shutil.copytree(runs / "lane1", other)
    settings = json.loads((other / "cell.json").read_text())
    (other / "cell.json").write_text(json.dumps(settings | {"max_new_tokens": 5}))
    with pytest.raises(UsageError, match="is a lane of another run"):
        merge([runs / "lane0", other], tmp_path / "merged")
    with pytest.raises(UsageError, match="is one of the lanes"):
        merge([runs / "lane0", runs / "lane1"], runs / "lane0")


@pytest.mark.parametrize("shard, problem", [("2/2", "K must be in 0..M-1"), ("1-2", "--shard is K/M")])
def test_a_malformed_shard_is_refused_before_any_folder_is_touched(tmp_path, capsys, shard, problem):
    assert main(["arena", "--n", "4", "--shard", shard, "--out", str(tmp_path / "lane")]) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "lane").exists()


def test_a_lane_resumed_as_another_share_is_refused(tiny_chat, runs, tmp_path):
    shutil.copytree(runs / "lane0", tmp_path / "lane")
    with pytest.raises(UsageError) as refused:
        run_arena(tiny_chat, make_arena_cell(n=N, **SETTINGS, shard="1/2"), tmp_path / "lane", progress=False)
    assert str(refused.value) == (  # the one setting that differs, not the whole of both
        f"{tmp_path / 'lane'} holds a run with other settings (shard: '0/2' there, '1/2' now); use another --out "
        "or delete it"
    )
