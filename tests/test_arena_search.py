"""The searched ceiling on a tiny random model: the space is what the chunk layout can spend (every
order of chunks written out), exhaustive search is brute force over that space (each set repaired
and its KL computed here by hand), the local search never ends worse than its best seed, at rho = 1
the searched set is every row and reproduces token-matched Dense, and on an arena run's records the
searched KL is at most every selector's on every call and budget."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from bcr_core.arena import ceiling, measures, search
from bcr_core.arena.copies import PAIRED, ArenaCall, DenseReference, run_call
from bcr_core.arena.registry import make_entries
from bcr_core.arena.run import make_arena_cell, run_arena
from bcr_core.run_folder import read_jsonl
from tests.test_arena import IDS, SPANS, M, assembled  # noqa: F401  (the shared fixture)

CHUNK, TOKENS = 8, 4
FIELD = "kv-error,draft,coin:seed=0,cacheblend,seams,window"
SEARCHER = "searched:cap=8,evals=6"  # small: the run's searches mostly local


def spendable(m: int, rows: int, chunk: int) -> set[tuple[int, ...]]:
    """Every set the chunk layout can spend at `rows`, written out: chunks in every order, their rows
    concatenated in that order, the first `rows` taken."""
    chunks = [list(range(s, min(s + chunk, m))) for s in range(0, m, chunk)]
    return {tuple(sorted([j for c in order for j in c][:rows])) for order in itertools.permutations(chunks)}


def kl_by_hand(tiny, kv, tokens, dense_logits) -> float:
    """Mean over Dense's steps of sum_v p(v) (log p(v) - log q(v)), p Dense's, q the copy's."""
    p = dense_logits.log_softmax(-1)
    q = tiny.forced_logits(kv, IDS[-1], tokens).log_softmax(-1)
    return float((p.exp() * (p - q)).sum(-1).mean())


@pytest.fixture(scope="module")
def dense(tiny, assembled):  # noqa: F811
    exact, _ = assembled
    tokens = tiny.generate(exact, IDS[-1], TOKENS).tokens
    assert len(tokens) == TOKENS  # no early stop: the KL runs over every step
    record = SimpleNamespace(served=(exact, IDS[-1]), output_tokens=tokens)
    return tokens, DenseReference(tiny, record, TOKENS), tiny.forced_logits(exact, IDS[-1], tokens)


def arena_call(tiny, kv, reference, selectors: str, rhos, paired: int = 16) -> dict:
    return run_call(
        tiny, ArenaCall(kv, IDS, SPANS, paired, (0, 0)), reference, make_entries(selectors, CHUNK), rhos, CHUNK
    )


def entry(result, selector, budget):
    return next(e for e in result["entries"] if e["selector"].split(":")[0] == selector and e["budget"] == budget)


@pytest.mark.parametrize("rows", [1, 7, 8, 12, 15, 16, 23, 31, 38, 39])
def test_the_space_is_every_set_the_chunk_layout_can_spend(rows):
    listed = list(search.chunk_space(M, rows, CHUNK))
    assert len(listed) == len(set(listed))  # each set once
    assert set(listed) == spendable(M, rows, CHUNK)
    assert search.space_size(M, rows, CHUNK) == len(listed)


def test_a_move_takes_the_donors_last_rows_into_the_receivers_first_free_rows():
    moved = {(d, r): s for d, r, s in search.moves((0, 1, 2, 3, 9), 20, 4)}
    assert moved[0, 2] == (0, 8, 9, 10, 11)  # 3 free rows in chunk 2: rows 1..3 leave, 8, 10, 11 enter
    assert (2, 0) not in moved and moved[2, 4] == (0, 1, 2, 3, 16)
    assert len(moved) == 2 * 4 - 1  # donors 0 and 2; receivers: every chunk with room but the donor
    assert search.runs((0, 1, 2, 5, 7, 8)) == [[0, 3], [5, 6], [7, 9]]
    assert search.rows_of([[0, 3], [5, 6]]) == [0, 1, 2, 5]


