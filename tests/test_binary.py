"""Tests for bcr_core.analysis.statistics.binary against values computed independently of scipy where possible."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from bcr_core.analysis.claims.line import line_residuals, reuse_accuracy_line
from bcr_core.analysis.reports.summary import condition_table
from bcr_core.analysis.statistics.binary import discordant, mcnemar_exact, wilson_ci
from bcr_core.errors import UsageError

# ---------------------------------------------------------------- reference formulas


def binom_two_sided(b: int, c: int) -> float:
    """Exact McNemar p by an explicit binomial sum: 2 * P(X <= min(b, c)), capped at 1."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def wilson_closed_form(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson interval from its closed form, z from the stdlib normal."""
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    centre = (k + z * z / 2) / (n + z * z)
    half = z / (n + z * z) * math.sqrt(k * (n - k) / n + z * z / 4)
    return centre - half, centre + half


# ---------------------------------------------------------------- mcnemar_exact


@pytest.mark.parametrize("b,c", [(0, 1), (1, 0), (3, 3), (17, 9), (9, 8), (14, 4), (47, 24), (5, 20), (0, 12)])
def test_mcnemar_matches_binomial_sum(b, c):
    assert mcnemar_exact(b, c) == pytest.approx(binom_two_sided(b, c), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "b,c,printed",
    [
        (17, 9, "0.169"),  # Table 4(d), GSM8K 2 agents
        (11, 5, "0.210"),  # Table 4(d), GSM8K 3 agents
        (9, 8, "1.000"),  # Table 4(d), GSM8K 5 agents
        (16, 12, "0.572"),  # Table 4(d), MMLU 2 agents
        (15, 12, "0.701"),  # Table 4(d), MMLU 3 agents
        (8, 6, "0.791"),  # Table 4(d), HumanEval 2 agents
        (14, 4, "0.031"),  # §4.3, BCR-single GSM8K 2 agents
        (52, 30, "0.020"),  # App. H.1
        (67, 52, "0.199"),  # App. H.1
    ],
)
def test_mcnemar_reproduces_paper_values(b, c, printed):
    assert f"{mcnemar_exact(b, c):.3f}" == printed


def test_mcnemar_symmetric():
    for b, c in itertools.product(range(0, 12), range(0, 12)):
        assert mcnemar_exact(b, c) == pytest.approx(mcnemar_exact(c, b), rel=1e-12)


def test_mcnemar_no_discordant_pairs_is_one():
    assert mcnemar_exact(0, 0) == 1.0


def test_mcnemar_one_sided_extreme():
    # 0/10: p = 2 / 2**10 exactly.
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024, rel=1e-12)


def test_mcnemar_accepts_numpy_integers():
    assert mcnemar_exact(np.int64(17), np.int32(9)) == pytest.approx(binom_two_sided(17, 9))


@pytest.mark.parametrize("b,c", [(-1, 3), (3, -1), (2.5, 3), (3, 1.0), ("4", 2), (True, 2), (None, 1)])
def test_mcnemar_rejects_bad_counts(b, c):
    with pytest.raises(ValueError, match="non-negative integer"):
        mcnemar_exact(b, c)


# ---------------------------------------------------------------- wilson_ci


def test_wilson_known_interval():
    lo, hi = wilson_ci(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)


@pytest.mark.parametrize(
    "k,n,level",
    [
        (8, 10, 0.95),
        (0, 10, 0.95),
        (10, 10, 0.95),
        (1, 1, 0.95),
        (128, 150, 0.95),
        (37, 60, 0.9),
        (5, 300, 0.99),
        (150, 150, 0.8),
    ],
)
def test_wilson_matches_closed_form(k, n, level):
    lo, hi = wilson_ci(k, n, level)
    elo, ehi = wilson_closed_form(k, n, level)
    assert lo == pytest.approx(elo, abs=1e-10)
    assert hi == pytest.approx(ehi, abs=1e-10)


def test_wilson_edges_touch_bounds():
    lo, hi = wilson_ci(0, 20)
    assert lo == pytest.approx(0.0, abs=1e-12) and 0 < hi < 1
    lo, hi = wilson_ci(20, 20)
    assert hi == pytest.approx(1.0, abs=1e-12) and 0 < lo < 1


@pytest.mark.parametrize(
    "k,printed",
    [(128, (79, 90)), (118, (71, 84)), (119, (72, 85)), (116, (70, 83)), (113, (68, 82))],
)
def test_wilson_reproduces_table7_brackets(k, printed):
    lo, hi = wilson_ci(k, 150)
    assert (round(100 * lo), round(100 * hi)) == printed


def test_wilson_wider_at_higher_level():
    lo90, hi90 = wilson_ci(30, 50, 0.90)
    lo99, hi99 = wilson_ci(30, 50, 0.99)
    assert lo99 < lo90 and hi99 > hi90


