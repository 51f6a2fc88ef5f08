"""The batched limit-order-book core: ``B`` books replaying one market timeline, stepped at once.

Timing of a step (book ``b`` at episode step ``t`` reads market row ``i = offset[b] + t``):

1. The agent has observed snapshot ``i``. Its action sets a target position
   ``direction * magnitude * max_position``.
2. Marketable orders (Market, IoC) execute immediately against snapshot ``i`` (taker fee). A Market or
   IoC action cancels any resting order first.
3. A LimitMaker action posts (or keeps, when its target is unchanged) one post-only order priced off
   snapshot ``i``; its queue ahead starts at the visible size at its price in snapshot ``i``.
4. The market advances to row ``i + 1``; the resting order meets that row's flow (``exec_*``,
   ``cancel_*`` around ``flow_ref_tick[i + 1]``): cancellations at its price first shrink the queue
   ahead by the ProbQueue split (visible size = size at its price in snapshot ``i``), then executions at
   its price consume the queue ahead and fill it; any execution at a worse price (a trade through it)
   fills it completely. Fills are at its limit price with the maker fee (a rebate when negative).
5. If ``halted[i + 1]``, nothing executes in the step (orders still post; their queue does not move).
6. Equity is marked at the mid of snapshot ``i + 1``, which the new observation shows.

Assumptions: the agent's own fills never deplete the replayed book (the next snapshot is the recorded
one); a Market order walks all ``market.num_levels`` visible levels and what the book cannot fill is
dropped, not queued; fractional shares are allowed (Market slices of 1/3 and 2/3). A fill opens a trade
at the mid of snapshot ``i`` (``entry_mid``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from foxenv.accounting import Ledger
from foxenv.config import EnvConfig
from foxenv.data.market import FLOW_WIDTH, MarketData
from foxenv.features import PORTFOLIO_FEATURES, market_feature_dim, market_features, portfolio_features
from foxenv.matching import (
    IOC_OFFSETS,
    MARKET_SLICES,
    NO_LIMIT,
    ioc_limit_tick,
    limit_maker_tick,
    meet_flow,
    walk_book,
)
from foxenv.rewards import drawdown_hit, step_reward

#: Names of the per-book resting order state tensors (for ``state_dict``).
_ORDER_FIELDS = ("order_side", "order_tick", "order_ahead", "order_remaining", "order_target")


class BatchedLOB:
    """``num_books`` trading books on one market timeline, stepped together on one device.

    :param market: the timeline every book replays (moved to ``device``).
    :param num_books: number of books ``B``; >= 1.
    :param config: environment settings.
    :param device: device of all state; ``None`` = the market's device.
    :param seed: seed of the env's ``torch.Generator`` (time offsets at reset); ``None`` = random.
    :param validate_actions: check action values are in range in :meth:`step` (and that no book steps
        past its episode end). This needs a host sync, so it defaults to True on CPU and False on CUDA,
        where out-of-range actions are undefined behaviour. Shape and dtype are always checked.
    """

    ACTION_NVEC = (3, 3, 3, 3)
    BRANCH_NAMES = ("direction", "magnitude", "order", "urgency")
    MAGNITUDES = (0.25, 0.5, 1.0)

    def __init__(
        self,
        market: MarketData,
        num_books: int,
        config: EnvConfig = EnvConfig(),  # noqa: B008 (frozen dataclass, immutable default)
        device: str | torch.device | None = None,
        seed: int | None = None,
        validate_actions: bool | None = None,
    ) -> None:
        if int(num_books) != num_books or num_books < 1:
            raise ValueError(f"num_books={num_books} must be an integer >= 1")
        if config.levels > market.num_levels:
            raise ValueError(f"levels={config.levels} must be <= market.num_levels={market.num_levels}")
        if market.num_steps < config.episode_length + 1:
            raise ValueError(
                f"market {market.name!r} has num_steps={market.num_steps}, too short for "
                f"episode_length={config.episode_length} (needs at least {config.episode_length + 1})"
            )
        if not market.tick_size > 0:
            raise ValueError(f"tick_size={market.tick_size} must be > 0")
        self.device = torch.device(device) if device is not None else market.device
        self.market = market.to(self.device)
        self.config = config
        self.num_books = int(num_books)
        self.validate_actions = self.device.type == "cpu" if validate_actions is None else validate_actions
        self.n_market_features = market_feature_dim(config)
        self.observation_dim = self.n_market_features + len(PORTFOLIO_FEATURES)
        self._precompute(self.market)

        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(int(seed))
        zeros = torch.zeros(self.num_books, dtype=torch.float64, device=self.device)
        self._offset = torch.zeros(self.num_books, dtype=torch.int64, device=self.device)
        self._step = torch.zeros_like(self._offset)
        self._ledger = Ledger.zeros(self.num_books, self.device)
        self._equity = zeros.clone()
        self._peak_equity = zeros.clone()
        self._order_side = zeros.clone()
        self._order_tick = zeros.clone()
        self._order_ahead = zeros.clone()
        self._order_remaining = zeros.clone()
        self._order_target = zeros.clone()
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_state: dict[str, torch.Tensor] = {}
        self._graph_outputs: tuple = ()
        self._graph_action = torch.empty(0)
        self.reset()

    # ------------------------------------------------------------------ setup

    def _precompute(self, market: MarketData) -> None:
        """Per-market-step tables the step gathers from (one gather per table per step)."""
        tick = market.tick_size
        width = FLOW_WIDTH
        levels = market.num_levels
        self._tick = float(tick)
        self._num_steps = market.num_steps
        self._levels = levels
        self._flow_width = width
        # [T, 4L] float64: bid ticks, ask ticks, bid sizes, ask sizes (ticks are exact integers in float64).
        self._book = torch.cat(
            [
                torch.round(market.bid_price.double() / tick),
                torch.round(market.ask_price.double() / tick),
                market.bid_size.double(),
                market.ask_size.double(),
            ],
            dim=1,
        ).contiguous()
        best_bid = market.bid_price[:, 0].double()
        best_ask = market.ask_price[:, 0].double()
        # [T, 5] float64: mid, best bid, best ask, trading (1, or 0 when halted), flow grid reference tick.
        self._scalars = torch.stack(
            [
                (best_bid + best_ask) / 2,
                best_bid,
                best_ask,
                (~market.halted).double(),
                market.flow_ref_tick.double(),
            ],
            dim=1,
        ).contiguous()
        # Flow at a price, [T, 2 sides, W columns, 3] float32 (share counts): executed, cancelled, traded
        # through. Side 0 = bid grids (met by resting buys), 1 = ask grids (resting sells). Traded through a
        # buy at column j: executions below it, sum(exec_bid[:j]); a sell: above it, sum(exec_ask[j+1:]).
        exec_bid, exec_ask = market.exec_bid.double(), market.exec_ask.double()
        no_volume = torch.zeros_like(exec_bid[:, :1])
        below = torch.cat([no_volume, torch.cumsum(exec_bid, dim=1)[:, :-1]], dim=1)
        above = torch.cat(
            [torch.flip(torch.cumsum(torch.flip(exec_ask, [1]), dim=1), [1])[:, 1:], no_volume], dim=1
        )
        flow = torch.stack(
            [
                torch.stack([exec_bid, market.cancel_bid.double(), below], dim=2),
                torch.stack([exec_ask, market.cancel_ask.double(), above], dim=2),
            ],
            dim=1,
        )
        self._flow = flow.reshape(-1, 3).to(torch.float32).contiguous()
        self._features = market_features(market, self.config)
        self._targets = torch.tensor(
            [(d - 1) * m * self.config.max_position for d in range(3) for m in self.MAGNITUDES],
            dtype=torch.float64,
            device=self.device,
        )
        # By order * 3 + urgency: the slice of the need a marketable order works (0 for LimitMaker) and
        # its limit offset beyond the opposite touch in ticks.
        self._slices = torch.tensor(
            [*MARKET_SLICES, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64, device=self.device
        )
        self._limit_offsets = torch.tensor(
            [NO_LIMIT] * 3 + [0.0] * 3 + [float(o) for o in IOC_OFFSETS],
            dtype=torch.float64,
            device=self.device,
        )
        self._nvec = np.array(self.ACTION_NVEC)
        self._taker_rate = torch.tensor(
            self.config.taker_fee_bps * 1e-4, dtype=torch.float64, device=self.device
        )
        self._maker_rate = torch.tensor(
            self.config.maker_fee_bps * 1e-4, dtype=torch.float64, device=self.device
        )

    # ------------------------------------------------------------------ reset

    def reset(self, seed: int | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Start new episodes: a random time offset, flat, no cash, no order.

        :param seed: re-seed the env's generator first (``None``: continue its stream).
        :param mask: ``[B]`` bool, reset only these books; ``None`` = all. Offsets are drawn for every
            book either way, so the random stream does not depend on the mask.
        :return: ``[B, D]`` float32 observations of all books.
        """
        if seed is not None:
            self._generator.manual_seed(int(seed))
        if mask is None:
            mask = torch.ones(self.num_books, dtype=torch.bool, device=self.device)
        else:
            mask = torch.as_tensor(mask)
            if mask.shape != (self.num_books,) or mask.dtype != torch.bool:
                raise ValueError(
                    f"mask shape {tuple(mask.shape)} dtype {mask.dtype} must be ({self.num_books},) bool"
                )
            mask = mask.to(self.device)
        high = self._num_steps - self.config.episode_length
        offsets = torch.randint(0, high, (self.num_books,), generator=self._generator, device=self.device)
        self._offset = torch.where(mask, offsets, self._offset)
        self._step = self._step.masked_fill(mask, 0)
        self._ledger.reset(mask)
        for name in ("_equity", "_peak_equity", *(f"_{f}" for f in _ORDER_FIELDS)):
            setattr(self, name, getattr(self, name).masked_fill(mask, 0))
        self._pin_state()
        row = self._offset + self._step
        mid = self._scalars.index_select(0, row)[:, 0]
        return self._observe(row, mid, self._ledger.unrealized(mid), self._order_tick * self._tick)

    # ------------------------------------------------------------------ step

    def _check_action(self, action: Any) -> torch.Tensor:
        """Validate ``action`` and return it as ``[B, 4]`` int64 on the env's device."""
        if isinstance(action, np.ndarray):
            action = torch.from_numpy(action)
        if not isinstance(action, torch.Tensor):
            raise ValueError(f"action of type {type(action).__name__} must be a torch.Tensor")
        expected = (self.num_books, len(self.ACTION_NVEC))
        if tuple(action.shape) != expected:
            raise ValueError(f"action shape {tuple(action.shape)} must be {expected}")
        if action.dtype.is_floating_point or action.dtype.is_complex or action.dtype == torch.bool:
            raise ValueError(f"action dtype {action.dtype} must be an integer dtype")
        action = action.to(device=self.device, dtype=torch.int64)
        if self.validate_actions:
            values = action.cpu().numpy()
            bad = (values < 0) | (values >= self._nvec)
            if bad.any():
                book, branch = (int(v) for v in np.argwhere(bad)[0])
                raise ValueError(
                    f"action[{book}, {branch}]={int(values[book, branch])} out of range for branch "
                    f"{self.BRANCH_NAMES[branch]!r} (0..{self.ACTION_NVEC[branch] - 1})"
                )
            steps = self._step.cpu().numpy()
            if steps.max() >= self.config.episode_length:
                book = int(np.argmax(steps))
                raise ValueError(
                    f"book {book} has step={int(steps[book])} >= episode_length="
                    f"{self.config.episode_length}; reset it (reset(mask=done)) before stepping again"
                )
        return action

    def step(
        self, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Advance every book by one market step.

        :param action: ``[B, 4]`` integer tensor (direction, magnitude, order, urgency), any device.
        :return: ``(obs [B, D] float32, reward [B] float32, terminated [B] bool, truncated [B] bool, info)``;
            ``info`` maps names to ``[B]`` tensors (float64 money and prices, bool flags, int64 ``step``).
            ``mid``, ``best_bid``, ``best_ask``, ``equity`` are those of the new snapshot (the new obs);
            ``entry_mid`` is the closed trade's where ``trade_closed``, else the open trade's (0 when flat);
            ``fees`` are this step's; ``cash``, ``realized_pnl`` (net of all fees) and ``unrealized_pnl``
            (average entry price) satisfy ``equity = cash + position * mid = realized + unrealized``.
            No autoreset: reset finished books with ``reset(mask=terminated | truncated)``.
        """
        action = self._check_action(action)
        if self._graph is None:
            return self._advance(action)
        self._graph_action.copy_(action)
        self._graph.replay()
        obs, reward, terminated, truncated, info = self._graph_outputs
        return (
            obs.clone(),
            reward.clone(),
            terminated.clone(),
            truncated.clone(),
            {key: value.clone() for key, value in info.items()},
        )

    def _advance(
        self, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The step itself, on a validated ``[B, 4]`` int64 action (no host sync: capturable)."""
        cfg = self.config
        ledger = self._ledger
        levels = self._levels
        row = self._offset + self._step
        next_row = (row + 1).clamp_max(self._num_steps - 1)
        book = self._book.index_select(0, row)
        now = self._scalars.index_select(0, row)
        after = self._scalars.index_select(0, next_row)
        bid_ticks, ask_ticks = book[:, :levels], book[:, levels : 2 * levels]
        bid_sizes, ask_sizes = book[:, 2 * levels : 3 * levels], book[:, 3 * levels :]
        best_bid, best_ask = bid_ticks[:, 0], ask_ticks[:, 0]
        trading = after[:, 3]  # 1.0 when the step trades, 0.0 when it is halted

        direction, magnitude, order_type, urgency = action.unbind(dim=1)
        how = order_type * 3 + urgency
        target = self._targets.index_select(0, direction * 3 + magnitude)
        need = target - ledger.position
        side = torch.sign(need)
        need = need.abs()
        buy = (side > 0)[:, None]

        # Marketable orders: Market walks the book for a slice of the need, IoC takes it up to its limit.
        wanted = need * self._slices.index_select(0, how) * trading
        marketable = wanted > 0
        limit = ioc_limit_tick(best_bid, best_ask, side, self._limit_offsets.index_select(0, how))
        taken, notional, reachable = walk_book(
            torch.where(buy, ask_ticks, bid_ticks),
            torch.where(buy, ask_sizes, bid_sizes),
            side,
            wanted,
            limit,
        )
        taker_reached = marketable & (wanted == need) & (reachable >= wanted)

        # The resting order: kept on an unchanged LimitMaker target, replaced on a changed one, and
        # cancelled by any other action.
        is_maker = order_type == 1
        keep = is_maker & (self._order_target == target) & (self._order_side != 0)
        post = is_maker & ~keep & (side != 0)
        order_side = torch.where(post, side, torch.where(keep, self._order_side, 0.0))
        order_tick = torch.where(post, limit_maker_tick(best_bid, best_ask, side, urgency), self._order_tick)
        own_buy = (order_side > 0)[:, None]
        own_ticks = torch.where(own_buy, bid_ticks, ask_ticks)
        own_sizes = torch.where(own_buy, bid_sizes, ask_sizes)
        visible = torch.where(own_ticks == order_tick[:, None], own_sizes, 0.0).sum(dim=1)
        ahead = torch.where(post, visible, self._order_ahead)
        remaining = torch.where(post, need, torch.where(keep, self._order_remaining, 0.0))
        order_target = torch.where(post, target, self._order_target)

        # It meets the flow of the next market step at its price (grid column, clamped to the grid).
        width = self._flow_width
        column = order_tick - after[:, 4] + width // 2
        clamped = column.clamp(0, width - 1)
        grid = next_row * (2 * width) + torch.where(order_side < 0, clamped + width, clamped).to(torch.int64)
        executed, cancelled, through = self._flow.index_select(0, grid).double().unbind(dim=1)
        at_price = column == clamped
        beyond_grid = order_side * (column - clamped) > 0  # the edge column lies at a worse price
        traded_through = torch.where(beyond_grid, through + executed, through) > 0
        fill, ahead_after = meet_flow(
            ahead,
            remaining,
            visible,
            torch.where(at_price, executed, 0.0),
            torch.where(at_price, cancelled, 0.0),
            traded_through,
            cfg.queue_power,
        )
        fill = fill * trading  # a halted step executes nothing and leaves the queue as it was
        ahead = torch.where(trading > 0, ahead_after, ahead)
        left = remaining - fill
        maker_reached = (fill > 0) & (left <= 0)
        alive = left > 0
        still_resting = torch.sign(left)  # 1.0 while some of the order is left, else 0.0 (left >= 0)
        self._order_side = order_side * still_resting
        self._order_tick = order_tick * still_resting
        self._order_ahead = ahead * still_resting
        self._order_target = order_target * still_resting
        self._order_remaining = left

        # One fill per book: either the marketable order's or the resting order's.
        quantity = torch.where(marketable, side * taken, order_side * fill)
        notional = torch.where(marketable, notional, fill * order_tick) * self._tick
        fees = notional * torch.where(marketable, self._taker_rate, self._maker_rate)
        price = notional / torch.where(quantity == 0, 1.0, quantity.abs())
        reached = torch.where(marketable, taker_reached, maker_reached)
        closed = ledger.apply_fill(quantity, price, fees, now[:, 0], self._step, target, reached)

        # Advance the market, mark to market, reward.
        self._step = self._step + 1
        mid = after[:, 0]
        equity = ledger.equity(mid)
        reward = step_reward(self._equity, equity, ledger.position, cfg)
        self._equity = equity
        self._peak_equity = torch.maximum(self._peak_equity, equity)
        terminated = drawdown_hit(self._peak_equity, equity, cfg)
        truncated = self._step >= cfg.episode_length
        unrealized = ledger.unrealized(mid)
        order_price = self._order_tick * self._tick
        obs = self._observe(next_row, mid, unrealized, order_price)

        info = {
            "mid": mid,
            "best_bid": after[:, 1],
            "best_ask": after[:, 2],
            "position": ledger.position,
            "trade_closed": closed.closed,
            "trade_pnl": closed.pnl,
            "trade_lots": closed.lots,
            "entry_mid": torch.where(closed.closed, closed.entry_mid, ledger.entry_mid),
            "equity": equity,
            "fees": fees,
            "cash": ledger.cash,
            "realized_pnl": ledger.realized,
            "unrealized_pnl": unrealized,
            "order_active": alive,
            "order_price": order_price,
            "order_queue_ahead": self._order_ahead,
            "order_remaining": self._order_remaining,
            "step": self._step,
        }
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ observation

    def _observe(
        self, row: torch.Tensor, mid: torch.Tensor, unrealized: torch.Tensor, order_price: torch.Tensor
    ) -> torch.Tensor:
        """Observation ``[B, D]`` of every book at market rows ``row`` (market features, then portfolio)."""
        ledger = self._ledger
        time_in_trade = (self._step - ledger.trade_start) * (ledger.position != 0)
        portfolio = portfolio_features(
            ledger.position,
            unrealized,
            mid,
            self._order_side,
            order_price,
            self._order_ahead,
            self._order_remaining,
            time_in_trade.double(),
            self._step.double(),
            self.config,
            self._tick,
        )
        return torch.cat([self._features.index_select(0, row), portfolio], dim=1)

    # ------------------------------------------------------------------ checkpointing

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """The per-book state tensors by their ``state_dict`` names (not copies)."""
        state = {
            "offset": self._offset,
            "step": self._step,
            "equity": self._equity,
            "peak_equity": self._peak_equity,
        }
        for name in _ORDER_FIELDS:
            state[name] = getattr(self, f"_{name}")
        for name, value in vars(self._ledger).items():
            state[f"ledger.{name}"] = value
        return state

    def _set_state_tensors(self, state: dict[str, torch.Tensor]) -> None:
        """Point the per-book state at ``state``'s tensors (no copies)."""
        for key, value in state.items():
            if key.startswith("ledger."):
                setattr(self._ledger, key.removeprefix("ledger."), value)
            else:
                setattr(self, f"_{key}", value)

    def _pin_state(self) -> None:
        """With a CUDA graph, copy the state into the graph's static input tensors and point at them."""
        if self._graph is None:
            return
        for key, value in self._state_tensors().items():
            self._graph_state[key].copy_(value)
        self._set_state_tensors(self._graph_state)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume stepping exactly where this env is.

        :return: a dict of cloned ``[B]`` tensors plus the generator state (``"generator"``).
        """
        state: dict[str, Any] = {key: value.clone() for key, value in self._state_tensors().items()}
        state["generator"] = self._generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (taken from an env with the same market, config and ``num_books``).

        :param state: the dict.
        """
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(f"state keys {sorted(set(state) ^ expected)} differ from this env's state")
        current = self._state_tensors()
        for key in current:
            if tuple(state[key].shape) != (self.num_books,):
                raise ValueError(
                    f"state[{key!r}] shape {tuple(state[key].shape)} must be ({self.num_books},)"
                )
        self._generator.set_state(state["generator"])
        self._set_state_tensors(
            {
                key: state[key].to(device=self.device, dtype=value.dtype).clone()
                for key, value in current.items()
            }
        )
        self._pin_state()

    # ------------------------------------------------------------------ CUDA graph

    def enable_cuda_graph(self) -> None:
        """Capture :meth:`step` in a CUDA graph, so each later step is one graph launch (CUDA only).

        The environment's state is unchanged by the capture. After it, ``step`` copies the action into a
        static buffer, replays the graph and returns clones of the outputs (so they stay valid); ``reset``
        and ``load_state_dict`` copy the new state into the graph's static tensors. Action validation
        still follows ``validate_actions``.

        :raises ValueError: when the env is not on a CUDA device.
        """
        if self.device.type != "cuda":
            raise ValueError(f"device={self.device}: enable_cuda_graph needs a CUDA device")
        if self._graph is not None:
            return
        saved = self.state_dict()
        self._graph_action = torch.ones(
            self.num_books, len(self.ACTION_NVEC), dtype=torch.int64, device=self.device
        )
        side_stream = torch.cuda.Stream(device=self.device)
        side_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side_stream):
            for _ in range(3):  # warm up caches and allocator outside the capture
                self._advance(self._graph_action)
        torch.cuda.current_stream(self.device).wait_stream(side_stream)
        self.load_state_dict(saved)
        static_state = self._state_tensors()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self._advance(self._graph_action)
            for key, value in self._state_tensors().items():
                static_state[key].copy_(value)
        self._set_state_tensors(static_state)
        self._graph_state = static_state
        self._graph_outputs = outputs
        self._graph = graph
