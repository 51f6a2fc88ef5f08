"""Property tests: random action sequences keep the books finite, bounded and their bookkeeping consistent."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from tests.foxenv.fake_market import random_market

BOOKS = 3
LEVELS = 4
MARKET = random_market(300, LEVELS, seed=7)
TICK = MARKET.tick_size

action_rows = st.lists(st.integers(0, 2), min_size=4 * BOOKS, max_size=4 * BOOKS)
configs = st.fixed_dictionaries({
    "max_position": st.sampled_from([1.0, 37.5, 100.0, 1000.0]),
    "maker_fee_bps": st.sampled_from([-0.3, 0.0, 0.2]),
    "taker_fee_bps": st.sampled_from([0.0, 0.5, 3.0]),
    "reward_scale": st.sampled_from([1.0, 0.01]),
    "inventory_penalty": st.sampled_from([0.0, 0.5]),
    "queue_power": st.sampled_from([0.0, 1.0, 2.0, 3.5]),
})


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(config=configs, seed=st.integers(0, 2**16), steps=st.lists(action_rows, min_size=1, max_size=40))
def test_random_actions_keep_books_consistent(config: dict, seed: int, steps: list[list[int]]) -> None:
    cfg = EnvConfig(levels=LEVELS, episode_length=15, **config)
    env = BatchedLOB(MARKET, BOOKS, cfg, seed=seed)
    obs = env.reset()
    rows = env.state_dict()["offset"]
    prev_bid, prev_ask = MARKET.bid_price[rows, 0], MARKET.ask_price[rows, 0]
    prev_cash = torch.zeros(BOOKS, dtype=torch.float64)
    prev_position = torch.zeros(BOOKS, dtype=torch.float64)
    prev_equity = torch.zeros(BOOKS, dtype=torch.float64)
    closed_pnl = torch.zeros(BOOKS, dtype=torch.float64)
    for flat in steps:
        action = torch.tensor(flat).reshape(BOOKS, 4)
        obs, reward, terminated, truncated, info = env.step(action)
        assert bool(torch.isfinite(obs).all()) and bool(torch.isfinite(reward).all())
        for key, value in info.items():
            assert bool(torch.isfinite(value.double()).all()), key
        position, cash, fees, mid = info["position"], info["cash"], info["fees"], info["mid"]
        assert bool((position.abs() <= cfg.max_position * (1 + 1e-12)).all())
        scale = 1.0 + cash.abs() + position.abs() * mid
        assert torch.allclose(info["equity"], cash + position * mid, rtol=0, atol=1e-9 * scale.max().item())
        assert torch.allclose(info["equity"], info["realized_pnl"] + info["unrealized_pnl"], atol=1e-8 * 1e4)
        expected = (info["equity"] - prev_equity) * cfg.reward_scale
        expected = expected - cfg.inventory_penalty * (position / cfg.max_position) ** 2
        assert torch.allclose(reward.double(), expected, rtol=1e-5, atol=1e-4)

        # Every fill: cash moves by -q * p - fee, at a price the observed book offered.
        traded = position - prev_position
        moved = cash - prev_cash
        taker = action[:, 2] != 1
        for b in range(BOOKS):
            q = traded[b].item()
            if abs(q) < 1e-9:
                assert abs(moved[b].item()) < 1e-6 and abs(fees[b].item()) < 1e-9
                continue
            price = -(moved[b].item() + fees[b].item()) / q
            notional = abs(q) * price
            bps = cfg.taker_fee_bps if taker[b] else cfg.maker_fee_bps
            assert fees[b].item() == pytest.approx(bps * 1e-4 * notional, rel=1e-6, abs=1e-9)
            if taker[b]:
                if q > 0:
                    assert prev_ask[b] - 1e-9 <= price <= prev_ask[b] + (LEVELS - 1) * TICK + 1e-9
                else:
                    assert prev_bid[b] - (LEVELS - 1) * TICK - 1e-9 <= price <= prev_bid[b] + 1e-9
            else:
                assert price / TICK == pytest.approx(round(price / TICK), abs=1e-6)

        # Closed trades: reported with a size; and when flat, all closed trades' PnL is the cash.
        closed = info["trade_closed"]
        assert bool((info["trade_lots"][closed] > 0).all())
        assert bool((info["trade_pnl"][~closed] == 0).all())
        closed_pnl += info["trade_pnl"]
        flat_books = position == 0
        assert torch.allclose(closed_pnl[flat_books], cash[flat_books], atol=1e-6)
        assert bool((info["order_remaining"][info["order_active"]] > 0).all())

        prev_bid, prev_ask = info["best_bid"], info["best_ask"]
        prev_cash, prev_position, prev_equity = cash, position, info["equity"]
        done = terminated | truncated
        if bool(done.any()):
            env.reset(mask=done)
            rows = env.state_dict()["offset"]
            prev_bid = torch.where(done, MARKET.bid_price[rows, 0], prev_bid)
            prev_ask = torch.where(done, MARKET.ask_price[rows, 0], prev_ask)
            zero = torch.zeros_like(cash)
            prev_cash, prev_position = torch.where(done, zero, cash), torch.where(done, zero, position)
            prev_equity = torch.where(done, zero, prev_equity)
            closed_pnl = torch.where(done, zero, closed_pnl)


@pytest.mark.slow
def test_real_lobster_rollout_stays_finite_and_bounded(lobster_dir) -> None:
    from foxenv.data import load_market

    market = load_market(str(lobster_dir))
    cfg = EnvConfig(levels=10, episode_length=200, max_position=50.0)
    env = BatchedLOB(market, 16, cfg, seed=0)
    env.reset()
    gen = torch.Generator().manual_seed(0)
    closed = 0
    for _ in range(250):
        action = torch.randint(0, 3, (16, 4), generator=gen)
        obs, reward, terminated, truncated, info = env.step(action)
        assert bool(torch.isfinite(obs).all()) and bool(torch.isfinite(reward).all())
        assert bool((info["position"].abs() <= cfg.max_position).all())
        assert torch.allclose(info["equity"], info["realized_pnl"] + info["unrealized_pnl"], atol=1e-6)
        assert bool((info["fees"][action[:, 2] != 1] >= 0).all())  # takers always pay
        assert bool((info["fees"][action[:, 2] == 1] == 0).all())  # the default maker fee: 0, no rebate
        closed += int(info["trade_closed"].sum())
        done = terminated | truncated
        if bool(done.any()):
            env.reset(mask=done)
    assert closed > 0  # random agents do complete round trips on real data
