"""The one per-condition table (`bcr run`, `bcr grid`, the notebooks, the claims' grid), checked on a
hand-made set of records against numbers worked out by hand."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from bcr_core.analysis.reports.summary import COLUMNS, GRID, GROUPS, RUN, condition_table
from bcr_core.errors import UsageError

PAIRED = ["q1", "q2", "q3", "q4", "q5", "q6"]
CONDITIONS = {  # per condition, the item records' fields on each paired item
    "dense": dict(
        correct=[1, 1, 1, 0, 1, 0],
        final_text=list("abcdef"),
        answer=["1", "2", None, "4", "5", "6"],
        reuse_rate=[0] * 6,
        rows_per_call=[0] * 6,
        rows_wasted_per_call=[0] * 6,
        skipped_calls=[0] * 6,
        ttft_s_mean=[0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
        kl_mean=[0.0] * 6,
    ),
    "kvcomm": dict(
        correct=[0, 0, 0, 0, 1, 1],
        final_text=list("axcyef"),
        answer=["1", "9", None, "4", "5", "0"],
        reuse_rate=[1, 0.5, 1, 0.5, 1, 1],
        rows_per_call=[0] * 6,
        rows_wasted_per_call=[0] * 6,
        skipped_calls=[0] * 6,
        ttft_s_mean=[0.1, 0.2, 0.3, 0.9, 0.2, 0.2],
        kl_mean=[0.2, 0.4, 0.0, 0.2, 0.1, 0.1],
    ),
    "kvcomm@0.5": dict(
        correct=[1, 1, 1, 1, 1, 1],
        final_text=list("abzdqw"),
        answer=["1", "2", "7", None, "5", "6"],
        reuse_rate=[0.5, 0.5, 0, 1, 0.5, 0.5],
        rows_per_call=[2, 4, 0, 6, 2, 4],
        rows_wasted_per_call=[1, 0, 0, 1, 0, 1],
        skipped_calls=[1, 0, 2, 0, 0, 0],
        ttft_s_mean=[0.25] * 6,
        kl_mean=[0.1, 0.1, 0.1, 0.3, 0.1, 0.1],
    ),
}


def records() -> pd.DataFrame:
    rows = []
    for condition, values in CONDITIONS.items():
        for i, item in enumerate(PAIRED):
            rows.append({"condition": condition, "item_id": item, "index": i} | {k: v[i] for k, v in values.items()})
            rows[-1]["correct"] = bool(rows[-1]["correct"])
    for condition in ("dense", "kvcomm"):  # q7: not finished by kvcomm@0.5, so left out of every column
        q7 = {"condition": condition, "item_id": "q7", "index": 6, "correct": False, "final_text": "?"}
        rows.append(rows[0] | q7)
    return pd.DataFrame(rows)


def calls() -> pd.DataFrame:
    call = lambda condition, item, mode, rows, wasted, cached, skipped, fidelity: dict(  # noqa: E731
        condition=condition,
        item_id=item,
        mode=mode,
        rows_recomputed=rows,
        rows_wasted=wasted,
        cached_rows=cached,
        skipped=skipped,
        fidelity=fidelity,
    )
    return pd.DataFrame(
        [
            call("dense", "q1", "dense", 0, 0, 0, False, None),
            call("kvcomm", "q1", "reuse", 0, 0, 30, False, {"first_token_agree": 1.0, "kl": 0.2}),
            call("kvcomm@0.5", "q1", "reuse", 4, 1, 40, False, {"first_token_agree": 1.0, "kl": 0.1}),
            call("kvcomm@0.5", "q2", "reuse", 0, 0, 20, True, {"first_token_agree": 0.0, "kl": 0.3}),
            call("kvcomm@0.5", "q3", "dense", 0, 0, 0, False, None),
            call("kvcomm@0.5", "q7", "reuse", 100, 50, 100, False, {"first_token_agree": 0.0, "kl": 9.0}),  # unpaired
        ]
    )


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval written out (z for 95%)."""
    z, p = 1.959963984540054, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def mcnemar(b: int, c: int) -> float:
    """Two-sided exact McNemar p written out: twice the smaller binomial tail, at most 1."""
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def sign_flip_exact(d: list[float]) -> float:
    """Every one of the 2^n sign patterns: the share whose |mean| reaches the observed one."""
    observed = abs(sum(d))
    flips = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(f >= observed - 1e-12 for f in flips) / len(flips)


