"""The verdicts of notebook 10 on records whose answers are known, and the compact results format."""

import gzip
import json
from dataclasses import replace
from math import comb

import numpy as np
import pandas as pd
import pytest

from bcr_core import run_folder
from bcr_core.analysis.claims import line, protocol, synthetic, tax
from bcr_core.analysis.reports import claims_grid, claims_report
from bcr_core.analysis.reports.summary import GRID, condition_table
from bcr_core.analysis.statistics import inference, power
from bcr_core.errors import UsageError
from bcr_core.paths import CHECKOUT, RESULTS
from bcr_core.runs.cell import Cell
from bcr_core.runs.runner import run_cell


def exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar written out: twice the binomial(b + c, 1/2) tail, capped at 1."""
    n, k = b + c, min(b, c)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n)


def test_a_binary_claim_reads_one_exact_mcnemar_in_the_claimed_direction():
    better = [True] * 10 + [False] * 1 + [True] * 20
    worse = [False] * 10 + [True] * 1 + [True] * 20
    row = protocol.decide(
        protocol.binary_claim("c", "p", "correct", "t", pd.Series(better), pd.Series(worse)) | holm_alone
    )
    assert row.verdict == "holds" and row.p == pytest.approx(exact_p(10, 1))
    assert row.effect == pytest.approx(9 / 31) and row.evidence.startswith("10/1")
    assert row.ci_lo < row.effect < row.ci_hi and row.items_needed is None  # decided: no power line
    reverse = protocol.binary_claim("c", "p", "correct", "t", pd.Series(worse), pd.Series(better)) | holm_alone
    assert protocol.decide(reverse).verdict == "does not hold" and reverse.effect < 0
    close = protocol.binary_claim(
        "c",
        "p",
        "correct",
        "t",
        pd.Series([True, True, True, False, False] + [True] * 15),
        pd.Series([False, False, False, True, True] + [True] * 15),
    )
    assert protocol.decide(close | holm_alone).verdict == "undecided" and close.p == pytest.approx(exact_p(3, 2))
    post = close.items_needed_post_hoc  # post hoc: 80% power at the observed rates
    assert power.mcnemar_power(3 / 20, 2 / 20, post) >= 0.8 > power.mcnemar_power(3 / 20, 2 / 20, post - 1)
    # prospective: at the stated 3-point effect and the observed discordance (25%), p10 - p01 = 0.03
    ahead = close.items_needed
    assert power.mcnemar_power(0.14, 0.11, ahead) >= 0.8 > power.mcnemar_power(0.14, 0.11, ahead - 1)


class HolmAlone:
    """`row | holm_alone`: the row as the only member of its family (adjusted p = raw p)."""

    def __ror__(self, row):
        row.p_holm = row.p
        return row


holm_alone = HolmAlone()


def test_the_verdict_is_read_from_the_holm_adjusted_p():
    rows = [
        protocol.binary_claim("a", "", "correct", "", pd.Series([True] * 9 + [False] * 11), pd.Series([False] * 20)),
        protocol.binary_claim(
            "b", "", "correct", "", pd.Series([True] * 6 + [False] * 14), pd.Series([False] * 20)
        ),  # raw p 0.031, second of three: Holm doubles it
        protocol.binary_claim("c", "", "correct", "", pd.Series([True, False] * 10), pd.Series([False, True] * 10)),
    ]
    for row, adjusted in zip(rows, inference.holm([r.p for r in rows])):
        row.p_holm = adjusted
        protocol.decide(row)
    assert rows[1].p < 0.05 < rows[1].p_holm and rows[1].verdict == "undecided"
    assert rows[0].verdict == "holds" and rows[0].p_holm == pytest.approx(3 * exact_p(9, 0))


def records(outcomes: dict[str, list[bool]], reuse: dict[str, float] | None = None, kl=None) -> pd.DataFrame:
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
                    "kl_mean": (kl or {}).get(condition, [0.0] * len(hits))[i],
                }
            )
    return pd.DataFrame(rows)


def test_the_gate_line_runs_through_dense_and_unconditional_reuse_within_the_papers_margin():
    """Equation 3's line as Fig. 2b draws it, through Dense (reuse 0) and unconditional reuse (reuse 1),
    within the paper's 1.6 points: Dense 80%, unconditional reuse 50%, so the line at reuse 0.5 is 65%
    and at reuse 0.25 is 72.5%. A setting on it holds at this n; one 5 points off does not hold; a
    noisy one 1 point off is undecided, with the n its TOST needs."""
    n = 4000

    def first(k):
        return [True] * k + [False] * (n - k)

    outcomes = {"dense": first(3200), "kvcomm@1": first(2000), "kvcomm": first(2600), "kvcomm@0.25": first(2900)}
    scattered = [(7 * i) % n < 2640 for i in range(n)]  # 66%, uncorrelated with the ends: noisy
    outcomes |= {"opengate": first(2800), "kvcomm@0.5": scattered}
    rates = {"kvcomm@1": 1.0, "kvcomm": 0.5, "kvcomm@0.25": 0.25, "opengate": 0.5, "kvcomm@0.5": 0.5}
    items = records(outcomes, rates)

    def read(settings):
        return protocol.decide(line.line_claim(items, "dense", "kvcomm@1", settings, "correct") | holm_alone)

    on = read(["kvcomm", "kvcomm@0.25", "kvcomm@1"])  # the anchor itself is not a free point
    assert on.margin == pytest.approx(0.016) and on.effect == pytest.approx(0.0) and on.verdict == "holds"
    assert "kvcomm@1 (" not in on.evidence and -on.margin < on.tost_lo < on.tost_hi < on.margin
    off = read(["kvcomm", "opengate"])  # 70% where the line says 65%
    assert off.verdict == "does not hold" and "opengate (reuse 0.50): +5.0 pts" in off.evidence
    near = read(["kvcomm@0.5"])  # +1 point: inside the margin, but its 90% interval reaches past it
    assert near.effect == pytest.approx(0.01) and near.verdict == "undecided"
    assert near.tost_lo < near.margin < near.tost_hi and near.items_needed > n
    assert line.line_claim(items, "dense", "kvcomm@1", [], "correct").verdict == "not measured"


def nested(n: int, **right: int) -> pd.DataFrame:
    """Records where condition c is right on its first right[c] items (so each term is known exactly)."""
    return records({c.replace("_", "-"): [True] * k + [False] * (n - k) for c, k in right.items()})


def test_the_gap_decomposition_on_a_table_where_it_is_known():
    """Dense right on all 100 items, token-matched Dense on 80, KVComm on 50, BCR on 60: the tokenization
    term is 20 points, the approximation term 30, the tax 40% of the gap, BCR recovers 10 of the 30
    approximation points (a third) and 10 of the 50-point cost (a fifth), and sits 20 points below
    token-matched Dense: repair has not touched the tax, read within the paper's 1.6 points (the margin of
    Equation 3's line, the paper's number the code must carry; test_counterfactuals.py's
    test_the_level_claims_take_their_margins_from_the_paper checks a repair just inside and just outside it)."""
    items = nested(100, dense=100, token_matched_dense=80, kvcomm=50, bcr=60)
    args = (items, "dense", "token-matched-dense", "kvcomm")
    row = tax.tax_claim(*args, "correct")
    assert row.effect == pytest.approx(0.20) and row.p == pytest.approx(exact_p(20, 0))
    assert "approximation term 30.0 pts" in row.evidence and "tokenization share of the gap 40%" in row.evidence
    approximation = tax.approximation_claim(items, "token-matched-dense", "kvcomm", "correct")
    assert approximation.effect == pytest.approx(0.30) and approximation.p == pytest.approx(exact_p(30, 0))
    untouched = protocol.decide(tax.untouched_claim(items, "token-matched-dense", ["bcr"], "correct") | holm_alone)
    assert untouched.effect == pytest.approx(0.20) and untouched.margin == pytest.approx(0.016)
    assert untouched.verdict == "holds"
    text = tax.recovered_text(items, "token-matched-dense", "kvcomm", "bcr", "correct")
    assert "recovers 10.0 pts of the 30.0 pts approximation term: 33% [" in text
    recovery = line.recovery_claim(items, "dense", "kvcomm", "bcr", "correct")
    assert recovery.effect == pytest.approx(0.2) and recovery.null == 0.5
    assert protocol.decide(recovery | holm_alone).verdict == "does not hold"  # a fifth, not most
    touched = nested(200, dense=200, token_matched_dense=160, kvcomm=100, bcr=200)  # repair past the tax
    over = protocol.decide(tax.untouched_claim(touched, "token-matched-dense", ["bcr"], "correct") | holm_alone)
    assert over.effect == pytest.approx(-0.20) and over.verdict == "does not hold"


def test_repair_lifts_the_line_by_its_residual():
    """BCR at KVComm's reuse rate: its residual above the line through Dense and KVComm is BCR - KVComm."""
    items = records(
        {
            "dense": [True] * 300 + [False] * 100,
            "kvcomm": [True] * 200 + [False] * 200,
            "bcr": [True] * 260 + [False] * 140,
        },
        {"kvcomm": 0.6, "bcr": 0.6},
    )
    assert line.lift_text(items, "dense", "kvcomm", "bcr", "correct").startswith("15.0 pts [")


