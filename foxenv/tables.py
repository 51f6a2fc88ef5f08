"""The per-market tables of the core: everything a step needs that does not depend on the agent,
computed once per market and config, so a step gathers rows instead of recomputing (one row-table gather,
one book-side gather per side, one flow gather, one feature gather and one action-table gather per step).

:meth:`MarketTables.cached` keeps the tables of the last few (market, config, device) triples: an evaluation
builds one env per policy and baseline on the same held-out market, and on the CPU each build of a 100k-step
market costs about a second. A market is recognised by the identity of its tensors (held weakly, compared
with ``is``), never by an address that a freed tensor's successor could reuse.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, fields

import torch

from foxenv.config import EnvConfig
from foxenv.data.market import FLOW_WIDTH, MarketData
from foxenv.features import market_features, portfolio_affine, portfolio_features
from foxenv.matching import NO_LIMIT
from foxenv.spec import DIRECTIONS, ORDER_TYPES

#: Tables kept by :meth:`MarketTables.cached` (the most recently used).
CACHED_TABLES = 4
_CACHE: OrderedDict[tuple, tuple[list[weakref.ref], MarketTables]] = OrderedDict()
_CACHE_LOCK = threading.Lock()  # envs may be built in several threads at once

#: Columns of the per-market-step row table (:attr:`MarketTables.rows`).
ROW_COLUMNS = (
    "mid",
    "bid_tick",
    "ask_tick",
    "wide",
    "next_trading",
    "next_mid",
    "next_best_bid",
    "next_best_ask",
    "next_column_zero",
    "next_flow_bid",
    "next_flow_ask",
)


@dataclass(frozen=True)
class MarketTables:
    """The tables of one market under one config, on one device (never modified after :meth:`build`).

    :param tick: the tick size, a Python float (a compiled step takes it as a constant).
    :param num_steps: market steps ``T``.
    :param levels: book levels per side ``L`` of the market.
    :param flow_width: columns ``W`` of the flow grids.
    :param sides: ``[2T, 2L]`` float64: row ``2 i`` = bid ticks then bid sizes of snapshot ``i``, row
        ``2 i + 1`` the asks.
    :param rows: ``[T, len(ROW_COLUMNS)]`` float64 per-step scalars of snapshot ``i`` and the next one.
    :param flow: ``[T * 2 * W, 3]`` float32 executed, cancelled and traded-through shares at a price.
    :param features: ``[T, F]`` float32 market features of snapshot ``i``.
    :param next_features: ``[T, F]`` those of snapshot ``i + 1`` (clamped to the last row).
    :param actions: ``[A, 6]`` float64 action table by joint action code (``A`` = the grid's
        ``joint_actions``: 81, code ``d * 27 + m * 9 + o * 3 + u``, on the default grid).
    :param action_code: ``[4]`` int64, the grid's ``code_weights`` (``(27, 9, 3, 1)`` on the default grid).
    :param taker_rate: taker fee as a fraction of notional (a Python float: a constant when compiled).
    :param maker_rate: maker fee as a fraction of notional (negative: a rebate).
    :param portfolio_affine: ``(scale, bias)`` of the portfolio features.
    :param start_portfolio: ``[1, P]`` float32 portfolio features of a fresh episode.
    """

    tick: float
    num_steps: int
    levels: int
    flow_width: int
    sides: torch.Tensor
    rows: torch.Tensor
    flow: torch.Tensor
    features: torch.Tensor
    next_features: torch.Tensor
    actions: torch.Tensor
    action_code: torch.Tensor
    taker_rate: float
    maker_rate: float
    portfolio_affine: tuple[torch.Tensor, torch.Tensor]
    start_portfolio: torch.Tensor

    @classmethod
    def cached(cls, market: MarketData, config: EnvConfig, device: torch.device) -> MarketTables:
        """:meth:`build`, or the tables built before for the same market tensors, config and device.

        :param market: the market timeline (on ``device``).
        :param config: the env config.
        :param device: device of the tables.
        :return: the tables (shared: never modified).
        """
        tensors = [value for value in (getattr(market, f.name) for f in fields(market))
                   if isinstance(value, torch.Tensor)]
        others = tuple(getattr(market, f.name) for f in fields(market)
                       if not isinstance(getattr(market, f.name), torch.Tensor))
        key = (tuple(id(t) for t in tensors), repr(others), repr(config), str(device))
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
            if hit is not None and all(ref() is t for ref, t in zip(hit[0], tensors, strict=True)):
                _CACHE.move_to_end(key)
                return hit[1]
        tables = cls.build(market, config, device)
        with _CACHE_LOCK:
            _CACHE[key] = ([weakref.ref(t) for t in tensors], tables)
            while len(_CACHE) > CACHED_TABLES:
                _CACHE.popitem(last=False)
        return tables

    @classmethod
    def build(cls, market: MarketData, config: EnvConfig, device: torch.device) -> MarketTables:
        """Compute the tables of ``market`` (already on ``device``) under ``config``.

        :param market: the market timeline.
        :param config: the env config (features, position limit, fees).
        :param device: device of the tables.
        :return: the tables.
        """
        tick_float = float(market.tick_size)
        num_steps = market.num_steps
        following = torch.arange(num_steps, device=device).add(1).clamp_max(num_steps - 1)  # row i + 1
        sides, bid_ticks, ask_ticks = _book_sides(market)
        features = market_features(market, config)  # of snapshot i (for reset)
        affine = portfolio_affine(config, tick_float, device)
        # Fee rates as Python floats, not tensors: a compiled step takes them as constants (a 0-dim tensor
        # would be one more graph input, and one more guard on its value).
        return cls(
            tick=tick_float,
            num_steps=num_steps,
            levels=market.num_levels,
            flow_width=FLOW_WIDTH,
            sides=sides,
            rows=_step_rows(market, bid_ticks, ask_ticks, following),
            flow=_flow_table(market, device),
            features=features,
            next_features=features[following].contiguous(),  # what a step from row i shows
            actions=_action_table(config, device),
            action_code=torch.tensor(config.grid.code_weights, dtype=torch.int64, device=device),
            taker_rate=float(config.taker_fee_bps) * 1e-4,
            maker_rate=float(config.maker_fee_bps) * 1e-4,
            portfolio_affine=affine,
            start_portfolio=_start_portfolio(config, tick_float, affine, device),
        )


def _book_sides(market: MarketData) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Book sides, [2T, 2L] float64: row 2 i = bid ticks then bid sizes of snapshot i, row 2 i + 1 = the
    asks (ticks are exact integers in float64). A step gathers the side it needs by 2 * row + is_ask.

    :return: ``(sides, bid_ticks, ask_ticks)`` (the ticks ``[T, L]``).
    """
    tick = market.tick_size
    bid_ticks = torch.round(market.bid_price.double() / tick)
    ask_ticks = torch.round(market.ask_price.double() / tick)
    sides = torch.stack(
        [
            torch.cat([bid_ticks, market.bid_size.double()], dim=1),
            torch.cat([ask_ticks, market.ask_size.double()], dim=1),
        ],
        dim=1,
    )
    sides = sides.reshape(2 * market.num_steps, 2 * market.num_levels).contiguous()
    return sides, bid_ticks, ask_ticks


