"""The HumanEval family (`analysis.claims.humaneval`) can fail, row by row: per-item records of a world where
the paper's HumanEval claims are true read "holds", and worlds where one is false read "does not hold" on
that row (Dense's records in KVComm's place, token-matched Dense's in Dense's, and so on).

The worlds are written out here per item, independently of the module: HumanEval's size (164 tasks) with
every outcome one-sided (a condition passes on its first k items, its code is Dense's on its first a)."""

import pandas as pd
import pytest

from bcr_core.analysis.claims import humaneval as hc

N = 164
BCR, COINS = "bcr-chunk", ["coin-chunk:seed=0", "coin-chunk:seed=1"]
CONDITIONS = ["dense", "token-matched-dense", "kvcomm@1", BCR, *COINS]
# (items passing, items whose final code is Dense's, per-item KL) in the paper's world on HumanEval: nothing
# costs pass@1; the tax changes a third of the final codes; the predicted cache changes more; BCR-chunk
# recovers KL, and its coin less.
PAPER_WORLD = {
    "dense": (66, N, 0.0),
    "token-matched-dense": (66, 110, 0.05),
    "kvcomm@1": (66, 60, 0.40),
    BCR: (66, 105, 0.15),
    COINS[0]: (66, 80, 0.30),
    COINS[1]: (66, 80, 0.30),
}


def world(**changes) -> tuple[pd.DataFrame, pd.DataFrame]:
    spec = PAPER_WORLD | {k.replace("_", "-").replace("kvcomm", "kvcomm@1"): v for k, v in changes.items()}
    items, calls = [], []
    for condition, (passing, agreeing, kl) in spec.items():
        for i in range(N):
            code = "dense code" if i < agreeing else f"{condition} code"
            noise = 0.01 * ((i * 7919) % 13) / 13  # KL varies across items, so a t-test has a spread
            items.append(
                {
                    "condition": condition,
                    "item_id": f"HumanEval/{i}",
                    "correct": i < passing,
                    "answer": code,
                    "final_text": f"```python\n{code}\n```",
                    "kl_mean": kl + noise if condition != "dense" else 0.0,
                }
            )
            repairs = condition.startswith(("bcr", "coin"))
            calls.append(
                {
                    "condition": condition,
                    "item_id": f"HumanEval/{i}",
                    "mode": "reuse" if condition not in ("dense", "token-matched-dense") else "dense",
                    "rows_recomputed": 40 if repairs else 0,
                    "cached_rows": 200,
                }
            )
    return pd.DataFrame(items), pd.DataFrame(calls)


def verdicts(**changes) -> dict[str, str]:
    table = hc.humaneval_verdicts(*world(**changes))
    return dict(zip(table["claim"], table["verdict"]))


def test_the_plan_names_each_row_and_its_measure_before_any_run():
    """The plan was fixed before the cell ran, so it is written out here again: a drift check, which makes any
    change to the pre-registered rows or their measures a visible change to this test (the rows' reading of
    those measures is tested below, in worlds where each is true or false)."""
    assert hc.PLAN == {
        "reuse costs nothing on HumanEval": "correct",
        "no repair damages HumanEval": "correct",
        "reuse pays a tokenization tax": "agrees_code",
        "the approximation costs fidelity": "agrees_code",
        "repair cannot touch the tokenization tax": "agrees_code",
        "BCR-chunk beats KVComm": "kl_mean",
        "draft beats coin at chunk granularity": "kl_mean",
    }


@pytest.mark.parametrize("gap, expected", [(0.02, "holds"), (0.06, "does not hold")])
def test_the_null_rows_margin_is_the_papers_four_points(gap, expected):
    """Table 4(d)'s "inside four points", as behaviour: on 4,000 tasks KVComm trailing Dense by 2 points (every
    discordant task one way) is shown level, and by 6 points is shown not to be (its interval clears the margin)."""
    n = 4000
    passing = {"dense": 2000, "kvcomm@1": 2000 - round(gap * n)}
    items = pd.DataFrame(
        [
            {"condition": c, "item_id": f"t{i}", "correct": i < k, "answer": "x", "final_text": "x", "kl_mean": 0.0}
            for c, k in passing.items()
            for i in range(n)
        ]
    )
    calls = items[["condition", "item_id"]].assign(mode="dense", rows_recomputed=0, cached_rows=100)
    table = hc.humaneval_verdicts(items, calls).set_index("claim")
    assert table.loc["reuse costs nothing on HumanEval", "verdict"] == expected