def test_draft_against_coin_seeds_is_one_control_read_on_the_row_matched_coin():
    n = 60
    draft = [True] * 40 + [False] * 20
    nominal = {f"coin-chunk:chunk=16,seed={s}": [True] * 45 + [False] * 15 for s in range(3)}
    matched = {
        f"coin-chunk:chunk=16,match=bcr-chunk,seed={s}": [True] * (20 + 5 * s) + [False] * (40 - 5 * s)
        for s in range(3)
    }
    items = records({"dense": [True] * n, "bcr-chunk:chunk=16": draft, **nominal, **matched})
    rows = {"bcr-chunk:chunk=16": 20, **dict.fromkeys(nominal, 25), **dict.fromkeys(matched, 20)}
    calls = pd.DataFrame(
        [
            {"condition": c, "item_id": str(i), "mode": "reuse", "rows_recomputed": r, "cached_rows": 100}
            for c, r in rows.items()
            for i in range(n)
        ]
    )
    table = synthetic.verdicts(items, calls, "bcr-chunk:chunk=16").set_index("claim")
    row = table.loc["draft beats coin at chunk granularity"]
    assert "row-matched coin" in row["read_on"] and "25.0 rows" in row["read_on"]  # 20 vs 25 rows: not matched
    share = np.mean([items[items.condition == c]["correct"].to_numpy() for c in matched], axis=0)
    gain = np.array(draft, float) - share  # the draft minus the mean of the seeds, per item
    assert row["effect"] == pytest.approx(gain.mean()) and row["p"] == pytest.approx(inference.sign_flip(gain))
    assert row["rows"].startswith("20.0 vs 20.0 rows/reuse call (20.0% vs 20.0%")
    assert "seed 0: 20/0" in row["evidence"]  # per seed, as description only


