"""Order matching against a replayed book, vectorised over books.

All prices here are integer ticks (``price / tick_size``, rounded); sizes are shares (float64). A side is
``+1`` for a buy and ``-1`` for a sell. The agent's own orders never change the replayed book: a
marketable order takes what the snapshot shows without depleting it for later steps, and a resting
order's queue position is tracked against the recorded flow only.
"""

from __future__ import annotations

import torch

#: Fraction of the needed position change a Market order works this step, by urgency (passive, normal,
#: aggressive).
MARKET_SLICES = (1.0 / 3.0, 2.0 / 3.0, 1.0)
#: IoC limit price offsets beyond the opposite touch, in ticks, by urgency.
IOC_OFFSETS = (0, 1, 3)
#: A limit far enough away that a Market order is never stopped by it.
NO_LIMIT = 1 << 50


def walk_book(
    level_ticks: torch.Tensor,
    level_sizes: torch.Tensor,
    side: torch.Tensor,
    quantity: torch.Tensor,
    limit_tick: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Take up to ``quantity`` shares from the opposite side of the book, best level first.

    Only levels at or better than ``limit_tick`` count (``<=`` for buys, ``>=`` for sells); the rest of
    the quantity is not filled (immediate-or-cancel). No Python loop over books or levels: cumulative
    sizes and a clamp.

    :param level_ticks: ``[B, L]`` int64 prices of the opposite side (asks for a buy, bids for a sell).
    :param level_sizes: ``[B, L]`` visible sizes there.
    :param side: ``[B]`` +1 buy, -1 sell (0: nothing is taken).
    :param quantity: ``[B]`` shares wanted, >= 0.
    :param limit_tick: ``[B]`` int64 worst acceptable price (use ``side * NO_LIMIT`` for a Market order).
    :return: ``(filled, notional, reachable)``: ``[B]`` shares filled, ``[B]`` sum of shares * price in
        ticks, and ``[B]`` total size within the limit.
    """
    reachable = side[:, None] * (level_ticks - limit_tick[:, None]) <= 0
    sizes = torch.where(reachable, level_sizes, torch.zeros_like(level_sizes))
    before = torch.cumsum(sizes, dim=1) - sizes
    taken = torch.minimum((quantity[:, None] - before).clamp_min(0.0), sizes)
    return taken.sum(dim=1), (taken * level_ticks).sum(dim=1), sizes.sum(dim=1)


def limit_maker_tick(
    best_bid: torch.Tensor, best_ask: torch.Tensor, side: torch.Tensor, urgency: torch.Tensor
) -> torch.Tensor:
    """Price of a post-only order: one tick behind (passive), at (normal), or one tick inside (aggressive)
    the own-side touch. Aggressive falls back to the touch when the spread is under 2 ticks, so the
    price never reaches the opposite touch.

    :param best_bid: ``[B]`` int64 best bid tick.
    :param best_ask: ``[B]`` int64 best ask tick.
    :param side: ``[B]`` +1 buy, -1 sell.
    :param urgency: ``[B]`` int64 0 passive, 1 normal, 2 aggressive.
    :return: ``[B]`` int64 order price in ticks.
    """
    touch = torch.where(side > 0, best_bid, best_ask)
    improve = urgency - 1
    improve = torch.where((improve > 0) & (best_ask - best_bid < 2), torch.zeros_like(improve), improve)
    return touch + side.to(touch.dtype) * improve


def ioc_limit_tick(
    best_bid: torch.Tensor, best_ask: torch.Tensor, side: torch.Tensor, urgency: torch.Tensor
) -> torch.Tensor:
    """Limit price of an IoC order: the opposite touch plus 0, 1 or 3 ticks by urgency.

    :param best_bid: ``[B]`` int64 best bid tick.
    :param best_ask: ``[B]`` int64 best ask tick.
    :param side: ``[B]`` +1 buy, -1 sell.
    :param urgency: ``[B]`` int64 0 passive, 1 normal, 2 aggressive.
    :return: ``[B]`` int64 limit price in ticks.
    """
    offsets = torch.tensor(IOC_OFFSETS, dtype=torch.int64, device=urgency.device)[urgency]
    touch = torch.where(side > 0, best_ask, best_bid)
    return touch + side.to(touch.dtype) * offsets


def probqueue_cancel(
    ahead: torch.Tensor, visible: torch.Tensor, cancelled: torch.Tensor, power: float
) -> torch.Tensor:
    """Shrink the queue ahead of a resting order by the ProbQueue share of cancellations at its price.

    ``behind = max(visible - ahead, 0)``; ``ahead -= cancelled * f(ahead) / (f(ahead) + f(behind))`` with
    ``f(x) = x ** power`` (no change when both are 0); the queue ahead never goes below 0.

    :param ahead: ``[B]`` shares ahead of the order.
    :param visible: ``[B]`` visible size at the order's price at the start of the step.
    :param cancelled: ``[B]`` shares cancelled at that price during the step.
    :param power: exponent ``n`` of ``f``.
    :return: ``[B]`` new queue ahead.
    """
    behind = (visible - ahead).clamp_min(0.0)
    weight_ahead = ahead.pow(power)
    total = weight_ahead + behind.pow(power)
    share = torch.where(total > 0, weight_ahead / total.clamp_min(1e-300), torch.zeros_like(total))
    return (ahead - cancelled * share).clamp_min(0.0)
