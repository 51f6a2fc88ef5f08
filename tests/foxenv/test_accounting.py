"""Accounting: cash and equity invariants, fees and rebates, round trips and flips, the Ledger directly."""

from __future__ import annotations

import pytest
import torch

from foxenv.accounting import Ledger
from tests.foxenv.fake_market import flat_market, make_market
from tests.foxenv.test_matching import (
    AGGRESSIVE,
    ASK,
    BID,
    FLAT,
    FULL,
    HALF,
    LONG,
    MAKER,
    MARKET,
    NORMAL,
    SHORT,
    SMALL,
    act,
    make_env,
)

DEEP_BID = [(100.00, 100.0)]
DEEP_ASK = [(100.02, 100.0)]


def test_round_trip_reports_trade_pnl_after_fees_and_entry_mid() -> None:
    env = make_env(flat_market(4, BID, ASK), taker_fee_bps=0.5)
    _, _, _, _, info = act(env, LONG, HALF, MARKET, AGGRESSIVE)
    assert not info["trade_closed"].item()
    assert info["entry_mid"].item() == pytest.approx(100.01)
    _, _, _, _, info = act(env, FLAT, HALF, MARKET, AGGRESSIVE)
    bought = 10 * 100.02 + 20 * 100.03 + 20 * 100.04     # 5001.6
    sold = 10 * 100.00 + 20 * 99.99 + 20 * 99.98         # 4999.4
    fees = (bought + sold) * 0.5e-4
    assert info["trade_closed"].item()
    assert info["position"].item() == 0.0
    assert info["trade_pnl"].item() == pytest.approx(sold - bought - fees, abs=1e-9)   # -2.70005
    assert info["trade_lots"].item() == 50.0
    assert info["entry_mid"].item() == pytest.approx(100.01)
    # Flat again: cash, equity and realized PnL are all the trade's PnL.
    for key in ("cash", "equity", "realized_pnl"):
        assert info[key].item() == pytest.approx(sold - bought - fees, abs=1e-9)
    assert info["unrealized_pnl"].item() == 0.0


def test_flip_closes_the_old_trade_and_opens_a_new_one_with_a_pro_rata_fee() -> None:
    env = make_env(flat_market(4, DEEP_BID, DEEP_ASK), taker_fee_bps=0.5)
    act(env, LONG, HALF, MARKET, AGGRESSIVE)                        # +50 @ 100.02, fee 0.25005
    _, _, _, _, info = act(env, SHORT, HALF, MARKET, AGGRESSIVE)    # -100 @ 100.00, fee 0.5
    assert info["trade_closed"].item()
    assert info["position"].item() == -50.0
    # Closing half of the fill: 50 * (100.00 - 100.02) = -1.0, its fees 0.25005 + 0.25.
    assert info["trade_pnl"].item() == pytest.approx(-1.0 - 0.25005 - 0.25, abs=1e-9)
    assert info["trade_lots"].item() == 50.0
    assert info["entry_mid"].item() == pytest.approx(100.01)
    assert info["unrealized_pnl"].item() == pytest.approx(-50 * (100.01 - 100.00), abs=1e-9)
    _, _, _, _, info = act(env, FLAT, HALF, MARKET, AGGRESSIVE)     # +50 @ 100.02, fee 0.25005
    assert info["trade_closed"].item()
    assert info["trade_pnl"].item() == pytest.approx(-1.0 - 0.25 - 0.25005, abs=1e-9)
    assert info["cash"].item() == pytest.approx(2 * (-1.50005), abs=1e-9)


def test_taker_fees_always_cost_and_maker_rebates_pay() -> None:
    market = flat_market(4, BID, ASK, exec_bid={2: {99.99: 1.0}})
    env = make_env(market, taker_fee_bps=0.3, maker_fee_bps=-0.25, fill_model="optimistic")  # full fill
    _, _, _, _, info = act(env, SHORT, SMALL, MARKET, AGGRESSIVE)   # sell: fee still positive
    assert info["fees"].item() == pytest.approx((10 * 100.00 + 15 * 99.99) * 0.3e-4, abs=1e-12)
    _, _, _, _, info = act(env, LONG, SMALL, MAKER, NORMAL)         # buy 50 at 100.00, traded through
    assert info["position"].item() == 25.0
    assert info["fees"].item() == pytest.approx(-50 * 100.00 * 0.25e-4, abs=1e-12)
    assert info["fees"].item() < 0


