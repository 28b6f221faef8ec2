"""The verdicts of notebook 10 on records whose answers are known, and the compact results format."""

import gzip
import json
from math import comb

import pandas as pd
import pytest

from bcr_core.experiments import claims, claims_grid
from bcr_core.experiments.runner import Cell, run_cell
from bcr_core.paths import RESULTS


def exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar written out: twice the binomial(b + c, 1/2) tail, capped at 1."""
    n, k = b + c, min(b, c)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n)


def test_binary_verdicts_read_the_split_in_the_claimed_direction():
    better = [True] * 10 + [False] * 1 + [True] * 20
    worse = [False] * 10 + [True] * 1 + [True] * 20
    holds = claims.binary_verdict("c", "p", "t", pd.Series(better), pd.Series(worse))
    assert holds.verdict == "holds" and holds.p == pytest.approx(exact_p(10, 1)) and holds.items_needed is None
    assert holds.evidence.startswith("10/1")
    reverse = claims.binary_verdict("c", "p", "t", pd.Series(worse), pd.Series(better))
    assert reverse.verdict == "does not hold"
    close = claims.binary_verdict(
        "c",
        "p",
        "t",
        pd.Series([True, True, True, False, False] + [True] * 15),
        pd.Series([False, False, False, True, True] + [True] * 15),
    )
    assert close.verdict == "undecided" and close.p == pytest.approx(exact_p(3, 2))
    needed = close.items_needed  # at 3:2 per 20 items, a test at that many items separates them
    scale = needed / 20
    assert exact_p(round(3 * scale), round(2 * scale)) < 0.05
    assert exact_p(round(3 * scale / 1.2), round(2 * scale / 1.2)) >= 0.05
    tie = claims.binary_verdict("c", "p", "t", pd.Series([True, False]), pd.Series([False, True]))
    assert tie.verdict == "undecided" and tie.items_needed is None  # 1:1 never separates


def records(outcomes: dict[str, list[bool]], reuse: dict[str, float] | None = None) -> pd.DataFrame:
    """Items where `correct` is the outcome and the final text is Dense's exactly when correct."""
    rows = []
    for condition, hits in outcomes.items():
        for i, hit in enumerate(hits):
            rows.append(
                {
                    "condition": condition,
                    "item_id": str(i),
                    "index": i,
                    "correct": hit,
                    "final_text": "A" if hit else f"wrong {condition}",
                    "reuse_rate": (reuse or {}).get(condition, 0.0),
                }
            )
    return pd.DataFrame(rows)


def test_the_gate_line_holds_on_the_line_and_not_off_it():
    n = 40
    dense, kvcomm = [True] * 30 + [False] * 10, [True] * 20 + [False] * 20  # 75% at reuse 0, 50% at reuse 0.5
    on_line = [True] * 25 + [False] * 15  # 62.5% at reuse 0.25: on the line
    off_line = [True] * 40  # 100% at reuse 0.5: far above it
    items = records(
        {"dense": dense, "kvcomm": kvcomm, "kvcomm@1": on_line, "opengate": off_line},
        {"kvcomm": 0.5, "kvcomm@1": 0.25, "opengate": 0.5},
    )
    assert len(items) == 4 * n
    assert claims.line_verdict(items, "dense", "kvcomm", ["kvcomm@1"]).verdict == "holds"
    off = claims.line_verdict(items, "dense", "kvcomm", ["kvcomm@1", "opengate"])
    assert off.verdict == "does not hold" and "opengate: +50.0 pts" in off.evidence


def test_verdicts_on_known_records():
    n = 60
    dense = [True] * n
    matched = [True] * n  # token-matched Dense reproduces Dense (identical ids)
    kvcomm = [True] * 30 + [False] * 30
    bcr = [True] * 50 + [False] * 10  # beats KVComm on 20 items, loses on none
    coins = {f"coin-chunk:chunk=16,seed={s}": [True] * 32 + [False] * 28 for s in range(3)}
    items = records(
        {
            "dense": dense,
            "token-matched-dense": matched,
            "kvcomm": kvcomm,
            "bcr-chunk:chunk=16": bcr,
            **coins,
            "cacheblend-cost:chunk=16": kvcomm,
        }
    )
    calls = pd.DataFrame(
        [
            {"condition": c, "item_id": str(i), "node": "agent_1", "mode": "dense", "ids_match": True, "fidelity": {}}
            for c in items["condition"].unique()
            for i in range(n)
        ]
    )
    table = claims.verdicts(items, calls, "bcr-chunk:chunk=16", cacheblend="cacheblend-cost:chunk=16").set_index(
        "claim"
    )
    assert table.loc["reuse costs Dense-agreement", "verdict"] == "holds"  # 30/0
    assert table.loc["BCR-chunk beats KVComm", "verdict"] == "holds"
    assert table.loc["BCR-chunk beats KVComm", "p"] == pytest.approx(exact_p(20, 0))
    assert table.loc["draft beats coin at chunk granularity", "verdict"] == "holds"  # 18/0 against each seed
    assert table.loc["BCR beats CacheBlend at matched cost", "verdict"] == "holds"
    assert table.loc["the tokenization term is separable", "verdict"] == "holds"
    assert table.loc["full repair equals Dense", "verdict"] == "not measured"
    assert table.loc["the gate only slides along Equation 3's line", "verdict"] == "not measured"


