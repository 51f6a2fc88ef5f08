"""Hand-worked matching cases: Market walks, IoC limits, LimitMaker prices and queue, post-only, halts."""

from __future__ import annotations

import pytest
import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.matching import (
    IOC_OFFSETS,
    ioc_limit_tick,
    limit_maker_tick,
    meet_flow,
    probqueue_cancel,
    walk_book,
)
from tests.foxenv.fake_market import flat_market, make_market

# Direction, magnitude, order type and urgency codes.
SHORT, FLAT, LONG = 0, 1, 2
SMALL, HALF, FULL = 0, 1, 2
MARKET, MAKER, IOC = 0, 1, 2
PASSIVE, NORMAL, AGGRESSIVE = 0, 1, 2

BID = [(100.00, 10.0), (99.99, 20.0), (99.98, 30.0)]
ASK = [(100.02, 10.0), (100.03, 20.0), (100.04, 30.0)]


def make_env(market, **config) -> BatchedLOB:
    """One book whose episode spans the whole market, so its offset is 0 and rows equal steps."""
    cfg = EnvConfig(levels=market.num_levels, episode_length=market.num_steps - 1, **config)
    return BatchedLOB(market, 1, cfg, seed=0)


def act(env: BatchedLOB, direction: int, magnitude: int, order: int, urgency: int):
    """Step every book with the same action."""
    action = torch.tensor([[direction, magnitude, order, urgency]]).repeat(env.num_books, 1)
    return env.step(action)


# ---------------------------------------------------------------------------- Market


def test_market_order_walks_three_levels_with_exact_vwap_and_taker_fee() -> None:
    env = make_env(flat_market(3, BID, ASK), taker_fee_bps=0.5)
    _, reward, _, _, info = act(env, LONG, HALF, MARKET, AGGRESSIVE)
    # 50 lots: 10 @ 100.02 + 20 @ 100.03 + 20 @ 100.04 = 5001.6 (VWAP 100.032); fee 0.5 bps of it.
    notional = 10 * 100.02 + 20 * 100.03 + 20 * 100.04
    fee = notional * 0.5e-4
    assert info["position"].item() == 50.0
    assert info["fees"].item() == pytest.approx(fee, abs=1e-12)
    assert info["cash"].item() == pytest.approx(-notional - fee, abs=1e-9)
    # Equity moves only by (mid - VWAP) * q - fee = (100.01 - 100.032) * 50 - 0.25008.
    assert info["equity"].item() == pytest.approx((100.01 - 100.032) * 50 - fee, abs=1e-9)
    assert reward.item() == pytest.approx((100.01 - 100.032) * 50 - fee, abs=1e-5)


@pytest.mark.parametrize(("urgency", "lots", "notional"), [
    (PASSIVE, 30.0, 10 * 100.02 + 20 * 100.03),                     # 1/3 of 90
    (NORMAL, 60.0, 10 * 100.02 + 20 * 100.03 + 30 * 100.04),        # 2/3 of 90
])
def test_market_order_urgency_slices_the_needed_change(urgency: int, lots: float, notional: float) -> None:
    env = make_env(flat_market(3, BID, ASK), max_position=90.0, taker_fee_bps=0.0)
    _, _, _, _, info = act(env, LONG, FULL, MARKET, urgency)
    assert info["position"].item() == pytest.approx(lots, abs=1e-12)
    assert info["cash"].item() == pytest.approx(-notional, abs=1e-9)


def test_market_order_beyond_visible_depth_fills_only_the_depth() -> None:
    env = make_env(flat_market(3, BID, ASK), max_position=100.0, taker_fee_bps=0.0)
    _, _, _, _, info = act(env, SHORT, FULL, MARKET, AGGRESSIVE)
    assert info["position"].item() == pytest.approx(-60.0)
    assert info["cash"].item() == pytest.approx(10 * 100.00 + 20 * 99.99 + 30 * 99.98, abs=1e-9)


def test_walk_book_directly() -> None:
    ticks = torch.tensor([[10002, 10003, 10004], [10000, 9999, 9998]], dtype=torch.float64)
    sizes = torch.tensor([[10.0, 20.0, 30.0], [10.0, 20.0, 30.0]], dtype=torch.float64)
    side = torch.tensor([1.0, -1.0], dtype=torch.float64)
    wanted = torch.tensor([25.0, 35.0], dtype=torch.float64)
    limit = torch.tensor([10003, 9999], dtype=torch.float64)
    filled, notional, reachable = walk_book(ticks, sizes, side, wanted, limit)
    assert filled.tolist() == [25.0, 30.0]
    assert notional.tolist() == [10 * 10002 + 15 * 10003, 10 * 10000 + 20 * 9999]
    assert reachable.tolist() == [30.0, 30.0]


