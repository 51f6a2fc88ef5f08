"""Cash, position and trade bookkeeping of every book, with average-entry-price PnL.

A fill of ``q`` shares (signed: + buy, - sell) at price ``p`` with fee ``fee`` moves cash by
``-q * p - fee``; equity ``cash + position * mid`` therefore changes by ``(mid - p) * q - fee`` at the
moment of the fill. ``realized`` counts the gains of closed lots (against the average entry price) minus
every fee paid so far (rebates count as negative fees), so ``equity = realized + unrealized`` always.

A *trade* is a round trip: it opens when the position leaves 0 (or flips sign) and closes when the
position returns to 0 or flips sign. Its PnL is the realized gain of all its lots minus all its fees; on
a flip the fill's fee is split pro rata between the closing and the opening part.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class TradeClose:
    """What closed in one fill, per book (zeros where nothing closed).

    :param closed: ``[B]`` bool, a round trip ended (flat again or a flip).
    :param pnl: ``[B]`` that trade's realized PnL in currency after its fees.
    :param lots: ``[B]`` absolute size of the position that closed.
    :param entry_mid: ``[B]`` the mid when that trade was opened.
    """

    closed: torch.Tensor
    pnl: torch.Tensor
    lots: torch.Tensor
    entry_mid: torch.Tensor


@dataclass
class Ledger:
    """Per-book accounting state, all ``[B]`` float64 (``trade_start`` int64), updated in place.

    :param cash: currency; starts at 0.
    :param position: signed lots.
    :param avg_price: average entry price of the open position (0 when flat).
    :param realized: realized PnL of closed lots minus all fees, since the episode began.
    :param trade_realized: realized gains of the open trade so far (partial closes).
    :param trade_fees: fees of the open trade so far.
    :param entry_mid: mid when the open trade began (0 when flat).
    :param trade_start: episode step at which the open trade began.
    """

    cash: torch.Tensor
    position: torch.Tensor
    avg_price: torch.Tensor
    realized: torch.Tensor
    trade_realized: torch.Tensor
    trade_fees: torch.Tensor
    entry_mid: torch.Tensor
    trade_start: torch.Tensor

    @classmethod
    def zeros(cls, num_books: int, device: torch.device) -> Ledger:
        """A flat ledger with no cash.

        :param num_books: number of books ``B``.
        :param device: device of the state tensors.
        :return: the ledger.
        """
        state = {f.name: torch.zeros(num_books, dtype=torch.float64, device=device) for f in fields(cls)}
        state["trade_start"] = torch.zeros(num_books, dtype=torch.int64, device=device)
        return cls(**state)

    def reset(self, mask: torch.Tensor) -> None:
        """Make the books in ``mask`` flat with no cash (new tensors: earlier infos are not changed).

        :param mask: ``[B]`` bool.
        """
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name).masked_fill(mask, 0))

    def unrealized(self, mid: torch.Tensor) -> torch.Tensor:
        """Unrealized PnL of the open position at ``mid``.

        :param mid: ``[B]`` mid price.
        :return: ``[B]`` ``position * (mid - avg_price)``.
        """
        return self.position * (mid - self.avg_price)

    def equity(self, mid: torch.Tensor) -> torch.Tensor:
        """Mark-to-market equity.

        :param mid: ``[B]`` mid price.
        :return: ``[B]`` ``cash + position * mid``.
        """
        return self.cash + self.position * mid

    def apply_fill(
        self,
        quantity: torch.Tensor,
        price: torch.Tensor,
        fee: torch.Tensor,
        mid: torch.Tensor,
        step: torch.Tensor,
        target: torch.Tensor,
        reached_target: torch.Tensor,
    ) -> TradeClose:
        """Book one fill per book (``quantity == 0``: none) and report closed trades.

        :param quantity: ``[B]`` signed shares filled (+ bought, - sold).
        :param price: ``[B]`` average fill price (ignored where ``quantity == 0``).
        :param fee: ``[B]`` fee paid for the fill (negative = rebate).
        :param mid: ``[B]`` mid at the time of the fill (becomes ``entry_mid`` of a trade it opens).
        :param step: ``[B]`` int64 episode step of the fill.
        :param target: ``[B]`` position the order was working towards.
        :param reached_target: ``[B]`` bool, the fill completed the order: the position is set to exactly
            ``target`` (no rounding residue, so a close to flat is exactly 0).
        :return: the trades that closed.
        """
        # Fewer ops than the plain formulas (the step is bound by per-op overhead), same floats:
        # ``x.masked_fill(c, 0.0)`` is ``where(c, 0, x)``; dividing by ``new + flat`` is dividing by
        # ``where(flat, 1, new)``; the three closed-trade values are zeroed as one stacked tensor.
        old = self.position
        new = torch.where(reached_target, target, old + quantity)
        size = quantity.abs()
        old_abs = old.abs()
        opening = old * quantity >= 0  # from flat, adding to the position, or no fill
        closed_lots = torch.minimum(size, old_abs).masked_fill(opening, 0.0)
        realized_now = closed_lots * (price - self.avg_price) * torch.sign(old)
        flat = new == 0
        flip = old * new < 0
        closes = (old != 0) & (flat | flip)
        starts = (quantity != 0) & ((old == 0) | flip)
        fee_old_trade = torch.where(flip, fee * closed_lots / size, fee)
        trade_realized = self.trade_realized + realized_now
        trade_fees = self.trade_fees + fee_old_trade
        closed_values = torch.stack([trade_realized - trade_fees, old_abs, self.entry_mid])
        pnl, lots, entry_mid = closed_values.masked_fill(~closes, 0.0).unbind()
        result = TradeClose(closed=closes, pnl=pnl, lots=lots, entry_mid=entry_mid)

        cost = quantity * price
        added = (old * self.avg_price + cost) / (new + flat)
        avg = torch.where(flip, price, torch.where(opening, added, self.avg_price))
        self.avg_price = avg.masked_fill(flat, 0.0)
        self.trade_realized = trade_realized.masked_fill(closes, 0.0)
        self.trade_fees = torch.where(closes, fee - fee_old_trade, trade_fees)
        self.entry_mid = torch.where(starts, mid, self.entry_mid.masked_fill(flat, 0.0))
        self.trade_start = torch.where(starts, step, self.trade_start)
        self.cash = self.cash - cost - fee
        self.realized = self.realized + realized_now - fee
        self.position = new
        return result
