"""The execute task's baselines (foxhunt.evaluation.execution_baselines): their schedules on a tiny fake
market (TWAP slices sum to Q, the final cross), hand-computed shortfalls, Almgren-Chriss and VWAP schedules,
and buys and sells symmetric."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxhunt.evaluation.execution_baselines import (
    EXECUTION_BASELINES,
    ExecutionModel,
    almgren_chriss_kappa,
    almgren_chriss_schedule,
    baseline_child_sizes,
    disjoint_offsets,
    fit_execution_model,
    make_execution_baseline,
    score_windows,
    twap_schedule,
)
from tests.foxenv.fake_market import flat_market, random_market

T = 4
Q = 40.0
DEEP_BID = [(100.00, 1000.0)]
DEEP_ASK = [(100.02, 1000.0)]
ARRIVAL = 100.01
ROW0 = torch.tensor([0])


def config(**overrides) -> EnvConfig:
    settings = {"levels": 1, "episode_length": T, "task": "execute", "exec_side": "buy", "exec_quantity": Q,
                "maker_fee_bps": 0.0, "taker_fee_bps": 0.5, **overrides}
    return EnvConfig(**settings)


def positions(policy, market, cfg: EnvConfig) -> list[float]:
    """The position after each step of one window starting at row 0, run with the baselines' child sizes."""
    cfg = dataclasses.replace(cfg, exec_child_sizes=baseline_child_sizes(cfg.episode_length))
    env = BatchedLOB(market, 1, cfg, seed=0)
    obs = env.reset()
    assert env.state_dict()["offset"].item() == 0
    policy.reset(1, env.device)
    path = []
    for _ in range(cfg.episode_length):
        obs, _, _, _, info = env.step(policy.act(obs, torch.zeros(1, dtype=torch.bool)))
        path.append(info["position"].item())
    return path


def test_twap_sends_equal_market_slices_summing_to_q_and_its_shortfall_is_hand_computed() -> None:
    market = flat_market(T + 1, DEEP_BID, DEEP_ASK)
    assert positions(make_execution_baseline("twap", T), market, config()) == [10.0, 20.0, 30.0, 40.0]
    result = score_windows(make_execution_baseline("twap", T), market, config(), ROW0)
    # every share at the ask 100.02 against the arrival mid 100.01, plus the 0.5 bps taker fee
    expected = 1e4 * (0.01 + 100.02 * 0.5e-4) / ARRIVAL
    assert result["shortfall_bps"].item() == pytest.approx(expected, rel=1e-9)
    assert result["filled_at"].item() == T


def test_immediate_takes_everything_at_once_walking_the_book() -> None:
    market = flat_market(T + 1, DEEP_BID, [(100.02, 30.0), (100.03, 30.0)])
    assert positions(make_execution_baseline("immediate", T), market, config(levels=2)) == [Q] * T
    result = score_windows(make_execution_baseline("immediate", T), market, config(levels=2), ROW0)
    notional = 30 * 100.02 + 10 * 100.03
    assert result["shortfall_bps"].item() == pytest.approx(1e4 * (notional * 1.00005 - Q * ARRIVAL)
                                                           / (Q * ARRIVAL), rel=1e-9)
    assert result["filled_at"].item() == 1


def test_submit_and_leave_without_flow_crosses_everything_at_the_end() -> None:
    market = flat_market(T + 1, DEEP_BID, DEEP_ASK)  # no trades: the resting order never fills
    path = positions(make_execution_baseline("submit_and_leave", T), market, config())
    assert path == [0.0] * (T - 1) + [Q]
    result = score_windows(make_execution_baseline("submit_and_leave", T), market, config(), ROW0)
    assert result["shortfall_bps"].item() == pytest.approx(1e4 * (0.01 + 100.02 * 0.5e-4) / ARRIVAL)


def test_submit_and_leave_fills_at_the_touch_from_the_flow() -> None:
    market = flat_market(T + 1, DEEP_BID, DEEP_ASK, exec_bid={2: {100.00: 1030.0}})  # 1000 ahead, 30 fill
    path = positions(make_execution_baseline("submit_and_leave", T), market, config())
    assert path == [0.0, 30.0, 30.0, Q]  # the 10 left cross at T
    result = score_windows(make_execution_baseline("submit_and_leave", T), market, config(), ROW0)
    cost = 30 * (100.00 - ARRIVAL) + 10 * (100.02 * 1.00005 - ARRIVAL)
    assert result["shortfall_bps"].item() == pytest.approx(1e4 * cost / (Q * ARRIVAL), rel=1e-9)


