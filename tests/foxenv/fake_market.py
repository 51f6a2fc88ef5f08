"""Tiny hand-made :class:`MarketData` timelines for the book-core tests.

Prices are given in currency and must sit on the tick grid. A book snapshot is a list of
``(price, size)`` levels, best first; missing levels are filled the MarketData way (size 0, price
continued one tick per level). Flows are ``{step: {price: volume}}``; the grid reference of step ``t`` is
the mid of snapshot ``t - 1`` rounded down to a tick (snapshot 0's own mid for ``t = 0``).
"""

from __future__ import annotations

import math

import torch

from foxenv.data.market import FLOW_WIDTH, MarketData

Levels = list[tuple[float, float]]
Flow = dict[int, dict[float, float]]


def _side(
    snapshots: list[Levels], num_levels: int, tick: float, sign: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prices ``[T, L]`` (float64) and sizes ``[T, L]`` (float32) of one side; ``sign`` -1 bids, +1 asks."""
    prices = torch.zeros(len(snapshots), num_levels, dtype=torch.float64)
    sizes = torch.zeros(len(snapshots), num_levels, dtype=torch.float32)
    for t, levels in enumerate(snapshots):
        for level in range(num_levels):
            if level < len(levels):
                prices[t, level], sizes[t, level] = levels[level]
            else:
                prices[t, level] = prices[t, level - 1] + sign * tick
    return prices, sizes


def _grid(flow: Flow | None, ref_tick: torch.Tensor, tick: float) -> torch.Tensor:
    """``[T, FLOW_WIDTH]`` float32 grid from ``{step: {price: volume}}`` (edge columns take overflow)."""
    grid = torch.zeros(ref_tick.shape[0], FLOW_WIDTH, dtype=torch.float32)
    for t, by_price in (flow or {}).items():
        for price, volume in by_price.items():
            column = round(price / tick) - int(ref_tick[t]) + FLOW_WIDTH // 2
            grid[t, min(max(column, 0), FLOW_WIDTH - 1)] += volume
    return grid


def make_market(
    bids: list[Levels],
    asks: list[Levels],
    tick_size: float = 0.01,
    num_levels: int | None = None,
    exec_bid: Flow | None = None,
    exec_ask: Flow | None = None,
    cancel_bid: Flow | None = None,
    cancel_ask: Flow | None = None,
    halted: list[int] | None = None,
) -> MarketData:
    """Build a timeline from explicit snapshots and flows.

    :param bids: per step, the bid levels ``(price, size)``, best first.
    :param asks: per step, the ask levels, best first.
    :param tick_size: price increment.
    :param num_levels: levels per side (default: the most any snapshot lists).
    :param exec_bid: executions against bids, ``{step: {price: volume}}``.
    :param exec_ask: executions against asks.
    :param cancel_bid: cancellations of bids.
    :param cancel_ask: cancellations of asks.
    :param halted: steps during which trading was halted.
    :return: the MarketData on CPU.
    """
    if len(bids) != len(asks):
        raise ValueError(f"bids has {len(bids)} steps but asks has {len(asks)}")
    levels = num_levels or max(len(s) for s in bids + asks)
    bid_price, bid_size = _side(bids, levels, tick_size, -1)
    ask_price, ask_size = _side(asks, levels, tick_size, +1)
    mid = (bid_price[:, 0] + ask_price[:, 0]) / 2
    start_mid = torch.cat([mid[:1], mid[:-1]])
    ref_tick = torch.tensor([math.floor(m / tick_size + 1e-9) for m in start_mid.tolist()], dtype=torch.int64)
    steps = len(bids)
    halted_mask = torch.zeros(steps, dtype=torch.bool)
    for t in halted or []:
        halted_mask[t] = True
    return MarketData(
        bid_price=bid_price,
        bid_size=bid_size,
        ask_price=ask_price,
        ask_size=ask_size,
        flow_ref_tick=ref_tick,
        exec_bid=_grid(exec_bid, ref_tick, tick_size),
        exec_ask=_grid(exec_ask, ref_tick, tick_size),
        cancel_bid=_grid(cancel_bid, ref_tick, tick_size),
        cancel_ask=_grid(cancel_ask, ref_tick, tick_size),
        time=torch.arange(steps, dtype=torch.float64),
        halted=halted_mask,
        tick_size=tick_size,
        name="fake",
    )


def flat_market(
    steps: int,
    bid: Levels,
    ask: Levels,
    tick_size: float = 0.01,
    **flows: Flow | list[int] | None,
) -> MarketData:
    """A timeline whose book is the same snapshot at every step (flows as in :func:`make_market`).

    :param steps: number of steps ``T``.
    :param bid: the bid levels.
    :param ask: the ask levels.
    :param tick_size: price increment.
    :param flows: keyword flows / ``halted`` passed to :func:`make_market`.
    :return: the MarketData on CPU.
    """
    return make_market([bid] * steps, [ask] * steps, tick_size=tick_size, **flows)


def random_market(steps: int, num_levels: int = 5, seed: int = 0, tick_size: float = 0.01) -> MarketData:
    """A random-walk book with random sizes, flows and a few halted steps, for property tests.

    :param steps: number of steps ``T``.
    :param num_levels: levels per side.
    :param seed: seed of the generator.
    :param tick_size: price increment.
    :return: the MarketData on CPU.
    """
    gen = torch.Generator().manual_seed(seed)
    moves = torch.randint(-2, 3, (steps,), generator=gen)
    best_bid_tick = 10_000 + torch.cumsum(moves, 0)
    spread = torch.randint(1, 4, (steps,), generator=gen)
    level = torch.arange(num_levels)
    bid_tick = best_bid_tick[:, None] - level[None, :]
    ask_tick = (best_bid_tick + spread)[:, None] + level[None, :]
    bid_size = torch.randint(0, 500, (steps, num_levels), generator=gen).float()
    ask_size = torch.randint(0, 500, (steps, num_levels), generator=gen).float()
    bid_size[:, 0] += 1
    ask_size[:, 0] += 1
    mid_tick2 = best_bid_tick * 2 + spread
    start = torch.cat([mid_tick2[:1], mid_tick2[:-1]])
    ref_tick = torch.div(start, 2, rounding_mode="floor")

    def flow() -> torch.Tensor:
        grid = torch.zeros(steps, FLOW_WIDTH)
        sparse = torch.rand(steps, FLOW_WIDTH, generator=gen) < 0.1
        volume = torch.randint(1, 300, (steps, FLOW_WIDTH), generator=gen).float()
        grid[sparse] = volume[sparse]
        return grid

    return MarketData(
        bid_price=bid_tick.double() * tick_size,
        bid_size=bid_size,
        ask_price=ask_tick.double() * tick_size,
        ask_size=ask_size,
        flow_ref_tick=ref_tick,
        exec_bid=flow(),
        exec_ask=flow(),
        cancel_bid=flow(),
        cancel_ask=flow(),
        time=torch.arange(steps, dtype=torch.float64),
        halted=torch.rand(steps, generator=gen) < 0.02,
        tick_size=tick_size,
        name="random",
    )
