"""The lean one-book step: :meth:`BatchedLOB._advance <foxenv.core.BatchedLOB._advance>` at ``B = 1`` on
Python floats, for :class:`~foxenv.gym_env.LOBEnv`'s default (uncompiled) face.

At one book the eager core's cost is PyTorch's per-op dispatch (~200 tiny tensor ops a step), not its
arithmetic. :class:`SingleBook` follows the core's step line by line on Python floats, gathering the same
per-market tables (:class:`~foxenv.tables.MarketTables`, read once as numpy), so every value equals the
core's bit for bit: IEEE ``+ - * /``, ``min`` and ``max`` round alike on both. What IEEE leaves to the
implementation is left to PyTorch itself, on tiny tensors: the two sums over the levels of
:func:`~foxenv.matching.walk_book` when a walk reaches more than one level (the result then depends on the
summation order) and the ProbQueue powers of a resting order (PyTorch special-cases some exponents). A sum
with one non-zero term (a walk within one level, the visible size at a price) is exact in any order, and
zero to a positive power is zero: those stay on Python floats.

The core stays the reference: the state lives here while the lean step steps, :meth:`SingleBook.store`
writes it into the core (through its ``state_dict``), and a step first takes the core's state again
(:meth:`SingleBook.load`) when the core was stepped, reset or loaded since. When the core gains
config fields or state this module does not know, :func:`lean_path_problem` says so and the env steps
the core instead (``tests/foxenv/test_single_book.py`` then fails, naming what to port).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.features import portfolio_features
from foxenv.matching import walk_book
from foxenv.spec import INFO_KEYS

#: The :class:`EnvConfig` fields the lean step implements; a new field disables it until ported.
KNOWN_CONFIG_FIELDS = (
    "max_position",
    "episode_length",
    "levels",
    "maker_fee_bps",
    "taker_fee_bps",
    "reward_scale",
    "inventory_penalty",
    "max_drawdown",
    "queue_power",
    "return_horizons",
    "vol_window",
    "flow_window",
    "fill_model",
    "order_latency",
    "action_grid",
    "task",  # the lean step is the trading task's (lean_path_problem refuses the execute task)
    "exec_side",
    "exec_quantity",
    "exec_quantity_unit",
    "exec_child_sizes",
)
#: The core's ``state_dict`` keys the lean step carries (its per-book state, plus the generator).
KNOWN_STATE_KEYS = (
    "offset",
    "step",
    "equity",
    "peak_equity",
    "order_side",
    "order_tick",
    "order_ahead",
    "order_remaining",
    "order_target",
    "ledger.cash",
    "ledger.position",
    "ledger.avg_price",
    "ledger.realized",
    "ledger.trade_realized",
    "ledger.trade_fees",
    "ledger.entry_mid",
    "ledger.trade_start",
    "generator",
)
#: The smallest positive double, as ``core._SMALLEST_DOUBLE``.
_SMALLEST_DOUBLE = 5e-324


def _powers(queue: float, behind: float, exponent: float) -> tuple[float, float]:
    """``(queue ** exponent, behind ** exponent)`` as ``torch.pow`` gives them (``exponent``:
    ``EnvConfig.queue_power``, >= 0); two zeros with a positive exponent are zeros in any implementation,
    given without a tensor (every step without a resting order)."""
    if queue == 0.0 and behind == 0.0 and exponent > 0:
        return 0.0, 0.0
    ahead, rest = torch.tensor([queue, behind], dtype=torch.float64).pow_(exponent).tolist()
    return ahead, rest


def _sign(x: float) -> float:
    """``torch.sign`` of a double (0.0 for both zeros)."""
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def lean_path_problem(core: BatchedLOB) -> str | None:
    """Why :class:`SingleBook` cannot step ``core`` exactly, or None when it can.

    :param core: a one-book CPU core.
    :return: a reason, or None.
    """
    if type(core) is not BatchedLOB:
        return f"core type {type(core).__name__} is not BatchedLOB"
    if core.num_books != 1 or core.device.type != "cpu":
        return f"num_books={core.num_books} device={core.device}: the lean step is one book on the CPU"
    fields = tuple(field.name for field in dataclasses.fields(EnvConfig))
    if fields != KNOWN_CONFIG_FIELDS:
        return f"EnvConfig fields {sorted(set(fields) ^ set(KNOWN_CONFIG_FIELDS))} are new to the lean step"
    if core.config.task != "trade":
        return f"task={core.config.task!r}: the lean step is the trading task's"
    keys = tuple(core.state_dict())
    if set(keys) != set(KNOWN_STATE_KEYS):
        return f"core state keys {sorted(set(keys) ^ set(KNOWN_STATE_KEYS))} are new to the lean step"
    scale, bias = core._tables.portfolio_affine
    if bias[:-1].any() or bias[-1] != 1.0:
        return "the portfolio feature bias is not (0, ..., 0, 1)"
    return None


class SingleBook:
    """The state and step of a one-book core on Python floats (see the module docstring).

    :param core: a one-book CPU :class:`BatchedLOB`, for which :func:`lean_path_problem` is None. Its
        tables are read once; its state is read by :meth:`load` and written by :meth:`store`.
    """

    def __init__(self, core: BatchedLOB) -> None:
        problem = lean_path_problem(core)
        if problem is not None:
            raise ValueError(f"core cannot be stepped by SingleBook: {problem}")
        self.core = core
        self.config: EnvConfig = core.config
        tables = core._tables
        self._levels = tables.levels
        self._rows = tables.rows.numpy()
        self._sides = tables.sides.numpy()
        self._flow = tables.flow.double().numpy()
        self._next_features = tables.next_features.numpy()
        self._actions = tables.actions.tolist()
        self._action_code = tables.action_code.tolist()
        self._flow_width = tables.flow_width
        self._tick = tables.tick
        self._taker_rate = tables.taker_rate
        self._maker_rate = tables.maker_rate
        scale, _ = tables.portfolio_affine
        self._scale = scale.tolist()
        self._n_market = core.n_market_features
        self._obs_dim = core.observation_dim
        # The time-left feature (the one with a bias) of every step, from the core's own feature function.
        steps = torch.arange(self.config.episode_length + 1, dtype=torch.float64)
        zero = torch.zeros_like(steps)
        self._time_left = portfolio_features(
            zero, zero, torch.ones_like(steps), zero, zero, zero, zero, zero, steps,
            self.config, tables.tick, tables.portfolio_affine,
        )[:, -1].tolist()
        self._state: dict[str, Any] = {}
        self._synced: list[torch.Tensor] = []
        self.load()

    def load(self) -> None:
        """Take the core's current state (after a reset of the core, or a ``load_state_dict``)."""
        state = self.core.state_dict()
        self._state = {key: state[key].item() for key in KNOWN_STATE_KEYS if key != "generator"}
        self._synced = self._core_tensors()

    def store(self) -> None:
        """Write this state into the core (its generator is left as it is)."""
        state = self.core.state_dict()
        for key, value in self._state.items():
            state[key] = torch.tensor([value], dtype=state[key].dtype)
        self.core.load_state_dict(state)
        self._synced = self._core_tensors()

    def _core_tensors(self) -> list[torch.Tensor]:
        """The core's state tensors: a core step, reset or load replaces them, so while they are the ones
        seen at the last :meth:`load` or :meth:`store`, nobody else has moved the core."""
        return list(self.core._state_tensors().values())

    def self_check(self, steps: int = 48, seed: int = 0) -> str | None:
        """Step the core and this lean step side by side from the core's current state for ``steps``
        random actions (half of them LimitMaker) and report the first output that differs; both end
        where they started. A guard for a core whose rules changed without this module following.

        :param steps: steps compared (fewer when the episode ends first).
        :param seed: of the actions.
        :return: None when every output is equal, else what differed first.
        """
        saved = self.core.state_dict()
        generator = np.random.default_rng(seed)
        actions = generator.integers(0, np.asarray(self.core.ACTION_NVEC), size=(steps, 4))
        actions[generator.random(steps) < 0.5, 2] = 1
        self.load()
        problem = None
        for t, action in enumerate(actions.tolist()):
            expected = self.core._advance(torch.tensor([action]))
            self._synced = self._core_tensors()  # the lean step goes on from its own state, not the core's
            obs, reward, terminated, truncated, info = self.step(action)
            want = {key: value.item() for key, value in expected[4].items()}
            if not np.array_equal(obs, expected[0][0].numpy()):
                problem = f"the observation at step {t}"
            elif (reward, terminated, truncated) != tuple(value.item() for value in expected[1:4]):
                problem = f"reward or episode end at step {t}"
            elif list(info.items()) != list(want.items()):
                problem = f"info at step {t}: {sorted(k for k in want if info.get(k) != want[k])}"
            if problem is not None or terminated or truncated:
                break
        self.core.load_state_dict(saved)
        self.load()
        return problem

    def walk(self, side: float, wanted: float, limit: float, side_row: int) -> tuple[float, float, float]:
        """:func:`~foxenv.matching.walk_book` of one book on side-table row ``side_row``."""
        levels = self._levels
        book = self._sides[side_row].tolist()
        ticks, sizes = book[:levels], book[levels:]
        sizes = [size * (side * (tick - limit) <= 0) for tick, size in zip(ticks, sizes, strict=True)]
        cumulative = []
        running = 0.0
        for size in sizes:
            running += size
            cumulative.append(running)
        taken = [
            min(max(wanted - (total - size), 0.0), size)
            for total, size in zip(cumulative, sizes, strict=True)
        ]
        notional = [amount * tick for amount, tick in zip(taken, ticks, strict=True)]
        if sum(amount != 0.0 for amount in taken) <= 1:  # one level reached: a sum exact in any order
            return sum(taken, 0.0), sum(notional, 0.0), cumulative[-1]
        filled, cost = torch.tensor([taken, notional], dtype=torch.float64).sum(dim=1).tolist()
        return filled, cost, cumulative[-1]

    def step(self, action: list[int]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One step of the core's ``_advance`` on a checked action, in the core's order: the action's order,
        its marketable part, the resting order meeting the next market step's flow (:meth:`_rest`), the one
        fill booked, then the market advances (:meth:`_mark`).

        :param action: ``[direction, magnitude, order, urgency]`` Python ints, each in range.
        :return: observation (float32 ``[D]``), reward (the float32 value), terminated, truncated, info.
        """
        if any(now is not seen for now, seen in zip(self._core_tensors(), self._synced, strict=True)):
            self.load()  # the core was stepped, reset or loaded directly: it holds the state now
        s = self._state
        weights = self._action_code
        row = s["offset"] + s["step"]
        market = self._rows[row].tolist()
        direction, magnitude, order, urgency = action
        code = direction * weights[0] + magnitude * weights[1] + order * weights[2] + urgency * weights[3]
        target, slice_of_need, limit_offset, is_maker, improve, aggressive = self._actions[code]
        need = target - s["ledger.position"]
        side = _sign(need)
        need = abs(need)
        buy = side > 0
        side_row = row * 2

        # Marketable orders (walk_book only where it is used: its results are masked out otherwise).
        wanted = need * slice_of_need * market[4]  # market[4]: trading
        marketable = wanted > 0
        if marketable:
            limit = (market[2] if buy else market[1]) + side * limit_offset  # the opposite touch
            taken, notional, reachable = self.walk(side, wanted, limit, side_row + buy)
            taker_reached = wanted == need and reachable >= wanted
        else:
            taken = notional = 0.0
            taker_reached = False

        order_side, order_tick, fill, left = self._rest(
            market, side_row, side, buy, need, target, is_maker > 0, improve, aggressive
        )

        # One fill: the marketable order's or the resting order's.
        if marketable:
            quantity = side * taken
            notional = notional * self._tick
            fees = notional * self._taker_rate
            reached = taker_reached
        else:
            quantity = order_side * fill
            notional = fill * order_tick * self._tick
            fees = notional * self._maker_rate
            reached = fill > 0 and left <= 0
        price = notional / max(abs(quantity), _SMALLEST_DOUBLE)
        closed = self._apply_fill(quantity, price, fees, market[0], target, reached)
        return self._mark(row, market, fees, closed, left)

    def _rest(
        self, market: list[float], side_row: int, side: float, buy: bool, need: float, target: float,
        is_maker: bool, improve: float, aggressive: float,
    ) -> tuple[float, float, float, float]:
        """The resting order, kept while at or ahead of this urgency's price and re-pegged there once the
        touch moved away (core.py), meets the next market step's flow at its price; its state is written.

        :return: ``(order_side, order_tick, fill, left)``: the order as it met the flow, its fill, what is
            left of it.
        """
        cfg = self.config
        s = self._state
        levels = self._levels
        _, best_bid, best_ask, wide, trading, _, _, _, column_zero, flow_bid, flow_ask = market
        maker_tick = (best_bid if buy else best_ask) + side * (improve + aggressive * wide)
        in_flight = cfg.order_latency and s["order_ahead"] < 0  # arrives at its price; re-pegged after
        behind = side * (maker_tick - s["order_tick"]) > 0 and not in_flight
        keep = is_maker and s["order_target"] == target and s["order_side"] != 0 and not behind
        post = is_maker and side != 0 and not keep
        order_side = side if post else s["order_side"] * keep
        order_tick = maker_tick if post else s["order_tick"]
        own = self._sides[side_row + (order_side <= 0)].tolist()
        at_tick = zip(own[:levels], own[levels:], strict=True)
        visible = sum((size for tick, size in at_tick if tick == order_tick), 0.0)  # one level at most: exact
        latency = cfg.order_latency
        if latency:
            # a pending order holds -(steps until it rests + 1); at -1 it rests now behind the visible size
            ahead = -1.0 - latency if post else s["order_ahead"]
            pending = ahead < -1.5
            if ahead == -1.0:
                ahead = visible
            countdown = ahead + 1.0
            queue = max(ahead, 0.0)
        else:
            ahead = visible if post else s["order_ahead"]
            pending = False
            countdown = 0.0
            queue = ahead
        remaining = need if post else s["order_remaining"] * keep
        order_target = target if post else s["order_target"]

        width = self._flow_width
        column = order_tick - column_zero
        clamped = min(max(column, 0.0), float(width - 1))
        grid = int((flow_ask if order_side < 0 else flow_bid) + clamped)
        executed, cancelled, through = self._flow[grid].tolist()
        at_price = column == clamped
        beyond_grid = order_side * (column - clamped) > 0
        through = through + executed if beyond_grid else through
        # matching.probqueue_cancel, then matching.meet_flow (optimistic) or meet_flow_conservative
        executed = executed * at_price
        cancelled = cancelled * at_price
        weight_ahead, weight_behind = _powers(queue, max(visible - queue, 0.0), cfg.queue_power)
        total = weight_ahead + weight_behind
        share = weight_ahead / max(total, _SMALLEST_DOUBLE)
        queue = max(queue - cancelled * share, 0.0)
        if cfg.fill_model == "optimistic":
            fill = remaining if through > 0 else min(max(executed - queue, 0.0), remaining)
            ahead_after = max(queue - executed, 0.0)
        else:
            volume = executed + through
            fill = min(max(volume - queue, 0.0), remaining)
            ahead_after = max(queue - volume, 0.0)

        fill = fill * trading
        ahead = ahead_after if trading > 0 else ahead
        if pending:  # a pending order meets no flow; its wait counts down, halted or not
            fill = 0.0
            ahead = countdown
        left = remaining - fill
        still_resting = _sign(left)
        s["order_side"] = order_side * still_resting
        s["order_tick"] = order_tick * still_resting
        s["order_ahead"] = ahead * still_resting
        s["order_target"] = order_target * still_resting
        s["order_remaining"] = left
        return order_side, order_tick, fill, left

    def _mark(
        self, row: int, market: list[float], fees: float, closed: tuple[bool, float, float, float],
        left: float,
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advance the market, mark to market, reward; the step's observation and info."""
        cfg = self.config
        s = self._state
        mid, next_best_bid, next_best_ask = market[5], market[6], market[7]
        s["step"] = step = s["step"] + 1
        position = s["ledger.position"]
        equity = s["ledger.cash"] + position * mid
        reward = equity - s["equity"]
        if cfg.reward_scale != 1.0:
            reward = reward * cfg.reward_scale
        if cfg.inventory_penalty > 0:
            ratio = position / cfg.max_position
            reward = reward - ratio * ratio * cfg.inventory_penalty
        s["equity"] = equity
        s["peak_equity"] = peak = max(s["peak_equity"], equity)
        terminated = cfg.max_drawdown is not None and peak - equity >= cfg.max_drawdown
        truncated = step >= cfg.episode_length
        unrealized = position * (mid - s["ledger.avg_price"])
        resting_side = s["order_side"]
        queue_shown = max(s["order_ahead"], 0.0) if cfg.order_latency else s["order_ahead"]  # 0 while pending
        order_price = s["order_tick"] * self._tick

        obs = np.empty(self._obs_dim, dtype=np.float32)
        n_market = self._n_market
        obs[:n_market] = self._next_features[row]
        scale = self._scale
        time_in_trade = (step - s["ledger.trade_start"]) * (position != 0)
        obs[n_market:] = (
            position * scale[0],
            unrealized / mid * scale[1],
            resting_side * scale[2],
            (order_price - mid) * abs(resting_side) * scale[3],
            math.log1p(queue_shown) * scale[4],
            left * scale[5],
            float(time_in_trade) * scale[6],
            self._time_left[step],
        )
        closed_now, pnl, lots, closed_entry_mid = closed
        info = {
            "mid": mid,
            "best_bid": next_best_bid,
            "best_ask": next_best_ask,
            "position": position,
            "trade_closed": closed_now,
            "trade_pnl": pnl,
            "trade_lots": lots,
            "entry_mid": closed_entry_mid if closed_now else s["ledger.entry_mid"],
            "equity": equity,
            "fees": fees,
            "cash": s["ledger.cash"],
            "realized_pnl": s["ledger.realized"],
            "unrealized_pnl": unrealized,
            "order_active": left > 0,
            "order_price": order_price,
            "order_queue_ahead": queue_shown,
            "order_remaining": left,
            "step": step,
        }
        return obs, float(np.float32(reward)), terminated, truncated, info

    def _apply_fill(
        self, quantity: float, price: float, fee: float, mid: float, target: float, reached: bool
    ) -> tuple[bool, float, float, float]:
        """:meth:`Ledger.apply_fill <foxenv.accounting.Ledger.apply_fill>` of one book.

        :return: closed, pnl, lots, entry_mid of the closed trade (zeros where none closed).
        """
        s = self._state
        old = s["ledger.position"]
        avg_price = s["ledger.avg_price"]
        new = target if reached else old + quantity
        size = abs(quantity)
        old_abs = abs(old)
        opening = old * quantity >= 0
        closed_lots = 0.0 if opening else min(size, old_abs)
        realized_now = closed_lots * (price - avg_price) * _sign(old)
        flat = new == 0
        flip = old * new < 0
        closes = old != 0 and (flat or flip)
        starts = quantity != 0 and (old == 0 or flip)
        fee_old_trade = fee * closed_lots / size if flip else fee
        trade_realized = s["ledger.trade_realized"] + realized_now
        trade_fees = s["ledger.trade_fees"] + fee_old_trade
        if closes:
            result = True, trade_realized - trade_fees, old_abs, s["ledger.entry_mid"]
        else:
            result = False, 0.0, 0.0, 0.0

        cost = quantity * price
        if flip:
            avg = price
        elif opening:
            avg = (old * avg_price + cost) / (new + flat)
        else:
            avg = avg_price
        s["ledger.avg_price"] = 0.0 if flat else avg
        s["ledger.trade_realized"] = 0.0 if closes else trade_realized
        s["ledger.trade_fees"] = fee - fee_old_trade if closes else trade_fees
        if starts:
            s["ledger.entry_mid"] = mid
            s["ledger.trade_start"] = s["step"]
        elif flat:
            s["ledger.entry_mid"] = 0.0
        s["ledger.cash"] = s["ledger.cash"] - cost - fee
        s["ledger.realized"] = s["ledger.realized"] + realized_now - fee
        s["ledger.position"] = new
        return result


def check_walk(core: BatchedLOB, count: int = 200, seed: int = 0) -> None:
    """Assert :meth:`SingleBook.walk` equals :func:`~foxenv.matching.walk_book` on ``count`` random
    rows of the core's side table (a self-test for the tests).

    :param core: a one-book CPU core.
    :param count: rows tried.
    :param seed: of the draws.
    """
    book = SingleBook(core)
    generator = np.random.default_rng(seed)
    levels = book._levels
    for _ in range(count):
        side_row = int(generator.integers(0, book._sides.shape[0]))
        side = float(generator.choice([-1.0, 1.0]))
        wanted = float(generator.uniform(0, 2) * book._sides[side_row, levels:].sum() + 1e-3) / 3.0
        limit = float(book._sides[side_row, int(generator.integers(0, levels))] + generator.integers(-2, 3))
        lean = book.walk(side, wanted, limit, side_row)
        row = torch.from_numpy(book._sides[side_row:side_row + 1])
        core_walk = walk_book(
            row[:, :levels], row[:, levels:], torch.tensor([side], dtype=torch.float64),
            torch.tensor([wanted], dtype=torch.float64), torch.tensor([limit], dtype=torch.float64),
        )
        assert lean == tuple(value.item() for value in core_walk), (side_row, side, wanted, limit)


__all__ = ["INFO_KEYS", "KNOWN_CONFIG_FIELDS", "KNOWN_STATE_KEYS", "SingleBook", "check_walk",
           "lean_path_problem"]