def test_verdicts_on_known_records():
    n = 200
    dense = [True] * n
    matched = [True] * n  # token-matched Dense reproduces Dense (identical ids)
    kvcomm = [True] * 100 + [False] * 100
    bcr = [True] * 160 + [False] * 40  # beats KVComm on 60 items, loses on none
    coins = {f"coin-chunk:chunk=16,seed={s}": [True] * 100 + [False] * 100 for s in range(3)}
    kl = {"bcr-chunk:chunk=16": [0.01] * n, "kvcomm": [0.05] * n, "cacheblend-cost:chunk=16": [0.05] * n}
    items = records(
        {
            "dense": dense,
            "token-matched-dense": matched,
            "kvcomm": kvcomm,
            "bcr-chunk:chunk=16": bcr,
            **coins,
            "cacheblend-cost:chunk=16": kvcomm,
        },
        kl=kl | {c: [0.05] * n for c in coins},
    )
    calls = pd.DataFrame(
        [
            {"condition": c, "item_id": str(i), "node": "agent_1", "mode": "dense", "ids_match": True, "fidelity": {}}
            for c in items["condition"].unique()
            for i in range(n)
        ]
    )
    table = synthetic.verdicts(items, calls, "bcr-chunk:chunk=16", cacheblend="cacheblend-cost:chunk=16").set_index(
        "claim"
    )
    assert table.loc["reuse costs accuracy", "verdict"] == "holds"  # 100/0
    assert table.loc["BCR-chunk beats KVComm", "verdict"] == "holds"
    assert table.loc["BCR-chunk beats KVComm", "p"] == pytest.approx(exact_p(60, 0))
    assert "on KL to Dense: +0.0400 [+0.0400, +0.0400]" in table.loc["BCR-chunk beats KVComm", "evidence"]
    assert table.loc["draft beats coin at chunk granularity", "verdict"] == "holds"  # 60/0 against each seed
    assert table.loc["BCR is level with CacheBlend at matched cost", "verdict"] == "does not hold"  # 30 pts apart
    assert table.loc["token-matched Dense is Dense where the ids coincide", "verdict"] == "holds"  # outside Holm
    assert table.loc["reuse pays a tokenization tax", "verdict"] == "undecided"  # 0/0: no tax to find
    assert table.loc["full repair equals Dense", "verdict"] == "not measured"
    assert table.loc["the gate only slides along Equation 3's line", "verdict"] == "not measured"
    ps = table["p"].dropna()
    assert table["p_holm"].dropna().tolist() == pytest.approx(inference.holm(ps.tolist()))


