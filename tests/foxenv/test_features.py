"""Observation features: hand-computed market rows, the portfolio block, finiteness."""

from __future__ import annotations

import math

import pytest
import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.features import PORTFOLIO_FEATURES, market_feature_dim, market_features
from tests.foxenv.fake_market import make_market, random_market
from tests.foxenv.test_matching import ASK, BID, HALF, LONG, MAKER, NORMAL, SMALL, act, make_env


def moving_market():
    """Three rows; the mid goes 100.01 -> 100.02 -> 100.00; trades of 5 (buys) and 2 (sells)."""
    bids = [BID, [(100.01, 10.0), (100.00, 5.0)], [(99.99, 4.0), (99.98, 0.0)]]
    asks = [ASK, [(100.03, 30.0), (100.04, 1.0)], [(100.01, 12.0), (100.02, 3.0)]]
    return make_market(bids, asks, num_levels=2, exec_ask={1: {100.02: 5.0}}, exec_bid={2: {100.01: 2.0}})


def test_market_feature_row_by_hand() -> None:
    cfg = EnvConfig(levels=2, return_horizons=(1, 2), vol_window=2, flow_window=2)
    feats = market_features(moving_market(), cfg)
    assert feats.shape == (3, market_feature_dim(cfg)) and feats.dtype == torch.float32
    row = feats[1].double()
    # Levels: bid distances, ask distances (ticks from mid 100.02), log1p sizes.
    assert row[0:2].tolist() == pytest.approx([-1.0, -2.0], abs=1e-4)
    assert row[2:4].tolist() == pytest.approx([1.0, 2.0], abs=1e-4)
    assert row[4:6].tolist() == pytest.approx([math.log1p(10), math.log1p(5)], rel=1e-6)
    assert row[6:8].tolist() == pytest.approx([math.log1p(30), math.log1p(1)], rel=1e-6)
    assert row[8].item() == pytest.approx((10 - 30) / 40, rel=1e-6)        # imbalance
    assert row[9].item() == pytest.approx(2.0, abs=1e-4)                   # spread in ticks
    r1 = 1e4 * math.log(100.02 / 100.01)
    assert row[10].item() == pytest.approx(r1, rel=1e-4)                    # 1-step return, bps
    assert row[11].item() == pytest.approx(r1, rel=1e-4)                    # 2-step: clipped at row 0
    assert row[12].item() == pytest.approx(abs(r1), rel=1e-4)               # vol over 2 returns (0, r1)
    assert row[13].item() == pytest.approx(math.log1p(5.0), rel=1e-6)       # buyer-initiated flow
    last = feats[2].double()
    r2 = 1e4 * math.log(100.00 / 100.02)
    assert last[10].item() == pytest.approx(r2, rel=1e-4)
    assert last[11].item() == pytest.approx(1e4 * math.log(100.00 / 100.01), rel=1e-4)
    assert last[12].item() == pytest.approx(math.sqrt(r1**2 + r2**2), rel=1e-4)
    assert last[13].item() == pytest.approx(math.log1p(3.0), rel=1e-6)      # 5 bought - 2 sold
    assert feats[0, 8].item() == 0.0                                         # 10 vs 10


def test_empty_top_of_book_gives_zero_imbalance() -> None:
    market = make_market([[(100.00, 0.0)]] * 2, [[(100.01, 0.0)]] * 2)
    feats = market_features(market, EnvConfig(levels=1))
    assert feats[:, 4].tolist() == [0.0, 0.0]
    assert bool(torch.isfinite(feats).all())


def test_observation_is_market_row_then_portfolio_block() -> None:
    market = random_market(300, 4, seed=1)
    cfg = EnvConfig(levels=3, episode_length=50)
    env = BatchedLOB(market, 6, cfg, seed=2)
    obs = env.reset()
    offsets = env.state_dict()["offset"]
    feats = market_features(market, cfg)
    assert torch.equal(obs[:, : env.n_market_features], feats[offsets])
    portfolio = obs[:, env.n_market_features :]
    assert portfolio.shape[1] == len(PORTFOLIO_FEATURES)
    assert portfolio[:, PORTFOLIO_FEATURES.index("time_left")].tolist() == [1.0] * 6
    assert portfolio[:, PORTFOLIO_FEATURES.index("position")].tolist() == [0.0] * 6


def test_portfolio_features_by_hand() -> None:
    market = make_market([BID] * 4, [ASK] * 4, exec_bid={1: {99.99: 1.0}})
    # a whole fill on a one-lot trade-through is the optimistic rule (test_fill_model covers the default's)
    env = make_env(market, max_position=100.0, maker_fee_bps=0.0, fill_model="optimistic")
    n = env.n_market_features
    names = {name: n + i for i, name in enumerate(PORTFOLIO_FEATURES)}
    obs, _, _, _, _ = act(env, LONG, SMALL, MAKER, NORMAL)  # bought 25 at 100.00 (traded through)
    assert obs[0, names["position"]].item() == pytest.approx(0.25)
    # unrealized = 25 * (100.01 - 100.00) = 0.25 -> bps of 100 * 100.01 notional
    assert obs[0, names["unrealized_bps"]].item() == pytest.approx(1e4 * 0.25 / (100 * 100.01), rel=1e-4)
    assert obs[0, names["time_in_trade"]].item() == pytest.approx(1 / 3)
    assert obs[0, names["time_left"]].item() == pytest.approx(2 / 3)
    assert obs[0, names["order_side"]].item() == 0.0
    obs, _, _, _, _ = act(env, LONG, HALF, MAKER, NORMAL)   # rests: buy 25 more at 100.00 behind 10
    assert obs[0, names["order_side"]].item() == 1.0
    assert obs[0, names["order_distance"]].item() == pytest.approx(-1.0, abs=1e-4)
    assert obs[0, names["order_queue_ahead"]].item() == pytest.approx(math.log1p(10.0), rel=1e-6)
    assert obs[0, names["order_remaining"]].item() == pytest.approx(0.25)
    assert obs[0, names["time_in_trade"]].item() == pytest.approx(2 / 3)


def test_features_on_random_market_are_finite() -> None:
    feats = market_features(random_market(2000, 5, seed=4), EnvConfig(levels=5))
    assert bool(torch.isfinite(feats).all())
    assert feats.abs().max().item() < 1e4


@pytest.mark.slow
def test_real_lobster_features_are_finite(lobster_dir) -> None:
    from foxenv.data import load_market

    market = load_market(str(lobster_dir))
    feats = market_features(market, EnvConfig(levels=10))
    assert bool(torch.isfinite(feats).all())


def test_volatility_survives_a_window_sum_that_cancels_below_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # On CUDA the cumulative sum behind a windowed sum of squares runs in another order than on the CPU, and
    # over a flat stretch it can cancel to a tiny negative number (seen on the H200 with GOOG at 1 s steps).
    import foxenv.features as features_module

    plain = features_module._window_sum
    monkeypatch.setattr(features_module, "_window_sum", lambda values, window: plain(values, window) - 1e-12)
    config = EnvConfig(levels=3)
    features = market_features(random_market(64, 3, seed=0), config)
    assert torch.isfinite(features).all()
