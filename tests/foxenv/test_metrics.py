"""Trading metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from foxenv import metrics


def test_sharpe_hand_computed() -> None:
    # mean 2, sample std sqrt(((1-2)^2 + 0 + (3-2)^2) / 2) = 1
    assert metrics.sharpe_ratio([1.0, 2.0, 3.0]) == pytest.approx(2.0)
    # annualised by sqrt(4) = 2
    assert metrics.sharpe_ratio(np.array([1.0, 2.0, 3.0]), periods_per_year=4) == pytest.approx(4.0)
    # mean 1, sample std sqrt((1 + 1) / 1) = sqrt(2)
    assert metrics.sharpe_ratio([0.0, 2.0]) == pytest.approx(1.0 / math.sqrt(2.0))


def test_sharpe_batched_and_degenerate_rows() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-1.0, -1.0, -1.0], [1.0, -1.0, 0.0]])
    ratio = metrics.sharpe_ratio(returns)
    assert isinstance(ratio, np.ndarray) and ratio.shape == (4,)
    assert ratio[0] == pytest.approx(2.0)
    assert ratio[1] == 0.0
    assert ratio[2] == -math.inf
    assert ratio[3] == 0.0


def test_sharpe_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="returns"):
        metrics.sharpe_ratio([1.0])
    with pytest.raises(ValueError, match="returns"):
        metrics.sharpe_ratio([1.0, float("nan")])
    with pytest.raises(ValueError, match="periods_per_year=0"):
        metrics.sharpe_ratio([1.0, 2.0], periods_per_year=0)


def test_max_drawdown_hand_computed() -> None:
    # running peak 1 3 3 5 5 5, drawdown 0 0 1 0 4 1
    assert metrics.max_drawdown([1.0, 3.0, 2.0, 5.0, 1.0, 4.0]) == pytest.approx(4.0)
    batch = metrics.max_drawdown(np.array([[0.0, 1.0, 2.0], [0.0, -2.0, -1.0]]))
    np.testing.assert_allclose(batch, [0.0, 2.0])


def test_turnover_hand_computed() -> None:
    # |1-0| + |3-1| + |-1-3| + |-1-(-1)| = 1 + 2 + 4 + 0
    assert metrics.turnover([1.0, 3.0, -1.0, -1.0]) == pytest.approx(7.0)
    # from a starting position of 1: 0 + 2 + 4 + 0
    assert metrics.turnover([1.0, 3.0, -1.0, -1.0], initial_position=1.0) == pytest.approx(6.0)
    np.testing.assert_allclose(metrics.turnover(torch.tensor([[0.0, 0.0], [-2.0, 2.0]])), [0.0, 6.0])


def test_turnover_restarts_at_episode_starts() -> None:
    # the book was reset to flat before step 2: |1| + |3-1| + |2-0| + |-2-2| = 1 + 2 + 2 + 4
    positions = [1.0, 3.0, 2.0, -2.0]
    starts = [False, False, True, False]
    assert metrics.turnover(positions, episode_starts=starts) == pytest.approx(9.0)
    with pytest.raises(ValueError, match="episode_starts"):
        metrics.turnover(positions, episode_starts=starts[:3])


def test_hit_rate_hand_computed() -> None:
    # winners: 1 and 3 (0 is not a win) -> 2 of 4
    assert metrics.hit_rate([1.0, -2.0, 0.0, 3.0]) == pytest.approx(0.5)
    pnl = np.array([[5.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    closed = np.array([[True, False, True, False], [False, False, False, False]])
    rate = metrics.hit_rate(pnl, closed)
    assert rate[0] == pytest.approx(0.5)
    assert math.isnan(rate[1])
    with pytest.raises(ValueError, match="closed"):
        metrics.hit_rate(pnl, closed[:, :2])


def test_action_mix_hand_computed() -> None:
    actions = np.array([[0, 1, 2, 0], [2, 1, 0, 0], [2, 0, 0, 1], [1, 1, 0, 2]])
    table = metrics.action_mix(actions)
    expected = np.array(
        [
            [0.25, 0.25, 0.5],
            [0.25, 0.75, 0.0],
            [0.75, 0.0, 0.25],
            [0.5, 0.25, 0.25],
        ]
    )
    np.testing.assert_allclose(table, expected)
    # leading axes are flattened, torch input works too
    np.testing.assert_allclose(metrics.action_mix(torch.from_numpy(actions).reshape(2, 2, 4)), expected)


def test_action_mix_uneven_branches_and_errors() -> None:
    table = metrics.action_mix(np.array([[0, 4], [1, 4]]), nvec=(2, 5))
    np.testing.assert_allclose(table, [[0.5, 0.5, 0, 0, 0], [0, 0, 0, 0, 1.0]])
    with pytest.raises(ValueError, match="actions"):
        metrics.action_mix(np.array([[0, 3, 0, 0]]))
    with pytest.raises(ValueError, match="actions"):
        metrics.action_mix(np.array([[0, 1, 0]]))
    with pytest.raises(ValueError, match="actions"):
        metrics.action_mix(np.array([[0.0, 1.0, 0.0, 0.0]]))


def test_sortino_hand_computed() -> None:
    # mean 0.5; downside deviation sqrt((1 + 4) / 4)
    assert metrics.sortino_ratio([2.0, -1.0, -2.0, 3.0]) == pytest.approx(0.5 / math.sqrt(5.0 / 4.0))
    assert metrics.sortino_ratio([2.0, -1.0, -2.0, 3.0], periods_per_year=9) == pytest.approx(
        3 * 0.5 / math.sqrt(5.0 / 4.0))
    ratio = metrics.sortino_ratio(np.array([[1.0, 2.0], [0.0, 0.0], [-1.0, -1.0]]))
    assert ratio.tolist() == [math.inf, 0.0, -1.0]


def test_max_drawdown_counts_a_fall_from_the_initial_equity() -> None:
    # cumulative PnL -1, -3, 2: from its first value the fall is 2; from the initial 0 it is 3
    assert metrics.max_drawdown([-1.0, -3.0, 2.0]) == 2.0
    assert metrics.max_drawdown([-1.0, -3.0, 2.0], initial=0.0) == 3.0
    assert metrics.max_drawdown(np.array([[-1.0, -3.0], [1.0, 2.0]]), initial=0.0).tolist() == [3.0, 0.0]


def test_annualisation_only_where_the_sample_covers_a_trading_day() -> None:
    assert metrics.annualisation(10.0, 4 * 10.0) is None  # 40 s of data
    assert metrics.annualisation(10.0, 6.5 * 3600) == pytest.approx(math.sqrt(252 * 6.5 * 3600 / 10.0))
    assert metrics.annualisation(float("nan"), 1e9) is None and metrics.annualisation(0.0, 1e9) is None


def test_the_vocabulary_names_units_and_labels() -> None:
    assert metrics.currency_of("LOBSTER GOOG_2012-06-21_34200000_57600000") == "USD"
    assert metrics.currency_of("synthetic seed=0 steps=20000 levels=10") == "synthetic currency units"
    named = metrics.units("USD")
    assert named["pnl"].startswith("USD") and "{" not in "".join(named.values())
    assert metrics.action_labels()["order"] == ["market", "limit_maker", "ioc"]
    assert metrics.action_labels((2, 5), ("direction", "x")) == {"direction": ["0", "1"],
                                                                 "x": ["0", "1", "2", "3", "4"]}
    with pytest.raises(ValueError, match="branch_names"):
        metrics.action_labels((3,), ("a", "b"))