def _step_rows(
    market: MarketData, bid_ticks: torch.Tensor, ask_ticks: torch.Tensor, following: torch.Tensor
) -> torch.Tensor:
    """Per-step scalars, [T, len(ROW_COLUMNS)] float64, one row per book gathered by its row ``i``: what
    the step needs of snapshot i and of the next one, ``following[i] = i + 1`` (clamped to the last row)."""
    width = FLOW_WIDTH
    best_bid = market.bid_price[:, 0].double()
    best_ask = market.ask_price[:, 0].double()
    mid = (best_bid + best_ask) / 2
    column_zero = market.flow_ref_tick.double() - width // 2  # price in ticks of flow grid column 0
    flow_base = following.double() * (2 * width)  # the next row's first row in the flat flow table
    columns = {
        "mid": mid,
        "bid_tick": bid_ticks[:, 0],
        "ask_tick": ask_ticks[:, 0],
        "wide": (ask_ticks[:, 0] - bid_ticks[:, 0] >= 2).double(),  # an aggressive maker can step in
        "next_trading": (~market.halted).double()[following],  # 1, or 0 when the next step is halted
        "next_mid": mid[following],
        "next_best_bid": best_bid[following],
        "next_best_ask": best_ask[following],
        "next_column_zero": column_zero[following],
        "next_flow_bid": flow_base,  # flow rows of the bid grid (met by resting buys)
        "next_flow_ask": flow_base + width,  # and of the ask grid (resting sells)
    }
    assert tuple(columns) == ROW_COLUMNS
    return torch.stack(list(columns.values()), dim=1).contiguous()


