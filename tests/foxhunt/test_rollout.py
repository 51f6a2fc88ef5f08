"""The random-policy rollout: finite metrics, consistent bookkeeping, determinism."""

from __future__ import annotations

import math

import pytest

from foxenv.data.market import MarketData
from foxhunt.evaluation.rollout import random_rollout
from tests.foxenv.fake_market import random_market


@pytest.fixture(scope="module")
def market() -> MarketData:
    """A random-walk 10-level market of 400 steps."""
    return random_market(400, num_levels=10, seed=5)


def test_random_rollout_returns_finite_consistent_metrics(market: MarketData) -> None:
    summary = random_rollout(num_steps=40, num_envs=4, data=market, seed=0, progress=False, episode_length=20)
    for key in ("sharpe", "max_drawdown", "turnover", "pnl", "pnl_per_book", "hit_rate",
                "mean_episode_reward", "book_steps_per_second"):
        assert math.isfinite(summary[key]), key
    assert summary["steps"] == 160 and summary["num_envs"] == 4 and summary["num_steps"] == 40
    # every book finished exactly two 20-step episodes
    assert summary["episodes"] == summary["episodes_finished"] == 8
    # reward = change of equity (reward_scale 1, no penalty), and every episode finished:
    # the summed episode rewards are the summed PnL of all books
    assert summary["mean_episode_reward"] * 8 == pytest.approx(summary["pnl"], rel=1e-4, abs=1e-3)
    assert summary["pnl_per_book"] * 4 == pytest.approx(summary["pnl"])
    assert summary["max_drawdown"] >= 0.0 and summary["turnover"] > 0.0 and summary["trades"] > 0
    assert summary["currency"] == "synthetic currency units" and 0.0 <= summary["resting_share"] <= 1.0
    assert 0.0 <= summary["hit_rate"] <= 1.0
    assert list(summary["action_mix"]) == ["direction", "magnitude", "order", "urgency"]
    for frequencies in summary["action_mix"].values():
        assert len(frequencies) == 3 and sum(frequencies) == pytest.approx(1.0)


def test_random_rollout_is_deterministic(market: MarketData) -> None:
    def run(seed: int) -> dict:
        summary = random_rollout(num_steps=30, num_envs=3, data=market, seed=seed, progress=False,
                                 episode_length=10)
        summary.pop("book_steps_per_second")
        return summary

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_random_rollout_on_synthetic_data_and_bad_length() -> None:
    summary = random_rollout(num_steps=25, num_envs=2, seed=0, progress=False, market_steps=300,
                             episode_length=50)
    assert summary["market"].startswith("synthetic")
    assert math.isfinite(summary["sharpe"]) and summary["episodes_finished"] == 0
    with pytest.raises(ValueError, match="num_steps=1"):
        random_rollout(num_steps=1, progress=False)


@pytest.mark.gpu
def test_random_rollout_on_cuda_is_finite_and_deterministic(market: MarketData) -> None:
    def run() -> dict:
        summary = random_rollout(num_steps=40, num_envs=256, data=market, seed=3, device="cuda",
                                 progress=False, episode_length=20)
        summary.pop("book_steps_per_second")
        return summary

    first = run()
    assert first["device"].startswith("cuda") and first["episodes"] == 512
    for key in ("sharpe", "max_drawdown", "turnover", "hit_rate", "mean_episode_reward"):
        assert math.isfinite(first[key]), key
    assert run() == first