def test_a_grid_with_only_row_matched_controls_reads_its_claims_on_them():
    """A model's grid may run only the row-matched coin and CacheBlend (the Gemma grid does): the coin
    and CacheBlend claims are read on them, and a tokenizer that splits some seam on every item leaves
    the tokenization claim not measured rather than failing."""
    n = 40
    bcr, coin, blend = [True] * 30 + [False] * 10, [True] * 10 + [False] * 30, [True] * 30 + [False] * 10
    coins = {f"coin-chunk:chunk=16,match=bcr-chunk,seed={s}": coin for s in range(3)}
    items = records(
        {
            "dense": [True] * n,
            "token-matched-dense": [True] * n,
            "kvcomm": [True] * n,
            "bcr-chunk:chunk=16": bcr,
            **coins,
            "cacheblend-cost:chunk=16,match=bcr-chunk": blend,
        }
    )
    calls = pd.DataFrame(
        [
            {"condition": c, "item_id": str(i), "mode": "reuse", "rows_recomputed": 20, "cached_rows": 100}
            | {"ids_match": c != "token-matched-dense" or call == 0, "node": f"agent_{call}"}
            for c in items["condition"].unique()
            for i in range(n)
            for call in (0, 1)
        ]
    )
    table = synthetic.verdicts(items, calls, "bcr-chunk:chunk=16", cacheblend="cacheblend-cost:chunk=16").set_index(
        "claim"
    )
    coin_row = table.loc["draft beats coin at chunk granularity"]
    assert coin_row["effect"] == pytest.approx(0.5) and coin_row["read_on"].startswith("row-matched coin")
    blend_row = table.loc["BCR is level with CacheBlend at matched cost"]
    assert (
        blend_row["test"].startswith("BCR-chunk vs cacheblend-cost:chunk=16,match=bcr-chunk:")
        and blend_row["effect"] == 0
    )
    tokenization = table.loc["token-matched Dense is Dense where the ids coincide"]
    assert tokenization["verdict"] == "not measured" and "identical on 50% of calls" in tokenization["evidence"]


def test_committed_records_keep_counts_in_place_of_id_lists_and_load_back(tiny_chat, tmp_path):
    cell = Cell(
        benchmark="synthetic",
        agents=2,
        conditions=("dense", "kvcomm:gamma=1", "bcr-single:gamma=1,skip=off"),
        n=6,
        max_new_tokens=3,
        item_seed=7,
    )
    run_cell(tiny_chat, cell, tmp_path / "run", progress=False)
    assert run_folder.export(tmp_path / "run", tmp_path / "results" / "cell") == 18
    with gzip.open(tmp_path / "results" / "cell" / "calls.jsonl.gz", "rt") as f:
        compact = [json.loads(line) for line in f]
    full = [json.loads(line) for line in (tmp_path / "run" / "calls.jsonl").read_text().splitlines()]
    implied = {"mode", "rows_recomputed", "rows_wasted", "cached_rows", "ids_match", "served_ids"}
    assert not any(k in c for c in full for k in implied)  # a run stores nothing its records imply
    assert any(big["repaired_rows"] for big in full)
    assert len(compact) == len(full)
    for small, big in zip(compact, full):
        assert set(small) == set(big) - {"dense_ids", "merged_ids", "repaired_rows"} | implied - {"mode", "served_ids"}
        assert small["cached_rows"] == len(big["merged_ids"]) - 1
        assert small["ids_match"] == (big["dense_ids"] == big["merged_ids"])
        assert small["rows_recomputed"] == len(big["repaired_rows"])
        prefix = big["segment_map"][0]["stop"]  # the agent's own prefix: the rows KVComm did not predict
        assert small["rows_wasted"] == sum(row < prefix for row in big["repaired_rows"])
    assert any(c["rows_wasted"] for c in compact) and any(c["rows_recomputed"] > c["rows_wasted"] for c in compact)
    items, calls = claims_grid.load_runs(tmp_path / "results")
    assert len(items) == 18 and len(calls) == len(full) and set(items["run"]) == {"cell"}
    table = condition_table(items, "kvcomm:gamma=1", conditions=list(cell.conditions), calls=calls, groups=GRID)
    assert table.set_index("condition").loc["dense", "agrees_dense"] == 1.0
    run_folder.export(tmp_path / "run", tmp_path / "results" / "again")  # the same condition twice
    with pytest.raises(UsageError, match=r"holds \S+ on item \S+ in more than one run \(again, cell\)"):
        claims_grid.load_runs(tmp_path / "results")


