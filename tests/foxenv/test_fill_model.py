"""Hand-worked cases of the maker fill models (``EnvConfig.fill_model``) and of the placement latency
(``EnvConfig.order_latency``)."""

from __future__ import annotations

import shutil

import pytest
import torch

from foxenv.config import FILL_MODELS, EnvConfig
from foxenv.core import BatchedLOB
from foxenv.matching import meet_flow, meet_flow_conservative
from tests.foxenv.fake_market import flat_market, random_market

SHORT, FLAT, LONG = 0, 1, 2
SMALL, HALF, FULL = 0, 1, 2
MARKET, MAKER, IOC = 0, 1, 2
PASSIVE, NORMAL, AGGRESSIVE = 0, 1, 2

# 5 lots rest at the best bid, 100.00: a buy posted there has 5 ahead of it.
BID = [(100.00, 5.0), (99.99, 20.0), (99.98, 30.0)]
ASK = [(100.02, 10.0), (100.03, 20.0), (100.04, 30.0)]


def make_env(market, **config) -> BatchedLOB:
    """One book whose episode spans the whole market, so its offset is 0 and rows equal steps."""
    steps = market.num_steps - 1
    cfg = EnvConfig(levels=market.num_levels, episode_length=steps, maker_fee_bps=0.0, **config)
    return BatchedLOB(market, 1, cfg, seed=0)


def buy_small_at_touch(env: BatchedLOB):
    """Post (or keep) a LimitMaker buy of 25 lots at the best bid."""
    return env.step(torch.tensor([[LONG, SMALL, MAKER, NORMAL]]))


