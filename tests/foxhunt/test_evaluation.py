"""The evaluation instrument: the recorder and its metrics on hand-worked cases, the paired comparison, the
planned episode windows, the baselines (the oracle on and off the planted signal) and the API's held-out
rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from foxenv.data import generate_synthetic
from foxhunt.evaluation import evaluate, evaluate_policies
from foxhunt.evaluation.baselines import ModelPolicy, OraclePolicy, RandomPolicy
from foxhunt.evaluation.metrics import compute_metrics, episode_pnl, paired_comparison
from foxhunt.evaluation.recorder import SERIES, Recording, distinct_rows, plan_offsets, record
from tests.foxenv.fake_market import make_market, random_market


def hand_recording(step_pnl: list[list[float]], episode_length: int, policy: str = "p",
                   **series: list[list[float]]) -> Recording:
    """A recording of ``[N, B]`` series given by hand (the rest zero, every book alive)."""
    pnl = torch.tensor(step_pnl, dtype=torch.float64)
    shape = tuple(pnl.shape)
    values = {name: torch.zeros(shape, dtype=torch.float64) for name in SERIES if name != "actions"}
    values["step_pnl"] = pnl
    values["alive"] = torch.ones(shape, dtype=torch.bool)
    values["trade_closed"] = torch.zeros(shape, dtype=torch.bool)
    values["order_active"] = torch.zeros(shape, dtype=torch.bool)
    values["actions"] = torch.zeros((*shape, 4), dtype=torch.int8)
    for name, value in series.items():
        values[name] = torch.tensor(value, dtype=values[name].dtype if name != "actions" else torch.int8)
    values["equity"] = torch.cumsum(pnl, 0)
    episodes = -(-shape[0] // episode_length)
    offsets = torch.arange(episodes * shape[1]).reshape(episodes, shape[1]) * 100
    return Recording(policy=policy, series=values, offsets=offsets, episode_length=episode_length,
                     market="hand", step_seconds=10.0)


def test_metrics_of_a_hand_worked_series() -> None:
    # one book, 4 steps: PnL +2, -1, -2, +3 (cumulative 2, 1, -1, 2: drawdown 3 from the peak 2)
    rec = hand_recording(
        [[2.0], [-1.0], [-2.0], [3.0]], episode_length=4,
        traded_lots=[[10.0], [0.0], [10.0], [20.0]], notional=[[1000.0], [0.0], [1000.0], [2000.0]],
        maker_lots=[[10.0], [0.0], [0.0], [0.0]], fees=[[0.5], [0.0], [0.5], [1.0]],
        position=[[10.0], [10.0], [0.0], [-20.0]],
        trade_closed=[[False], [False], [True], [False]], trade_pnl=[[0.0], [0.0], [-1.5], [0.0]],
        actions=[[[2, 0, 1, 0]], [[2, 0, 1, 0]], [[1, 0, 0, 0]], [[0, 2, 0, 2]]],
    )
    m = compute_metrics(rec)
    samples = np.array([2.0, -1.0, -2.0, 3.0])
    assert m["pnl"] == 2.0 and m["pnl_per_episode"] == 2.0
    assert m["pnl_bps_of_notional"] == pytest.approx(1e4 * 2.0 / 4000.0)
    assert m["sharpe"] == pytest.approx(samples.mean() / samples.std(ddof=1))
    assert m["sortino"] == pytest.approx(0.5 / math.sqrt((1 + 4) / 4))
    # 4 steps of 10 s are no sample to annualise from: n/a (the rule of foxenv.metrics.annualisation)
    assert math.isnan(m["sharpe_annualised"]) and math.isnan(m["sortino_annualised"])
    # on a clock of one 6.5 h session per step the 4 distinct steps cover 4 days: annualised by sqrt(252)
    daily = compute_metrics(rec, step_seconds=6.5 * 3600)
    assert daily["sharpe_annualised"] == pytest.approx(m["sharpe"] * math.sqrt(252))
    assert daily["sortino_annualised"] == pytest.approx(m["sortino"] * math.sqrt(252))
    assert m["max_drawdown"] == 3.0 and m["max_drawdown_worst"] == 3.0
    assert m["turnover"] == 40.0 / 4 and m["notional_traded"] == 4000.0
    assert m["fees"] == 2.0 and m["maker_share"] == 0.25
    assert m["trades"] == 1 and m["hit_rate"] == 0.0 and m["fills"] == 3
    assert m["time_in_market"] == 0.75 and m["mean_abs_position"] == 10.0
    assert m["action_mix"]["direction"] == [0.25, 0.25, 0.5]
    assert m["action_mix"]["order"] == [0.5, 0.5, 0.0]
    assert m["action_labels"]["order"] == ["market", "limit_maker", "ioc"]
    assert m["action_labels"]["direction"] == ["short", "flat", "long"]
    assert m["steps"] == 4 and m["episodes"] == 1
    assert m["currency"] == "synthetic currency units" and m["resting_share"] == 0.0
    assert math.isnan(m["resting_distance"])


def test_resting_order_metrics_by_hand() -> None:
    # 2 books, 2 steps: orders rest in 3 of the 4 book-steps, 2, 0 and -1 ticks behind their own touch
    rec = hand_recording([[0.0, 0.0], [0.0, 0.0]], episode_length=2,
                         order_active=[[True, True], [False, True]], order_distance=[[2.0, 0.0], [0.0, -1.0]])
    m = compute_metrics(rec)
    assert m["resting_share"] == 0.75 and m["resting_distance"] == pytest.approx(1.0 / 3.0)


class PassiveSell:
    """A LimitMaker sell of a quarter of max_position, one tick behind the ask, every step."""

    name = "passive_sell"

    def reset(self, num_books: int, device: torch.device) -> None:
        self._action = torch.tensor([[0, 0, 1, 0]], device=device).expand(num_books, 4).contiguous()

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        return self._action


def test_a_resting_order_follows_a_falling_market_and_is_measured() -> None:
    # the ask falls a tick a step and nothing trades: the sell, re-pegged one tick behind each ask, sits
    # 2 ticks behind the next snapshot's ask after every step (a stale order would drift 2, 3, 4, ... away)
    bids = [[(100.00 - 0.01 * t, 500.0)] for t in range(8)]
    asks = [[(100.02 - 0.01 * t, 500.0)] for t in range(8)]
    rec = record(PassiveSell(), make_market(bids, asks), num_books=1, num_steps=4,
                 env_kwargs={"episode_length": 4, "levels": 1}, offsets=torch.zeros(1, 1, dtype=torch.int64))
    assert rec.series["order_active"].all()
    assert rec.series["order_distance"][:, 0].tolist() == [2.0, 2.0, 2.0, 2.0]
    m = compute_metrics(rec)
    assert m["resting_share"] == 1.0 and m["resting_distance"] == 2.0


def test_episode_pnl_and_paired_comparison_by_hand() -> None:
    # 2 books, episodes of 2 steps, 4 steps: windows (episode, book)
    policy = hand_recording([[1.0, 2.0], [1.0, 0.0], [3.0, -1.0], [0.0, 0.0]], episode_length=2)
    base = hand_recording([[0.0, 1.0], [1.0, 0.0], [1.0, -1.0], [0.0, 0.0]], episode_length=2, policy="b")
    assert episode_pnl(policy).tolist() == [[2.0, 2.0], [3.0, -1.0]]
    row = paired_comparison(policy, base, resamples=500)
    # differences per window: 1, 1, 2, 0 -> mean 1; the bootstrap interval holds it, within [0, 2]
    assert row["mean_difference"] == 1.0 and row["episodes"] == 4 and row["win_share"] == 0.75
    assert 0.0 <= row["ci_low"] <= 1.0 <= row["ci_high"] <= 2.0
    constant = paired_comparison(policy, policy)
    assert constant["mean_difference"] == constant["ci_low"] == constant["ci_high"] == 0.0
    other = hand_recording([[0.0, 0.0]] * 4, episode_length=2)
    other.offsets = other.offsets + 1
    with pytest.raises(ValueError, match="same windows"):
        paired_comparison(policy, other)


def test_planned_windows_are_distinct_and_disjoint_when_the_market_allows() -> None:
    offsets = plan_offsets(market_steps=10_001, episode_length=100, num_books=8, num_episodes=3, seed=4)
    starts = np.sort(offsets.reshape(-1).numpy())
    assert offsets.shape == (3, 8) and starts.min() >= 0 and starts.max() < 10_001 - 100
    assert np.diff(starts).min() >= 100  # 24 disjoint windows
    assert distinct_rows(offsets, 100, 300) == 24 * 100
    assert distinct_rows(offsets, 100, 250) == 16 * 100 + 8 * 50  # the last episode is half run
    assert torch.equal(offsets, plan_offsets(10_001, 100, 8, 3, seed=4))
    assert not torch.equal(offsets, plan_offsets(10_001, 100, 8, 3, seed=5))
    # a short market: the windows overlap, and the distinct rows say so
    short = plan_offsets(market_steps=120, episode_length=100, num_books=4, num_episodes=1)
    assert distinct_rows(short, 100, 100) < 4 * 100
    with pytest.raises(ValueError, match="must exceed episode_length"):
        plan_offsets(100, 100, 1, 1)


def rising_market(rows: int = 8):
    """Touch 100.00 + t ticks bid / 100.02 + t ticks ask (500 lots each): the mid rises a tick a step."""
    bids = [[(100.00 + 0.01 * t, 500.0)] for t in range(rows)]
    asks = [[(100.02 + 0.01 * t, 500.0)] for t in range(rows)]
    return make_market(bids, asks)


def test_buy_and_hold_on_a_rising_market_by_hand() -> None:
    # Bought 100 lots at the ask (one tick above the mid), then the mid rises a tick each step:
    # step 0 earns the tick back minus the tick paid; steps 1..3 earn 100 x 0.01 each; the taker fee
    # is 0.5 bps of the notional 100 x ask.
    market = rising_market()
    rec = record("buy_and_hold", market, num_books=2, num_steps=4,
                 env_kwargs={"episode_length": 4, "levels": 1})
    s = rec.series
    ask = 100.02 + 0.01 * rec.offsets[0].double()
    fee = 0.5e-4 * 100 * ask
    assert torch.allclose(s["fees"][0], fee) and torch.all(s["fees"][1:] == 0)
    assert torch.allclose(s["spread_cost"][0], torch.full((2,), 1.0, dtype=torch.float64))
    assert torch.allclose(s["step_pnl"].sum(0), 3.0 - fee)
    assert torch.allclose(s["step_pnl"][1:], torch.ones(3, 2, dtype=torch.float64))
    assert torch.all(s["position"] == 100.0) and torch.all(s["traded_lots"][0] == 100.0)
    m = compute_metrics(rec)
    assert m["pnl"] == pytest.approx(float((3.0 - fee).sum()))
    assert m["maker_share"] == 0.0 and m["turnover"] == pytest.approx(200 / 8)
    flat = compute_metrics(record("flat", market, num_books=2, num_steps=4,
                                  env_kwargs={"episode_length": 4, "levels": 1}))
    assert flat["pnl"] == 0.0 and flat["fills"] == 0 and flat["fees"] == 0.0


def test_recorder_bookkeeping_identity_and_same_windows_for_every_policy() -> None:
    market = random_market(400, num_levels=5, seed=2)
    kwargs = {"num_books": 4, "num_steps": 50, "seed": 3, "env_kwargs": {"episode_length": 20, "levels": 5}}
    rec = record(RandomPolicy(1), market, **kwargs)
    s = rec.series
    # equity change = position x mid move - (fill price - pre-trade mid) x lots - fees, every step
    identity = s["position"] * (s["mid"] - s["prev_mid"]) - s["spread_cost"] - s["fees"]
    assert torch.allclose(s["step_pnl"], identity, atol=1e-9)
    assert s["episode_start"][[0, 20, 40]].all() and s["episode_start"].sum() == 3 * 4
    assert rec.offsets.shape == (3, 4)
    other = record("buy_and_hold", market, **kwargs)
    assert torch.equal(other.offsets, rec.offsets)
    assert torch.equal(other.series["prev_mid"][s["episode_start"]], s["prev_mid"][s["episode_start"]])
    again = record(RandomPolicy(1), market, **kwargs)
    assert torch.equal(again.series["step_pnl"], s["step_pnl"])


def test_a_flattened_action_model_is_decoded() -> None:
    class FlatCodes:
        def predict(self, obs, deterministic=True):  # noqa: ANN001, ANN202
            return np.full(obs.shape[0], 2 * 27 + 2 * 9 + 0 * 3 + 2), None  # long, full, Market, high

    policy = ModelPolicy(FlatCodes())
    policy.reset(3, torch.device("cpu"))
    action = policy.act(torch.zeros(3, 10), torch.ones(3, dtype=torch.bool))
    assert action.tolist() == [[2, 2, 0, 2]] * 3
    with pytest.raises(ValueError, match="no predict"):
        ModelPolicy(object())

    class Sized(FlatCodes):
        observation_space = type("Box", (), {"shape": (7,)})()

    with pytest.raises(ValueError, match=r"observation_space has shape \(7,\)"):
        record(ModelPolicy(Sized()), random_market(100, seed=1), num_books=1, num_steps=2,
               env_kwargs={"episode_length": 10, "levels": 5})


ORACLE = {"signal_strength": 1.0, "signal_horizon": 10}


@pytest.mark.parametrize("strength", [0.0, 1.0])
def test_oracle_pays_its_costs_without_the_signal_and_earns_with_it(strength: float) -> None:
    market = generate_synthetic(8_000, seed=11, signal_strength=strength, signal_horizon=10)
    rec = record(OraclePolicy(**ORACLE), market, num_books=8, num_steps=500, seed=0,
                 env_kwargs={"episode_length": 500})
    m = compute_metrics(rec)
    costs = m["fees"] + m["spread_cost"]
    assert m["fills"] > 100 and costs > 0
    s = rec.series
    exposure = (s["position"] * (s["mid"] - s["prev_mid"])).sum(0)  # the market-move part, per book
    noise = float(exposure.std()) * math.sqrt(exposure.numel())  # its spread over the books' sum
    if strength == 0.0:
        # no signal: the imbalance it reads is noise, so it loses its costs, up to the market's noise
        assert abs(m["pnl"] + costs) < 4 * noise + 0.05 * costs
        assert m["pnl"] < 0
    else:
        assert m["pnl"] > 0.5 * costs and m["pnl"] > 4 * noise


def test_evaluate_policies_holds_out_and_compares_on_the_same_windows() -> None:
    evaluation = evaluate_policies(
        {"rand": RandomPolicy(5)}, "synthetic", n_envs=4, steps=60, seed=1, market_seed=7,
        train_market_seed=0,
        env_kwargs={"episode_length": 30}, market_kwargs={"num_steps": 2_000, **ORACLE},
    )
    assert list(evaluation.results) == ["rand", "flat", "random", "buy_and_hold", "oracle"]
    setup = evaluation.setup
    assert setup["market_seed"] == 7 and setup["train_market_seed"] == 0
    assert "seed=7" in setup["market"] and setup["independent_steps"] == 4 * 60
    assert [row["baseline"] for row in evaluation.comparisons["rand"]] == ["flat", "random", "buy_and_hold",
                                                                           "oracle"]
    windows = {name: r.recording.offsets for name, r in evaluation.results.items()}
    assert all(torch.equal(w, windows["rand"]) for w in windows.values())
    assert evaluation.results["flat"].metrics["pnl"] == 0.0
    with pytest.raises(ValueError, match="not held out"):
        evaluate_policies({"rand": RandomPolicy(5)}, "synthetic", market_seed=3, train_market_seed=3)
    with pytest.raises(ValueError, match="no planted signal"):
        evaluate_policies({"r": RandomPolicy(5)}, "synthetic", baselines=("oracle",), steps=2, n_envs=1,
                          market_kwargs={"num_steps": 300}, env_kwargs={"episode_length": 10})


def test_a_short_split_is_walked_in_disjoint_windows() -> None:
    market = random_market(400, num_levels=5, seed=2)
    result = evaluate("flat", market, env_kwargs={"episode_length": 90, "levels": 5})
    setup = result.setup
    assert setup["books"] == 399 // 90 and setup["independent_steps"] == 4 * 90
    assert result.series["equity"].shape == (90, 4)


@pytest.mark.gpu
def test_recorder_on_cuda_keeps_the_series_there_and_agrees_with_the_cpu() -> None:
    market = random_market(400, num_levels=5, seed=2)
    kwargs = {"num_books": 64, "num_steps": 50, "seed": 3, "env_kwargs": {"episode_length": 20, "levels": 5}}
    rec = record(RandomPolicy(1), market, device="cuda", **kwargs)
    s = rec.series
    assert all(value.is_cuda for value in s.values())
    identity = s["position"] * (s["mid"] - s["prev_mid"]) - s["spread_cost"] - s["fees"]
    assert torch.allclose(s["step_pnl"], identity, atol=1e-9)
    cpu = record("buy_and_hold", market, device="cpu", **kwargs)
    gpu = record("buy_and_hold", market, device="cuda", **kwargs)
    assert torch.equal(cpu.offsets, gpu.offsets)
    assert torch.allclose(cpu.series["step_pnl"], gpu.series["step_pnl"].cpu(), atol=1e-9)
    assert math.isfinite(compute_metrics(rec)["sharpe"])


def test_the_recorders_progress_bar_is_the_kind_sb3_draws() -> None:
    import warnings

    from tqdm.rich import tqdm_rich

    from foxhunt.evaluation.recorder import progress_bar

    assert list(progress_bar(range(3), "x", disable=True)) == [0, 1, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the experimental-bar warning is silenced, nothing else is raised
        bar = progress_bar(range(3), "x")
        assert isinstance(bar, tqdm_rich) and list(bar) == [0, 1, 2]
    rec = record("flat", random_market(200, seed=1), num_books=2, num_steps=5, progress=True,
                 env_kwargs={"episode_length": 5, "levels": 5})
    assert rec.num_steps == 5