@pytest.mark.parametrize("rho", [0.3, 0.4])
def test_exhaustive_search_is_brute_force_over_the_space(tiny, assembled, dense, rho):  # noqa: F811
    _, kv = assembled
    tokens, reference, dense_logits = dense
    count = round(rho * M)
    result = arena_call(tiny, kv, reference, FIELD + ",searched:cap=1000", [rho])
    brute = {}
    for rows in sorted(spendable(M, count, CHUNK)):  # every set of the space, repaired and measured here
        brute[rows] = kl_by_hand(tiny, tiny.repair(kv, IDS[:-1], list(rows)), tokens, dense_logits)
    found = entry(result, "searched", f"{rho:g}")
    record = result["search"]["searched:cap=1000"][f"{rho:g}"]
    assert record["case"] == "exhaustive" and record["optimum"] and record["space"] == len(brute)
    assert record["space_kl"] == pytest.approx(min(brute.values()), rel=1e-4, abs=1e-7)
    seeds = [e for e in result["entries"] if e["budget"] == f"{rho:g}" and e["selector"][:8] != "searched"]
    assert found["kl"] == pytest.approx(min([min(brute.values())] + [e["kl"] for e in seeds]), rel=1e-4, abs=1e-7)
    if record["from"] == "space":
        assert tuple(search.rows_of(found["runs"])) == min(brute, key=brute.get)
    assert record["evaluations"] <= len(brute) and found["rows"] == count


@pytest.mark.parametrize("evals", [0, 5, 20])
def test_the_local_search_never_ends_worse_than_its_best_seed(tiny, assembled, dense, evals):  # noqa: F811
    _, kv = assembled
    tokens, reference, dense_logits = dense
    label = f"searched:cap=1,evals={evals}"
    result = arena_call(tiny, kv, reference, f"{FIELD},{label}", [0.3])
    for budget in (PAIRED, "0.3"):
        found, record = entry(result, "searched", budget), result["search"][label][budget]
        seeds = [e for e in result["entries"] if e["budget"] == budget and e["selector"] != label]
        best_seed = min(e["kl"] for e in seeds if e["rows"] == found["rows"])
        assert record["case"] == "local" and not record["optimum"] and record["evaluations"] <= evals
        assert found["kl"] <= best_seed + 1e-12
        rows = search.rows_of(found["runs"])
        assert kl_by_hand(tiny, tiny.repair(kv, IDS[:-1], rows), tokens, dense_logits) == pytest.approx(
            found["kl"], rel=1e-4, abs=1e-7
        )  # the searched KL is the set's own
        if evals == 0:
            assert record["from"] == "seed" and found["kl"] == best_seed
    assert sum(r["evaluations"] for r in result["search"][label].values()) == result["cost"][label]["passes"]


def test_at_rho_one_the_searched_set_is_every_row_and_reproduces_token_matched_dense(tiny, assembled, dense):  # noqa: F811
    exact, kv = assembled
    tokens, reference, _ = dense
    result = arena_call(tiny, kv, reference, FIELD + ",searched", [1.0])
    found = entry(result, "searched", "1")
    assert found["runs"] == [[0, M]] and found["rows"] == M
    assert found["identical"] and found["kl"] < 1e-6
    assert result["token_matched"]["kl"] < 1e-6  # here Dense is the exact cache itself
    assert tiny.generate(tiny.repair(kv, IDS[:-1], list(range(M))), IDS[-1], TOKENS).tokens == tokens


def comparisons_below_the_searched_set(calls: list[dict], searcher: str) -> int:
    """Written out: per call and budget, no other selector's set at the searched set's row count leaves
    less KL; returns how many such pairs were compared."""
    compared = 0
    for call in calls:
        best = {e["budget"]: e for e in call["arena"]["entries"] if e["selector"] == searcher}
        for e in call["arena"]["entries"]:
            if e["selector"] != searcher and e["rows"] == best[e["budget"]]["rows"]:
                assert best[e["budget"]]["kl"] <= e["kl"], (call["item_id"], e["selector"], e["budget"])
                compared += 1
    return compared


