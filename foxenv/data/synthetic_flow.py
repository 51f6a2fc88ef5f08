"""The order flow of the synthetic market (:func:`foxenv.data.synthetic.generate_synthetic`): what
executed and what was cancelled in each step, derived from the book at the step's start and at its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from foxenv.data.market import FLOW_WIDTH

if TYPE_CHECKING:
    from foxenv.data.synthetic import SyntheticProfile

_HALF = FLOW_WIDTH // 2
#: Salt of the trade gates' own random stream (the market's stream stays untouched by them).
_TRADE_SALT = 0x7EAD_E5A1
#: Salt of the sweep gates' own random stream (whether the levels the price moves past traded).
_SWEEP_SALT = 0x5EE9_0A7E


def _gates(
    seed: int, salt: int, probability: float, pressure: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """Whether the buy side and the sell side trade in each step, from the salted stream ``salt``: each with
    chance ``2 * probability`` times its pressure (``pressure`` buys, ``1 - pressure`` sells), capped at 1;
    ``(None, None)`` (every step) when ``probability >= 1``."""
    if probability >= 1:
        return None, None
    gates = torch.Generator(device="cpu").manual_seed((int(seed) + salt) % 2**63)
    uniform = torch.rand((2, pressure.shape[0]), generator=gates, dtype=torch.float64)
    chance = 2.0 * probability
    buys = uniform[0] < (chance * pressure).clamp(max=1.0)
    return buys, uniform[1] < (chance * (1.0 - pressure)).clamp(max=1.0)


def book_flows(
    book: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    increments: torch.Tensor,
    volatility: torch.Tensor,
    metaorder: torch.Tensor | None,
    seed: int,
    knobs: SyntheticProfile,
    generator: torch.Generator,
) -> tuple[torch.Tensor, ...]:
    """Flows of step t (rows 1..T) from the book at its start (row t-1) and its end (row t).

    :param book: ``(bid_ticks, ask_ticks, bid_size, ask_size)``, each ``[T + 1, L]``.
    :param increments: ``[T + 1]`` the mid's increments in ticks (row 0 is 0).
    :param volatility: ``[T + 1]`` the mid's volatility in ticks.
    :param metaorder: ``[T + 1]`` the latent order-flow imbalance, or None (no metaorders).
    :param seed: the market's seed (the gates draw from their own salted streams).
    :param knobs: the profile.
    :param generator: the market's random source.
    :return: ``(ref_tick, exec_bid, exec_ask, cancel_bid, cancel_ask)``.
    """
    bid_ticks, ask_ticks, bid_size, ask_size = book
    ref_tick = (bid_ticks[:-1, 0] + ask_ticks[:-1, 0]).div(2, rounding_mode="floor")
    move = increments[1:]
    if knobs.adverse_selection > 0:  # lean toward the next step's move (none after the last step)
        following = torch.cat([increments[2:], torch.zeros(1, dtype=torch.float64)])
        move = move + knobs.adverse_selection * following
    buy_pressure = torch.sigmoid(2.0 * move / volatility[1:])
    buys_trade, sells_trade = _gates(seed, _TRADE_SALT, knobs.trade_probability, buy_pressure)
    sharp = torch.sigmoid(2.0 * increments[1:] / volatility[1:])  # this step's move only
    buys_sweep, sells_sweep = _gates(seed, _SWEEP_SALT, knobs.sweep_trade_probability, sharp)
    exec_ask, cancel_ask = _side_flow(ask_ticks[:-1], ask_size[:-1], ask_ticks[:-1] < ask_ticks[1:, :1],
                                      buy_pressure, ref_tick, knobs, generator, buys_trade, buys_sweep)
    exec_bid, cancel_bid = _side_flow(bid_ticks[:-1], bid_size[:-1], bid_ticks[:-1] > bid_ticks[1:, :1],
                                      1.0 - buy_pressure, ref_tick, knobs, generator, sells_trade,
                                      sells_sweep)
    if metaorder is not None and knobs.flow_volume > 0:  # their own trades at the step's starting touch
        traded = knobs.flow_volume * metaorder[1:]
        if (buys_sweep is not None and sells_sweep is not None and buys_trade is not None
                and sells_trade is not None):
            # they also trade where they swept the touch away (the price moved past it and that side traded)
            buys_trade = buys_trade | (buys_sweep & (ask_ticks[:-1, 0] < ask_ticks[1:, 0]))
            sells_trade = sells_trade | (sells_sweep & (bid_ticks[:-1, 0] > bid_ticks[1:, 0]))
        sides = ((exec_ask, ask_ticks[:-1, 0], traded.clamp(min=0.0), buys_trade),
                 (exec_bid, bid_ticks[:-1, 0], (-traded).clamp(min=0.0), sells_trade))
        for grid, touch, volume, gate in sides:
            if gate is not None:
                volume = volume * gate
            column = (touch - ref_tick + _HALF).clamp(0, FLOW_WIDTH - 1)
            grid.scatter_add_(1, column[:, None], volume[:, None].float())
    return ref_tick, exec_bid, exec_ask, cancel_bid, cancel_ask


def _side_flow(
    prev_price: torch.Tensor,
    prev_size: torch.Tensor,
    consumed: torch.Tensor,
    pressure: torch.Tensor,
    ref_tick: torch.Tensor,
    profile: SyntheticProfile,
    generator: torch.Generator,
    trades: torch.Tensor | None = None,
    sweeps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Executed and cancelled volume of one side during each step, on the flow grid.

    :param prev_price: ``[T, L]`` int64 tick prices of the side at the step's start.
    :param prev_size: ``[T, L]`` sizes at the step's start.
    :param consumed: ``[T, L]`` bool, levels the price moved past during the step.
    :param pressure: ``[T]`` in ``[0, 1]``, share of aggressive flow hitting this side.
    :param ref_tick: ``[T]`` int64 grid reference (floor of the start mid, in ticks).
    :param profile: the knobs.
    :param generator: the random source.
    :param trades: ``[T]`` bool, steps in which the surviving touch trades at all; ``None``: every step.
    :param sweeps: ``[T]`` bool, steps in which the levels the price moved past traded (else they were
        cancelled); ``None``: every step.
    :return: ``(executed, cancelled)``, each ``[T, FLOW_WIDTH]`` float32.
    """
    steps, levels = prev_price.shape
    uniform = torch.rand((steps, levels), generator=generator, dtype=torch.float64)
    consumed_exec = prev_size * (profile.consumed_exec_min + (1.0 - profile.consumed_exec_min) * uniform)
    touch_share = profile.exec_fraction * 2.0 * pressure * torch.empty(
        steps, dtype=torch.float64).exponential_(generator=generator)
    touch_exec = torch.zeros_like(prev_size)
    touch_exec[:, 0] = prev_size[:, 0] * touch_share.clamp(max=1.0)
    if trades is not None:
        touch_exec[:, 0] = touch_exec[:, 0] * trades
    if sweeps is not None:
        consumed_exec = consumed_exec * sweeps[:, None]
    executed = torch.where(consumed, consumed_exec, touch_exec)
    decay = (1.0 + torch.arange(levels, dtype=torch.float64)) ** -profile.cancel_power
    cancel_share = profile.cancel_fraction * decay * torch.empty(
        (steps, levels), dtype=torch.float64).exponential_(generator=generator)
    remaining = prev_size - executed
    cancelled = torch.where(consumed, remaining, remaining * cancel_share.clamp(max=1.0))
    column = (prev_price - ref_tick[:, None] + _HALF).clamp(0, FLOW_WIDTH - 1)
    executed_grid = torch.zeros((steps, FLOW_WIDTH), dtype=torch.float64).scatter_add_(1, column, executed)
    cancelled_grid = torch.zeros((steps, FLOW_WIDTH), dtype=torch.float64).scatter_add_(1, column, cancelled)
    return executed_grid.float(), cancelled_grid.float()