def test_in_the_papers_world_every_row_holds():
    table = hc.humaneval_verdicts(*world())
    assert dict(zip(table["claim"], table["measure"])) == hc.PLAN
    assert set(table["verdict"]) == {"holds"}, table[["claim", "verdict", "p_holm"]]


@pytest.mark.parametrize(
    "change, row",
    [
        (dict(kvcomm=(36, 60, 0.40)), "reuse costs nothing on HumanEval"),  # reuse costs 18 points
        (dict(bcr_chunk=(30, 105, 0.15)), "no repair damages HumanEval"),  # the repair costs 22 points
        (dict(token_matched_dense=(66, N, 0.05)), "reuse pays a tokenization tax"),  # Dense's records: no tax
        (dict(kvcomm=(66, 140, 0.40), bcr_chunk=(66, 140, 0.15)), "the approximation costs fidelity"),
        (dict(bcr_chunk=(66, N, 0.15)), "repair cannot touch the tokenization tax"),  # Dense's codes in BCR's place
        (dict(bcr_chunk=(66, 105, 0.60)), "BCR-chunk beats KVComm"),
        (dict(bcr_chunk=(66, 105, 0.45)), "draft beats coin at chunk granularity"),
    ],
    ids=["reuse-costs", "repair-damages", "no-tax", "codes-alike", "repair-is-dense", "bcr-worse", "draft-worse"],
)
def test_a_world_where_a_claim_is_false_reads_does_not_hold(change, row):
    found = verdicts(**change)
    assert found[row] == "does not hold", found


def test_a_few_items_that_all_agree_do_not_prove_equivalence():
    """Seven items on which Dense, KVComm and BCR-chunk all pass or all fail: a t-test of the 0/1 differences
    sees zero variance and would read certainty; the null rows must stay undecided (an exact binomial says the
    same: a true 4-point difference leaves all 7 items concordant with probability 0.96^7 = 0.75), and 140
    such items are enough (0.96^140 = 0.3%)."""
    items, calls = world()
    found = {n: found_at(items, calls, n) for n in (7, 140)}
    for n, expected in [(7, "undecided"), (140, "holds")]:
        assert found[n]["reuse costs nothing on HumanEval"] == expected, (n, found[n])
        assert found[n]["no repair damages HumanEval"] == expected, (n, found[n])
    # the same on the one-sided row: seven items where BCR-chunk and token-matched Dense agree on every code
    assert found[7]["repair cannot touch the tokenization tax"] == "undecided"


def found_at(items, calls, n):
    """The family's verdicts on the world's items HumanEval/60 to 60 + n - 1."""
    keep = [f"HumanEval/{i}" for i in range(60, 60 + n)]
    table = hc.humaneval_verdicts(items[items["item_id"].isin(keep)], calls[calls["item_id"].isin(keep)])
    assert (table.loc[table["verdict"] == "undecided", "items_needed"] > 2).all()  # never "2 items would do"
    return dict(zip(table["claim"], table["verdict"]))


def test_every_row_prints_the_items_it_would_need_when_undecided():
    """At 20 items nothing is decided, and each undecided row says how many items 80% power would need."""
    items, calls = world(kvcomm=(60, 60, 0.40))
    keep = [f"HumanEval/{i}" for i in range(0, N, 8)][:20]
    table = hc.humaneval_verdicts(items[items["item_id"].isin(keep)], calls[calls["item_id"].isin(keep)])
    undecided = table[table["verdict"] == "undecided"]
    assert len(undecided) >= 1
    assert undecided["items_needed"].notna().all() or undecided["items_needed_post_hoc"].notna().all()


