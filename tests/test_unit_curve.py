"""The unit-of-choice probe on the tiny model."""

import pytest
import torch
from conftest import rounding_close

from bcr_core.errors import UsageError
from bcr_core.probes.unit_curve import (
    UnitCurveConfig,
    attention_outputs,
    build_case,
    default_texts,
    predicted_caches,
    read_prompts,
    summarize_curve,
    unit_curve,
)

CONFIG = UnitCurveConfig(segment_tokens=96, units=(1, 16, 96), seeds=(0, 1))


@pytest.fixture(scope="module")
def curve(tiny_chat):
    return unit_curve(tiny_chat, default_texts(3), CONFIG, progress=False)


def test_budget_is_counted_in_whole_units(curve):
    realised = curve.groupby("unit")["budget_realised"].first().to_dict()
    assert realised[1] == pytest.approx(round(0.2 * 96) / 96)
    assert realised[16] == pytest.approx(16 / 96)  # round(0.2 * 6) = 1 unit
    assert realised[96] == 1.0  # max(1, round(0.2)) = the whole segment


def test_restoring_the_whole_segment_removes_all_error(curve):
    whole = curve[curve.unit == 96]
    assert (whole["error"] < 1e-5).all()
    assert (whole["unrepaired_error"] > 1e-3).all()  # the prediction really was wrong


def test_restoring_rows_never_hurts_on_average(curve):
    table = summarize_curve(curve).set_index("unit")
    assert (table["informed_error"] <= table["unrepaired_error"] + 1e-9).all()
    assert table.loc[96, "gap_share"] == pytest.approx(0.0, abs=1e-6)
    assert set(table.columns) >= {"budget_realised", "informed_error", "random_error", "unrepaired_error", "gap_share"}


def test_prediction_is_exact_outside_the_segment(tiny_chat):
    cases = [build_case(tiny_chat, t, CONFIG) for t in default_texts(3)]
    kv = predicted_caches(tiny_chat, cases)[0]
    outside = torch.cat([torch.arange(cases[0].segment.start), torch.arange(cases[0].segment.stop, kv.length)])
    assert rounding_close(kv.select(outside).values, cases[0].dense.select(outside).values)
    reference = attention_outputs(tiny_chat, cases[0].dense, cases[0].queries)
    assert reference.shape[:2] == (tiny_chat.num_layers, len(cases[0].queries))


def test_prompts_file_and_errors(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert read_prompts(good) == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "a"}\n')
    with pytest.raises(UsageError, match="'text' field"):
        read_prompts(bad)
    with pytest.raises(UsageError, match="do not fit"):
        UnitCurveConfig(segment_tokens=64, units=(128,))
    with pytest.raises(UsageError, match="budget"):
        UnitCurveConfig(budget=0.0)


def test_too_short_prompt_is_a_clear_error(tiny_chat):
    with pytest.raises(UsageError, match="fewer than --segment-tokens"):
        build_case(tiny_chat, "short text", CONFIG)