def test_reward_is_equity_change_times_scale_minus_inventory_penalty() -> None:
    bids = [BID, [(100.04, 10.0)], [(100.10, 10.0)]]
    asks = [ASK, [(100.06, 10.0)], [(100.12, 10.0)]]
    env = make_env(make_market(bids, asks), reward_scale=2.5, inventory_penalty=0.1, taker_fee_bps=0.0,
                   max_position=40.0)
    _, reward, _, _, info = act(env, LONG, SMALL, MARKET, AGGRESSIVE)  # +10 @ 100.02, mid -> 100.05
    equity_1 = info["equity"].item()
    assert equity_1 == pytest.approx(10 * (100.05 - 100.02), abs=1e-9)
    assert reward.item() == pytest.approx(2.5 * equity_1 - 0.1 * (10 / 40) ** 2, rel=1e-6)
    _, reward, _, _, info = act(env, LONG, SMALL, MARKET, AGGRESSIVE)  # no trade, mid -> 100.11
    assert info["equity"].item() - equity_1 == pytest.approx(10 * 0.06, abs=1e-9)
    assert reward.item() == pytest.approx(2.5 * 0.6 - 0.1 * 0.25**2, rel=1e-6)
    assert reward.dtype == torch.float32


def test_equity_changes_by_mid_minus_price_times_quantity_minus_fee_at_the_fill() -> None:
    env = make_env(flat_market(3, BID, ASK), taker_fee_bps=0.7)
    _, _, _, _, info = act(env, SHORT, HALF, MARKET, AGGRESSIVE)
    received = 10 * 100.00 + 20 * 99.99 + 20 * 99.98
    fee = received * 0.7e-4
    price = received / 50
    assert info["equity"].item() == pytest.approx((100.01 - price) * -50 - fee, abs=1e-9)
    assert info["equity"].item() == pytest.approx(info["realized_pnl"].item() + info["unrealized_pnl"].item())


def test_ledger_average_entry_price_and_partial_close() -> None:
    ledger = Ledger.zeros(1, torch.device("cpu"))

    def fill(quantity: float, price: float, fee: float = 0.0, target: float = 1e9):
        as_t = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
        return ledger.apply_fill(as_t(quantity), as_t(price), as_t(fee), as_t(10.0), torch.tensor([0]),
                                 as_t(target), torch.tensor([False]))

    fill(10, 100.0, fee=1.0)
    fill(30, 104.0, fee=1.0)
    assert ledger.avg_price.item() == pytest.approx(103.0)       # (10*100 + 30*104) / 40
    closed = fill(-20, 105.0, fee=1.0)                            # partial close: +40 realized
    assert not closed.closed.item()
    assert ledger.avg_price.item() == pytest.approx(103.0)
    assert ledger.realized.item() == pytest.approx(40.0 - 3.0)
    closed = fill(-20, 101.0, fee=1.0)                            # close the rest: -40
    assert closed.closed.item() and closed.lots.item() == 20.0
    assert closed.pnl.item() == pytest.approx(40.0 - 40.0 - 4.0)
    assert closed.entry_mid.item() == 10.0
    assert ledger.position.item() == 0.0 and ledger.avg_price.item() == 0.0
    assert ledger.cash.item() == pytest.approx(ledger.realized.item())


def test_reached_target_sets_the_position_exactly() -> None:
    ledger = Ledger.zeros(1, torch.device("cpu"))
    one = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    ledger.apply_fill(one(1 / 3), one(10.0), one(0.0), one(10.0), torch.tensor([0]), one(0.0),
                      torch.tensor([False]))
    closed = ledger.apply_fill(one(-1 / 3), one(10.0), one(0.0), one(10.0), torch.tensor([1]), one(0.0),
                               torch.tensor([True]))
    assert ledger.position.item() == 0.0
    assert closed.closed.item()


def test_no_fill_leaves_the_ledger_unchanged_in_a_flat_market() -> None:
    env = make_env(flat_market(3, BID, ASK))
    _, reward, _, _, info = act(env, FLAT, FULL, MARKET, NORMAL)
    assert reward.item() == 0.0
    assert info["cash"].item() == 0.0 and info["fees"].item() == 0.0
    assert not info["trade_closed"].item() and info["trade_pnl"].item() == 0.0