def test_the_committed_results_give_the_committed_verdicts():
    """results/claims holds compact records that notebook 10 reads by default; the verdicts
    docs/results.md shows must be what the code computes from them (a change to either is caught here).
    It is a drift check: it holds the verdicts computed from the committed records equal to
    results/claims/verdicts.csv, and the markdown of those verdicts and of the committed grid_table.csv equal
    to the lines of docs/results.md, so it catches a change to the code or to a committed file without judging
    which is right; the verdicts themselves are checked on hand-made records by test_verdicts_on_known_records,
    and the grid table by test_condition_table.py::test_the_grid_table_reads_the_calls_of_paired_items."""
    root = RESULTS / "claims"
    grid = claims_grid.ClaimsGrid()
    tables = claims_report.compute(root, grid)
    table = tables["grid_table"]
    assert len(table) == len(grid.main() + grid.matched() + grid.budgets())
    assert table["n"].nunique() == 1 and table["n"].iloc[0] == 200
    predicted = table[table["condition"].str.contains("rank=predicted")]
    assert (predicted["rows_wasted_per_call"] == 0).all() and (predicted["rows_per_reuse_call"] > 0).all()
    shown_in = (CHECKOUT / "docs" / "results.md").read_text()
    committed = pd.read_csv(root / "verdicts.csv")
    assert tables["verdicts"]["claim"].tolist() == committed["claim"].tolist()
    assert tables["verdicts"]["verdict"].tolist() == committed["verdict"].tolist()
    assert tables["verdicts"]["p_holm"].fillna(-1).tolist() == pytest.approx(committed["p_holm"].fillna(-1).tolist())
    assert not (root / "verdicts_correct.csv").exists()  # one family per model
    shown = claims_report.markdown(tables["verdicts"]) + "\n"
    shown += claims_report.grid_markdown(pd.read_csv(root / "grid_table.csv"))
    for text in shown.splitlines():
        assert text in shown_in, text


def test_a_rerun_reproduces_the_committed_records(real, tmp_path):
    """The first five items of the committed grid (the fifth is the first served from an assembled
    cache), rerun by today's code: every call's tokens, route, gate decisions and repaired rows as
    committed (the counts now derived from the run's own lists, `records.committed`). A change that
    moves any of them is a change in behaviour, not in layout. It is a drift check: it holds today's code
    equal to the records an earlier version of it committed, so it catches a change to either, not an error
    both share. The gate's
    floats (entropy, threshold, anchor weights) are compared within a tolerance, since their last bits
    differ between CPUs; modes, reasons, tokens, rows and every other int or string exactly."""
    from conftest import record_differences

    committed = json.loads((RESULTS / "claims" / "a" / "cell.json").read_text())
    conditions = ("bcr-chunk:chunk=16", "coin-chunk:chunk=16,seed=0")
    cell = replace(Cell.from_record(committed), conditions=conditions, n=5, fidelity=False)
    run_cell(real, cell, tmp_path, progress=False)
    fresh = [run_folder.committed(c) for c in run_folder.read_records(tmp_path / "calls.jsonl")]
    with gzip.open(RESULTS / "claims" / "a" / "calls.jsonl.gz", "rt") as f:
        wanted = {
            (c["condition"], c["item_id"], c["node"]): c for c in map(json.loads, f) if c["condition"] in conditions
        }
    keys = ("reason", "output_tokens", "rows_recomputed", "rows_wasted", "skipped", "decisions", "segment_map")
    keys += ("cached_rows", "ids_match")
    assert len(fresh) == 2 * 5 * 4 and any(c["reason"] == "reuse" and c["rows_recomputed"] for c in fresh)
    for call in fresh:
        old = wanted[(call["condition"], call["item_id"], call["node"])]
        where = (call["condition"], call["item_id"], call["node"])
        assert record_differences({k: call[k] for k in keys}, {k: old[k] for k in keys}) == [], where