def test_compact_results_drop_id_lists_and_load_back(tiny_chat, tmp_path):
    cell = Cell(
        "synthetic",
        2,
        ("dense", "kvcomm:gamma=1", "bcr-single:gamma=1,skip=off"),
        3,
        max_new_tokens=3,
        extra={"seed": 7},
    )
    run_cell(tiny_chat, cell, tmp_path / "run", progress=False)
    assert claims_grid.export_compact(tmp_path / "run", tmp_path / "results" / "cell") == 9
    with gzip.open(tmp_path / "results" / "cell" / "calls.jsonl.gz", "rt") as f:
        compact = [json.loads(line) for line in f]
    full = [json.loads(line) for line in (tmp_path / "run" / "calls.jsonl").read_text().splitlines()]
    assert len(compact) == len(full) and not any(k in c for c in compact for k in claims_grid.ID_LISTS)
    for small, big in zip(compact, full):
        assert small["cached_rows"] == len(big["merged_ids"]) - 1
        assert small["ids_match"] == (big["dense_ids"] == big["merged_ids"])
        assert small["rows_recomputed"] == len(big["repaired_rows"])
    items, calls = claims_grid.load_runs(tmp_path / "results")
    assert len(items) == 9 and len(calls) == len(full) and set(items["run"]) == {"cell"}
    table = claims_grid.grid_table(items, calls, list(cell.conditions), reference="kvcomm:gamma=1")
    assert table.set_index("condition").loc["dense", "agrees_dense"] == 1.0
    claims_grid.export_compact(tmp_path / "run", tmp_path / "results" / "again")  # the same condition twice
    with pytest.raises(ValueError, match=r"holds \S+ on item \S+ in more than one run \(again, cell\)"):
        claims_grid.load_runs(tmp_path / "results")


def test_the_committed_results_give_the_committed_verdicts():
    """results/claims holds compact records that notebook 10 reads by default; the verdicts the README
    shows must be what the code computes from them (a change to either is caught here)."""

    root = RESULTS / "claims"
    data = claims_grid.load_claims(root)
    grid = claims_grid.ClaimsGrid()
    table = claims_grid.grid_table(data["items"], data["calls"], grid.main())
    assert len(table) == len(grid.main()) and table["n"].nunique() == 1 and table["n"].iloc[0] >= 60
    predicted = table[table["condition"].str.contains("rank=predicted")]
    assert (predicted["rows_wasted_per_call"] == 0).all() and (predicted["rows_per_call"] > 0).all()
    fresh = claims.verdicts(
        data["items"],
        data["calls"],
        grid.bcr,
        cacheblend=grid.cacheblend,
        gate_settings=grid.gate(),
        curve=data["curve"],
        verify=data["verify"],
    )
    committed = pd.read_csv(root / "verdicts.csv")
    assert fresh["claim"].tolist() == committed["claim"].tolist()
    assert fresh["verdict"].tolist() == committed["verdict"].tolist()
    readme = (root.parent.parent / "README.md").read_text()
    for row in committed.itertuples():
        assert f"| {row.claim} | **{row.verdict}** |" in readme


@pytest.mark.real_model
def test_a_rerun_reproduces_the_committed_records(real, tmp_path):
    """The first five items of the committed grid (the fifth is the first served from an assembled
    cache), rerun by today's code: every call's tokens, route, gate decisions and repaired rows as
    committed. A change that moves any of them is a change in behaviour, not in layout. The gate's
    floats (entropy, threshold, anchor weights) are compared within a tolerance, since their last bits
    differ between CPUs; modes, reasons, tokens, rows and every other int or string exactly."""
    from conftest import record_differences

    committed = json.loads((RESULTS / "claims" / "a" / "cell.json").read_text())
    conditions = ("bcr-chunk:chunk=16", "coin-chunk:chunk=16,seed=0")
    cell = Cell(
        "synthetic", committed["n_agents"], conditions, 5, committed["max_new_tokens"], extra=committed["extra"]
    )
    run_cell(real, cell, tmp_path, progress=False)
    fresh = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    with gzip.open(RESULTS / "claims" / "a" / "calls.jsonl.gz", "rt") as f:
        wanted = {
            (c["condition"], c["item_id"], c["node"]): c for c in map(json.loads, f) if c["condition"] in conditions
        }
    keys = ("mode", "reason", "output_tokens", "rows_recomputed", "rows_wasted", "skipped", "decisions", "segment_map")
    assert len(fresh) == 2 * 5 * 4 and any(c["mode"] == "reuse" and c["rows_recomputed"] for c in fresh)
    for call in fresh:
        old = wanted[(call["condition"], call["item_id"], call["node"])]
        where = (call["condition"], call["item_id"], call["node"])
        assert record_differences({k: call[k] for k in keys}, {k: old[k] for k in keys}) == [], where
