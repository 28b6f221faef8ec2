"""Each layout's row set on hand-made score vectors."""

import pytest
import torch

from bcr_core.errors import UsageError
from bcr_core.repair.layouts import Chunk, Grow, LayoutConfig, Single, layout


def t(values):
    return torch.tensor(values, dtype=torch.float64)


NO_SKIP = LayoutConfig(skip="off")  # these small vectors are under Algorithm 1's 2B rows


def test_single_takes_the_best_rows_ties_to_the_earlier():
    scores = t([0.1, 0.5, 0.5, 0.2, 0.5, 0.0, 0.3, 0.0, 0.0, 0.0])
    assert Single(NO_SKIP).rows(scores, 0.3).tolist() == [1, 2, 4]
    assert Single(NO_SKIP).rows(scores, 0.2).tolist() == [1, 2]
    assert Single(NO_SKIP).rows(scores, 1.0).tolist() == list(range(10))
    assert Single(NO_SKIP).rows(scores, 0.04).tolist() == []  # round(0.4) = 0 rows: nothing to repair
    assert Single().rows(scores, 1.0).tolist() == []  # Algorithm 1's skip rule: M = 10 < 2B = 128


def test_chunk_scores_a_short_trailing_chunk_by_its_mean():
    b = 4
    scores = t([1] * 4 + [0] * 4 + [2] * 4 + [0] * 4 + [3, 3])  # M = 18: chunks of 4, 4, 4, 4, 2
    chunk = Chunk(LayoutConfig(chunk=b))
    assert chunk.rows(scores, 0.4).tolist() == [8, 9, 10, 11, 16, 17]  # round(0.4 * 5) = 2 chunks
    assert chunk.rows(scores, 1.0).tolist() == list(range(18))


def test_chunk_ties_go_to_the_earlier_chunk():
    chunk = Chunk(LayoutConfig(chunk=2))
    assert chunk.rows(t([1, 1, 1, 1, 0, 0, 0, 0, 0, 0]), 0.2).tolist() == [0, 1]


def test_chunk_skip_rule():
    chunk = Chunk()  # B = 64
    assert chunk.rows(torch.rand(127), 1.0).numel() == 0  # M < 2B
    assert chunk.rows(torch.rand(300), 0.2).numel() == 0  # rho * M = 60 < B
    assert chunk.rows(torch.rand(320), 0.2).numel() == 64  # rho * M = 64: one chunk


def test_grow_extends_towards_the_better_neighbour_and_stops_at_tau():
    #        0    1    2    3    4    5    6    7    8    9
    scores = t([0.0, 0.1, 0.3, 0.6, 1.0, 0.5, 0.2, 0.0, 0.9, 0.0])
    grow = Grow(LayoutConfig(tau=0.25, skip="off"))
    # seed 4 (1.0): neighbours 3 (0.6) and 5 (0.5) -> 3, then 5, then 2 (0.3), then 6 (0.2) < 0.25 and 1 < 0.25: stop.
    # next seed 8 (0.9): neighbours 7 and 9 score 0 < 0.225: a span of one row.
    assert grow.rows(scores, 0.5).tolist() == [2, 3, 4, 5, 8]
    assert grow.rows(scores, 0.6).tolist() == [2, 3, 4, 5, 6, 8]  # then 6 (0.2), the best row left, seeds
    assert grow.rows(scores, 0.3).tolist() == [3, 4, 5]  # budget exhausted mid-span


def test_grow_respects_the_span_cap():
    scores = t([1.0] * 10)
    grow = Grow(LayoutConfig(tau=0.25, span_cap=3, skip="off"))
    assert grow.rows(scores, 0.6).tolist() == [0, 1, 2, 3, 4, 5]  # two capped spans: 0-2 then 3-5


def test_grow_at_full_budget_covers_every_row():
    assert Grow(NO_SKIP).rows(torch.rand(50), 1.0).tolist() == list(range(50))


@pytest.mark.parametrize("rho", [-0.1, 1.5])
def test_rho_outside_the_unit_interval_is_an_error(rho):
    with pytest.raises(UsageError, match=r"rho must lie in \[0, 1\]"):
        Single(NO_SKIP).rows(torch.rand(10), rho)


def test_unknown_layout_is_an_error():
    with pytest.raises(UsageError, match="unknown layout 'tile'"):
        layout("tile")
