"""The HumanEval family (`analysis.humaneval_claims`) can fail, row by row: per-item records of a world where
the paper's HumanEval claims are true read "holds", and worlds where one is false read "does not hold" on
that row (Dense's records in KVComm's place, token-matched Dense's in Dense's, and so on).

The worlds are written out here per item, independently of the module: HumanEval's size (164 tasks) with
every outcome one-sided (a condition passes on its first k items, its code is Dense's on its first a)."""

import pandas as pd
import pytest

from bcr_core.analysis import humaneval_claims as hc

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
    assert hc.PLAN == {
        "reuse costs nothing on HumanEval": "correct",
        "no repair damages HumanEval": "correct",
        "reuse pays a tokenization tax": "agrees_code",
        "the approximation costs fidelity": "agrees_code",
        "repair cannot touch the tokenization tax": "agrees_code",
        "BCR-chunk beats KVComm": "kl_mean",
        "draft beats coin at chunk granularity": "kl_mean",
    }
    assert hc.HUMANEVAL_MARGIN == 0.04  # the paper's four points


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


def test_every_row_prints_the_items_it_would_need_when_undecided():
    """At 20 items nothing is decided, and each undecided row says how many items 80% power would need."""
    items, calls = world(kvcomm=(60, 60, 0.40))
    keep = [f"HumanEval/{i}" for i in range(0, N, 8)][:20]
    table = hc.humaneval_verdicts(items[items["item_id"].isin(keep)], calls[calls["item_id"].isin(keep)])
    undecided = table[table["verdict"] == "undecided"]
    assert len(undecided) >= 1
    assert undecided["items_needed"].notna().all() or undecided["items_needed_post_hoc"].notna().all()
