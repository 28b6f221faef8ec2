"""Monte-Carlo p precision, the floor's printing, and prospective power of the tests that decide."""

import numpy as np
import pytest

from bcr_core.analysis.claims import protocol
from bcr_core.analysis.statistics import inference, monte_carlo, power


def near_threshold_gain(n: int = 200, seed: int = 3) -> np.ndarray:
    """Per-item gains whose sign-flip p sits near 0.05 / 8 (a Holm threshold in a family of 8)."""
    rng = np.random.default_rng(seed)
    d = rng.normal(0, 1, n)
    d = d - d.mean() + 2.8 * d.std(ddof=1) / np.sqrt(n)  # sign-flip p near 0.0055: within 4 MC errors at 20,000 flips
    return d


def test_a_p_near_its_holm_threshold_gets_more_flips_and_one_far_from_it_does_not():
    d = near_threshold_gain()
    p = inference.sign_flip(d, resamples=monte_carlo.RESAMPLES)
    assert monte_carlo.close_to(p, 0.05 / 8, monte_carlo.RESAMPLES)
    refined, flips = monte_carlo.refine(d, p, 0.05 / 8)
    assert (
        flips > monte_carlo.RESAMPLES
        and not monte_carlo.close_to(refined, 0.05 / 8, flips)
        or (flips == monte_carlo.MAX_RESAMPLES)
    )
    far = np.random.default_rng(0).normal(1.0, 1, 200)
    p_far = inference.sign_flip(far)
    assert monte_carlo.refine(far, p_far, 0.05 / 8) == (p_far, monte_carlo.RESAMPLES)
    assert monte_carlo.exact(12, monte_carlo.RESAMPLES) and not monte_carlo.exact(200, monte_carlo.MAX_RESAMPLES)


def test_a_verdict_near_its_threshold_is_the_same_for_every_resampler_seed():
    """The seed sweep: a family whose second test sits near its Holm threshold gives the same verdict
    for three resampler seeds, because the refinement draws until the Monte-Carlo error cannot cross."""
    d = near_threshold_gain()
    nulls = [np.random.default_rng(k).normal(0, 1, 200) for k in range(7)]
    verdicts = set()
    for seed in range(3):
        rows = [protocol.mean_claim("near", "", "kl_mean", "", d)]
        rows += [protocol.mean_claim(f"null {k}", "", "kl_mean", "", x - x.mean()) for k, x in enumerate(nulls)]
        table = protocol.family(rows, seed=seed).set_index("claim")  # near is the smallest of 8: threshold 0.05 / 8
        assert table.loc["near", "resamples"] > monte_carlo.RESAMPLES  # refined past the first draw
        verdicts.add(table.loc["near", "verdict"])
    assert verdicts == {"holds"}  # p about 0.0055 < 0.00625 on every seed


def test_the_floor_prints_as_a_bound():
    flips = 20_000
    floor = 1 / (flips + 1)  # no flip's |mean| reaches the observed one: (0 + 1) / (R + 1)
    ones = np.ones(200)
    assert inference.sign_flip(ones, resamples=flips) == pytest.approx(floor)
    assert monte_carlo.p_text(floor, flips) == "< 5e-05"
    assert monte_carlo.p_text(0.0123, flips) == "0.012" and monte_carlo.p_text(0.0123) == "0.012"
    assert monte_carlo.p_text(26 * floor, bound=True) == "< 0.0013"
    assert monte_carlo.holm_thresholds([0.01, None, 0.001, 0.2]) == [0.05 / 2, None, 0.05 / 3, 0.05]


def test_prospective_power_of_the_sign_flip_reaches_80_percent_by_simulation():
    """At the n `mean_items_needed_at` gives for a stated effect and spread, simulated samples with that
    effect reject in about 80% of runs (the sign-flip that decides, 2,000 flips each)."""
    spread, effect = 0.3, 0.05
    pilot = np.random.default_rng(0).normal(0, spread, 400)
    n = power.mean_items_needed_at(pilot, effect)
    assert n == pytest.approx(((1.959964 + 0.841621) * pilot.std(ddof=1) / effect) ** 2, abs=1)
    rng = np.random.default_rng(1)
    hits = [inference.sign_flip(rng.normal(effect, spread, n), resamples=2_000, seed=k) < 0.05 for k in range(300)]
    assert 0.72 < np.mean(hits) < 0.88


def test_the_tost_items_needed_reach_80_percent_power_at_a_true_zero():
    margin, spread = 0.05, 0.4
    pilot = np.random.default_rng(2).normal(0, spread, 500)
    n = power.tost_items_needed(pilot, margin)
    rng = np.random.default_rng(3)
    hits = [inference.t_tost(rng.normal(0, pilot.std(ddof=1), n), margin) < 0.05 for _ in range(1000)]
    assert 0.76 < np.mean(hits) < 0.84
    small = [inference.t_tost(rng.normal(0, pilot.std(ddof=1), n // 2), margin) < 0.05 for _ in range(1000)]
    assert np.mean(small) < 0.6  # half the items: clearly short of it
