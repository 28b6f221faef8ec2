"""The claims' statistics against independent references: published values, brute-force
enumeration, the textbook formulas written out here, and scipy's own one-sided tests."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from bcr_core.analysis.statistics import inference as inf
from bcr_core.analysis.statistics import power


@pytest.mark.parametrize(
    "table, published",
    [  # Newcombe (1998), Stat. Med. 17:2635, examples (a), (b) and (d), method 10
        ((36, 12, 2, 0), (0.0569, 0.3404)),
        ((18, 12, 2, 18), (0.0562, 0.3290)),
        ((53, 0, 0, 1), (-0.0729, 0.0729)),
    ],
)
def test_paired_interval_reproduces_newcombes_published_examples(table, published):
    lo, hi = inf.paired_difference_ci(*table)
    assert lo == pytest.approx(published[0], abs=1e-4) and hi == pytest.approx(published[1], abs=1e-4)


def test_paired_interval_orientation_and_width():
    lo, hi = inf.paired_difference_ci(20, 2, 12, 16)  # the second side is the better one
    assert hi < 0
    assert inf.paired_difference_ci(20, 12, 2, 16) == pytest.approx((-hi, -lo))
    narrow = inf.paired_difference_ci(20, 2, 12, 16, level=0.80)
    assert lo < narrow[0] < narrow[1] < hi  # a lower level gives a narrower interval
    assert inf.table_of([1, 1, 0, 0, 1], [1, 0, 1, 0, 0]) == (1, 2, 1, 1)


def test_sign_flip_equals_the_enumeration_of_every_sign():
    d = np.array([0.31, -0.12, 0.5, 0.22, 0.05, 0.41, -0.03, 0.18, 0.27])
    flips = np.array([np.mean(d * s) for s in itertools.product([1, -1], repeat=d.size)])
    observed = d.mean()
    one_sided = np.mean(flips >= observed - 1e-12)
    assert inf.sign_flip(d) == pytest.approx(min(1.0, 2 * one_sided))
    assert inf.sign_flip(-d) == pytest.approx(inf.sign_flip(d))
    assert inf.sign_flip(np.zeros(5)) == 1.0


def test_a_sign_flip_whose_every_flip_ties_or_exceeds_the_observed_mean_gives_p_1():
    """Per-item thirds (a draft against three coin seeds) whose units sum to an odd count: no flip sums
    to zero, so every flip's |mean| reaches the observed 1/3 over n, and p is 1 exactly, however the
    floats of the flipped sums round."""
    d = np.array([1 / 3] * 21 + [2 / 3] * 10 + [-1 / 3] * 20 + [-2 / 3] * 10 + [0.0] * 139)
    assert inf.sign_flip(d) == 1.0 and inf.sign_flip(d, resamples=100_000, seed=3) == 1.0


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    small, large = rng.normal(0.3, 1, 50), rng.normal(0.3, 1, 800)
    lo, hi = inf.bootstrap_ci(small)
    assert lo < small.mean() < hi
    wide, narrow = hi - lo, np.subtract(*inf.bootstrap_ci(large)[::-1])
    assert narrow < wide / 2.5  # about sqrt(16) = 4 times narrower
    normal = 2 * 1.96 * small.std(ddof=1) / math.sqrt(small.size)
    assert wide == pytest.approx(normal, rel=0.15)


def power_by_enumeration(p10: float, p01: float, n: int, alpha: float) -> float:
    """Every outcome (b, c, rest) of n items, its multinomial probability, and whether scipy's exact
    binomial test of b out of b + c rejects: the power of exact McNemar, written out."""
    total = 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            p = stats.multinomial.pmf([b, c, n - b - c], n, [p10, p01, 1 - p10 - p01])
            if b + c and stats.binomtest(b, b + c).pvalue < alpha:
                total += p
    return total


@pytest.mark.parametrize("p10, p01, n", [(0.3, 0.1, 30), (0.2, 0.15, 25), (0.05, 0.4, 20)])
def test_mcnemar_power_equals_the_enumeration(p10, p01, n):
    assert power.mcnemar_power(p10, p01, n, 0.05) == pytest.approx(power_by_enumeration(p10, p01, n, 0.05), abs=1e-6)


def test_connors_formula_and_the_exact_search():
    za, zb = 1.959963984540054, 0.8416212335729143
    for p10, p01 in [(0.09, 0.095), (0.045, 0.025), (0.2, 0.1)]:
        psi, delta = p10 + p01, p10 - p01
        written = (za * math.sqrt(psi) + zb * math.sqrt(psi - delta**2)) ** 2 / delta**2
        assert power.connor_items(p10, p01) == pytest.approx(written)
        exact = power.mcnemar_items_needed(p10, p01)
        assert exact == pytest.approx(written, rel=0.10)  # the exact test is a little less powerful
        assert power.mcnemar_power(p10, p01, exact) >= 0.8 > power.mcnemar_power(p10, p01, exact - 1)
    assert power.mcnemar_items_needed(0.1, 0.1) is None  # equal rates: no n decides them


def test_detectable_difference_sits_at_80_percent_power():
    psi, n = 0.185, 200
    delta = power.detectable_difference(psi, n)
    assert power.mcnemar_power((psi + delta) / 2, (psi - delta) / 2, n) >= 0.8
    assert power.mcnemar_power((psi + 0.95 * delta) / 2, (psi - 0.95 * delta) / 2, n) < 0.8
    assert power.detectable_difference(0.02, 20) is None  # 20 items with ~0.4 discordant cannot


def test_mean_power_approximation_written_out():
    d = np.array([0.1, 0.3, -0.05, 0.2, 0.15, 0.0, 0.25, 0.05])
    z = 1.959963984540054 + 0.8416212335729143
    assert power.mean_items_needed(d) == math.ceil((z * d.std(ddof=1) / d.mean()) ** 2)
    assert power.mean_detectable(d) == pytest.approx(z * d.std(ddof=1) / math.sqrt(d.size))


def test_tost_by_interval_inversion_equals_two_one_sided_t_tests():
    d = np.array([0.8, -0.4, 0.3, 0.1, -0.2, 0.5, 0.0, 0.2, -0.1, 0.3, 0.4, -0.3])
    margin = 0.6
    se = d.std(ddof=1) / math.sqrt(d.size)

    def interval(level):
        return stats.t.interval(level, d.size - 1, loc=d.mean(), scale=se)

    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    assert inf.tost_p(interval, margin) == pytest.approx(max(lower, upper), rel=1e-6)
    assert inf.tost_p(interval, 0.01) == 1.0  # a margin inside the estimate's own spread
    draws = np.linspace(-0.5, 0.5, 1001)
    assert inf.bootstrap_tost(draws, 0.4) == pytest.approx(101 / 1001)
    with pytest.raises(ValueError, match="margin must be positive"):
        inf.tost_p(interval, 0.0)


def test_holm_step_down_written_out():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert inf.holm([0.01, 0.04, 0.03, 0.005, None]) == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
    assert inf.holm([0.5, 0.9]) == [1.0, 1.0]
    assert inf.holm([]) == []


def test_tangos_statistic_at_zero_is_mcnemars_and_falls_with_the_null_difference():
    b, c, n = 12, 5, 50
    assert inf.tango_statistic(b, c, n, 0.0) == pytest.approx((b - c) / math.sqrt(b + c), rel=1e-12)
    values = [inf.tango_statistic(b, c, n, d) for d in np.linspace(-0.5, 0.5, 21)]
    assert all(x > y for x, y in zip(values, values[1:]))


def test_tangos_interval_is_where_its_test_does_not_reject_and_covers_at_its_level():
    """Each end of the interval is the difference at which the two-sided test's p is exactly 1 - level; over
    simulated paired samples of a known difference the 95% interval covers it about 95% of the time."""
    lo, hi = inf.tango_interval(40, 20, 160, 0.95)
    assert lo < 20 / 160 < hi
    for end in (lo, hi):
        assert 2 * stats.norm.sf(abs(inf.tango_statistic(40, 20, 160, end))) == pytest.approx(0.05, rel=1e-6)
    rng = np.random.default_rng(0)
    p10, p01, n = 0.12, 0.06, 140
    counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=2000)
    intervals = [inf.tango_interval(b, c, n) for b, c, _ in counts]
    covered = np.mean([lo <= p10 - p01 <= hi for lo, hi in intervals])
    assert 0.93 <= covered <= 0.97


def test_tangos_tost_is_its_90_percent_interval_inside_the_margin():
    for b, c, n in [(0, 0, 7), (0, 0, 140), (10, 10, 140), (3, 1, 140), (9, 2, 164)]:
        lo, hi = inf.tango_interval(b, c, n, 0.90)
        inside = -0.04 < lo and hi < 0.04
        assert (inf.tango_tost(b, c, n, 0.04) < 0.05) == inside, (b, c, n)
    assert inf.tango_tost(0, 0, 7, 0.04) > 0.2  # seven concordant items do not show a difference under 4 points


def test_tangos_tost_power_is_the_share_of_simulated_samples_it_decides():
    """The exact power sum against 4,000 simulated paired samples of the same discordance, each read by
    `tango_tost` itself; the sample size is the first n where that power reaches 80%."""
    rng = np.random.default_rng(4)
    for p10, p01, n in [(0.05, 0.05, 300), (0.08, 0.02, 164), (0.0, 0.0, 80)]:
        counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=4000)
        simulated = np.mean([inf.tango_tost(b, c, n, 0.04) < 0.05 for b, c, _ in counts])
        assert power.tango_tost_power(p10, p01, n, 0.04) == pytest.approx(simulated, abs=0.025), (p10, p01, n)
    n = power.tango_items_needed(0.1, 0.04)
    assert power.tango_tost_power(0.05, 0.05, n, 0.04) >= 0.8 > power.tango_tost_power(0.05, 0.05, n - 1, 0.04)
    # the normal approximation on 0/1 differences of the same spread lands near it
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.9)
    assert n == pytest.approx((z * math.sqrt(0.1) / 0.04) ** 2, rel=0.1)
    # no discordance at all: the n at which that many concordant pairs alone show equivalence, not 2
    none = power.tango_items_needed(0.0, 0.04)
    assert inf.tango_tost(0, 0, none, 0.04) < 0.05 <= inf.tango_tost(0, 0, none - 1, 0.04)
    assert power.tango_items_needed(0.5, 0.04, limit=1000) is None
    with pytest.raises(ValueError, match="discordance in"):
        power.tango_items_needed(1.5, 0.04)


def test_values_that_do_not_vary_are_evidence_in_proportion_to_their_number_not_certainty():
    """n paired 0/1 differences that are all 0: a t-test has zero spread and would read p = 0 at any n. The
    exact reading: the boundary null (a share `margin` of items differ by 1, the rest by 0, mean = margin)
    leaves all n items at 0 with probability (1 - margin)^n, which is the p; simulated from that null, the
    all-zero samples come up that often. The interval's ends are where the one-sided p is half its tail."""
    margin, n = 0.04, 40
    assert inf.t_tost(np.zeros(n), margin) == pytest.approx((1 - margin) ** n, rel=1e-12)
    assert inf.t_noninferior(np.zeros(n), margin) == pytest.approx((1 - margin) ** n, rel=1e-12)
    draws = np.random.default_rng(5).random((20_000, n)) < margin  # items that differ under the boundary null
    assert np.mean(~draws.any(axis=1)) == pytest.approx((1 - margin) ** n, abs=0.01)
    assert inf.t_tost(np.zeros(7), margin) > 0.7 and inf.t_tost(np.zeros(140), margin) < 0.01
    assert inf.t_tost(np.zeros(300), margin, bound=2.0) == pytest.approx((1 - margin / 2) ** 300, rel=1e-12)
    lo, hi = inf.t_interval(np.zeros(n), 0.95)
    assert (1 - hi) ** n == pytest.approx(0.025, rel=1e-9) and lo == pytest.approx(-hi, rel=1e-12)
    assert inf.t_noninferior(np.full(5, 1.0), margin) == pytest.approx(((1 - margin) / 2) ** 5, rel=1e-12)
    assert inf.t_tost(np.full(9, 0.5), margin) == 1.0  # a constant offset beyond the margin shows no equivalence
    assert power.tost_items_needed(np.zeros(10), margin) == math.ceil(math.log(0.05) / math.log(1 - margin))
    assert inf.t_tost(np.zeros(power.tost_items_needed(np.zeros(10), margin)), margin) < 0.05
    # every item the same nonzero gain: the sign-flip needs 6 items (2 / 2^6 < 0.05), never "0 items"
    needed = power.mean_items_needed(np.full(4, 0.25))
    assert inf.sign_flip(np.full(needed, 0.25)) < 0.05 <= inf.sign_flip(np.full(needed - 1, 0.25))
