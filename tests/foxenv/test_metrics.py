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


def test_summarize_hand_computed() -> None:
    step_pnl = np.array([[1.0, -2.0, 3.0], [0.0, 0.0, 0.0]])
    positions = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    trade_pnl = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    trade_closed = np.array([[False, True, False], [False, False, False]])
    actions = np.zeros((2, 3, 4), dtype=np.int64)
    summary = metrics.summarize(
        step_pnl=step_pnl,
        positions=positions,
        trade_pnl=trade_pnl,
        trade_closed=trade_closed,
        actions=actions,
        episode_rewards=[1.0, 2.0],
    )
    # book 0: mean 2/3, sample std sqrt(((1/3)^2 + (8/3)^2 + (7/3)^2) / 2) = sqrt(19/3); book 1: 0
    assert summary["sharpe"] == pytest.approx((2.0 / 3.0) / math.sqrt(19.0 / 3.0) / 2.0)
    # book 0 cumulative 1, -1, 2 -> drawdown 2; book 1: 0
    assert summary["max_drawdown"] == pytest.approx(1.0)
    # book 0 turnover 2 lots over 3 steps, book 1: 0 -> mean 1 lot / 3 steps
    assert summary["turnover"] == pytest.approx(1.0 / 3.0)
    assert summary["total_pnl"] == pytest.approx(1.0)
    assert summary["hit_rate"] == 0.0
    assert summary["num_trades"] == 1
    assert summary["steps"] == 6
    assert summary["episodes"] == 2
    assert summary["mean_episode_reward"] == pytest.approx(1.5)
    assert summary["action_mix"]["direction"] == [1.0, 0.0, 0.0]
    assert list(summary["action_mix"]) == ["direction", "magnitude", "order", "urgency"]


def test_summarize_rejects_series_of_another_shape() -> None:
    series = np.zeros((2, 5))
    with pytest.raises(ValueError, match=r"positions has shape \(2, 4\), step_pnl has shape \(2, 5\)"):
        metrics.summarize(step_pnl=series, positions=np.zeros((2, 4)), trade_pnl=series, trade_closed=series)
    with pytest.raises(ValueError, match=r"trade_closed has shape \(5,\)"):
        metrics.summarize(step_pnl=series, positions=series, trade_pnl=series, trade_closed=np.zeros(5))
