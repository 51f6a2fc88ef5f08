"""The per-step market tensors that every data source produces and the batched book consumes.

A :class:`MarketData` is one timeline of ``T`` steps, preloaded on a device. Each book of the
batched environment reads it at its own time offset. Both the LOBSTER replay and the synthetic
generator produce exactly this structure, so the book core never knows where data came from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

#: Width, in ticks, of the per-step order-flow grid (see :class:`MarketData`).
FLOW_WIDTH = 64


@dataclass(frozen=True)
class MarketData:
    """One timeline of ``T`` steps of an ``L``-level book, all tensors on one device.

    Prices are in currency (e.g. USD), stored as float64; sizes in shares, float32.

    :param bid_price: ``[T, L]`` bid prices of the book at the end of each step, best first.
        Empty levels (the data had fewer occupied levels) carry size 0 and a price continued one
        tick per level past the last occupied one, so every price is finite and strictly ordered.
    :param bid_size: ``[T, L]`` visible size at each bid level.
    :param ask_price: ``[T, L]`` ask prices, best first (same convention).
    :param ask_size: ``[T, L]`` visible size at each ask level.
    :param flow_ref_tick: ``[T]`` int64, the tick index (price / tick_size, rounded) that column
        ``FLOW_WIDTH // 2`` of the flow grids stands for in step ``t``. It is the mid at the
        *start* of the step (the previous step's end), rounded down to a tick.
    :param exec_bid: ``[T, FLOW_WIDTH]`` volume executed against resting *bids* during the step
        (seller-initiated trades), by price: column ``j`` is price tick ``flow_ref_tick + j - W//2``.
        Volume beyond the grid is added to the edge column nearest to it.
    :param exec_ask: ``[T, FLOW_WIDTH]`` volume executed against resting *asks* (buyer-initiated).
    :param cancel_bid: ``[T, FLOW_WIDTH]`` visible bid volume cancelled or deleted during the step.
    :param cancel_ask: ``[T, FLOW_WIDTH]`` visible ask volume cancelled or deleted during the step.
    :param time: ``[T]`` float64 seconds (after midnight for LOBSTER) at the end of each step.
    :param halted: ``[T]`` bool, True where trading was halted during the step: no order of the
        agent executes in such a step.
    :param tick_size: price increment in currency.
    :param name: a short human-readable description of the source.
    """

    bid_price: torch.Tensor
    bid_size: torch.Tensor
    ask_price: torch.Tensor
    ask_size: torch.Tensor
    flow_ref_tick: torch.Tensor
    exec_bid: torch.Tensor
    exec_ask: torch.Tensor
    cancel_bid: torch.Tensor
    cancel_ask: torch.Tensor
    time: torch.Tensor
    halted: torch.Tensor
    tick_size: float
    name: str = "market"

    @property
    def num_steps(self) -> int:
        """Number of steps ``T`` in the timeline."""
        return int(self.bid_price.shape[0])

    @property
    def num_levels(self) -> int:
        """Number of book levels ``L`` per side."""
        return int(self.bid_price.shape[1])

    @property
    def device(self) -> torch.device:
        """Device the tensors live on."""
        return self.bid_price.device

    def to(self, device: torch.device | str) -> MarketData:
        """Return a copy with every tensor on ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)

    def slice(self, start: int, stop: int) -> MarketData:
        """Return steps ``[start, stop)`` as a new timeline (views, no copy)."""
        if not 0 <= start < stop <= self.num_steps:
            raise ValueError(f"slice: start={start}, stop={stop} must satisfy 0 <= start < stop <= {self.num_steps}")
        cut = {
            f.name: getattr(self, f.name)[start:stop]
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **cut)

    def split(self, train_fraction: float = 0.8) -> tuple[MarketData, MarketData]:
        """Split by time into (train, test): the first ``train_fraction`` of steps, then the rest."""
        if not 0.0 < train_fraction < 1.0:
            raise ValueError(f"train_fraction={train_fraction} must lie strictly between 0 and 1")
        cut = int(round(self.num_steps * train_fraction))
        if cut < 1 or cut >= self.num_steps:
            raise ValueError(f"train_fraction={train_fraction} leaves an empty split of {self.num_steps} steps")
        return self.slice(0, cut), self.slice(cut, self.num_steps)