# ---------------------------------------------------------------------------- IoC


@pytest.mark.parametrize(("urgency", "lots", "notional"), [
    (PASSIVE, 10.0, 10 * 100.02),                                   # limit = ask
    (NORMAL, 30.0, 10 * 100.02 + 20 * 100.03),                      # limit = ask + 1 tick
    (AGGRESSIVE, 50.0, 10 * 100.02 + 20 * 100.03 + 20 * 100.04),    # limit = ask + 3 ticks
])
def test_ioc_buy_fills_up_to_its_limit_cancels_rest(urgency: int, lots: float, notional: float) -> None:
    env = make_env(flat_market(3, BID, ASK), taker_fee_bps=1.0)
    _, _, _, _, info = act(env, LONG, HALF, IOC, urgency)
    assert info["position"].item() == pytest.approx(lots)
    assert info["fees"].item() == pytest.approx(notional * 1e-4, abs=1e-12)
    assert info["cash"].item() == pytest.approx(-notional * (1 + 1e-4), abs=1e-9)
    assert not info["order_active"].item()  # the unfilled rest is cancelled, nothing rests


def test_ioc_sell_normal_takes_two_bid_levels() -> None:
    env = make_env(flat_market(3, BID, ASK), taker_fee_bps=0.0)
    _, _, _, _, info = act(env, SHORT, HALF, IOC, NORMAL)
    assert info["position"].item() == pytest.approx(-30.0)
    assert info["cash"].item() == pytest.approx(10 * 100.00 + 20 * 99.99, abs=1e-9)


def test_ioc_limit_tick_offsets() -> None:
    bid, ask = torch.full((3,), 100.0, dtype=torch.float64), torch.full((3,), 102.0, dtype=torch.float64)
    offset = torch.tensor(IOC_OFFSETS, dtype=torch.float64)
    assert ioc_limit_tick(bid, ask, torch.ones(3, dtype=torch.float64), offset).tolist() == [102, 103, 105]
    assert ioc_limit_tick(bid, ask, -torch.ones(3, dtype=torch.float64), offset).tolist() == [100, 99, 97]


# ---------------------------------------------------------------------------- LimitMaker


@pytest.mark.parametrize(("direction", "urgency", "price"), [
    (LONG, PASSIVE, 99.99), (LONG, NORMAL, 100.00), (LONG, AGGRESSIVE, 100.01),
    (SHORT, PASSIVE, 100.03), (SHORT, NORMAL, 100.02), (SHORT, AGGRESSIVE, 100.01),
])
def test_limit_maker_price_by_urgency(direction: int, urgency: int, price: float) -> None:
    env = make_env(flat_market(3, BID, ASK))
    _, _, _, _, info = act(env, direction, SMALL, MAKER, urgency)
    assert info["order_active"].item()
    assert info["order_price"].item() == pytest.approx(price, abs=1e-9)
    assert info["position"].item() == 0.0


def test_limit_maker_aggressive_stays_at_the_touch_when_spread_is_one_tick() -> None:
    env = make_env(flat_market(3, [(100.00, 10.0)], [(100.01, 10.0)]))
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, AGGRESSIVE)
    assert info["order_price"].item() == pytest.approx(100.00, abs=1e-9)


def test_limit_maker_tick_never_crosses() -> None:
    gen = torch.Generator().manual_seed(3)
    bid = torch.randint(1000, 1100, (500,), generator=gen).double()
    ask = bid + torch.randint(1, 5, (500,), generator=gen)
    side = (torch.randint(0, 2, (500,), generator=gen) * 2 - 1).double()
    urgency = torch.randint(0, 3, (500,), generator=gen)
    price = limit_maker_tick(bid, ask, side, urgency)
    assert bool(torch.where(side > 0, price < ask, price > bid).all())


def test_limit_maker_queue_is_consumed_by_executions_then_fills() -> None:
    # Rests at 100.00 behind 10 shares; row 1 executes 4 there, row 2 executes 10.
    market = flat_market(4, BID, ASK, exec_bid={1: {100.00: 4.0}, 2: {100.00: 10.0}})
    env = make_env(market, maker_fee_bps=-0.2)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["order_queue_ahead"].item() == pytest.approx(6.0)
    assert info["position"].item() == 0.0
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)  # unchanged target: keeps its place
    assert info["order_queue_ahead"].item() == pytest.approx(0.0)
    assert info["position"].item() == pytest.approx(4.0)      # 10 executed - 6 ahead
    assert info["order_remaining"].item() == pytest.approx(21.0)
    assert info["fees"].item() == pytest.approx(-0.2e-4 * 4 * 100.00, abs=1e-12)  # a rebate
    assert info["cash"].item() == pytest.approx(-400.0 + 0.008, abs=1e-9)


