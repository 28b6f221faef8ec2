"""A notebook's `Comparison` reads a run folder whose cell.json holds its settings: written out
here field by field, as cell.json holds them."""

import pytest

from bcr_core.lab.comparisons import Comparison

SAVED = {  # a cell.json as `bcr run` writes it, before `prompt` and `stop` existed
    "benchmark": "synthetic",
    "n_agents": 3,
    "conditions": ["dense", "kvcomm"],
    "n": 200,
    "max_new_tokens": 8,
    "pinned": None,
    "model": "default",
    "reference": None,
    "extra": {"seed": 0},
    "fidelity": True,
}
COMPARISON = Comparison(benchmark="synthetic", agents=3, n=100, max_new_tokens=8)


def test_a_run_with_the_same_settings_and_more_items_serves_the_comparison():
    assert COMPARISON.matches(SAVED)
    assert COMPARISON.matches(SAVED | {"prompt": "standard", "stop": "eos"})  # later settings at their old value
    assert COMPARISON.matches(SAVED | {"fidelity": False, "reference": "dense", "conditions": ["opengate"]})
    assert COMPARISON.matches(SAVED | {"n": 100}) and not COMPARISON.matches(SAVED | {"n": 99})


@pytest.mark.parametrize(
    "changed",
    [
        {"benchmark": "gsm8k"},
        {"n_agents": 2},
        {"max_new_tokens": 9},
        {"pinned": "math"},
        {"model": "gemma-3-270m"},
        {"extra": {"seed": 1}},
        {"extra": None},
        {"prompt": "one-shot"},
        {"stop": "line"},
    ],
)
def test_a_run_that_differs_in_what_its_records_hold_does_not(changed):
    assert not COMPARISON.matches(SAVED | changed)


def test_a_comparison_at_a_later_setting_needs_it_recorded():
    assert not Comparison(benchmark="synthetic", agents=3, n=100, max_new_tokens=8, prompt="one-shot").matches(SAVED)
    assert Comparison(benchmark="synthetic", agents=3, n=100, max_new_tokens=8, prompt="one-shot").matches(
        SAVED | {"prompt": "one-shot"}
    )