def f64(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_defaults_are_conservative_without_latency_and_the_old_model_is_reachable() -> None:
    assert EnvConfig().fill_model == "conservative"
    assert EnvConfig().order_latency == 0
    assert EnvConfig(fill_model="optimistic").fill_model == "optimistic"
    assert FILL_MODELS == ("conservative", "optimistic")


@pytest.mark.parametrize(("field", "value"), [
    ("fill_model", "generous"), ("fill_model", None), ("order_latency", -1), ("order_latency", 1.5),
    ("order_latency", True),
])
def test_bad_fill_settings_are_refused_naming_the_field(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        EnvConfig(**{field: value})


@pytest.mark.parametrize("fill_model", FILL_MODELS)
def test_queue_ahead_is_consumed_before_the_order_fills(fill_model: str) -> None:
    # 5 ahead; 3 executed at its price: no fill, 2 left ahead; the next 3: 2 consume the queue, 1 fills.
    market = flat_market(4, BID, ASK, exec_bid={1: {100.00: 3.0}, 2: {100.00: 3.0}})
    env = make_env(market, fill_model=fill_model)
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == 0.0
    assert info["order_queue_ahead"].item() == pytest.approx(2.0)
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == pytest.approx(1.0)
    assert info["order_queue_ahead"].item() == 0.0
    assert info["order_remaining"].item() == pytest.approx(24.0)
    assert info["cash"].item() == pytest.approx(-100.00, abs=1e-9)


def test_conservative_trade_through_fills_only_the_volume_beyond_the_queue() -> None:
    # 3 at its price and 12 below it: 15 shares met the order's level; 5 were ahead, so 10 fill.
    market = flat_market(3, BID, ASK, exec_bid={1: {100.00: 3.0, 99.99: 12.0}})
    env = make_env(market)
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == pytest.approx(10.0)
    assert info["order_active"].item() and info["order_remaining"].item() == pytest.approx(15.0)
    assert info["cash"].item() == pytest.approx(-10 * 100.00, abs=1e-9)
    # The old model fills the whole order on the same flow.
    env = make_env(market, fill_model="optimistic")
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == 25.0 and not info["order_active"].item()


def test_conservative_trade_through_fills_the_whole_order_when_the_volume_covers_it() -> None:
    market = flat_market(3, BID, ASK, exec_bid={1: {99.99: 40.0}})
    _, _, _, _, info = buy_small_at_touch(make_env(market))
    assert info["position"].item() == 25.0 and not info["order_active"].item()


def test_small_trade_through_does_not_jump_the_queue() -> None:
    # 1 share sold below the order's price: the 5 ahead of it would have taken it.
    market = flat_market(3, BID, ASK, exec_bid={1: {99.99: 1.0}})
    _, _, _, _, info = buy_small_at_touch(make_env(market))
    assert info["position"].item() == 0.0
    assert info["order_queue_ahead"].item() == pytest.approx(4.0)


def test_aggressive_order_inside_the_spread_fills_by_the_volume_traded_through_it() -> None:
    # Buy at 100.01 (a new level, empty queue); 3 sold at 100.00: 3 fill (the old model: all 25).
    market = flat_market(3, BID, ASK, exec_bid={1: {100.00: 3.0}})
    _, _, _, _, info = make_env(market).step(torch.tensor([[LONG, SMALL, MAKER, AGGRESSIVE]]))
    assert info["position"].item() == pytest.approx(3.0)
    assert info["cash"].item() == pytest.approx(-3 * 100.01, abs=1e-9)


def test_trade_through_on_the_ask_side_is_volume_limited() -> None:
    # Sell 50 at 100.02 behind 10; 2 executed at 100.03: nothing fills; 30 at 100.03: 20 fill.
    market = flat_market(4, BID, ASK, exec_ask={1: {100.03: 2.0}, 2: {100.03: 30.0}})
    env = make_env(market)
    sell = torch.tensor([[SHORT, HALF, MAKER, NORMAL]])
    _, _, _, _, info = env.step(sell)
    assert info["position"].item() == 0.0
    _, _, _, _, info = env.step(sell)
    assert info["position"].item() == pytest.approx(-22.0)  # 8 left ahead after the 2: 30 - 8 = 22
    assert info["cash"].item() == pytest.approx(22 * 100.02, abs=1e-9)


@pytest.mark.parametrize("fill_model", FILL_MODELS)
def test_latency_delays_eligibility(fill_model: str) -> None:
    # Latency 1: the flow of row 1 passes the order by; it joins behind the 5 visible in snapshot 1 and
    # 8 executed in row 2 fill 3.
    flows = {"exec_bid": {1: {100.00: 8.0}, 2: {100.00: 8.0}}}
    market = flat_market(4, BID, ASK, **flows)
    env = make_env(market, fill_model=fill_model, order_latency=1)
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == 0.0
    assert info["order_active"].item()
    assert info["order_queue_ahead"].item() == 0.0  # pending: shown as 0
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == pytest.approx(3.0)
    assert info["order_queue_ahead"].item() == 0.0
    # Without latency the first flow already fills 3, the second 8 more.
    env = make_env(market, fill_model=fill_model)
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == pytest.approx(3.0)
    _, _, _, _, info = buy_small_at_touch(env)
    assert info["position"].item() == pytest.approx(11.0)


def test_latency_of_two_steps_and_a_reposted_order_waits_again() -> None:
    flows = {"exec_bid": {t: {100.00: 8.0} for t in range(1, 7)}}
    market = flat_market(7, BID, ASK, **flows)
    env = make_env(market, order_latency=2)
    positions = [buy_small_at_touch(env)[4]["position"].item() for _ in range(3)]
    assert positions == pytest.approx([0.0, 0.0, 3.0])
    # A new target replaces the order: it waits two steps again.
    half = torch.tensor([[LONG, HALF, MAKER, NORMAL]])
    positions = [env.step(half)[4]["position"].item() for _ in range(2)]
    assert positions == pytest.approx([3.0, 3.0])
    obs, _, _, _, info = env.step(half)
    assert info["position"].item() == pytest.approx(6.0)
    assert torch.isfinite(obs).all()


def test_pending_order_observation_is_finite_and_state_round_trips() -> None:
    market = flat_market(5, BID, ASK)
    env = make_env(market, order_latency=3)
    obs, _, _, _, _ = buy_small_at_touch(env)
    assert torch.isfinite(obs).all()
    state = env.state_dict()
    other = make_env(market, order_latency=3)
    other.load_state_dict(state)
    assert torch.equal(buy_small_at_touch(other)[0], buy_small_at_touch(env)[0])


def test_meet_flow_conservative_hand_computed() -> None:
    fill, ahead = meet_flow_conservative(
        ahead=f64(5, 5, 0, 10), remaining=f64(25, 25, 25, 4), visible=f64(5, 5, 0, 30),
        executed=f64(3, 3, 0, 0), cancelled=f64(0, 0, 0, 6), through=f64(0, 12, 3, 20), power=1.0,
    )
    # 3 at price behind 5: none; 15 behind 5: 10; empty queue, 3 through: 3; cancels 6 * 10/30 = 2 -> 8
    # ahead, 20 through: 12 left, capped at the 4 remaining.
    assert fill.tolist() == pytest.approx([0.0, 10.0, 3.0, 4.0])
    assert ahead.tolist() == pytest.approx([2.0, 0.0, 0.0, 0.0])


def test_conservative_never_fills_more_than_optimistic() -> None:
    generator = torch.Generator().manual_seed(0)
    n = 4096
    ahead = torch.rand(n, generator=generator, dtype=torch.float64) * 50
    remaining = torch.rand(n, generator=generator, dtype=torch.float64) * 100
    visible = ahead + torch.rand(n, generator=generator, dtype=torch.float64) * 50
    executed = torch.rand(n, generator=generator, dtype=torch.float64) * 60
    cancelled = torch.rand(n, generator=generator, dtype=torch.float64) * 20
    through = torch.rand(n, generator=generator, dtype=torch.float64) * 60
    through = through * (torch.rand(n, generator=generator) < 0.5)
    flow = (ahead, remaining, visible, executed, cancelled)
    careful, careful_ahead = meet_flow_conservative(*flow, through, 2.0)
    generous, generous_ahead = meet_flow(*flow, through > 0, 2.0)
    assert bool((careful <= generous).all())
    # Without a trade through the two models agree exactly.
    none = through == 0
    assert torch.equal(careful[none], generous[none])
    assert torch.equal(careful_ahead[none], generous_ahead[none])


def _assert_same_steps(first: BatchedLOB, second: BatchedLOB, steps: int = 40) -> int:
    """Step both envs with the same random actions; their outputs must agree. :return: fills seen."""
    generator = torch.Generator().manual_seed(4)
    fills = 0
    for _ in range(steps):
        action = torch.randint(0, 3, (first.num_books, 4), generator=generator)
        out_a, out_b = first.step(action), second.step(action)
        torch.testing.assert_close(out_a[0], out_b[0].cpu(), rtol=0, atol=1e-6)
        for key, value in out_a[4].items():
            other = out_b[4][key].cpu()
            if value.dtype.is_floating_point:
                torch.testing.assert_close(value, other, rtol=0, atol=1e-9, msg=key)
            else:
                assert torch.equal(value, other), key
        fills += int((out_a[4]["fees"] != 0).sum())
        done = out_a[2] | out_a[3]
        first.reset(mask=done)
        second.reset(mask=done.to(second.device))
    return fills


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs g++")
def test_compiled_step_with_latency_matches_eager() -> None:
    market = random_market(600, 5, seed=8)
    cfg = EnvConfig(levels=5, episode_length=20, order_latency=2)
    eager = BatchedLOB(market, 16, cfg, seed=3)
    compiled = BatchedLOB(market, 16, cfg, seed=3)
    compiled.enable_compile()
    assert _assert_same_steps(eager, compiled) > 0


@pytest.mark.gpu
@pytest.mark.parametrize(("fill_model", "latency"), [("conservative", 2), ("optimistic", 1)])
def test_cuda_step_matches_cpu_for_the_fill_settings(fill_model: str, latency: int) -> None:
    market = random_market(600, 5, seed=8)
    cfg = EnvConfig(levels=5, episode_length=100, fill_model=fill_model, order_latency=latency)
    cpu = BatchedLOB(market, 32, cfg, device="cpu", seed=0)
    gpu = BatchedLOB(market, 32, cfg, device="cuda", seed=0)
    state = cpu.state_dict()
    state["generator"] = gpu.state_dict()["generator"]
    gpu.load_state_dict(state)  # same offsets on both devices
    generator = torch.Generator().manual_seed(2)
    for _ in range(50):
        action = torch.randint(0, 3, (32, 4), generator=generator)
        obs_c, rew_c, _, _, info_c = cpu.step(action)
        obs_g, rew_g, _, _, info_g = gpu.step(action)
        assert torch.allclose(obs_c, obs_g.cpu(), atol=1e-4)
        assert torch.allclose(rew_c, rew_g.cpu(), atol=1e-4)
        assert torch.allclose(info_c["equity"], info_g["equity"].cpu(), atol=1e-8)
        assert torch.allclose(info_c["order_queue_ahead"], info_g["order_queue_ahead"].cpu(), atol=1e-8)