def test_probqueue_cancel_split_hand_computed() -> None:
    # Post behind 10 at 100.00; by row 1 the level has grown to 30 (20 behind us). Row 2 cancels 6 there:
    # ahead -= 6 * 10**2 / (10**2 + 20**2) = 1.2 -> 8.8; then 10 execute: 8.8 ahead, 1.2 fill us.
    bids = [BID, [(100.00, 30.0)] + BID[1:], BID]
    market = make_market(bids, [ASK] * 3, cancel_bid={2: {100.00: 6.0}}, exec_bid={2: {100.00: 10.0}})
    env = make_env(market, queue_power=2.0)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["order_queue_ahead"].item() == pytest.approx(10.0)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["position"].item() == pytest.approx(1.2, abs=1e-12)
    assert info["order_queue_ahead"].item() == pytest.approx(0.0)


def test_probqueue_cancel_function() -> None:
    ahead = torch.tensor([10.0, 10.0, 0.0, 5.0], dtype=torch.float64)
    visible = torch.tensor([30.0, 10.0, 0.0, 30.0], dtype=torch.float64)
    cancelled = torch.tensor([6.0, 4.0, 3.0, 6.0], dtype=torch.float64)
    new = probqueue_cancel(ahead, visible, cancelled, power=1.0)
    # power 1: 6 * 10/30 = 2; nothing behind: all 4 from ahead; empty queue stays 0; 6 * 5/30 = 1.
    assert new.tolist() == pytest.approx([8.0, 6.0, 0.0, 4.0])


def test_meet_flow_function() -> None:
    def f64(*values: float) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64)

    fill, ahead = meet_flow(
        ahead=f64(10, 10, 10, 0), remaining=f64(5, 5, 5, 5), visible=f64(30, 30, 10, 0),
        executed=f64(12, 8, 30, 2), cancelled=f64(0, 4, 0, 0),
        traded_through=torch.tensor([False, False, False, True]), power=1.0,
    )
    # 12 executed behind 10: 2 fill; cancels 4 * 10/30 then 8 executed: ahead 8.667 -> 0.667 left, no fill;
    # 30 executed: fill capped at 5; trade-through fills all 5.
    assert fill.tolist() == pytest.approx([2.0, 0.0, 5.0, 5.0])
    assert ahead.tolist() == pytest.approx([0.0, 10 - 4 / 3 - 8, 0.0, 0.0])


def test_trade_through_fills_the_resting_order_completely() -> None:
    market = flat_market(3, BID, ASK, exec_bid={1: {99.99: 1.0}})
    env = make_env(market, maker_fee_bps=0.0, fill_model="optimistic")  # conservative: test_fill_model.py
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["position"].item() == 25.0
    assert not info["order_active"].item()
    assert info["cash"].item() == pytest.approx(-25 * 100.00, abs=1e-9)


def test_trade_through_on_the_ask_side() -> None:
    market = flat_market(3, BID, ASK, exec_ask={1: {100.03: 2.0}})
    env = make_env(market, maker_fee_bps=0.0, fill_model="optimistic")
    _, _, _, _, info = act(env, SHORT, HALF, MAKER, NORMAL)  # sell 50 at 100.02
    assert info["position"].item() == -50.0
    assert info["cash"].item() == pytest.approx(50 * 100.02, abs=1e-9)


def test_new_price_level_has_an_empty_queue_and_fills_on_trade_through() -> None:
    # Aggressive buy at 100.01 (a new level): queue 0; sells at 100.00 trade through it.
    market = flat_market(3, BID, ASK, exec_bid={1: {100.00: 3.0}})
    env = make_env(market, maker_fee_bps=0.0, fill_model="optimistic")
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, AGGRESSIVE)
    assert info["position"].item() == 25.0
    assert info["cash"].item() == pytest.approx(-25 * 100.01, abs=1e-9)


def test_changed_target_replaces_the_order_and_resets_the_queue() -> None:
    market = flat_market(4, BID, ASK, exec_bid={1: {100.00: 4.0}})
    env = make_env(market)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["order_queue_ahead"].item() == pytest.approx(6.0)
    _, _, _, _, info = act(env, LONG, HALF, MAKER, NORMAL)  # new target 50: back of the visible queue
    assert info["order_queue_ahead"].item() == pytest.approx(10.0)
    assert info["order_remaining"].item() == pytest.approx(50.0)


def test_market_action_cancels_the_resting_order() -> None:
    env = make_env(flat_market(4, BID, ASK))
    act(env, LONG, SMALL, MAKER, NORMAL)
    _, _, _, _, info = act(env, FLAT, SMALL, MARKET, NORMAL)
    assert not info["order_active"].item()
    assert info["order_remaining"].item() == 0.0