def verdict_table(rows, values) -> pd.DataFrame:
    """A verdict table as `claims.verdicts` returns it: rows on accuracy, and per claim its per-item values."""
    table = pd.DataFrame(
        [
            dict(claim=c, verdict=v, measure="correct", effect=e, ci_lo=e - 0.01, ci_hi=e + 0.01, n=n)
            for c, v, e, n in rows
        ]
    )
    table.attrs["per_item"] = values
    return table


def test_a_claim_transfers_only_with_equivalent_effects_and_not_where_they_differ(tmp_path):
    """The transfer table: "yes" where the per-item difference of the two models' effects (paired by
    item) is equivalent within ±3 points (TOST, Holm over the table); "no" where it differs (Holm);
    "not decided" otherwise, same labels or not; "open" where a model has not measured it. Simulated:
    claim a has the same per-item effect on both models, claim b the same mean with per-item noise too
    wide to show equivalence, claim d effects 9 points apart."""
    rng = np.random.default_rng(1)
    ids = [str(i) for i in range(200)]

    def sample(mean, sd=0.05):
        return pd.Series(rng.normal(mean, sd, 200), index=ids)

    small = verdict_table(
        [("a", "holds", 0.02, 200), ("b", "undecided", 0.0, 200), ("c", "holds", 0.01, 200), ("d", "holds", 0.01, 200)],
        {"a": sample(0.02), "b": sample(0.0, 0.5), "c": sample(0.01), "d": sample(0.01)},
    )
    other = verdict_table(
        [("a", "holds", 0.02, 200), ("b", "does not hold", 0.0, 200), ("c", "not measured", 0.0, 0)]
        + [("d", "holds", 0.1, 200)],
        {"a": sample(0.02), "b": sample(0.0, 0.5), "d": sample(0.1)},
    )
    out = claims_report.transfer({"S": small, "G": other}).set_index("claim")
    assert out["transfers"].to_dict() == {"a": "yes", "b": "not decided", "c": "open", "d": "no"}
    assert out.loc["a", "tost_p_holm"] < 0.05 < out.loc["b", "tost_p_holm"] and out.loc["b", "diff_p_holm"] > 0.05
    assert out.loc["d", "diff_lo"] < -0.09 < out.loc["d", "diff"] + 0.01 and out.loc["a", "diff_n"] == 200
    text = claims_report.transfer_markdown(out.reset_index(), ["S", "G"])
    assert "| b | **undecided** (+0.0 pts [-1.0, +1.0], n = 200) | **does not hold** (+0.0 pts" in text
    assert "| ±3 pts |" in text
    labels = claims_report.transfer({"S": small, "G": other}, test_difference=False).set_index("claim")
    assert labels["same verdict"].to_dict() == {"a": "yes", "b": "no", "c": "open", "d": "yes"}
    for run, model in (("x", "gemma-3-270m"), ("y", "gemma-3-270m")):
        (tmp_path / run).mkdir()
        (tmp_path / run / "cell.json").write_text(json.dumps({"model": model}))
    assert claims_report.model_of(tmp_path) == "Gemma 3 270M"
    (tmp_path / "y" / "cell.json").write_text(json.dumps({"model": "default"}))
    with pytest.raises(UsageError, match="runs of 2 models"):
        claims_report.model_of(tmp_path)