def test_bcr_report_humaneval_writes_the_family_and_the_seams_of_a_run_folder(tmp_path, capsys, chat_tokenizer):
    """`bcr report humaneval` on a run folder: the family's verdicts.csv, and the seams of token-matched Dense's
    calls counted from their id lists with the folder's model's tokenizer (here the embedded model's)."""
    import json

    from bcr_core.cli import main

    items, calls = world()
    seam = chat_tokenizer("Maria", add_special_tokens=False)["input_ids"]
    apart = [t for piece in ("Ma", "ria") for t in chat_tokenizer(piece, add_special_tokens=False)["input_ids"]]
    assert seam != apart  # the embedded tokenizer splits this text differently at the seam
    calls = calls.assign(node="agent_1", reason="dense", dense_ids=[seam] * len(calls), merged_ids=[apart] * len(calls))
    calls = calls.assign(repaired_rows=[[]] * len(calls), segment_map=[[]] * len(calls))
    (tmp_path / "cell.json").write_text(
        json.dumps({"model": "default", "benchmark": "humaneval", "conditions": CONDITIONS, "n": N})
    )
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items.to_dict("records")))
    (tmp_path / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in calls.to_dict("records")))
    assert main(["report", "humaneval", str(tmp_path)]) == 0
    assert not (tmp_path / "verdicts.csv").exists() and not (tmp_path / "seams.csv").exists()  # it only prints
    printed_alone = capsys.readouterr().out
    assert main(["report", "humaneval", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert printed == printed_alone
    written = pd.read_csv(tmp_path / "out" / "verdicts.csv")
    assert list(written["claim"]) == list(hc.PLAN) and set(written["verdict"]) == {"holds"}
    assert "| reuse costs nothing on HumanEval | pass@1 |" in printed
    counted = pd.read_csv(tmp_path / "out" / "seams.csv")
    assert counted["calls"].sum() == N and counted["share_of_calls"].max() == 1.0  # every call of token-matched Dense
    assert "token-matched-dense's 164 calls; ids identical to Dense's on 0" in printed
    assert "Every condition (description)" in printed and "| `dense` | 164 | " in printed
    assert counted["kind"].tolist() == ["'Maria'"] and counted["reuse_path_split"].tolist() == ['["Ma", "ria"]']
    assert "| `'Maria'` | `'Ma'` + `'ria'` | 164 | 164 (100.0%) |" in printed  # the pieces read back as text
    assert "Partial" not in printed
    # a run still going: KVComm has served 100 of the 164 planned items
    unserved = (items["condition"] == "kvcomm@1") & (items["item_id"].str.split("/").str[1].astype(int) >= 100)
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items[~unserved].to_dict("records")))
    assert main(["report", "humaneval", str(tmp_path)]) == 0
    assert "**Partial**: 100 to 164 of the 164 planned items (" in capsys.readouterr().out


def test_bcr_against_kvcomm_says_the_share_of_the_approximation_it_recovers():
    """KVComm's KL is 0.35 above token-matched Dense's in the paper's world and BCR-chunk's 0.25 below KVComm's:
    it recovers 0.25 / 0.35 = 71% of the approximation term, a positive share since lower KL is better."""
    table = hc.humaneval_verdicts(*world()).set_index("claim")
    assert "recovers 0.2500 of the 0.3500 approximation term: 71% [" in table.loc["BCR-chunk beats KVComm", "evidence"]


