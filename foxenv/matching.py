"""Order matching against a replayed book, vectorised over books.

All prices here are integer ticks (``price / tick_size``, rounded); sizes are shares (float64). A side is
``+1`` for a buy and ``-1`` for a sell. The agent's own orders never change the replayed book: a
marketable order takes what the snapshot shows without depleting it for later steps, and a resting
order's queue position is tracked against the recorded flow only.
"""

from __future__ import annotations

import torch

#: IoC limit price offsets beyond the opposite touch, in ticks, by urgency, on the default grid
#: (:attr:`foxenv.spec.ActionGrid.ioc_offsets`).
IOC_OFFSETS = (0, 1, 3)
#: A limit, in ticks beyond the touch, far enough away that a Market order is never stopped by it.
NO_LIMIT = float(1 << 50)
#: The smallest positive double (subnormal): ``x.clamp_min(_SMALLEST_DOUBLE)`` is ``x`` for every ``x > 0``.
_SMALLEST_DOUBLE = 5e-324


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

    :param level_ticks: ``[B, L]`` prices of the opposite side in ticks (asks for a buy, bids for a sell).
    :param level_sizes: ``[B, L]`` visible sizes there.
    :param side: ``[B]`` +1 buy, -1 sell (0: nothing is taken), same dtype as ``level_ticks``.
    :param quantity: ``[B]`` shares wanted, >= 0.
    :param limit_tick: ``[B]`` worst acceptable price in ticks (``side * NO_LIMIT`` beyond the touch for a
        Market order).
    :return: ``(filled, notional, reachable)``: ``[B]`` shares filled, ``[B]`` sum of shares * price in
        ticks, and ``[B]`` total size within the limit.
    """
    sizes = level_sizes * (side[:, None] * (level_ticks - limit_tick[:, None]) <= 0)
    cumulative = torch.cumsum(sizes, dim=1)
    taken = torch.minimum((quantity[:, None] - (cumulative - sizes)).clamp_min(0.0), sizes)
    return taken.sum(dim=1), (taken * level_ticks).sum(dim=1), cumulative[:, -1]


def maker_offset_tick(
    best_bid: torch.Tensor, best_ask: torch.Tensor, side: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """Price of a post-only order ``offset`` ticks off the own-side touch
    (:attr:`foxenv.spec.ActionGrid.maker_offsets`): ``-k`` is ``k`` ticks behind it, 0 at it, 1 one tick
    inside it, which falls back to the touch when the spread is under 2 ticks, so the price never reaches
    the opposite touch. The core computes the same from its action table (``improve + aggressive * wide``).

    :param best_bid: ``[B]`` best bid in ticks.
    :param best_ask: ``[B]`` best ask in ticks.
    :param side: ``[B]`` +1 buy, -1 sell (same dtype as the prices).
    :param offset: ``[B]`` whole ticks, each <= 1.
    :return: ``[B]`` order price in ticks.
    """
    touch = torch.where(side > 0, best_bid, best_ask)
    improve = offset.clamp_max(0) + (offset == 1) * (best_ask - best_bid >= 2)
    return touch + side * improve


def limit_maker_tick(
    best_bid: torch.Tensor, best_ask: torch.Tensor, side: torch.Tensor, urgency: torch.Tensor
) -> torch.Tensor:
    """Price of a post-only order on the default grid: one tick behind (passive), at (normal), or one tick
    inside (aggressive) the own-side touch (:func:`maker_offset_tick` at ``urgency - 1``).

    :param best_bid: ``[B]`` best bid in ticks.
    :param best_ask: ``[B]`` best ask in ticks.
    :param side: ``[B]`` +1 buy, -1 sell (same dtype as the prices).
    :param urgency: ``[B]`` 0 passive, 1 normal, 2 aggressive.
    :return: ``[B]`` order price in ticks.
    """
    return maker_offset_tick(best_bid, best_ask, side, urgency - 1)


def ioc_limit_tick(
    best_bid: torch.Tensor, best_ask: torch.Tensor, side: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """Limit price of a marketable order: the opposite touch plus ``offset`` ticks in the order's direction
    (IoC: the grid's ``ioc_offsets`` by urgency, :data:`IOC_OFFSETS` on the default grid; Market:
    :data:`NO_LIMIT`).

    :param best_bid: ``[B]`` best bid in ticks.
    :param best_ask: ``[B]`` best ask in ticks.
    :param side: ``[B]`` +1 buy, -1 sell (same dtype as the prices).
    :param offset: ``[B]`` ticks beyond the opposite touch.
    :return: ``[B]`` limit price in ticks.
    """
    return torch.where(side > 0, best_ask, best_bid) + side * offset


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
    weight_ahead = ahead.pow(power)
    total = weight_ahead + (visible - ahead).clamp_min(0.0).pow(power)
    # total == 0 only where weight_ahead == 0 (both terms are >= 0): then the share is 0 / tiny = 0; for
    # total > 0 the clamp to the smallest positive double changes nothing (one op fewer than a where).
    share = weight_ahead / total.clamp_min(_SMALLEST_DOUBLE)
    return (ahead - cancelled * share).clamp_min(0.0)


def meet_flow(
    ahead: torch.Tensor,
    remaining: torch.Tensor,
    visible: torch.Tensor,
    executed: torch.Tensor,
    cancelled: torch.Tensor,
    traded_through: torch.Tensor,
    power: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One market step of flow at a resting order's price: cancellations shrink the queue ahead (ProbQueue),
    then executions consume the queue ahead and fill the order; a trade through its price fills it all,
    whatever its volume (``EnvConfig.fill_model="optimistic"``; the default: :func:`meet_flow_conservative`).

    :param ahead: ``[B]`` shares ahead of the order.
    :param remaining: ``[B]`` unfilled size of the order (0 where there is none).
    :param visible: ``[B]`` visible size at its price at the start of the step.
    :param executed: ``[B]`` shares executed at its price during the step.
    :param cancelled: ``[B]`` shares cancelled at its price during the step.
    :param traded_through: ``[B]`` bool, shares executed at a worse price (below a bid, above an ask).
    :param power: ProbQueue exponent.
    :return: ``(fill, ahead)``: ``[B]`` shares filled (<= ``remaining``) and the new queue ahead.
    """
    ahead = probqueue_cancel(ahead, visible, cancelled, power)
    fill = torch.where(traded_through, remaining, torch.minimum((executed - ahead).clamp_min(0.0), remaining))
    return fill, (ahead - executed).clamp_min(0.0)