def test_twap_limit_posts_each_slice_and_crosses_what_is_left_at_its_end() -> None:
    # two slices of two steps; 5 of the first slice's 20 fill at the bid in row 1
    market = flat_market(T + 1, DEEP_BID, DEEP_ASK, exec_bid={1: {100.00: 1005.0}})
    policy = make_execution_baseline("twap_limit", T, intervals=2)
    assert positions(policy, market, config()) == [5.0, 20.0, 20.0, Q]
    result = score_windows(make_execution_baseline("twap_limit", T, intervals=2), market, config(),
                           ROW0)
    cost = 5 * (100.00 - ARRIVAL) + 35 * (100.02 * 1.00005 - ARRIVAL)
    assert result["shortfall_bps"].item() == pytest.approx(1e4 * cost / (Q * ARRIVAL), rel=1e-9)


def test_twap_limit_keeps_its_queue_within_a_slice() -> None:
    # one slice of four steps: 20 of 40 fill in row 1 after the 1000 ahead, 20 more in row 3 (queue kept)
    market = flat_market(T + 1, DEEP_BID, DEEP_ASK, exec_bid={1: {100.00: 1020.0}, 3: {100.00: 20.0}})
    assert positions(make_execution_baseline("twap_limit", T, intervals=1), market, config()) == [20.0, 20.0,
                                                                                                    Q, Q]


def test_almgren_chriss_is_twap_at_zero_risk_aversion_and_front_loads_above() -> None:
    torch.testing.assert_close(almgren_chriss_schedule(10, 0.0), twap_schedule(10))
    assert almgren_chriss_kappa(0.0, 0.1, 1e-4) == 0.0
    kappa = almgren_chriss_kappa(1e-2, 0.1, 1e-4)
    assert kappa == pytest.approx(math.acosh(1 + 1e-2 * 0.01 / 2e-4))
    schedule = almgren_chriss_schedule(10, kappa)
    assert schedule[-1].item() == pytest.approx(1.0)
    assert bool((schedule.diff() > 0).all())
    assert bool((schedule[:-1] > twap_schedule(10)[:-1]).all())  # ahead of TWAP until the end
    assert bool((schedule.diff()[1:] < schedule.diff()[:-1]).all())  # ever smaller children
    # by hand, two steps: the first child is 1 - sinh(k) / sinh(2 k) = 1 - 1 / (2 cosh k) of the parent; with
    # cosh k = 1 + lambda sigma^2 / (2 eta) = 1.25 (lambda 0.25, sigma 1, eta 0.5) that is 0.6
    two = almgren_chriss_schedule(2, almgren_chriss_kappa(0.25, 1.0, 0.5))
    torch.testing.assert_close(two, torch.tensor([0.6, 1.0], dtype=torch.float64))
    huge = almgren_chriss_schedule(10, 100.0)  # no overflow: all in the first step
    assert huge[0].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="kappa"):
        almgren_chriss_schedule(10, -1.0)
    with pytest.raises(ValueError, match="risk_aversion"):
        almgren_chriss_kappa(-1.0, 0.1, 1e-4)


def test_almgren_chriss_policy_follows_its_schedule_and_sums_to_q() -> None:
    market = flat_market(T + 1, DEEP_BID, DEEP_ASK)
    model = ExecutionModel(sigma=1.0, eta=0.5, step_seconds=1.0, profile_start=0.0, bin_seconds=1.0,
                           profile=(1.0,))
    policy = make_execution_baseline("almgren_chriss", T, model, risk_aversion=1.0)
    schedule = almgren_chriss_schedule(T, almgren_chriss_kappa(1.0, 1.0, 0.5))
    expected = [round(float(x) * T * 4) / 4 * Q / T for x in schedule]  # nearest quarter slice
    assert positions(policy, market, config()) == pytest.approx(expected)
    assert expected[-1] == Q and expected[0] > Q / T