@pytest.mark.parametrize(
    "synthetic, change, said",
    [
        ("holds", {}, "workload-specific: a cost on the synthetic task, none on HumanEval"),
        ("holds", dict(kvcomm=(36, 60, 0.40)), "not workload-specific: a cost on both benchmarks"),
        ("does not hold", {}, "no cost on either benchmark"),
        ("undecided", {}, "undecided"),
    ],
    ids=["paper", "cost-on-both", "no-cost", "synthetic-undecided"],
)
def test_the_workload_line_reads_the_two_families_verdicts(synthetic, change, said):
    """The synthetic family's reuse-cost verdict (a table as `claims.verdicts` gives it) and the HumanEval
    family's null, read from a world where the paper is right and from worlds where it is not."""
    from bcr_core.analysis.claims import workload

    table = pd.DataFrame({"claim": ["reuse costs accuracy"], "verdict": [synthetic]})
    line = workload.workload_line(table, hc.humaneval_verdicts(*world(**change)))
    assert line.startswith(f"Is the cost of reuse workload-specific? {said}"), line


def test_a_seam_shows_in_a_markdown_table_cell_whatever_its_characters():
    """A closing code fence and a pipe are what code agents write; in a table cell a backtick must not end
    the code span and a pipe must not end the cell (GitHub's rules: doubled delimiters, an escaped pipe)."""
    from bcr_core.analysis.reports.humaneval_report import code_span, seams_markdown

    assert code_span("'```'") == "`` '```' ``" and code_span("'a|b'") == "`'a\\|b'`"
    table = pd.DataFrame(
        {"kind": ["'```\\n\\n'"], "seams": [3], "calls": [2], "share_of_calls": [0.5]}
        | {"reuse_path_split": ['["```", "\\n\\n"]']}
    )
    (line,) = seams_markdown(table).splitlines()[2:]
    assert line == "| `` '```\\n\\n' `` | `` '```' `` + `'\\n\\n'` | 3 | 2 (50.0%) |"
    assert line.replace("\\|", "").count("|") == 5  # four cells


def test_a_seam_is_read_back_by_the_models_own_tokenizer_whatever_its_kind_of_tokens():
    """A SentencePiece vocabulary (Gemma's kind) marks a word's start with '▁', which a byte-level decoder would
    print as it is: each piece of the reuse path is text decoded by the model's own tokenizer, never its token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from bcr_core.analysis.reports.humaneval_report import seams_markdown
    from bcr_core.analysis.reports.seams import seam_counts, seam_rows

    vocab = {"<unk>": 0, "▁Maria": 1, "▁Ma": 2, "ria": 3, "▁says": 4}
    sentencepiece = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    sentencepiece.pre_tokenizer, sentencepiece.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=sentencepiece)
    call = {"condition": "token-matched-dense", "item_id": "HumanEval/0", "node": "agent_1"}
    rows = seam_rows([call | {"dense_ids": [4, 1], "merged_ids": [4, 2, 3]}], tokenizer)
    assert rows["merged_tokens"].tolist() == [["▁Ma", "ria"]] and rows["merged_pieces"].tolist() == [["Ma", "ria"]]
    (line,) = seams_markdown(seam_counts(rows, 1)).splitlines()[2:]
    assert "▁" not in line and "`'Ma'` + `'ria'`" in line


def test_the_committed_humaneval_cell_gives_the_documented_verdicts_conditions_and_seams():
    """`results/claims-qwen2.5-coder-0.5b/humaneval` holds the Qwen coder's HumanEval cell, complete (exported
    records, the seams counted from the run's id lists): every condition on the same 140 tasks, its family
    recomputed from the records is the committed verdicts.csv, and docs/results.md shows what `bcr report
    humaneval` prints for it."""
    from bcr_core.analysis.reports import claims_report
    from bcr_core.analysis.reports import humaneval_report as report
    from bcr_core.paths import CHECKOUT
    from bcr_core.run_folder import RunFolder

    folder = claims_report.QWEN_CODER / "humaneval"
    run = RunFolder(folder)
    items, calls = pd.DataFrame(run.items()), pd.DataFrame(run.calls())
    tasks = items.groupby("condition")["item_id"].agg(frozenset)
    assert len(tasks) == 7 and set(tasks) == {frozenset(f"HumanEval/{i}" for i in range(140))}
    table = hc.humaneval_verdicts(items, calls)
    committed = pd.read_csv(folder / "verdicts.csv")
    assert table["verdict"].tolist() == committed["verdict"].tolist()
    assert table["p_holm"].fillna(-1).tolist() == pytest.approx(committed["p_holm"].fillna(-1).tolist())
    seams = pd.read_csv(folder / report.SEAMS, keep_default_na=False)
    matched_calls = int((calls["condition"] == "token-matched-dense").sum())
    assert ((seams["calls"] / seams["share_of_calls"]).round() == matched_calls).all()
    # 140 tasks of four calls, none whose reuse-path ids are the template's
    assert report.seams_said(calls) == "token-matched-dense's 560 calls; ids identical to Dense's on 0"
    shown = "\n".join(
        [
            report.partial_text(items, run.settings),
            report.markdown(table),
            report.conditions_markdown(report.conditions_table(items, calls)),
            report.seams_markdown(seams),
        ]
    )
    shown_in = (CHECKOUT / "docs" / "results.md").read_text()
    for text in filter(None, shown.splitlines()):
        assert text in shown_in, text


def test_the_floor_prints_beside_the_agreement_measures():
    """Without `dense-again` the floor is read from the records: first calls served by a dense prefill of Dense's
    very ids whose tokens are not Dense's (4 of 26 in the committed cell, on two tasks); with it, its agreement."""
    from bcr_core.analysis.reports import claims_report
    from bcr_core.analysis.reports.humaneval_report import floor_text
    from bcr_core.run_folder import RunFolder

    run = RunFolder(claims_report.QWEN_CODER / "humaneval")
    items, calls = pd.DataFrame(run.items()), pd.DataFrame(run.calls())
    said = floor_text(items, calls)
    assert "of the 26 first calls" in said and "4 gave tokens other than Dense's (HumanEval/78, HumanEval/115)" in said
    again_items = items[items["condition"] == "dense"].assign(condition="dense-again")
    again_calls = calls[calls["condition"] == "dense"].assign(condition="dense-again")
    world = floor_text(pd.concat([items, again_items]), pd.concat([calls, again_calls]))
    assert "final code = Dense's on 100.0% of 140 items; calls identical to the reference 100.0%" in world
    half = again_items.assign(answer=[a if i % 2 else a + "#" for i, a in enumerate(again_items["answer"])])
    assert "on 50.0% of 140 items" in floor_text(pd.concat([items, half]), pd.concat([calls, again_calls]))