def test_the_run_table_on_hand_made_records():
    table = condition_table(records()).set_index("condition")  # reference: KVComm, recorded
    assert list(table.index) == ["dense", "kvcomm", "kvcomm@0.5"]
    assert list(table.columns) == [
        "n",
        "accuracy",
        "wilson_lo",
        "wilson_hi",
        "agrees_dense",
        "answer_agreement",
        "reuse_rate",
        "rows_per_call",
        "rows_wasted_per_call",
        "skipped_calls",
        "ttft_ms",
        "reference",
        "only_reference_right",
        "only_condition_right",
        "p_exact",
    ]  # no accuracy_strict: these records have one rule
    assert (table["n"] == 6).all() and (table["reference"] == "kvcomm").all()
    expected = {  # accuracy, agrees_dense, answer_agreement, reuse_rate, rows, wasted, skipped, ttft_ms
        "dense": (4 / 6, 1.0, 1.0, 0.0, 0.0, 0.0, 0, 650.0),
        "kvcomm": (2 / 6, 4 / 6, 4 / 6, 5 / 6, 0.0, 0.0, 0, 200.0),
        "kvcomm@0.5": (1.0, 3 / 6, 4 / 6, 0.5, 3.0, 0.5, 3, 250.0),
    }
    columns = [
        "accuracy",
        "agrees_dense",
        "answer_agreement",
        "reuse_rate",
        "rows_per_call",
        "rows_wasted_per_call",
        "skipped_calls",
        "ttft_ms",
    ]
    for condition, values in expected.items():
        assert table.loc[condition, columns].astype(float).tolist() == pytest.approx(values)
        k = round(values[0] * 6)
        assert (table.loc[condition, "wilson_lo"], table.loc[condition, "wilson_hi"]) == pytest.approx(wilson(k, 6))
    # against KVComm [0,0,0,0,1,1]: Dense [1,1,1,0,1,0] is alone right on q1-q3, KVComm alone on q6;
    # kvcomm@0.5 (all right) alone on q1-q4, KVComm never alone
    assert table.loc["dense", ["only_reference_right", "only_condition_right"]].tolist() == [1, 3]
    assert table.loc["kvcomm@0.5", ["only_reference_right", "only_condition_right"]].tolist() == [0, 4]
    assert table.loc["dense", "p_exact"] == pytest.approx(mcnemar(1, 3)) == pytest.approx(10 / 16)
    assert table.loc["kvcomm@0.5", "p_exact"] == pytest.approx(mcnemar(0, 4)) == pytest.approx(2 / 16)
    assert table.loc["kvcomm", ["only_reference_right", "only_condition_right", "p_exact"]].isna().all()


def test_the_grid_table_reads_the_calls_of_paired_items():
    items = records()
    table = condition_table(items, "kvcomm", calls=calls(), groups=GRID).set_index("condition")
    assert list(table.columns) == [
        "n",
        "accuracy",
        "wilson_lo",
        "wilson_hi",
        "agrees_dense",
        "kl_per_item",
        "reuse_rate",
        "reuse_calls",
        "first_token_agree",
        "kl_reuse_calls",
        "rows_per_reuse_call",
        "rows_share",
        "rows_wasted_per_call",
        "skipped_calls",
        "only_reference_right",
        "only_condition_right",
        "p_exact",
        "kl_p_vs_reference",
    ]  # the header of results/**/grid_table.csv
    mine = table.loc["kvcomm@0.5"]  # two reuse calls on paired items (q7's is left out), one of them skipped
    assert mine["reuse_calls"] == 2 and mine["skipped_calls"] == 1
    assert mine["first_token_agree"] == pytest.approx(0.5) and mine["kl_reuse_calls"] == pytest.approx(0.2)
    assert mine["rows_per_reuse_call"] == pytest.approx(2.0) and mine["rows_share"] == pytest.approx(4 / 40)
    assert mine["rows_wasted_per_call"] == pytest.approx(0.5)  # per reuse call, not the items' mean
    assert mine["kl_per_item"] == pytest.approx(0.8 / 6)
    kvcomm = table.loc["kvcomm"]
    assert (kvcomm["reuse_calls"], kvcomm["rows_per_reuse_call"], kvcomm["rows_share"]) == (1, 0.0, 0.0)
    assert np.isnan(table.loc["dense", "first_token_agree"]) and table.loc["dense", "reuse_calls"] == 0
    kl = {c: np.array(v["kl_mean"]) for c, v in CONDITIONS.items()}
    for condition in ("dense", "kvcomm@0.5"):
        expected = sign_flip_exact(list(kl[condition] - kl["kvcomm"]))
        assert table.loc[condition, "kl_p_vs_reference"] == pytest.approx(expected)
    assert table.loc["dense", "kl_p_vs_reference"] == pytest.approx(4 / 64)  # five same-signed differences and a 0
    assert np.isnan(table.loc["kvcomm", "kl_p_vs_reference"])


def test_every_group_names_columns_of_the_vocabulary():
    assert set().union(*GROUPS.values()) <= set(COLUMNS) and set(RUN) | set(GRID) <= set(GROUPS)


def test_conditions_are_found_by_their_settings_in_the_order_asked():
    table = condition_table(records(), "kvcomm@0.3", conditions=["kvcomm@0.5", "kvcomm@0.3"], groups=("split",))
    assert list(table["condition"]) == ["kvcomm@0.5", "kvcomm"]  # kvcomm@0.3 is KVComm at its default gate
    assert list(table.columns) == ["condition", "n", "accuracy", "wilson_lo", "wilson_hi", *GROUPS["split"]]
    assert table.set_index("condition").loc["kvcomm@0.5", "only_condition_right"] == 4


def test_the_run_table_without_dense_leaves_agreement_empty():
    items = records()
    table = condition_table(items[items["condition"] != "dense"], groups=RUN)
    assert table["agrees_dense"].isna().all() and table["answer_agreement"].isna().all()


@pytest.mark.parametrize(
    "call, message",
    [
        (dict(reference="opengate"), "reference 'opengate' is not among the conditions"),
        (dict(groups=("items", "colour")), "unknown column group"),
        (dict(groups=GRID), "the `calls` column group reads the call records"),
        (dict(value="agrees"), "the paired split reads 'agrees'"),
    ],
)
def test_bad_requests_are_usage_errors(call, message):
    with pytest.raises(UsageError, match=message):
        condition_table(records(), **call)