def test_vwap_follows_the_fit_volume_profile_of_the_windows_clock() -> None:
    # fit data: the first 2 s trade 3 shares a step, the next 2 s 1 share a step (bins of 2 s, steps of 1 s)
    fit = flat_market(4, DEEP_BID, DEEP_ASK, exec_ask={0: {100.02: 3.0}, 1: {100.02: 3.0}, 2: {100.02: 1.0},
                                                       3: {100.02: 1.0}})
    model = fit_execution_model(fit, slice_shares=Q / T, bin_seconds=2.0)
    assert model.profile == (3.0, 1.0) and model.step_seconds == 1.0
    market = flat_market(T + 1, DEEP_BID, DEEP_ASK)
    policy = make_execution_baseline("vwap", T, model)
    policy.reset(1, torch.device("cpu"))
    policy.start_times(torch.tensor([0.0]))  # steps end at 1 (bin 0: 3), 2, 3 (bin 1: 1), 4 (no bin: 2)
    expected = torch.tensor([[3.0, 4.0, 5.0, 7.0]], dtype=torch.float64) / 7
    torch.testing.assert_close(policy._schedule, expected)
    result = score_windows(make_execution_baseline("vwap", T, model), market, config(), ROW0)
    assert result["filled_at"].item() == T


def test_fit_execution_model_impact_and_volatility() -> None:
    fit = flat_market(5, [(100.00, 10.0), (99.95, 10.0)], [(100.02, 10.0), (100.07, 10.0)])
    model = fit_execution_model(fit, slice_shares=10.0)
    # one slice at the touch, two cost 0.025 more per share on average (half at 5 ticks): eta = 0.025 / 10
    assert model.eta == pytest.approx(0.0025) and model.sigma == 0.0
    # slices within the best level cost nothing extra: eta is then half a tick per share of the best level
    assert fit_execution_model(fit, slice_shares=2.0).eta == pytest.approx(0.01 / 20)
    with pytest.raises(ValueError, match="slice_shares"):
        fit_execution_model(fit, slice_shares=0.0)


@pytest.mark.parametrize("name", EXECUTION_BASELINES)
def test_buys_and_sells_are_symmetric_for_every_baseline(name: str) -> None:
    # a symmetric book (1 tick each side of the arrival), flow on both sides mirrored, no fees
    bid, ask = [(100.00, 20.0), (99.99, 50.0)], [(100.02, 20.0), (100.03, 50.0)]
    market = flat_market(T + 1, bid, ask, exec_bid={1: {100.00: 25.0}}, exec_ask={1: {100.02: 25.0}})
    model = ExecutionModel(sigma=1.0, eta=0.5, step_seconds=1.0, profile_start=0.0, bin_seconds=1.0,
                           profile=(1.0, 2.0, 1.0, 3.0))
    results = []
    for side in ("buy", "sell"):
        cfg = config(levels=2, exec_side=side, taker_fee_bps=0.0)
        results.append(score_windows(make_execution_baseline(name, T, model, risk_aversion=1.0), market, cfg,
                                     ROW0))
    buy, sell = results
    assert sell["side"].item() == -1.0 and buy["side"].item() == 1.0
    assert sell["shortfall_bps"].item() == pytest.approx(buy["shortfall_bps"].item(), abs=1e-9)
    assert sell["filled_at"].item() == buy["filled_at"].item()


def test_every_baseline_finishes_every_window_on_a_random_market() -> None:
    market = random_market(400, 5, seed=9)
    cfg = EnvConfig(levels=5, episode_length=10, task="execute", exec_quantity=300.0)
    model = fit_execution_model(market.slice(0, 200), slice_shares=30.0)
    offsets = disjoint_offsets(market.num_steps, 10, limit=12)
    assert offsets.tolist() == list(range(0, 120, 10))
    for name in EXECUTION_BASELINES:
        result = score_windows(make_execution_baseline(name, 10, model), market, cfg, offsets)
        assert bool(torch.isfinite(result["shortfall_bps"]).all()), name
        assert bool((result["filled_at"] <= 10).all()), name
        assert set(result["side"].tolist()) == {-1.0, 1.0}


def test_unknown_baseline_and_missing_model_are_refused() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        make_execution_baseline("pov", T)
    with pytest.raises(ValueError, match="needs a model"):
        make_execution_baseline("vwap", T)
    with pytest.raises(ValueError, match="task='trade'"):
        score_windows(make_execution_baseline("twap", T), flat_market(6, DEEP_BID, DEEP_ASK),
                      EnvConfig(levels=1, episode_length=T), ROW0)
