"""``MarketTables.cached``: envs on the same market tensors, config and device share one build; another
market, config or device builds its own, and a market whose tensors are gone is never matched again."""

from __future__ import annotations

import dataclasses
import gc

import torch

import foxenv.tables as tables_module
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.tables import CACHED_TABLES, MarketTables
from tests.foxenv.fake_market import flat_market as _flat_market

BID = [(100.00, 10.0), (99.99, 10.0)]
ASK = [(100.02, 10.0), (100.03, 10.0)]


def flat_market():
    return _flat_market(30, BID, ASK)


def test_envs_on_one_market_share_its_tables_and_others_build_their_own(monkeypatch) -> None:
    builds: list[int] = []
    build = MarketTables.build.__func__

    def counting(cls, market, config, device):
        builds.append(1)
        return build(cls, market, config, device)

    monkeypatch.setattr(MarketTables, "build", classmethod(counting))
    tables_module._CACHE.clear()
    market, config = flat_market(), EnvConfig(levels=2, episode_length=10)
    first = BatchedLOB(market, 2, config, seed=0)
    second = BatchedLOB(market.to("cpu"), 3, config, seed=1)  # .to(same device): same tensors
    assert second._tables is first._tables and len(builds) == 1
    assert BatchedLOB(market, 2, EnvConfig(levels=2, episode_length=10, taker_fee_bps=5.0))._tables \
        is not first._tables
    copied = dataclasses.replace(market, bid_price=market.bid_price.clone())  # equal values, other tensor
    assert BatchedLOB(copied, 2, config)._tables is not first._tables
    assert len(builds) == 3
    fresh = BatchedLOB(market, 2, config)._tables
    torch.testing.assert_close(fresh.rows, MarketTables.build(market, config, torch.device("cpu")).rows)


def test_the_cache_is_bounded_and_forgets_markets_that_are_gone() -> None:
    tables_module._CACHE.clear()
    config = EnvConfig(levels=2, episode_length=10)
    for _ in range(CACHED_TABLES + 3):
        BatchedLOB(flat_market(), 1, config)
    assert len(tables_module._CACHE) == CACHED_TABLES
    gc.collect()
    market = flat_market()  # its tensors may reuse a freed one's id: the weak references tell them apart
    assert BatchedLOB(market, 1, config)._tables.rows.shape[0] == market.num_steps
    assert all(ref() is not None for ref in next(reversed(tables_module._CACHE.values()))[0])
