"""The batched limit-order-book core: ``B`` books replaying one market timeline, stepped at once.

Timing of a step (book ``b`` at episode step ``t`` reads market row ``i = offset[b] + t``):

1. The agent has observed snapshot ``i``. Its action sets a target position
   ``direction * magnitude * max_position``.
2. Marketable orders (Market, IoC) execute immediately against snapshot ``i`` (taker fee). A Market or
   IoC action cancels any resting order first.
3. A LimitMaker action posts one post-only order priced off snapshot ``i``'s own-side touch
   (:func:`~foxenv.matching.maker_offset_tick`: the grid's offset by urgency; by default one tick behind,
   at, or one tick inside it); its
   queue ahead starts at the visible size at its price in snapshot ``i``. The same target again keeps the
   order and its queue while it is at or ahead of that price, and re-pegs it there (a new order, a new
   queue) once the touch has moved away from it: a maker order follows the book, it is never left behind.
4. The market advances to row ``i + 1``; the resting order meets that row's flow (``exec_*``,
   ``cancel_*`` around ``flow_ref_tick[i + 1]``): cancellations at its price first shrink the queue
   ahead by the ProbQueue split (visible size = size at its price in snapshot ``i``), then executions at
   its price, then any execution at a worse price (a trade through it), consume the queue ahead and fill
   it with the rest, never more than that volume (``fill_model="conservative"``, the default;
   ``"optimistic"`` fills it completely on any trade through). With ``order_latency=k`` a new order meets
   no flow for ``k`` steps and then joins the queue behind the size visible at its price (pending, its
   ``order_ahead`` state holds ``-(steps left + 1)``; observations and infos show 0). Fills are at its
   limit price with the maker fee (a rebate when negative).
5. If ``halted[i + 1]``, nothing executes in the step (orders still post; their queue does not move).
6. Equity is marked at the mid of snapshot ``i + 1``, which the new observation shows.

Assumptions: the agent's own fills never deplete the replayed book (the next snapshot is the recorded
one); a Market order walks all ``market.num_levels`` visible levels and what the book cannot fill is
dropped, not queued; fractional shares are allowed (Market slices of 1/3 and 2/3). A fill opens a trade
at the mid of snapshot ``i`` (``entry_mid``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from foxenv.accounting import TradeClose
from foxenv.compiled import AcceleratedStep
from foxenv.config import EnvConfig
from foxenv.data.market import MarketData
from foxenv.execution import EXECUTION_FEATURES, ExecutionTask
from foxenv.features import PORTFOLIO_FEATURES, market_feature_dim, portfolio_features
from foxenv.matching import meet_flow, meet_flow_conservative, walk_book
from foxenv.rewards import drawdown_hit, step_reward
from foxenv.spec import ACTION_NVEC, BRANCH_NAMES, MAGNITUDES, check_actions
from foxenv.state import BOOK_ROWS, COUNTER_ROWS, BookState
from foxenv.tables import MarketTables

#: The smallest positive double (subnormal): ``x.clamp_min(_SMALLEST_DOUBLE)`` is ``x`` for every ``x > 0``.
_SMALLEST_DOUBLE = 5e-324
#: What :meth:`BatchedLOB.step` returns: obs, reward, terminated, truncated, info.
StepOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]
#: What :meth:`BatchedLOB.step_autoreset` returns: obs, reward, terminated, truncated, info, final_obs.
AutoresetResult = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor
]


class _MarketRow(NamedTuple):
    """A step's row of the market table, ``[B]`` each (snapshot ``row`` and the next one; see
    :class:`~foxenv.tables.MarketTables`)."""

    mid_now: torch.Tensor
    best_bid: torch.Tensor
    best_ask: torch.Tensor
    wide: torch.Tensor
    trading: torch.Tensor  # 1.0 when the step trades, 0.0 when it is halted
    mid: torch.Tensor
    next_best_bid: torch.Tensor
    next_best_ask: torch.Tensor
    column_zero: torch.Tensor
    flow_bid: torch.Tensor
    flow_ask: torch.Tensor


class _ChildOrder(NamedTuple):
    """The order an action asks for, ``[B]`` float64 each: a row of the action table (or the execute
    task's child order)."""

    target: torch.Tensor
    slice_of_need: torch.Tensor
    limit_offset: torch.Tensor
    is_maker: torch.Tensor
    improve: torch.Tensor
    aggressive: torch.Tensor


class _Taken(NamedTuple):
    """The marketable part of a step: where it trades, the shares and notional (ticks) taken, and whether
    it reached its target."""

    marketable: torch.Tensor
    taken: torch.Tensor
    notional: torch.Tensor
    reached: torch.Tensor


class _Resting(NamedTuple):
    """The resting order after the action placed it, before it meets the flow (``pending`` and
    ``countdown`` only with ``order_latency``, else None)."""

    side: torch.Tensor
    tick: torch.Tensor
    target: torch.Tensor
    remaining: torch.Tensor
    visible: torch.Tensor
    ahead: torch.Tensor
    queue: torch.Tensor
    pending: torch.Tensor | None
    countdown: torch.Tensor | None


class BatchedLOB(AcceleratedStep):
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

    #: The action contract (:mod:`foxenv.spec`), kept here for callers that read it off the core (an
    #: instance holds its config's grid: ``ACTION_NVEC`` and ``MAGNITUDES`` of ``config.grid``).
    ACTION_NVEC = ACTION_NVEC
    BRANCH_NAMES = BRANCH_NAMES
    MAGNITUDES = MAGNITUDES

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
        if validate_actions is not None and not isinstance(validate_actions, bool):
            raise ValueError(f"validate_actions={validate_actions!r} must be a bool or None")
        self.validate_actions = self.device.type == "cpu" if validate_actions is None else validate_actions
        self.ACTION_NVEC = config.grid.nvec
        self.MAGNITUDES = config.grid.magnitudes
        self.n_market_features = market_feature_dim(config)
        self.observation_dim = self.n_market_features + len(PORTFOLIO_FEATURES)
        #: The per-market tables a step gathers from (:class:`~foxenv.tables.MarketTables`).
        self._tables = MarketTables.cached(self.market, config, self.device)
        #: The execute task's tables and step hooks (:mod:`foxenv.execution`); None on the trading task.
        self._execution = (ExecutionTask(self.market, config, self._tables, self.device)
                           if config.task == "execute" else None)
        if self._execution is not None:
            self.observation_dim += len(EXECUTION_FEATURES)

        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(int(seed))
        #: The per-book state, packed (:class:`BookState`): float64 rows ``BOOK_ROWS``, int64 rows
        #: ``COUNTER_ROWS``. A step replaces both with new tensors (earlier outputs stay unchanged).
        books = self.num_books
        self._books = torch.zeros(len(BOOK_ROWS), books, dtype=torch.float64, device=self.device)
        self._counters = torch.zeros(len(COUNTER_ROWS), books, dtype=torch.int64, device=self.device)
        self._init_acceleration()
        self.reset()

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
        self._reset_books(mask, self._draw_offsets())
        self._pin_state()
        state = BookState.unpack(self._books, self._counters)
        row = state.offset + state.step
        mid = self._tables.rows.index_select(0, row)[:, 0]
        features = self._tables.features.index_select(0, row)
        unrealized = state.ledger.unrealized(mid)
        return self._observe(state, features, mid, unrealized, state.order_tick * self._tables.tick)

    def _draw_offsets(self) -> torch.Tensor:
        """One draw of episode start offsets for every book from the env's generator (what a reset uses)."""
        high = self._tables.num_steps - self.config.episode_length
        return torch.randint(0, high, (self.num_books,), generator=self._generator, device=self.device)

    def _reset_books(self, mask: torch.Tensor, offsets: torch.Tensor) -> None:
        """Reset the state of the books in ``mask``: start ``offsets``, step 0, flat, no cash, no order
        (pure tensor ops: no host sync, capturable; new tensors, so earlier infos are not changed).

        :param mask: ``[B]`` bool.
        :param offsets: ``[B]`` int64 start offsets (only the masked books' are used).
        """
        self._books = self._books.masked_fill(mask, 0)
        offset = torch.where(mask, offsets, self._counters[0])  # step and trade_start go to 0
        self._counters = torch.cat([offset[None], self._counters[1:].masked_fill(mask, 0)])

    def _autoreset_books(
        self, done: torch.Tensor, offsets: torch.Tensor, final_obs: torch.Tensor
    ) -> torch.Tensor:
        """Reset the ``done`` books to ``offsets``; the observation is theirs after the reset and
        ``final_obs`` elsewhere (no host sync: capturable).

        A reset book's observation is its start row's market features and the constant portfolio
        features of a fresh episode (:class:`~foxenv.tables.MarketTables`), the same numbers
        :meth:`_observe` gives it.

        :param done: ``[B]`` bool, the books whose episode ended.
        :param offsets: ``[B]`` int64 start offsets of their next episodes.
        :param final_obs: ``[B, D]`` the observations the step produced.
        :return: ``[B, D]`` the observations to hand out.
        """
        self._reset_books(done, offsets)
        features = self._tables.features.index_select(0, self._counters[0])  # at the new offsets
        start = [features, self._tables.start_portfolio.expand(self.num_books, -1)]
        if self._execution is not None:
            start.append(self._execution.start_features(self._counters[0]))
        start = torch.cat(start, dim=1)
        return torch.where(done[:, None], start, final_obs)

    # ------------------------------------------------------------------ step

    def _check_action(self, action: Any) -> torch.Tensor:
        """Validate ``action`` (:func:`foxenv.spec.check_actions`; its range only with
        ``validate_actions``) and return it as ``[B, 4]`` int64 on the env's device."""
        if isinstance(action, np.ndarray):
            action = torch.from_numpy(action)
        if not isinstance(action, torch.Tensor):
            raise ValueError(f"action of type {type(action).__name__} must be a torch.Tensor")
        expected = (self.num_books, len(ACTION_NVEC))
        action = check_actions(action, expected, check_range=self.validate_actions, nvec=self.ACTION_NVEC)
        action = action.to(device=self.device, dtype=torch.int64)
        if self.validate_actions:
            steps = self._counters[COUNTER_ROWS.index("step")].cpu().numpy()
            if steps.max() >= self.config.episode_length:
                book = int(np.argmax(steps))
                raise ValueError(
                    f"book {book} has step={int(steps[book])} >= episode_length="
                    f"{self.config.episode_length}; reset it (reset(mask=done)) before stepping again"
                )
        return action

    def step(
        self, action: torch.Tensor
    ) -> StepOutputs:
        """Advance every book by one market step.

        :param action: ``[B, 4]`` integer tensor (direction, magnitude, order, urgency), any device.
        :return: ``(obs [B, D] float32, reward [B] float32, terminated [B] bool, truncated [B] bool, info)``;
            ``info`` maps names to ``[B]`` tensors (float64 money and prices, bool flags, int64 ``step``).
            ``mid``, ``best_bid``, ``best_ask``, ``equity`` are those of the new snapshot (the new obs);
            ``entry_mid`` is the closed trade's where ``trade_closed``, else the open trade's (0 when flat);
            ``fees`` are this step's; ``cash``, ``realized_pnl`` (net of all fees) and ``unrealized_pnl``
            (average entry price) satisfy ``equity = cash + position * mid = realized + unrealized``.
            No autoreset: reset finished books with ``reset(mask=terminated | truncated)``, or step with
            :meth:`step_autoreset`.
        """
        return self._run_step(self._check_action(action))

    def step_autoreset(
        self, action: torch.Tensor, host_sync: bool | None = None
    ) -> AutoresetResult:
        """Advance every book by one market step and reset the books whose episode ended in the same
        step (Gymnasium's same-step autoreset): :meth:`step` followed by ``reset(mask=terminated |
        truncated)``, with the observation of a finished book taken after its reset.

        With ``host_sync=False`` the reset is pure tensor ops fused into the step: :meth:`enable_compile`
        compiles them together and :meth:`enable_cuda_graph` captures them in one graph. The new episodes'
        start offsets are then drawn from the env's generator on every call, outside the compiled or
        captured part (one ``random_`` into the graph's static offsets buffer, which gives the same numbers
        as ``reset``'s ``randint``), so the results are those of ``step`` then ``reset(mask=done)`` on
        every call. With ``host_sync=True`` the host checks whether any book finished and resets (drawing
        offsets) only then, as a loop calling ``reset(mask=done)`` only ``if done.any()`` does; the two
        modes differ in how far the generator advances, so the same seed gives other episode starts.

        :param action: ``[B, 4]`` integer tensor (direction, magnitude, order, urgency), any device.
        :param host_sync: see above; ``None``: True on a CPU (where the sync is free and skipping idle
            resets saves work), False on an accelerator.
        :return: ``(obs, reward, terminated, truncated, info, final_obs)``: as :meth:`step`, except that
            ``obs`` is the reset observation of the finished books; ``info`` and ``final_obs`` (``[B, D]``
            float32, equal to ``obs`` where no episode ended) are those of the step before any reset.
        """
        action = self._check_action(action)
        if host_sync is None:
            host_sync = self.device.type == "cpu"
        if host_sync:
            final_obs, reward, terminated, truncated, info = self._run_step(action)
            done = terminated | truncated
            if not bool(done.any()):
                return final_obs, reward, terminated, truncated, info, final_obs
            obs = self._autoreset_books(done, self._draw_offsets(), final_obs)
            self._pin_state()
            return obs, reward, terminated, truncated, info, final_obs
        if self._autoreset_graph is None:
            return self._advance_autoreset_fn(action, self._draw_offsets())
        assert self._autoreset_outputs is not None
        high = self._tables.num_steps - self.config.episode_length
        self._graph_action.copy_(action)
        self._graph_offsets.random_(0, high, generator=self._generator)  # = _draw_offsets, in place
        self._autoreset_graph.replay()
        return self._autoreset_outputs.copies()

    def _advance_autoreset(
        self, action: torch.Tensor, offsets: torch.Tensor
    ) -> AutoresetResult:
        """:meth:`_advance`, then the reset of the books whose episode ended to ``offsets`` (no host
        sync: compiled and captured as one function).

        :return: ``(obs, reward, terminated, truncated, info, final_obs)`` as :meth:`step_autoreset`.
        """
        final_obs, reward, terminated, truncated, info = self._advance(action)
        obs = self._autoreset_books(terminated | truncated, offsets, final_obs)
        return obs, reward, terminated, truncated, info, final_obs

    def _advance(
        self, action: torch.Tensor
    ) -> StepOutputs:
        """The step itself, on a validated ``[B, 4]`` int64 action (no host sync: capturable).

        A CPU step is bound by per-op overhead, so it gathers precomputed rows
        (:class:`~foxenv.tables.MarketTables`) and uses few ops; every float expression is the same as in
        the plain formulas the comments give. The steps, in order: the action's order
        (:meth:`_child_order`), the marketable part (:meth:`_take`), the resting order (:meth:`_place_order`)
        meeting the next market step's flow (:meth:`_work_order`), the one fill booked (:meth:`_settle`),
        then the market advances (:meth:`_mark`).
        """
        state = BookState.unpack(self._books, self._counters)
        ledger = state.ledger
        row = state.offset + state.step
        # This step's row of the market table (snapshot ``row`` and the next one; see MarketTables).
        market = _MarketRow(*self._tables.rows.index_select(0, row).unbind(dim=1))
        parent = self._execution.parent(state.offset) if self._execution is not None else None
        child = self._child_order(action, state, parent)
        cash_before, position_before = ledger.cash, ledger.position
        need = child.target - ledger.position
        side = torch.sign(need)
        need = need.abs()
        buy = side > 0
        side_row = row * 2  # a book's rows in the side table: + 0 bids, + 1 asks
        taker = self._take(market, child, side_row, side, buy, need)
        order = self._place_order(state, market, child, side_row, side, buy, need)
        fill, maker_reached, alive = self._work_order(state, market, order)
        fees, closed = self._settle(state, market, child, side, taker, order, fill, maker_reached)
        if self._execution is not None:  # what is left at the window's end crosses the next snapshot
            fees = fees + self._execution.final_cross(state, row, market.mid, parent)
            alive = alive & (state.order_remaining > 0)
        return self._mark(state, row, market, fees, closed, alive, parent, cash_before, position_before)

    def _child_order(self, action: torch.Tensor, state: BookState, parent: Any) -> _ChildOrder:
        """The action's row of the action table (by joint code, d * 27 + m * 9 + o * 3 + u on the default
        grid); on the execute task the child order, as a target position (:mod:`foxenv.execution`)."""
        if self._execution is None:
            tables = self._tables
            return _ChildOrder(
                *tables.actions.index_select(0, (action * tables.action_code).sum(dim=1)).unbind(dim=1)
            )
        return _ChildOrder(*self._execution.child_orders(action, state, parent))

    def _take(
        self, market: _MarketRow, child: _ChildOrder, side_row: torch.Tensor, side: torch.Tensor,
        buy: torch.Tensor, need: torch.Tensor,
    ) -> _Taken:
        """Marketable orders: Market walks the book for a slice of the need, IoC takes it up to its limit
        (the opposite touch + side * offset, matching.ioc_limit_tick). Buys take asks, sells take bids."""
        tables = self._tables
        levels = tables.levels
        wanted = need * child.slice_of_need * market.trading
        marketable = wanted > 0
        limit = torch.addcmul(  # exact: int ticks
            torch.where(buy, market.best_ask, market.best_bid), side, child.limit_offset
        )
        opposite = tables.sides.index_select(0, side_row + buy)
        taken, notional, reachable = walk_book(
            opposite[:, :levels], opposite[:, levels:], side, wanted, limit
        )
        reached = marketable & (wanted == need) & (reachable >= wanted)
        return _Taken(marketable, taken, notional, reached)

    def _place_order(
        self, state: BookState, market: _MarketRow, child: _ChildOrder, side_row: torch.Tensor,
        side: torch.Tensor, buy: torch.Tensor, need: torch.Tensor,
    ) -> _Resting:
        """The resting order: kept (with its queue) on an unchanged LimitMaker target while it is at or
        ahead of where this urgency prices a new one, re-pegged there (a new order, a new queue) once the
        own touch moved away from it by more than the urgency's offset, replaced on a changed target, and
        cancelled by any other action. A new one is priced off the own touch (matching.limit_maker_tick)."""
        tables = self._tables
        levels = tables.levels
        latency = self.config.order_latency
        target = child.target
        is_maker = child.is_maker > 0
        maker_tick = torch.addcmul(
            torch.where(buy, market.best_bid, market.best_ask),
            side,
            torch.addcmul(child.improve, child.aggressive, market.wide),
        )
        behind = side * (maker_tick - state.order_tick) > 0  # a buy below / a sell above the new price
        if latency:  # an order in flight (order_ahead < 0) arrives at its price; re-pegged after
            behind = behind & (state.order_ahead >= 0)
        keep = is_maker & (state.order_target == target) & (state.order_side != 0) & ~behind
        post = is_maker & (side != 0) & ~keep
        order_side = torch.where(post, side, state.order_side * keep)
        order_tick = torch.where(post, maker_tick, state.order_tick)
        own = tables.sides.index_select(0, side_row + (order_side <= 0))  # resting buys queue at the bids
        elsewhere = own[:, :levels] != order_tick[:, None]
        visible = own[:, levels:].masked_fill(elsewhere, 0.0).sum(dim=1)  # = where(at its tick, size, 0)
        pending = countdown = None
        if latency:
            # A pending order holds -(steps until it rests + 1) in order_ahead; at -1 it rests now, behind the
            # size visible at its price in this snapshot, and meets this step's flow.
            ahead = torch.where(post, torch.full_like(visible, -1.0 - latency), state.order_ahead)
            pending = ahead < -1.5
            ahead = torch.where(ahead == -1.0, visible, ahead)
            countdown = ahead + 1.0
            queue = ahead.clamp_min(0.0)
        else:
            ahead = torch.where(post, visible, state.order_ahead)
            queue = ahead
        remaining = torch.where(post, need, state.order_remaining * keep)
        order_target = torch.where(post, target, state.order_target)
        return _Resting(
            order_side, order_tick, order_target, remaining, visible, ahead, queue, pending, countdown
        )

    def _work_order(
        self, state: BookState, market: _MarketRow, order: _Resting
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The resting order meets the flow of the next market step at its price (grid column, clamped to
        the grid); its state after that is written into ``state``.

        :return: ``(fill, maker_reached, alive)``, each ``[B]``.
        """
        cfg = self.config
        tables = self._tables
        width = tables.flow_width
        column = order.tick - market.column_zero
        clamped = column.clamp(0, width - 1)
        grid = (torch.where(order.side < 0, market.flow_ask, market.flow_bid) + clamped).to(torch.int64)
        executed, cancelled, through = tables.flow.index_select(0, grid).double().unbind(dim=1)
        at_price = column == clamped
        beyond_grid = order.side * (column - clamped) > 0  # the edge column lies at a worse price
        through = torch.where(beyond_grid, through + executed, through)
        if cfg.fill_model == "optimistic":
            fill, ahead_after = meet_flow(
                order.queue,
                order.remaining,
                order.visible,
                executed * at_price,  # exact: where(at_price, executed, 0) on finite share counts
                cancelled * at_price,
                through > 0,
                cfg.queue_power,
            )
        else:
            fill, ahead_after = meet_flow_conservative(
                order.queue,
                order.remaining,
                order.visible,
                executed * at_price,
                cancelled * at_price,
                through,
                cfg.queue_power,
            )
        trading = market.trading
        fill = fill * trading  # a halted step executes nothing and leaves the queue as it was
        ahead = torch.where(trading > 0, ahead_after, order.ahead)
        if cfg.order_latency:  # a pending order meets no flow; its wait counts down, halted or not
            fill = fill.masked_fill(order.pending, 0.0)
            ahead = torch.where(order.pending, order.countdown, ahead)
        left = order.remaining - fill
        maker_reached = (fill > 0) & (left <= 0)
        alive = left > 0
        still_resting = torch.sign(left)  # 1.0 while some of the order is left, else 0.0 (left >= 0)
        state.order_side = order.side * still_resting
        state.order_tick = order.tick * still_resting
        state.order_ahead = ahead * still_resting
        state.order_target = order.target * still_resting
        state.order_remaining = left
        return fill, maker_reached, alive

    def _settle(
        self, state: BookState, market: _MarketRow, child: _ChildOrder, side: torch.Tensor, taker: _Taken,
        order: _Resting, fill: torch.Tensor, maker_reached: torch.Tensor,
    ) -> tuple[torch.Tensor, TradeClose]:
        """One fill per book, either the marketable order's or the resting order's, booked in the ledger.
        Where nothing filled the notional is 0, so dividing by max(|quantity|, smallest double) gives the
        price 0.

        :return: ``(fees [B], closed)``: the step's fees and the ledger's closed-trade record.
        """
        tables = self._tables
        marketable = taker.marketable
        quantity = torch.where(marketable, side * taker.taken, order.side * fill)
        notional = torch.where(marketable, taker.notional, fill * order.tick) * tables.tick
        fees = torch.where(marketable, notional * tables.taker_rate, notional * tables.maker_rate)
        price = notional / quantity.abs().clamp_min(_SMALLEST_DOUBLE)
        reached = torch.where(marketable, taker.reached, maker_reached)
        closed = state.ledger.apply_fill(
            quantity, price, fees, market.mid_now, state.step, child.target, reached
        )
        return fees, closed

    def _mark(
        self, state: BookState, row: torch.Tensor, market: _MarketRow, fees: torch.Tensor, closed: TradeClose,
        alive: torch.Tensor, parent: Any, cash_before: torch.Tensor, position_before: torch.Tensor,
    ) -> StepOutputs:
        """Advance the market, mark to market, reward; observe, pack the state and return the step's
        outputs (``cash_before``, ``position_before``: the ledger's before the fill, for the execute task's
        reward)."""
        cfg = self.config
        tables = self._tables
        ledger = state.ledger
        mid = market.mid
        state.step = state.step + 1
        equity = ledger.equity(mid)
        reward = step_reward(state.equity, equity, ledger.position, cfg)
        state.equity = equity
        state.peak_equity = torch.maximum(state.peak_equity, equity)
        terminated = drawdown_hit(state.peak_equity, equity, cfg)
        truncated = state.step >= cfg.episode_length
        if self._execution is not None:
            reward, terminated = self._execution.outcome(state, cash_before, position_before, parent)
            truncated = truncated & ~terminated
        unrealized = ledger.unrealized(mid)
        order_price = state.order_tick * tables.tick
        obs = self._observe(state, tables.next_features.index_select(0, row), mid, unrealized, order_price,
                            parent)
        self._books, self._counters = state.pack()

        info = {
            "mid": mid,
            "best_bid": market.next_best_bid,
            "best_ask": market.next_best_ask,
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
            "order_queue_ahead": state.order_ahead.clamp_min(0.0) if cfg.order_latency else state.order_ahead,
            "order_remaining": state.order_remaining,
            "step": state.step,
        }
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ observation

    def _observe(
        self,
        state: BookState,
        features: torch.Tensor,
        mid: torch.Tensor,
        unrealized: torch.Tensor,
        order_price: torch.Tensor,
        parent: Any = None,
    ) -> torch.Tensor:
        """Observation ``[B, D]`` of every book in ``state``: its market ``features`` row, then its
        portfolio features (and on the execute task its execution features; ``parent``: the books' parent
        orders when the caller holds them)."""
        ledger = state.ledger
        time_in_trade = (state.step - ledger.trade_start) * (ledger.position != 0)
        portfolio = portfolio_features(
            ledger.position,
            unrealized,
            mid,
            state.order_side,
            order_price,
            state.order_ahead.clamp_min(0.0) if self.config.order_latency else state.order_ahead,  # 0 pending
            state.order_remaining,
            time_in_trade.double(),
            state.step.double(),
            self.config,
            self._tables.tick,
            self._tables.portfolio_affine,
        )
        if self._execution is not None:
            return torch.cat([features, portfolio, self._execution.features(state, mid, parent)], dim=1)
        return torch.cat([features, portfolio], dim=1)

    # ------------------------------------------------------------------ checkpointing

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """The packed per-book state tensors, ``books`` and ``counters`` (not copies)."""
        return {"books": self._books, "counters": self._counters}

    def _set_state_tensors(self, state: dict[str, torch.Tensor]) -> None:
        """Point the packed per-book state at ``state``'s tensors (no copies)."""
        self._books = state["books"]
        self._counters = state["counters"]

    def _named_state(self) -> dict[str, torch.Tensor]:
        """The per-book state by its ``state_dict`` names: ``[B]`` rows of the packed tensors (views)."""
        named = dict(zip(COUNTER_ROWS[:2], self._counters[:2].unbind(0), strict=True))  # offset, step
        named.update(zip(BOOK_ROWS, self._books.unbind(0), strict=True))
        named[COUNTER_ROWS[2]] = self._counters[2]  # ledger.trade_start, after the other ledger fields
        return named

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume stepping exactly where this env is.

        :return: a dict of cloned ``[B]`` tensors plus the generator state (``"generator"``).
        """
        state: dict[str, Any] = {key: value.clone() for key, value in self._named_state().items()}
        state["generator"] = self._generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (taken from an env with the same market, config and ``num_books``).

        :param state: the dict.
        :raises ValueError: when its keys, or a tensor's type, shape or dtype, differ from this env's, or an
            offset lies outside ``[0, num_steps - episode_length)``.
        """
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(f"state keys {sorted(set(state) ^ expected)} differ from this env's state")
        current = self._named_state()
        for key, value in current.items():
            if not isinstance(state[key], torch.Tensor):
                raise ValueError(f"state[{key!r}] of type {type(state[key]).__name__} must be a torch.Tensor")
            if tuple(state[key].shape) != (self.num_books,):
                raise ValueError(
                    f"state[{key!r}] shape {tuple(state[key].shape)} must be ({self.num_books},)"
                )
            if state[key].dtype != value.dtype:  # a cast would silently truncate (e.g. float offsets)
                raise ValueError(f"state[{key!r}] dtype {state[key].dtype} must be {value.dtype}")
        high = self._tables.num_steps - self.config.episode_length
        offset = state["offset"]
        if bool(((offset < 0) | (offset >= high)).any()):  # loading is no step: a host sync is fine
            low, top = int(offset.min()), int(offset.max())
            raise ValueError(f"state['offset'] values in [{low}, {top}] must lie in [0, {high})")
        self._generator.set_state(state["generator"])
        self._books = torch.stack([state[key].to(device=self.device) for key in BOOK_ROWS])
        self._counters = torch.stack([state[key].to(device=self.device) for key in COUNTER_ROWS])
        self._pin_state()