def test_halted_step_executes_nothing() -> None:
    market = flat_market(4, BID, ASK, exec_bid={1: {99.99: 5.0}}, halted=[1])
    env = make_env(market)
    _, _, _, _, info = act(env, LONG, FULL, MARKET, AGGRESSIVE)
    assert info["position"].item() == 0.0 and info["cash"].item() == 0.0
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)  # row 2 is not halted, but has no flow
    assert info["order_active"].item() and info["position"].item() == 0.0
    market = flat_market(4, BID, ASK, exec_bid={1: {99.99: 5.0}}, halted=[1])
    env = make_env(market)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)  # the trade-through happens in a halted step
    assert info["position"].item() == 0.0 and info["order_active"].item()


def test_resting_order_far_off_the_flow_grid_is_traded_through_at_the_grid_edge() -> None:
    # The buy rests at 100.00; the market then drops 50 ticks, so in row 2 its price lies beyond the top of
    # the flow grid (reference 99.51 + 32 ticks). Sells at 99.90 land in the edge column, below its price.
    bids = [BID, [(99.50, 10.0)], [(99.50, 10.0)]]
    asks = [ASK, [(99.52, 10.0)], [(99.52, 10.0)]]
    market = make_market(bids, asks, exec_bid={2: {99.90: 1.0}})
    env = make_env(market, maker_fee_bps=0.0, fill_model="optimistic")
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["order_active"].item() and info["position"].item() == 0.0
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["position"].item() == 25.0
    assert info["cash"].item() == pytest.approx(-25 * 100.00, abs=1e-9)


# ---------------------------------------------------------------------------- LimitMaker re-peg

FALLING_ASK = [[(100.02, 10.0), (100.03, 20.0)], [(100.01, 8.0), (100.02, 20.0)],
               [(99.98, 7.0), (99.99, 20.0)], [(99.98, 7.0), (99.99, 20.0)],
               [(100.00, 7.0), (100.01, 20.0)], [(100.00, 7.0), (100.01, 20.0)]]
FALLING_BID = [[(100.00, 10.0)], [(99.99, 10.0)]] + [[(99.96, 10.0)]] * 4


def test_a_repeated_sell_limit_maker_follows_a_falling_ask() -> None:
    """A sell at the ask (normal urgency), repeated while the ask falls from 100.02 to 99.98, is re-pegged to
    each new ask with a new queue (the size visible there); it is never left above the market."""
    env = make_env(make_market(FALLING_BID, FALLING_ASK))
    for ask, visible in ((100.02, 10.0), (100.01, 8.0), (99.98, 7.0)):
        _, _, _, _, info = act(env, SHORT, SMALL, MAKER, NORMAL)
        assert info["order_active"].item() and info["order_remaining"].item() == 25.0
        assert info["order_price"].item() == pytest.approx(ask, abs=1e-9)
        assert info["order_queue_ahead"].item() == visible


def test_a_repeated_limit_maker_keeps_its_queue_while_the_touch_stays_or_moves_toward_it() -> None:
    """Same ask (row 3): kept with its queue consumed by the executions; the ask rising past it (row 4):
    kept too, the order is then ahead of the touch, not behind it."""
    market = make_market(FALLING_BID, FALLING_ASK, exec_ask={4: {99.98: 3.0}})
    env = make_env(market)
    for _ in range(3):
        act(env, SHORT, SMALL, MAKER, NORMAL)
    _, _, _, _, info = act(env, SHORT, SMALL, MAKER, NORMAL)  # row 3: ask unchanged at 99.98
    assert info["order_price"].item() == pytest.approx(99.98, abs=1e-9)
    assert info["order_queue_ahead"].item() == 4.0  # 7 ahead, 3 executed
    _, _, _, _, info = act(env, SHORT, SMALL, MAKER, NORMAL)  # row 4: ask 100.00, above the order
    assert info["order_price"].item() == pytest.approx(99.98, abs=1e-9)


def test_a_passive_order_is_kept_until_the_touch_moves_beyond_its_offset() -> None:
    """Posted aggressively (one tick inside), then repeated passively (one tick behind): the order is ahead
    of where passive would price it, so it keeps its place."""
    env = make_env(flat_market(4, BID, ASK))
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, AGGRESSIVE)
    assert info["order_price"].item() == pytest.approx(100.01, abs=1e-9)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, PASSIVE)
    assert info["order_price"].item() == pytest.approx(100.01, abs=1e-9)
    # and the reverse: posted passively (99.99), repeated at normal urgency, it is re-pegged to the bid
    env = make_env(flat_market(4, BID, ASK))
    act(env, LONG, SMALL, MAKER, PASSIVE)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)
    assert info["order_price"].item() == pytest.approx(100.00, abs=1e-9)
    assert info["order_queue_ahead"].item() == 10.0