def _flow_table(market: MarketData, device: torch.device) -> torch.Tensor:
    """Flow at a price, [T, 2 sides, W columns, 3] float32 (share counts) flattened to [T * 2 * W, 3]:
    executed, cancelled, traded through. Side 0 = bid grids (met by resting buys), 1 = ask grids (resting
    sells). Traded through a buy at column j: executions below it, sum(exec_bid[:j]); a sell: above it,
    sum(exec_ask[j+1:])."""
    exec_bid, exec_ask = market.exec_bid.double(), market.exec_ask.double()
    no_volume = torch.zeros_like(exec_bid[:, :1])
    below = torch.cat([no_volume, torch.cumsum(exec_bid, dim=1)[:, :-1]], dim=1)
    above = torch.cat(
        [torch.flip(torch.cumsum(torch.flip(exec_ask, [1]), dim=1), [1])[:, 1:], no_volume], dim=1
    )
    # written column by column into the float32 table (each value rounded once, as a float64 stack cast
    # at the end would be, without its two float64 copies of the whole table)
    flow = torch.empty((market.num_steps, 2, FLOW_WIDTH, 3), dtype=torch.float32, device=device)
    for side, columns3 in enumerate(((exec_bid, market.cancel_bid, below), (exec_ask, market.cancel_ask,
                                                                              above))):
        for column, values in enumerate(columns3):
            flow[:, side, :, column] = values
    return flow.reshape(-1, 3)


def _action_table(config: EnvConfig, device: torch.device) -> torch.Tensor:
    """The action table, [A, 6] float64, by joint code (the grid's code_weights; 27 d + 9 m + 3 o + u on
    the default grid): the target position; the slice of the need a marketable order works (0 for
    LimitMaker); its limit offset beyond the opposite touch in ticks; LimitMaker (1.0) or not; and the
    LimitMaker price off the own touch in ticks, ``improve + aggressive * wide`` (improve = min(offset,
    0) behind or at it; aggressive = one inside when the spread allows).
    The maker price is read only on a LimitMaker action; every order type carries its urgency's."""
    grid = config.grid
    maker = [(float(min(o, 0)), float(o == 1)) for o in grid.maker_offsets]
    orders = {  # by order type: per urgency, (slice, limit offset, is maker)
        "market": [(s, NO_LIMIT, 0.0) for s in grid.market_slices],
        "limit_maker": [(0.0, 0.0, 1.0)] * len(maker),
        "ioc": [(1.0, float(o), 0.0) for o in grid.ioc_offsets],
    }
    actions = [
        [sign * magnitude * config.max_position, *row, *price]
        for sign in DIRECTIONS
        for magnitude in grid.magnitudes
        for order in ORDER_TYPES
        for row, price in zip(orders[order], maker, strict=True)
    ]
    return torch.tensor(actions, dtype=torch.float64, device=device)


def _start_portfolio(
    config: EnvConfig, tick: float, affine: tuple[torch.Tensor, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """The portfolio features at the start of an episode, [1, P] float32: flat, no order, step 0. They
    are the same for every book (the mid only divides or multiplies zeros), so an autoreset takes
    them from here instead of recomputing them."""
    zero = torch.zeros(1, dtype=torch.float64, device=device)
    return portfolio_features(
        position=zero,
        unrealized=zero,
        mid=torch.ones_like(zero),
        order_side=zero,
        order_price=zero,
        order_ahead=zero,
        order_remaining=zero,
        time_in_trade=zero,
        step=zero,
        config=config,
        tick_size=tick,
        affine=affine,
    )