def meet_flow_conservative(
    ahead: torch.Tensor,
    remaining: torch.Tensor,
    visible: torch.Tensor,
    executed: torch.Tensor,
    cancelled: torch.Tensor,
    through: torch.Tensor,
    power: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One market step of flow at a resting order's price, paying only for volume that really traded:
    cancellations shrink the queue ahead (ProbQueue), then the volume executed at its price and the volume
    executed strictly beyond it (a trade through) consume the queue ahead first and fill the order with
    what is left. The replay does not react to the order, so the recorded marketable flow that emptied its
    level and went through would have met the queue ahead, then the order; never more than that volume.

    :param ahead: ``[B]`` shares ahead of the order.
    :param remaining: ``[B]`` unfilled size of the order (0 where there is none).
    :param visible: ``[B]`` visible size at its price at the start of the step.
    :param executed: ``[B]`` shares executed at its price during the step.
    :param cancelled: ``[B]`` shares cancelled at its price during the step.
    :param through: ``[B]`` shares executed at a worse price (below a bid, above an ask).
    :param power: ProbQueue exponent.
    :return: ``(fill, ahead)``: ``[B]`` shares filled (<= ``remaining``) and the new queue ahead.
    """
    ahead = probqueue_cancel(ahead, visible, cancelled, power)
    volume = executed + through
    fill = torch.minimum((volume - ahead).clamp_min(0.0), remaining)
    return fill, (ahead - volume).clamp_min(0.0)
