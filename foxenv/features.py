"""Observation features: market features precomputed once per market step, portfolio features per book.

Market features do not depend on the agent, so :func:`market_features` computes them for every step of a
timeline at construction and the core gathers one row per book each step. Layout of a market row
(``levels = config.levels``, ``H = len(config.return_horizons)``):

=========================  =======================================================================
columns                    meaning
=========================  =======================================================================
``[0, levels)``            bid price distance from mid, in ticks (negative), best level first
``[levels, 2 levels)``     ask price distance from mid, in ticks (positive)
``[2 levels, 3 levels)``   ``log1p`` bid size
``[3 levels, 4 levels)``   ``log1p`` ask size
``4 levels``               top-of-book imbalance ``(bid - ask) / (bid + ask)`` (0 when both are empty)
``4 levels + 1``           spread in ticks
next ``H``                 mid log return over each horizon, in basis points (0 before the timeline has
                           that much history: the horizon is clipped at step 0)
next 1                     realized volatility: root sum of squared 1-step log returns in ``vol_window``, bps
next 1                     signed trade flow over ``flow_window``: buyer- minus seller-initiated volume,
                           as ``sign(x) * log1p(|x|)``
=========================  =======================================================================

Portfolio features (:func:`portfolio_features`, :data:`PORTFOLIO_FEATURES`) follow them in the observation.
"""

from __future__ import annotations

import functools

import torch

from foxenv.config import EnvConfig
from foxenv.data.market import MarketData

#: Names of the portfolio features, in observation order (they come after the market features).
PORTFOLIO_FEATURES = (
    "position",  # position / max_position, in [-1, 1]
    "unrealized_bps",  # unrealized PnL in bps of the full notional max_position * mid
    "order_side",  # +1 resting buy, -1 resting sell, 0 none
    "order_distance",  # (order price - mid) / tick, 0 when none
    "order_queue_ahead",  # log1p(shares ahead of the resting order)
    "order_remaining",  # remaining size / max_position
    "time_in_trade",  # steps since the open trade began / episode_length (0 when flat)
    "time_left",  # (episode_length - step) / episode_length
)


def market_feature_dim(config: EnvConfig) -> int:
    """Number of market features for ``config``.

    :param config: environment settings.
    :return: width of a market feature row.
    """
    return 4 * config.levels + 2 + len(config.return_horizons) + 2


def _window_sum(values: torch.Tensor, window: int) -> torch.Tensor:
    """Trailing sum over ``window`` steps (fewer at the start), along dim 0."""
    cumulative = torch.cumsum(values, dim=0)
    shifted = torch.zeros_like(cumulative)
    if window < values.shape[0]:
        shifted[window:] = cumulative[:-window]
    return cumulative - shifted


def market_features(market: MarketData, config: EnvConfig) -> torch.Tensor:
    """Compute the market feature row of every step of ``market``.

    :param market: the timeline.
    :param config: environment settings (``levels``, ``return_horizons``, ``vol_window``, ``flow_window``).
    :return: ``[T, market_feature_dim(config)]`` float32 tensor on the market's device, all finite.
    """
    levels = config.levels
    tick = market.tick_size
    bid_price = market.bid_price[:, :levels].double()
    ask_price = market.ask_price[:, :levels].double()
    bid_size = market.bid_size[:, :levels].double()
    ask_size = market.ask_size[:, :levels].double()
    mid = (market.bid_price[:, 0].double() + market.ask_price[:, 0].double()) / 2

    bid_distance = (bid_price - mid[:, None]) / tick
    ask_distance = (ask_price - mid[:, None]) / tick
    top_total = bid_size[:, 0] + ask_size[:, 0]
    imbalance = torch.where(
        top_total > 0,
        (bid_size[:, 0] - ask_size[:, 0]) / top_total.clamp_min(1e-12),
        torch.zeros_like(top_total),
    )
    spread = (ask_price[:, 0] - bid_price[:, 0]) / tick

    log_mid = torch.log(mid)
    steps = torch.arange(market.num_steps, device=mid.device)
    returns = []
    for horizon in config.return_horizons:
        past = log_mid[(steps - horizon).clamp_min(0)]
        returns.append(1e4 * (log_mid - past))
    one_step = torch.zeros_like(log_mid)
    one_step[1:] = 1e4 * (log_mid[1:] - log_mid[:-1])
    # a windowed sum of squares from a cumulative sum can cancel to a tiny negative number (on CUDA the scan's
    # order differs from the CPU's): clamp before the root, or a flat stretch gives NaN
    volatility = torch.sqrt(_window_sum(one_step**2, config.vol_window).clamp_min(0.0))

    signed_volume = market.exec_ask.double().sum(dim=1) - market.exec_bid.double().sum(dim=1)
    flow = _window_sum(signed_volume, config.flow_window)
    flow = torch.sign(flow) * torch.log1p(flow.abs())

    columns = [
        bid_distance,
        ask_distance,
        torch.log1p(bid_size),
        torch.log1p(ask_size),
        imbalance[:, None],
        spread[:, None],
        torch.stack(returns, dim=1),
        volatility[:, None],
        flow[:, None],
    ]
    features = torch.cat(columns, dim=1).float()
    if not bool(torch.isfinite(features).all()):
        bad = int((~torch.isfinite(features)).any(dim=1).nonzero()[0, 0])
        raise ValueError(
            f"market {market.name!r}: features at step {bad} are not finite (check prices/sizes)"
        )
    return features.contiguous()


