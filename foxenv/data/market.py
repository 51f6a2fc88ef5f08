"""The per-step market tensors that every data source produces and the batched book consumes.

A :class:`MarketData` is one timeline of ``T`` steps, preloaded on a device. Each book of the
batched environment reads it at its own time offset. Both the LOBSTER replay and the synthetic
generator produce exactly this structure, so the book core never knows where data came from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

#: Width, in ticks, of the per-step order-flow grid (see :class:`MarketData`).
FLOW_WIDTH = 64
#: Seconds of a day: a market's ``time % SECONDS_PER_DAY`` is its clock of day.
SECONDS_PER_DAY = 86_400.0


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
        """Return a copy with every tensor on ``device``.

        :param device: where the copy's tensors live.
        :return: the moved market (``self``'s tensors when already there).
        """
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)

    def slice(self, start: int, stop: int) -> MarketData:
        """Return steps ``[start, stop)`` as a new timeline (views, no copy).

        :param start: first step kept; ``0 <= start < stop``.
        :param stop: one past the last step kept; ``<= num_steps``.
        :return: the sliced market.
        """
        if not 0 <= start < stop <= self.num_steps:
            raise ValueError(
                f"slice: start={start}, stop={stop} must satisfy 0 <= start < stop <= {self.num_steps}"
            )
        cut = {
            f.name: getattr(self, f.name)[start:stop]
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **cut)

    def split(self, train_fraction: float = 0.8) -> tuple[MarketData, MarketData]:
        """Split by time into (train, test): the first ``train_fraction`` of steps, then the rest.

        :param train_fraction: share of the steps in the train part, strictly between 0 and 1.
        :return: ``(train, test)`` markets, both non-empty.
        """
        if not 0.0 < train_fraction < 1.0:
            raise ValueError(f"train_fraction={train_fraction} must lie strictly between 0 and 1")
        cut = int(round(self.num_steps * train_fraction))
        if cut < 1 or cut >= self.num_steps:
            raise ValueError(
                f"train_fraction={train_fraction} leaves an empty split of {self.num_steps} steps"
            )
        return self.slice(0, cut), self.slice(cut, self.num_steps)

    def mid_price(self) -> torch.Tensor:
        """Mid price at the end of each step.

        :return: ``[T]`` float64, ``(best_bid + best_ask) / 2``.
        """
        return 0.5 * (self.bid_price[:, 0] + self.ask_price[:, 0])

    def spread_ticks(self) -> torch.Tensor:
        """Best-ask minus best-bid at the end of each step, in ticks.

        :return: ``[T]`` int64 spread in ticks (rounded to the nearest tick).
        """
        return torch.round((self.ask_price[:, 0] - self.bid_price[:, 0]) / self.tick_size).to(torch.int64)

    def validate(self) -> MarketData:
        """Check every field against the contract above; for data sources and tests, not hot paths.

        Checks shapes, dtypes, one device, finite values, positive and tick-aligned prices, strictly
        ordered levels, an uncrossed book, non-negative sizes and flows, and non-decreasing time.
        It synchronises with the device, so call it once after loading, never inside a step.

        :return: ``self``, so that ``data = load(...).validate()`` reads naturally.
        :raises ValueError: naming the first field that breaks the contract, and the offending value.
        """
        if not self.tick_size > 0:
            raise ValueError(f"tick_size={self.tick_size} must be > 0")
        if self.bid_price.ndim != 2 or self.num_steps < 1 or self.num_levels < 1:
            raise ValueError(f"bid_price has shape {tuple(self.bid_price.shape)}, must be [T>=1, L>=1]")
        steps, levels = self.num_steps, self.num_levels
        expected = {
            "bid_price": ((steps, levels), torch.float64),
            "ask_price": ((steps, levels), torch.float64),
            "bid_size": ((steps, levels), torch.float32),
            "ask_size": ((steps, levels), torch.float32),
            "flow_ref_tick": ((steps,), torch.int64),
            "exec_bid": ((steps, FLOW_WIDTH), torch.float32),
            "exec_ask": ((steps, FLOW_WIDTH), torch.float32),
            "cancel_bid": ((steps, FLOW_WIDTH), torch.float32),
            "cancel_ask": ((steps, FLOW_WIDTH), torch.float32),
            "time": ((steps,), torch.float64),
            "halted": ((steps,), torch.bool),
        }
        for name, (shape, dtype) in expected.items():
            value = getattr(self, name)
            if tuple(value.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, must be {shape}")
            if value.dtype != dtype:
                raise ValueError(f"{name} has dtype {value.dtype}, must be {dtype}")
            if value.device != self.device:
                raise ValueError(f"{name} is on {value.device}, bid_price on {self.device}")
            if value.is_floating_point():
                bad = ~torch.isfinite(value)
                if bool(bad.any()):
                    where = _first_index(bad)
                    raise ValueError(f"{name}{where}={value[where].item()} is not finite")
        for name in ("bid_size", "ask_size", "exec_bid", "exec_ask", "cancel_bid", "cancel_ask"):
            value = getattr(self, name)
            if bool((value < 0).any()):
                where = _first_index(value < 0)
                raise ValueError(f"{name}{where}={value[where].item()} must be >= 0")
        if bool((self.bid_price <= 0).any()):
            where = _first_index(self.bid_price <= 0)
            raise ValueError(f"bid_price{where}={self.bid_price[where].item()} must be > 0")
        for name in ("bid_price", "ask_price"):
            value = getattr(self, name)
            ticks = value / self.tick_size
            off_grid = (ticks - torch.round(ticks)).abs() > 1e-6
            if bool(off_grid.any()):
                where = _first_index(off_grid)
                raise ValueError(f"{name}{where}={value[where].item()} is not a multiple of tick_size")
        unordered_bid = self.bid_price[:, 1:] >= self.bid_price[:, :-1]
        if bool(unordered_bid.any()):
            t, k = _first_index(unordered_bid)
            raise ValueError(
                f"bid_price[{t}] is not strictly decreasing between levels {k} and {k + 1}: "
                f"{self.bid_price[t].tolist()}"
            )
        unordered_ask = self.ask_price[:, 1:] <= self.ask_price[:, :-1]
        if bool(unordered_ask.any()):
            t, k = _first_index(unordered_ask)
            raise ValueError(
                f"ask_price[{t}] is not strictly increasing between levels {k} and {k + 1}: "
                f"{self.ask_price[t].tolist()}"
            )
        crossed = self.bid_price[:, 0] >= self.ask_price[:, 0]
        if bool(crossed.any()):
            (t,) = _first_index(crossed)
            raise ValueError(
                f"crossed book at step {t}: bid_price={self.bid_price[t, 0].item()} >= "
                f"ask_price={self.ask_price[t, 0].item()}"
            )
        backwards = self.time[1:] < self.time[:-1]
        if bool(backwards.any()):
            (t,) = _first_index(backwards)
            raise ValueError(f"time[{t + 1}]={self.time[t + 1].item()} < time[{t}]={self.time[t].item()}")
        return self


def concat_markets(markets: Sequence[MarketData], name: str | None = None) -> MarketData:
    """Join timelines end to end (days of one ticker, or several tickers) into one.

    A market that starts before the previous one ends is shifted by whole days, so ``time`` keeps increasing
    and ``time % SECONDS_PER_DAY`` stays its clock of day. The first step of every joined market is marked
    halted, so no order executes across a join (an overnight gap, or another ticker's prices); a position held
    across it is still marked at the new mid, so keep episodes short against the parts.

    :param markets: one or more timelines with the same levels and tick, on one device.
    :param name: the result's name (default: the parts' names joined by ``" + "``).
    :return: the joined timeline.
    :raises ValueError: naming the first part whose levels, tick or device differ.
    """
    markets = list(markets)
    if not markets:
        raise ValueError("markets is empty: nothing to join")
    first = markets[0]
    for k, market in enumerate(markets[1:], start=1):
        if market.num_levels != first.num_levels:
            raise ValueError(f"markets[{k}] ({market.name}) has {market.num_levels} levels, markets[0] "
                             f"{first.num_levels}: load every part with the same levels=")
        if not math.isclose(market.tick_size, first.tick_size, rel_tol=1e-9):
            raise ValueError(f"markets[{k}] ({market.name}) has tick_size={market.tick_size}, markets[0] "
                             f"{first.tick_size}")
        if market.device != first.device:
            raise ValueError(f"markets[{k}] is on {market.device}, markets[0] on {first.device}")
    if len(markets) == 1:
        return first if name is None else replace(first, name=name)
    times, halted = [first.time], [first.halted]
    end = float(first.time[-1])
    for market in markets[1:]:
        start = float(market.time[0])
        days = max(0, math.ceil((end - start) / SECONDS_PER_DAY + 1e-9)) if start <= end else 0
        shifted = market.time + days * SECONDS_PER_DAY
        times.append(shifted)
        halted.append(torch.cat([torch.ones_like(market.halted[:1]), market.halted[1:]]))
        end = float(shifted[-1])
    joined = {
        f.name: torch.cat([getattr(m, f.name) for m in markets])
        for f in fields(first)
        if isinstance(getattr(first, f.name), torch.Tensor)
    }
    joined.update(time=torch.cat(times), halted=torch.cat(halted))
    return replace(first, **joined, name=name or " + ".join(m.name for m in markets))


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    """Index of the first True entry of ``mask`` (row-major), as a tuple usable for indexing.

    :param mask: a boolean tensor with at least one True entry.
    :return: the multi-index of the first True entry.
    """
    return tuple(int(i) for i in torch.nonzero(mask)[0])