def test_with_three_models_each_later_model_is_read_against_the_first_in_one_holm_family():
    """Three models on the same items: claim a has the same per-item effect on all three, claim d the same on
    the first two and 9 points more on the third. Each later model gets its own reading against the first,
    Holm runs over every comparison of the table (so a p-value is never smaller than with the pair alone),
    and the markdown has one column per comparison."""
    rng = np.random.default_rng(2)
    ids = [str(i) for i in range(200)]

    def sample(mean, sd=0.05):
        return pd.Series(rng.normal(mean, sd, 200), index=ids)

    def model(d):
        rows = [("a", "holds", 0.02, 200), ("d", "holds", d, 200)]
        return verdict_table(rows, {"a": sample(0.02), "d": sample(d)})

    tables = {"S": model(0.01), "G": model(0.01), "Q": model(0.10)}
    out = claims_report.transfer(tables).set_index("claim")
    assert out["G vs S: transfers"].to_dict() == {"a": "yes", "d": "yes"}
    assert out["Q vs S: transfers"].to_dict() == {"a": "yes", "d": "no"}
    assert "transfers" not in out  # no unnamed comparison when there are several
    pair = claims_report.transfer({"S": tables["S"], "Q": tables["Q"]}).set_index("claim")
    assert out.loc["d", "Q vs S: diff"] == pytest.approx(pair.loc["d", "diff"])
    assert (out["Q vs S: tost_p_holm"] >= pair["tost_p_holm"] - 1e-12).all()  # four tests in the family, not two
    text = claims_report.transfer_markdown(out.reset_index(), list(tables))
    assert text.splitlines()[0] == (
        "| claim | S | G | Q | G vs S: transfers (difference [95% CI], equivalent within) "
        "| Q vs S: transfers (difference [95% CI], equivalent within) |"
    )
    assert "| no (-8.4 pts [-9.4, -7.4], n = 200, ±3 pts) |" in text


def test_the_committed_gemma_grid_gives_the_documented_grid_table():
    """`claims_report.GEMMA` holds Gemma 3 270M's runs of the same grid; its verdicts are its own Holm family,
    recomputed from its records, and docs/results.md's Gemma grid table is what its folder gives (the
    transfer table, which reads it beside the other two models, is the Qwen coder's test's). It is a drift
    check: it holds the verdicts computed from the committed records equal to the folder's verdicts.csv, and
    the markdown of its committed grid_table.csv equal to the lines of docs/results.md, so it catches a change
    to the code or to a committed file without judging which is right; the verdicts themselves are checked on
    hand-made records by test_a_grid_with_only_row_matched_controls_reads_its_claims_on_them."""
    root = claims_report.GEMMA
    tables = claims_report.compute(root)
    committed = pd.read_csv(root / "verdicts.csv")
    assert tables["verdicts"]["verdict"].tolist() == committed["verdict"].tolist()
    assert tables["verdicts"]["p_holm"].fillna(-1).tolist() == pytest.approx(committed["p_holm"].fillna(-1).tolist())
    assert (
        claims_report.model_of(root) == "Gemma 3 270M" and claims_report.model_of(RESULTS / "claims") == "SmolLM2-135M"
    )
    shown = claims_report.grid_markdown(pd.read_csv(root / "grid_table.csv"))
    shown_in = (CHECKOUT / "docs" / "results.md").read_text()
    for text in shown.splitlines():
        assert text in shown_in, text


def test_a_models_humaneval_cell_beside_its_claims_grid_is_not_read_as_part_of_it(tmp_path):
    """A model's claims folder holds its HumanEval cell in `humaneval/` beside the synthetic grid's cells. Its
    Dense and KVComm are not the grid's: the claims read only runs of the grid's benchmark (here a copy of a
    synthetic cell relabelled HumanEval would otherwise hold Dense on the same items twice, an error)."""
    import shutil

    shutil.copytree(RESULTS / "claims" / "gate", tmp_path / "cell")
    shutil.copytree(RESULTS / "claims" / "gate", tmp_path / "humaneval")
    settings = json.loads((tmp_path / "humaneval" / "cell.json").read_text())
    (tmp_path / "humaneval" / "cell.json").write_text(json.dumps(settings | {"benchmark": "humaneval"}))
    items, _ = claims_grid.load_runs(tmp_path, benchmark="synthetic")
    assert set(items["run"]) == {"cell"} and len(items) == len(claims_grid.load_runs(tmp_path / "cell")[0])
    with pytest.raises(UsageError, match="in more than one run"):
        claims_grid.load_runs(tmp_path)  # both, as before
    assert set(claims_grid.load_claims(tmp_path)["items"]["run"]) == {"cell"}