def test_the_committed_cells_labels_say_what_their_tests_computed():
    """Each label as its test: the TOST rows' 95% interval is Tango's own (the test whose p they print), not
    Newcombe's; the KL row's items needed are prospective at a tenth of KVComm's KL (159), the post-hoc figure
    at the observed effect labelled apart (15,125); Dense, which never takes the reuse path's ids, prints no
    share of calls whose reuse-path ids are Dense's."""
    from bcr_core.analysis.reports import claims_report
    from bcr_core.analysis.reports import humaneval_report as report
    from bcr_core.analysis.statistics import inference as inf
    from bcr_core.run_folder import RunFolder

    run = RunFolder(claims_report.QWEN_CODER / "humaneval")
    items, calls = pd.DataFrame(run.items()), pd.DataFrame(run.calls())
    table = hc.humaneval_verdicts(items, calls).set_index("claim")
    row = table.loc["reuse costs nothing on HumanEval"]
    assert (row.ci_lo, row.ci_hi) == pytest.approx(inf.tango_interval(9, 3, 140, 0.95))
    assert round(100 * row.ci_lo, 1) == -0.7 and round(100 * row.ci_hi, 1) == 10.0
    kl = table.loc["BCR-chunk beats KVComm"]
    assert kl.items_needed == 159 and kl.items_needed_post_hoc == 15_125
    assert "80% power at a tenth of KVComm's KL needs 159 items (post hoc, at the observed effect: 15,125)" in (
        claims_report.power_text(kl)
    )
    conditions = report.conditions_table(items, calls).set_index("condition")
    assert pd.isna(conditions.loc["dense", "ids_as_dense"])
    assert conditions.loc["token-matched-dense", "ids_as_dense"] == 0