def test_on_an_arena_runs_records_the_searched_kl_is_at_most_every_selectors(tiny_chat, tmp_path):
    cell = make_arena_cell(
        n=3,
        agents=2,
        max_new_tokens=4,
        item_seed=34,
        gamma=1.0,
        rhos=(0.1, 0.3),
        selectors=f"draft,coin,seams,{SEARCHER}",
    )
    run_arena(tiny_chat, cell, tmp_path, progress=False)
    calls = read_jsonl(tmp_path / "calls.jsonl")
    searched = [c for c in calls if "arena" in c]
    assert searched, "no call was served from an assembled cache"
    assert comparisons_below_the_searched_set(searched, SEARCHER) > 0
    assert ceiling.violations(calls).empty
    cost = ceiling.search_cost(calls)
    assert set(cost["budget"]) == {PAIRED, "0.1", "0.3"}
    assert (cost["exhaustive"] + cost["local"] + cost["none"]).tolist() == pytest.approx([1.0] * len(cost))
    made = ceiling.composition(calls)
    assert made[list(ceiling.REGIONS)].sum(axis=1).to_numpy() == pytest.approx(1.0)
    on_cache = made[made["selector"] == ceiling.CACHE].iloc[0]
    assert on_cache["runs"] == 1 and on_cache["prefix"] > 0
    jaccard = ceiling.overlap(calls)
    assert ((jaccard >= 0) & (jaccard <= 1)).all().all()
    reached = ceiling.reach(calls).set_index("budget")
    assert (reached["searched"] <= reached["unrepaired"] + 1e-12).all()
    frame = measures.arena_frame(calls)
    per, overall = measures.gap_share(frame)
    assert (per.drop(columns=[SEARCHER]).stack() <= 1 + 1e-9).all()  # no selector passes the ceiling
    assert "searched" not in " ".join(measures.verdicts(frame)["claim"])


def composed_call(docstring=None) -> dict:
    """One searched call: an exact prefix [0, 4), the question [4, 12) and template text [12, 16); a selector's
    set of rows 2..9 (two on the prefix, six in the question)."""
    spans = [
        {"name": "prefix", "start": 0, "stop": 4, "placeholder": False},
        {"name": "user_question", "start": 4, "stop": 12, "placeholder": True},
        {"name": "after:user_question", "start": 12, "stop": 16, "placeholder": False},
    ]
    entry = {"selector": "draft", "budget": PAIRED, "rows": 8, "runs": [[2, 10]], "kl": 0.1}
    arena = {"cached_rows": 16, "search": {SEARCHER: {}}, "entries": [entry]}
    return {"item_id": "t", "node": "agent_2", "segment_map": spans, "arena": arena | (docstring or {})}


def test_a_code_questions_docstring_rows_are_their_own_region():
    """Rows 7..10 are the question's docstring: of the set's 8 rows, 2 on the prefix, 3 on the question's code
    (4, 5, 6) and 3 on its docstring (7, 8, 9); of the cache's 16, 4 docstring rows, 4 code rows."""
    made = ceiling.composition([composed_call({"docstring": [[7, 11]]})]).set_index(["selector", "budget"])
    draft, cache = made.loc[("draft", PAIRED)], made.loc[(ceiling.CACHE, "")]
    assert (draft["prefix"], draft["question"], draft["docstring"], draft["template"]) == (2 / 8, 3 / 8, 3 / 8, 0)
    assert (cache["question"], cache["docstring"], cache["template"]) == (4 / 16, 4 / 16, 4 / 16)
    plain = ceiling.composition([composed_call()])
    assert "docstring" not in plain and plain.loc[plain["selector"] == "draft", "question"].item() == 6 / 8


def test_the_ceiling_s_share_of_kvcomm_s_kl_is_read_against_kvcomm_not_the_reachable():
    """Two items, KVComm's KL 0.010 and 0.030, the searched set's 0.004 and 0.012, token-matched Dense's (the tax
    no rows repair) 0.002 and 0.006: of KVComm's KL the set recovers (0.006 + 0.018) / (0.010 + 0.030) = 60%, of
    the reachable (0.024) / (0.008 + 0.024) = 75%."""
    calls = []
    for item, (kvcomm, found, tax) in enumerate([(0.010, 0.004, 0.002), (0.030, 0.012, 0.006)]):
        entry = {"selector": SEARCHER, "budget": "0.2", "rows": 4, "rows_wasted": 0, "kl": found, "runs": [[0, 4]]}
        arena = {"cached_rows": 16, "item_index": item, "items": 2, "search": {SEARCHER: {}}, "entries": [entry]}
        arena |= {
            "unrepaired": {"kl": kvcomm},
            "token_matched": {"kl": tax},
            "cost": {SEARCHER: {"passes": 1, "ms": 1}},
        }
        calls.append({"item_id": f"t{item}", "node": "agent_2", "segment_map": [], "arena": arena})
    row = ceiling.reach(calls).set_index("budget").loc["0.2"]
    assert row["recovered"] == pytest.approx(0.60) and row["reached"] == pytest.approx(0.75)
    assert row["recovered_lo"] <= 0.60 <= row["recovered_hi"] and row["lo"] <= 0.75 <= row["hi"]