@pytest.mark.parametrize(
    "k,n,level,match",
    [
        (0, 0, 0.95, "n must be positive"),
        (11, 10, 0.95, r"\[0, n\]"),
        (-1, 10, 0.95, "non-negative"),
        (3, 10, 1.0, "level"),
        (3, 10, 0.0, "level"),
        (2.0, 10, 0.95, "integer"),
    ],
)
def test_wilson_rejects_bad_input(k, n, level, match):
    with pytest.raises(ValueError, match=match):
        wilson_ci(k, n, level)


# ---------------------------------------------------------------- discordant


def test_discordant_orientation():
    first = [True, True, True, False, False, True, False]
    second = [True, False, False, True, False, False, False]
    # first-only right: items 1, 2, 5 -> b = 3; second-only right: item 3 -> c = 1
    assert discordant(first, second) == (3, 1)
    assert discordant(second, first) == (1, 3)


def test_discordant_accepts_zero_one_and_numpy():
    assert discordant(np.array([1, 0, 1]), np.array([False, True, True])) == (1, 1)


def test_discordant_errors():
    with pytest.raises(ValueError, match="equal length"):
        discordant([True, False], [True])
    with pytest.raises(ValueError, match="boolean"):
        discordant([True, 2], [True, False])
    with pytest.raises(ValueError, match="boolean"):
        discordant([True, False], [float("nan"), True])


# ---------------------------------------------------------------- Equation 3

# Table 7: five agents, 150 GSM8K problems. Unrounded scores are counts out of 150.
DENSE, KVCOMM, R_KVCOMM = 100 * 128 / 150, 100 * 113 / 150, 0.600


def test_line_endpoints():
    line = reuse_accuracy_line(DENSE, KVCOMM, R_KVCOMM)
    assert line(0.0) == pytest.approx(DENSE)
    assert line(R_KVCOMM) == pytest.approx(KVCOMM)


def test_line_endpoint_at_full_reuse_when_rate_is_one():
    line = reuse_accuracy_line(0.85, 0.70, 1.0)
    assert line(0.0) == pytest.approx(0.85)
    assert line(1.0) == pytest.approx(0.70)
    assert line(0.5) == pytest.approx(0.775)


def test_line_printed_form_of_equation_3():
    # accuracy (%) = 85.3 - 16.7 x reuse rate, slope (85.3 - 75.3) / 0.600.
    line = reuse_accuracy_line(85.3, 75.3, 0.600)
    assert line.slope == pytest.approx(16.6667, abs=1e-4)
    assert round(line.slope, 1) == 16.7
    # §4.3: at the repair run's reuse 0.629 the line predicts 74.8.
    assert round(reuse_accuracy_line(DENSE, KVCOMM, R_KVCOMM)(0.629), 1) == 74.8
    # Not a chord to reuse 1: at r = 1 the line lies below the KVComm endpoint.
    assert line(1.0) < 75.3 - 1


def test_line_vectorised():
    line = reuse_accuracy_line(80.0, 70.0, 0.5)
    np.testing.assert_allclose(line(np.array([0.0, 0.25, 0.5])), [80.0, 75.0, 70.0])


def test_line_rejects_bad_reuse_rate():
    for bad in (0.0, -0.1, 1.2):
        with pytest.raises(ValueError, match="reuse_rate"):
            reuse_accuracy_line(85.3, 75.3, bad)


def test_line_residuals_reproduce_table7():
    points = [
        ("Protect-the-Root", 0.456, 100 * 118 / 150),
        ("Random", 0.454, 100 * 119 / 150),
        ("Protect-the-Leaf", 0.504, 100 * 116 / 150),
        ("KVComm", 0.600, 100 * 113 / 150),
    ]
    out = line_residuals(points, DENSE, KVCOMM, R_KVCOMM)
    assert list(out.columns) == ["name", "reuse_rate", "accuracy", "prediction", "residual"]
    assert out["prediction"].round(1).tolist() == [77.7, 77.8, 76.9, 75.3]
    assert out["residual"].round(1).tolist() == [0.9, 1.6, 0.4, 0.0]
    np.testing.assert_allclose(out["residual"], out["accuracy"] - out["prediction"])


def test_line_residual_sign():
    frame = pd.DataFrame({"name": ["above", "below"], "reuse_rate": [0.5, 0.5], "accuracy": [0.9, 0.6]})
    out = line_residuals(frame, 0.8, 0.6, 1.0)  # line(0.5) = 0.7
    assert out.loc[0, "residual"] == pytest.approx(0.2)
    assert out.loc[1, "residual"] == pytest.approx(-0.1)


