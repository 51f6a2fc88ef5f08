"""The layout of the per-book state: which ``[B]`` tensors a step reads and writes, and how the core
packs them into one float64 and one int64 matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from foxenv.accounting import Ledger

#: Names of the per-book resting order state tensors (for ``state_dict``).
ORDER_FIELDS = ("order_side", "order_tick", "order_ahead", "order_remaining", "order_target")
#: The float64 ledger fields, in :class:`~foxenv.accounting.Ledger`'s order (its last field,
#: ``trade_start``, is an int64 counter).
LEDGER_FLOATS = ("cash", "position", "avg_price", "realized", "trade_realized", "trade_fees", "entry_mid")
#: Rows of the float64 state matrix ``BatchedLOB._books`` (``[len, B]``), by their ``state_dict`` names.
BOOK_ROWS = ("equity", "peak_equity", *ORDER_FIELDS, *(f"ledger.{name}" for name in LEDGER_FLOATS))
#: Rows of the int64 state matrix ``BatchedLOB._counters`` (``[len, B]``), by their ``state_dict`` names.
COUNTER_ROWS = ("offset", "step", "ledger.trade_start")
assert tuple(field.name for field in fields(Ledger)) == (*LEDGER_FLOATS, "trade_start")


@dataclass
class BookState:
    """The per-book state of every book, one ``[B]`` tensor per field: what a step reads and writes.

    The core keeps it packed in two matrices, ``[len(BOOK_ROWS), B]`` float64 and
    ``[len(COUNTER_ROWS), B]`` int64 (:meth:`unpack` and :meth:`pack`), so a compiled step has two state
    inputs and two state outputs instead of one per field: at one book a compiled call's cost grows with
    the number of tensors crossing it (guards, wrappers, buffer allocations), not with the arithmetic.
    A row of a matrix is a contiguous ``[B]`` tensor, so the step reads each field as before.

    :param offset: ``[B]`` int64 market row of each book's episode start.
    :param step: ``[B]`` int64 steps taken in the episode.
    :param equity: ``[B]`` equity after the last step.
    :param peak_equity: ``[B]`` highest equity of the episode.
    :param order_side: ``[B]`` +1 a resting buy, -1 a resting sell, 0 no resting order.
    :param order_tick: ``[B]`` its limit price in ticks.
    :param order_ahead: ``[B]`` shares queued ahead of it.
    :param order_remaining: ``[B]`` its unfilled shares.
    :param order_target: ``[B]`` the target position it works towards.
    :param ledger: cash, position and trade bookkeeping.
    """

    offset: torch.Tensor
    step: torch.Tensor
    equity: torch.Tensor
    peak_equity: torch.Tensor
    order_side: torch.Tensor
    order_tick: torch.Tensor
    order_ahead: torch.Tensor
    order_remaining: torch.Tensor
    order_target: torch.Tensor
    ledger: Ledger

    @classmethod
    def unpack(cls, books: torch.Tensor, counters: torch.Tensor) -> BookState:
        """The state held in the packed matrices (views of their rows, no copies).

        :param books: ``[len(BOOK_ROWS), B]`` float64.
        :param counters: ``[len(COUNTER_ROWS), B]`` int64.
        :return: the state.
        """
        equity, peak_equity, side, tick, ahead, remaining, target, *ledger_floats = books.unbind(0)
        offset, step, trade_start = counters.unbind(0)
        return cls(
            offset, step, equity, peak_equity, side, tick, ahead, remaining, target,
            Ledger(*ledger_floats, trade_start=trade_start),
        )

    def pack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state as the two matrices :meth:`unpack` reads (new tensors).

        :return: ``[len(BOOK_ROWS), B]`` float64 and ``[len(COUNTER_ROWS), B]`` int64.
        """
        ledger = self.ledger
        books = torch.stack(
            [
                self.equity,
                self.peak_equity,
                self.order_side,
                self.order_tick,
                self.order_ahead,
                self.order_remaining,
                self.order_target,
                ledger.cash,
                ledger.position,
                ledger.avg_price,
                ledger.realized,
                ledger.trade_realized,
                ledger.trade_fees,
                ledger.entry_mid,
            ]
        )
        counters = torch.stack([self.offset, self.step, ledger.trade_start])
        return books, counters