@pytest.mark.parametrize("folder", ["arena-gemma-3-270m-bos", "arena", "arena-qwen2.5-coder-0.5b-humaneval"])
def test_in_the_committed_records_no_selector_leaves_less_kl_than_the_searched_set(folder):
    """Every committed call and budget: no selector's set at the searched set's row count leaves less KL."""
    from bcr_core.paths import RESULTS
    from bcr_core.run_folder import read_calls

    calls = [c for c in read_calls(RESULTS / folder / "calls.jsonl") if "arena" in c]
    assert len(calls) > 40
    assert comparisons_below_the_searched_set(calls, "searched") > 10 * len(calls)


def test_records_that_call_the_kv_error_rankings_oracles_read_under_todays_names():
    call = {"item_id": "i0", "node": "agent_1"}
    entries = [
        {"selector": s, "budget": PAIRED, "rows": 8, "rows_wasted": 0, "kl": 0.1, "first_token_agree": True}
        | {"identical": True}
        for s in ("oracle", "oracle-attn", "oracle:rank=predicted", "coin:seed=0")
    ]
    cost = {e["selector"]: {"passes": 1, "ms": 2.0} for e in entries}
    call["arena"] = {"cached_rows": 40, "entries": entries, "cost": cost, "item_index": 0, "items": 1}
    frame = measures.arena_frame([call])
    assert list(frame["selector"]) == ["kv-error", "kv-error-attn", "kv-error:rank=predicted", "coin:seed=0"]
    assert frame["kl"].tolist() == [0.1] * 4 and frame["passes"].tolist() == [1] * 4
    assert measures.ceiling_of(measures.per_item(frame).columns) == "kv-error"


def test_the_gap_share_is_read_against_the_searched_ceiling_where_the_records_hold_it():
    from tests.test_arena import fake_calls

    kl = {"searched": [0.1, 0.2, 0.1, 0.2], "kv-error": [0.3, 0.2, 0.5, 0.4], "coin:seed=0": [1.0, 1.2, 0.9, 1.1]}
    kl["draft"] = [0.55, 0.7, 0.6, 0.8]
    per, overall = measures.gap_share(measures.arena_frame(fake_calls(kl)))
    coin, ceiling_kl = kl["coin:seed=0"], kl["searched"]
    for name in ("draft", "kv-error"):  # (coin - selector) / (coin - searched), per item and of the means
        written = [(c - v) / (c - s) for c, v, s in zip(coin, kl[name], ceiling_kl)]
        assert per[name].tolist() == pytest.approx(written)
        mean = lambda v: sum(v) / len(v)
        share = (mean(coin) - mean(kl[name])) / (mean(coin) - mean(ceiling_kl))
        row = overall.set_index("selector").loc[name]
        assert row["gap_share"] == pytest.approx(share) and row["lo"] <= share <= row["hi"]
    assert overall.set_index("selector").loc["searched", "gap_share"] == pytest.approx(1.0)


def test_the_ceiling_line_says_its_shares_are_upper_bounds_with_the_shares_the_records_give():
    """Four paired calls: one searched exhaustively, three locally of which one stopped at the cap:
    the line under the selector table reads 25% exhaustive, 75% local, 33% stopped at the cap."""
    from bcr_core.arena.report import bound_line

    cases = [("exhaustive", None), ("local", True), ("local", True), ("local", False)]
    calls = [
        {
            "item_id": str(i),
            "arena": {
                "search": {
                    "searched": {
                        PAIRED: {"case": case, "local_optimum": stop, "space": 10, "evaluations": 8, "seconds": 1.0},
                        "0.4": {"case": "local", "local_optimum": True, "space": 99, "evaluations": 48, "seconds": 2.0},
                    }
                }
            },
        }
        for i, (case, stop) in enumerate(cases)
    ]
    line = bound_line(calls)
    assert "exhaustively on 25% of the paired calls and locally on 75%, of which 33% stopped at the" in line
    assert "upper bound" in line