def test_line_residuals_errors():
    with pytest.raises(ValueError, match="triple"):
        line_residuals([("a", 0.5)], 0.8, 0.6, 1.0)
    with pytest.raises(ValueError, match="columns"):
        line_residuals(pd.DataFrame({"name": ["a"], "rate": [0.1]}), 0.8, 0.6, 1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        line_residuals([("a", 1.5, 0.7)], 0.8, 0.6, 1.0)


# ---------------------------------------------------------------- the paired split of condition_table


def tidy(columns: dict[str, list[bool]]) -> pd.DataFrame:
    """Tidy records from {condition: per-item correctness}, item ids 0..n-1."""
    rows = [
        {"item_id": i, "condition": cond, "correct": v, "final_text": str(v)}
        for cond, vals in columns.items()
        for i, v in enumerate(vals)
    ]
    return pd.DataFrame(rows)


DENSE_COL = [True, True, True, True, False, True, False, True]
KV_COL = [True, False, False, True, False, True, True, False]  # Dense-only: 1,2,7; KV-only: 6
BCR_COL = [True, True, True, True, True, True, False, True]  # BCR-only: 4; Dense-only: none
SPLIT_GROUPS = ("reference", "split")


def test_the_paired_split_on_known_records():
    table = condition_table(tidy({"kvcomm": KV_COL, "dense": DENSE_COL, "bcr": BCR_COL}), "dense", groups=SPLIT_GROUPS)
    assert list(table.columns) == [
        "condition",
        "n",
        "accuracy",
        "wilson_lo",
        "wilson_hi",
        "reference",
        "only_reference_right",
        "only_condition_right",
        "p_exact",
    ]
    assert table["condition"].tolist() == ["kvcomm", "dense", "bcr"]
    assert table["n"].tolist() == [8, 8, 8]
    assert table["accuracy"].tolist() == [4 / 8, 6 / 8, 7 / 8]
    # Dense-only items: 1, 2, 7; KVComm-only: 6
    kv = table.set_index("condition").loc["kvcomm"]
    assert (kv["only_reference_right"], kv["only_condition_right"]) == (3, 1)
    assert kv["p_exact"] == pytest.approx(binom_two_sided(1, 3))
    bcr = table.set_index("condition").loc["bcr"]
    assert (bcr["only_reference_right"], bcr["only_condition_right"]) == (0, 1)
    assert bcr["p_exact"] == pytest.approx(1.0)
    lo, hi = wilson_closed_form(4, 8)
    assert (kv["wilson_lo"], kv["wilson_hi"]) == pytest.approx((lo, hi), abs=1e-10)


def test_the_reference_row_has_no_split():
    table = condition_table(tidy({"dense": DENSE_COL, "kvcomm": KV_COL}), "dense", groups=SPLIT_GROUPS)
    ref = table.iloc[0]
    assert ref["condition"] == "dense"
    assert pd.isna(ref["only_reference_right"]) and pd.isna(ref["only_condition_right"])
    assert math.isnan(ref["p_exact"])


def test_the_split_ignores_row_order():
    records = tidy({"dense": DENSE_COL, "kvcomm": KV_COL}).sample(frac=1, random_state=3)
    kv = condition_table(records, "dense", groups=SPLIT_GROUPS).set_index("condition").loc["kvcomm"]
    assert (kv["only_reference_right"], kv["only_condition_right"]) == (3, 1)


def test_repeated_cells_are_refused_not_pooled():
    records = tidy({"dense": DENSE_COL, "kvcomm": KV_COL})
    # The same items re-run in a second cell and stacked: must not be pooled.
    pooled = pd.concat([records, records], ignore_index=True)
    with pytest.raises(UsageError, match="32 records repeat an .item, condition. pair, e.g. item 0 of 'dense'"):
        condition_table(pooled, "dense")


def test_an_unknown_reference_is_refused():
    with pytest.raises(UsageError, match="bcr"):
        condition_table(tidy({"dense": DENSE_COL, "kvcomm": KV_COL}), "bcr")


def test_the_notebooks_line_is_the_one_the_claims_test():
    """Notebooks 02 and 08 draw Equation 3 on condition means (`lab.line_table`); the gate claim reads
    per-item residuals (`analysis.claims.line.residuals`). On the same items they are one line: the mean
    residual is the notebook's, point for point (written out here: through Dense at reuse 0 and
    unconditional reuse at its rate)."""
    from bcr_core.analysis.claims import line
    from bcr_core.lab.tables import line_table

    rng = np.random.default_rng(7)
    rates = {"dense": 0.0, "kvcomm@1": 0.9, "kvcomm@0.5": 0.6, "opengate@0.5": 0.3}
    items = pd.DataFrame(
        [
            {"condition": c, "item_id": f"i{i}", "correct": bool(rng.random() < 0.8 - 0.3 * r), "reuse_rate": r}
            for c, r in rates.items()
            for i in range(40)
        ]
    )
    e, _ = line.residuals(items, "correct", "dense", "kvcomm@1", ["kvcomm@0.5", "opengate@0.5"])
    table = items.groupby("condition", sort=False)[["correct", "reuse_rate"]].mean().reset_index()
    drawn = line_table(table.rename(columns={"correct": "accuracy"}), "dense", "kvcomm@1").set_index("condition")
    means = table.set_index("condition")["correct"]
    for c in ("kvcomm@0.5", "opengate@0.5"):
        by_hand = means[c] - (means["dense"] - (means["dense"] - means["kvcomm@1"]) * rates[c] / rates["kvcomm@1"])
        assert drawn.loc[c, "residual_points"] == pytest.approx(100 * e[c].mean(), abs=1e-9)
        assert drawn.loc[c, "residual_points"] == pytest.approx(100 * by_hand, abs=1e-9)
