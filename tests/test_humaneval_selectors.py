"""The selectors' HumanEval family (`analysis.claims.humaneval_selectors`) can fail, row by row: per-item records of
a world where each selector leaves less KL than its coin and than the whole-cache draft read "holds"; a world where
a row's claim is false (the coin, or the whole-cache draft, leaving less KL) reads "does not hold" on that row, and
one where the two are the same condition's records reads neither. The worlds are written out here per item."""

import pandas as pd
import pytest

from bcr_core.analysis.claims import humaneval_selectors as hs

N = 140
RECORDED = {  # the labels a run records (the coins with their seed)
    "dense": "dense",
    "kvcomm": "kvcomm@1",
    "draft": "bcr-chunk:chunk=16,gamma=1",
    "predicted": "bcr-chunk:chunk=16,gamma=1,rank=predicted",
    "predicted_coin": "coin-chunk:chunk=16,gamma=1,match=bcr-chunk,rank=predicted,seed=0",
    "ours": "ours-chunk:chunk=16,gamma=1",
    "ours_coin": "coin-chunk:chunk=16,gamma=1,match=ours-chunk,seed=0",
    "dense_again": "dense-again",
}
# per-item KL to Dense in the world where the family's four claims are true
TRUE_WORLD = {
    "dense": 0.0,
    "kvcomm": 0.0068,
    "draft": 0.0067,
    "predicted": 0.0040,
    "predicted_coin": 0.0055,
    "ours": 0.0035,
    "ours_coin": 0.0054,
    "dense_again": 0.0,
}


def world(**kl) -> tuple[pd.DataFrame, pd.DataFrame]:
    items, calls = [], []
    for name, mean in (TRUE_WORLD | kl).items():
        for i in range(N):
            spread = mean * 0.4 * (((i * 7919) % 17) / 16 - 0.5)  # items differ; each condition's mean is `mean`
            items.append(
                {
                    "condition": RECORDED[name],
                    "item_id": f"HumanEval/{i}",
                    "correct": i < 60,
                    "answer": "code",
                    "final_text": "```python\ncode\n```",
                    "kl_mean": mean + spread,
                }
            )
            calls.append(
                {
                    "condition": RECORDED[name],
                    "item_id": f"HumanEval/{i}",
                    "mode": "dense" if name in ("dense", "dense_again") else "reuse",
                    "rows_recomputed": 0 if name in ("dense", "dense_again", "kvcomm") else 40,
                    "cached_rows": 200,
                }
            )
    return pd.DataFrame(items), pd.DataFrame(calls)


def verdicts(**kl) -> dict[str, str]:
    table = hs.selector_verdicts(*world(**kl))
    return dict(zip(table["claim"], table["verdict"]))


def test_the_plan_is_four_rows_on_kl_each_against_a_coin_or_the_whole_cache_draft():
    assert set(hs.PLAN.values()) == {
        (hs.PREDICTED, hs.PREDICTED_COIN),
        (hs.OURS, hs.OURS_COIN),
        (hs.PREDICTED, hs.DRAFT),
        (hs.OURS, hs.DRAFT),
    }
    table = hs.selector_verdicts(*world())
    assert list(table["claim"]) == list(hs.PLAN) and set(table["measure"]) == {"kl_mean"}
    # one Holm family of four, written out: the k-th smallest p times (5 - k), running maximum, capped at 1
    order = sorted(range(4), key=lambda i: table["p"].iloc[i])
    by_hand, running = [0.0] * 4, 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (4 - k) * table["p"].iloc[i]))
        by_hand[i] = running
    assert table["p_holm"].tolist() == pytest.approx(by_hand)


def test_where_every_claim_is_true_every_row_holds():
    assert set(verdicts().values()) == {"holds"}


@pytest.mark.parametrize(
    "change, row",
    [
        (dict(predicted_coin=0.0030), "the predicted-row draft beats its coin on code"),
        (dict(ours_coin=0.0025), "ours beats its coin on code"),
        (dict(draft=0.0030), "the predicted-row draft beats the whole-cache draft on code"),
        (dict(draft=0.0025), "ours beats the whole-cache draft on code"),
    ],
    ids=["coin-below-draft", "coin-below-ours", "draft-below-predicted", "draft-below-ours"],
)
def test_a_world_where_a_row_is_false_reads_does_not_hold(change, row):
    assert verdicts(**change)[row] == "does not hold"


def test_a_selector_served_in_its_coins_place_decides_nothing():
    """The predicted-row draft's records in its coin's place: every per-item difference is 0, neither claim."""
    found = verdicts(predicted_coin=TRUE_WORLD["predicted"])
    assert found["the predicted-row draft beats its coin on code"] == "undecided"


def test_the_report_reads_a_selectors_cell_by_its_own_family(tmp_path, capsys):
    """`bcr report humaneval` on a cell serving `ours` prints this family (its plan line, its four rows), not the
    paper's HumanEval claims."""
    import json

    from bcr_core.cli import main

    items, calls = world()
    calls = calls.assign(node="agent_1", reason="dense", ids_match=False)
    settings = {"model": "default", "benchmark": "humaneval", "conditions": list(RECORDED.values()), "n": N}
    (tmp_path / "cell.json").write_text(json.dumps(settings))
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items.to_dict("records")))
    (tmp_path / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in calls.to_dict("records")))
    assert main(["report", "humaneval", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "against its row-matched coin and against the paper's whole-cache draft" in printed
    assert "| ours beats its coin on code | KL to Dense |" in printed and "reuse costs nothing" not in printed
    assert pd.read_csv(tmp_path / "out" / "verdicts.csv")["claim"].tolist() == list(hs.PLAN)