def test_two_repairs_level_on_pass_fail_items_are_read_by_tangos_test_not_a_t_test():
    """100 items, one of which only BCR-chunk gets: a t-test on the 0/1 differences puts the 90% interval at
    [-0.7, +2.7] points and p near 1e-5, as if one discordant item in a hundred were precise; the discordance
    itself could be near 5% (the exact binomial's one-sided 95% bound for 1 in 100 is 4.6%). Tango's test
    keeps that width: its 90% interval reaches past +4 points and p is about 0.03."""
    n = 100
    bcr, blend = [True] * 51 + [False] * 49, [True] * 50 + [False] * 50
    items = records({"dense": [True] * n, "bcr-chunk:chunk=16": bcr, "cacheblend-cost:chunk=16": blend})
    calls = pd.DataFrame(
        [{"condition": c, "item_id": str(i), "mode": "dense"} for c in items["condition"].unique() for i in range(n)]
    )
    table = synthetic.verdicts(items, calls, "bcr-chunk:chunk=16", cacheblend="cacheblend-cost:chunk=16")
    row = table.set_index("claim").loc["BCR is level with CacheBlend at matched cost"]
    assert "Tango's score tests" in row["test"] and row["effect"] == pytest.approx(0.01)
    assert row["tost_hi"] > 0.04 and row["tost_lo"] < -0.01 and 0.01 < row["p"] < 0.05
    from scipy import stats

    assert row["tost_hi"] > 0.9 * stats.beta.ppf(0.95, 2, n - 1)  # near the exact bound on the discordance


def test_the_committed_qwen_coder_grid_gives_the_documented_three_model_transfer_table():
    """`claims_report.QWEN_CODER` holds the Qwen coder's run of the same grid (bf16, its own prompt rule): its
    verdicts are its own Holm family, recomputed from its records, and docs/results.md shows its verdicts, its
    grid table, the three-model transfer table and the line reading its synthetic family beside its HumanEval
    cell (`humaneval/` in the same folder, which the synthetic family does not read). It is a drift check: it
    holds the verdicts computed from the committed records equal to the folder's verdicts.csv, and the
    markdown the code prints from them equal to the lines of docs/results.md, so it catches a change to the
    code or to a committed file without judging which is right; the transfer table itself is checked on
    simulated models by test_a_claim_transfers_only_with_equivalent_effects_and_not_where_they_differ and
    test_with_three_models_each_later_model_is_read_against_the_first_in_one_holm_family."""
    from bcr_core.analysis.claims import humaneval as humaneval_claims
    from bcr_core.analysis.claims import workload
    from bcr_core.run_folder import RunFolder

    root = claims_report.QWEN_CODER
    tables = claims_report.compute(root)
    committed = pd.read_csv(root / "verdicts.csv")
    assert tables["verdicts"]["verdict"].tolist() == committed["verdict"].tolist()
    assert tables["verdicts"]["p_holm"].fillna(-1).tolist() == pytest.approx(committed["p_holm"].fillna(-1).tolist())
    assert claims_report.model_of(root) == "Qwen2.5-Coder-0.5B"
    assert not tables["grid_table"]["condition"].str.contains("assembly").any()  # no HumanEval condition in it
    folders = [claims_report.SMOLLM2, claims_report.GEMMA, root]
    verdicts = {claims_report.label_of(f): claims_report.compute(f)["verdicts"] for f in folders}
    shown = claims_report.markdown(tables["verdicts"]) + "\n" + claims_report.grid_markdown(tables["grid_table"])
    shown += "\n" + claims_report.transfer_markdown(claims_report.transfer(verdicts), list(verdicts))
    run = RunFolder(root / "humaneval")
    humaneval = humaneval_claims.humaneval_verdicts(pd.DataFrame(run.items()), pd.DataFrame(run.calls()))
    shown += "\n" + workload.workload_line(tables["verdicts"], humaneval)
    shown_in = (CHECKOUT / "docs" / "results.md").read_text()
    for text in shown.splitlines():
        assert text in shown_in, text


def test_the_grid_prints_a_kl_p_at_its_resampling_floor_as_a_bound():
    """A sign-flip p at its floor (1 / (R + 1)) is a bound, not a value: the grid's KL p column prints it as the
    verdict tables do ("< 5e-05"), and a p above the floor as it is."""
    from bcr_core.analysis.reports.summary import KL_RESAMPLES
    from bcr_core.analysis.statistics.inference import sign_flip

    floor = sign_flip([0.01] * 40, resamples=KL_RESAMPLES)  # every item the same sign: no flip reaches it
    assert floor == pytest.approx(1 / (KL_RESAMPLES + 1))
    assert claims_report.kl_p_text(floor) == "< 5e-05"
    assert claims_report.kl_p_text(0.34) == "0.34" and claims_report.kl_p_text(float("nan")) == ""