@functools.lru_cache(maxsize=16)
def portfolio_affine(
    config: EnvConfig, tick_size: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and offset turning the raw portfolio columns into :data:`PORTFOLIO_FEATURES` (cached).

    :param config: environment settings.
    :param tick_size: price increment in currency.
    :param device: device of the returned tensors.
    :return: ``(scale, bias)``, ``[len(PORTFOLIO_FEATURES)]`` float64 each.
    """
    length = float(config.episode_length)
    scale = [
        1 / config.max_position,
        1e4 / config.max_position,
        1.0,
        1 / tick_size,
        1.0,
        1 / config.max_position,
        1 / length,
        -1 / length,
    ]
    bias = [0.0] * 7 + [1.0]
    as_tensor = functools.partial(torch.tensor, dtype=torch.float64, device=device)
    return as_tensor(scale), as_tensor(bias)


def portfolio_features(
    position: torch.Tensor,
    unrealized: torch.Tensor,
    mid: torch.Tensor,
    order_side: torch.Tensor,
    order_price: torch.Tensor,
    order_ahead: torch.Tensor,
    order_remaining: torch.Tensor,
    time_in_trade: torch.Tensor,
    step: torch.Tensor,
    config: EnvConfig,
    tick_size: float,
    affine: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Portfolio features of each book, in the order of :data:`PORTFOLIO_FEATURES`.

    :param position: ``[B]`` signed position in lots (float64).
    :param unrealized: ``[B]`` unrealized PnL in currency.
    :param mid: ``[B]`` current mid price.
    :param order_side: ``[B]`` +1 / -1 for a resting buy / sell order, 0 for none.
    :param order_price: ``[B]`` resting order price (ignored where there is none).
    :param order_ahead: ``[B]`` shares ahead of the resting order.
    :param order_remaining: ``[B]`` unfilled size of the resting order (0 when none).
    :param time_in_trade: ``[B]`` steps since the open trade began (0 when flat), float64.
    :param step: ``[B]`` steps into the episode, float64.
    :param config: environment settings.
    :param tick_size: price increment in currency.
    :param affine: ``portfolio_affine(config, tick_size, device)`` when the caller holds it (the core does,
        so a ``torch.compile``'d step does not trace the cache); ``None`` looks it up.
    :return: ``[B, len(PORTFOLIO_FEATURES)]`` float32.
    """
    distance = (order_price - mid) * order_side.abs()
    raw = torch.stack(
        [
            position,
            unrealized / mid,
            order_side,
            distance,
            torch.log1p(order_ahead),
            order_remaining,
            time_in_trade,
            step,
        ],
        dim=1,
    )
    scale, bias = portfolio_affine(config, float(tick_size), raw.device) if affine is None else affine
    return torch.addcmul(bias, raw, scale).to(torch.float32)
