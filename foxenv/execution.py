"""The execution task (``EnvConfig(task="execute")``): work a parent order of ``Q`` shares within the episode.

A window starting at market row ``o`` (the episode's offset) draws a side ``s`` (+1 buy, -1 sell:
``exec_side``, or with ``"both"`` a fixed pseudo-random side per start row) and a parent quantity ``Q``
(``exec_quantity`` shares, or with ``exec_quantity_unit="volume"`` that share of the volume the market
trades in the window's ``T = episode_length`` steps, at least one share). Both follow from the offset alone,
so the core's state layout, its reset and its fused step-and-reset are those of the trading task: the
filled quantity is the ledger's position (``s * filled``), its cost the ledger's cash.

Each step the agent sends one child order, an action of four branches (``ExecutionGrid``):

- ``size`` (branch 0): ``exec_child_sizes[k]`` TWAP slices of ``Q / T`` shares (default 0, 1/2, 1, 2), never
  more than what is left;
- branch 1 has one value (the action keeps four branches, so every face and agent runs unchanged);
- ``order`` (branch 2): Market (walks the book for the child), post-only LimitMaker (rests the child off the
  own touch, :func:`foxenv.matching.maker_offset_tick`), IoC (takes the child up to its limit);
- ``urgency`` (branch 3): the action grid's price offset of a LimitMaker (``maker_offsets``) or an IoC
  (``ioc_offsets``) order; a Market child always works all of its size.

The child goes through the trading task's own matching (:mod:`foxenv.matching`: walking the book, queue
position, IoC, fees): it is the target position ``s * filled + s * child``. A LimitMaker child keeps its
queue: a resting order of the window's side no larger than the chosen size is left working (the core
re-pegs it when the touch moves away); otherwise it is replaced by one of the chosen size, and a size of 0
cancels it. After the last step's flow, what is left crosses the visible book of snapshot ``o + T`` as a
Market order with the taker fee; a remainder the visible book cannot absorb is charged at the price of its
deepest level (``walk_book`` drops it, the parent must not; MarketData prices an empty level one tick beyond
the last, so it is always a price beyond every visible share). The cross trades even when the last step is
halted: the parent must be done at ``T``.

Reward of a step: ``-1e4 * cost / (Q * a)`` (times ``reward_scale``) with ``a`` the arrival mid (snapshot
``o``) and ``cost`` what the step's fills paid beyond the arrival price, fees included (``-(cash change) -
(position change) * a``), so the episode's return is minus the implementation shortfall in basis points of
the parent's notional (higher is better). ``inventory_penalty`` and ``max_drawdown`` are the trading task's
and refused here. An episode terminates when the parent is filled (at the latest at step ``T``).

Observation: the trading observation plus :data:`EXECUTION_FEATURES` (the portfolio features' last entry is
already the time left).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from foxenv.matching import NO_LIMIT, walk_book
from foxenv.spec import BRANCH_NAMES, ORDER_TYPES, ActionGrid, JointCodes

if TYPE_CHECKING:
    from foxenv.config import EnvConfig
    from foxenv.data.market import MarketData
    from foxenv.state import BookState
    from foxenv.tables import MarketTables

#: The tasks of :attr:`foxenv.config.EnvConfig.task`.
TASKS = ("trade", "execute")
#: Sides of the parent order (``EnvConfig.exec_side``).
EXEC_SIDES = ("buy", "sell", "both")
#: Units of ``EnvConfig.exec_quantity``: shares, or a share of the window's traded volume.
EXEC_QUANTITY_UNITS = ("shares", "volume")
#: Child sizes in TWAP slices (``EnvConfig.exec_child_sizes``).
DEFAULT_CHILD_SIZES = (0.0, 0.5, 1.0, 2.0)
#: Execution features appended to the observation, in order.
EXECUTION_FEATURES = (
    "exec_side",  # +1 buy, -1 sell
    "exec_remaining",  # shares left / Q, in [0, 1]
    "exec_drift_bps",  # s * (mid - arrival mid) / arrival mid, in bps: how far the price moved against us
)
#: Seed of the per-start-row sides of ``exec_side="both"`` (fixed: the same window has the same side in
#: every run, on every device).
SIDE_SEED = 36


class Parent(NamedTuple):
    """The parent order of each book's window, ``[B]`` float64 each."""

    side: torch.Tensor  # +1 buy, -1 sell
    quantity: torch.Tensor  # shares
    arrival: torch.Tensor  # the mid of the window's first snapshot


@dataclass(frozen=True)
class ExecutionGrid(JointCodes):
    """The execution task's action space: ``nvec = (len(child_sizes), 1, 3, U)``, the urgency branch's price
    offsets those of ``base`` (an :class:`~foxenv.spec.ActionGrid`). It answers what foxenv's faces and
    agents ask of a grid (``nvec``, ``code_weights``, ``joint_actions``, ``labels``, ``to_dict``) and hands
    the trading fields on to ``base`` (the core's tables are built from them).

    :param base: the trading grid whose ``ioc_offsets`` and ``maker_offsets`` the urgency branch takes.
    :param child_sizes: child sizes in TWAP slices, strictly increasing, each >= 0.
    """

    base: ActionGrid
    child_sizes: tuple[float, ...] = DEFAULT_CHILD_SIZES

    def __post_init__(self) -> None:
        sizes = self.child_sizes
        if isinstance(sizes, str | bytes) or not hasattr(sizes, "__len__") or len(sizes) < 2:
            raise ValueError(f"exec_child_sizes={sizes!r} must be a sequence of at least 2 numbers")
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int | float) or not math.isfinite(size) \
                    or size < 0:
                raise ValueError(f"exec_child_sizes={list(sizes)} must hold finite numbers >= 0, got "
                                 f"{size!r}")
        if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ValueError(f"exec_child_sizes={list(sizes)} must be strictly increasing")
        object.__setattr__(self, "child_sizes", tuple(float(s) for s in sizes))

    @property
    def name(self) -> str:
        """``"execute-"`` and the base grid's name."""
        return f"execute-{self.base.name}"

    @property
    def nvec(self) -> tuple[int, ...]:
        """Choices per branch: ``(len(child_sizes), 1, 3, urgencies)``."""
        return (len(self.child_sizes), 1, len(ORDER_TYPES), len(self.base.ioc_offsets))

    def __getattr__(self, name: str) -> Any:
        """The trading fields (``magnitudes``, ``market_slices``, ``ioc_offsets``, ``maker_offsets``,
        ``full_size``, ``whole_gap``, ``at_touch``) are the base grid's."""
        if name.startswith("__") or name in ("base", "child_sizes"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def labels(self) -> dict[str, tuple[str, ...]]:
        """The name of each value of each branch (keyed by :data:`foxenv.spec.BRANCH_NAMES`)."""
        base = self.base.labels()
        values = (tuple(f"{s:g}x" for s in self.child_sizes), ("-",), ORDER_TYPES, base["urgency"])
        return dict(zip(BRANCH_NAMES, values, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """The grid as JSON-able values."""
        return {"name": self.name, "base": self.base.to_dict(), "child_sizes": list(self.child_sizes)}


def check_execution_config(config: EnvConfig) -> None:
    """Validate the execution fields of ``config`` (called by ``EnvConfig.__post_init__``).

    :raises ValueError: naming the field and value.
    """
    if config.task not in TASKS:
        raise ValueError(f"task={config.task!r} must be one of {TASKS}")
    if config.exec_side not in EXEC_SIDES:
        raise ValueError(f"exec_side={config.exec_side!r} must be one of {EXEC_SIDES}")
    if config.exec_quantity_unit not in EXEC_QUANTITY_UNITS:
        raise ValueError(f"exec_quantity_unit={config.exec_quantity_unit!r} must be one of "
                         f"{EXEC_QUANTITY_UNITS}")
    quantity = config.exec_quantity
    if isinstance(quantity, bool) or not isinstance(quantity, int | float) or not math.isfinite(quantity) \
            or quantity <= 0:
        raise ValueError(f"exec_quantity={quantity!r} must be a finite number > 0")
    if config.exec_quantity_unit == "volume" and quantity > 1:
        raise ValueError(f"exec_quantity={quantity} must be <= 1 with exec_quantity_unit='volume' (a "
                         "share of the window's traded volume)")
    ExecutionGrid(config.action_grid, config.exec_child_sizes)  # checks the sizes
    if config.task == "execute":
        for name, unset in (("inventory_penalty", 0.0), ("max_drawdown", None)):
            if getattr(config, name) != unset:
                raise ValueError(f"{name}={getattr(config, name)!r} is the trading task's; task='execute' "
                                 f"rewards minus the shortfall (leave {name} at {unset})")


def window_sides(num_steps: int, exec_side: str) -> torch.Tensor:
    """The side of the window starting at each market row: all +1 (buy), all -1 (sell), or for ``"both"`` a
    fixed pseudo-random +-1 per row (:data:`SIDE_SEED`, drawn on the CPU: the same on every device).

    :return: ``[num_steps]`` float64 on the CPU.
    """
    if exec_side == "buy":
        return torch.ones(num_steps, dtype=torch.float64)
    if exec_side == "sell":
        return -torch.ones(num_steps, dtype=torch.float64)
    generator = torch.Generator().manual_seed(SIDE_SEED)
    return torch.randint(0, 2, (num_steps,), generator=generator).double() * 2 - 1


def window_quantities(market: MarketData, config: EnvConfig) -> torch.Tensor:
    """The parent quantity of the window starting at each market row: ``exec_quantity`` shares, or that
    share of the volume traded in the window's steps ``o + 1 .. o + T`` (the flow it meets), at least 1.

    :return: ``[num_steps]`` float64 on the market's device (rows too late to start a window hold what the
        rest of the timeline trades).
    """
    num_steps = market.num_steps
    device = market.exec_bid.device
    if config.exec_quantity_unit == "shares":
        return torch.full((num_steps,), float(config.exec_quantity), dtype=torch.float64, device=device)
    volume = market.exec_bid.double().sum(dim=1) + market.exec_ask.double().sum(dim=1)
    cumulative = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), torch.cumsum(volume, 0)])
    start = torch.arange(num_steps, device=device)
    stop = (start + config.episode_length).clamp_max(num_steps - 1)
    window = cumulative[stop + 1] - cumulative[start + 1]
    return (window * float(config.exec_quantity)).clamp_min(1.0)


def action_table(grid: ExecutionGrid, device: torch.device) -> torch.Tensor:
    """``[A, 6]`` float64 by joint code: child size in slices, the share of the child a marketable order
    works (1; 0 for LimitMaker), its limit offset beyond the opposite touch in ticks, LimitMaker (1.0) or
    not, and the LimitMaker price off the own touch (``improve + aggressive * wide``, as the core's table)."""
    base = grid.base
    maker = [(float(min(o, 0)), float(o == 1)) for o in base.maker_offsets]
    orders = {
        "market": [(1.0, NO_LIMIT, 0.0)] * len(maker),
        "limit_maker": [(0.0, 0.0, 1.0)] * len(maker),
        "ioc": [(1.0, float(o), 0.0) for o in base.ioc_offsets],
    }
    rows = [[size, *row, *price] for size in grid.child_sizes for order in ORDER_TYPES
            for row, price in zip(orders[order], maker, strict=True)]
    return torch.tensor(rows, dtype=torch.float64, device=device)


class ExecutionTask:
    """The execution task's tables and its hooks into :class:`foxenv.core.BatchedLOB`'s step.

    :param market: the market (on ``device``).
    :param config: the env config (``task="execute"``).
    :param tables: the core's market tables.
    :param device: the core's device.
    """

    def __init__(
        self, market: MarketData, config: EnvConfig, tables: MarketTables, device: torch.device
    ) -> None:
        grid = config.grid
        assert isinstance(grid, ExecutionGrid)
        self.horizon = int(config.episode_length)
        self.reward_scale = float(config.reward_scale)
        self.levels = tables.levels
        self.tick = tables.tick
        self.taker_rate = tables.taker_rate
        side = window_sides(market.num_steps, config.exec_side).to(device)
        quantity = window_quantities(market, config).to(device)
        #: ``[N, 3]`` float64: side, parent quantity and arrival mid of the window starting at each row (one
        #: gather per step)
        self._parents = torch.stack([side, quantity, tables.rows[:, 0]], dim=1).contiguous()
        #: ``[N]`` float64 side of the window starting at each row
        self.side = self._parents[:, 0]
        #: ``[N]`` float64 parent quantity of the window starting at each row
        self.quantity = self._parents[:, 1]
        self.actions = action_table(grid, device)
        self.action_code = torch.tensor(grid.code_weights, dtype=torch.int64, device=device)
        self._sides = tables.sides

    def parent(self, offset: torch.Tensor) -> Parent:
        """The parent orders of the windows starting at ``offset`` (``[B]`` int64)."""
        return Parent(*self._parents.index_select(0, offset).unbind(dim=1))

    def child_orders(
        self, action: torch.Tensor, state: BookState, parent: Parent
    ) -> tuple[torch.Tensor, ...]:
        """The step's child orders as the core's action columns: ``(target, slice_of_need, limit_offset,
        is_maker, improve, aggressive)``, each ``[B]`` float64 (see the module docstring)."""
        sizes, slice_of_need, limit_offset, is_maker, improve, aggressive = self.actions.index_select(
            0, (action * self.action_code).sum(dim=1)
        ).unbind(dim=1)
        side, quantity, _ = parent
        position = state.ledger.position
        left = quantity - position * side
        wanted = sizes * quantity / self.horizon
        child = torch.minimum(wanted, left)
        fresh = torch.where(wanted >= left, side * quantity, position + side * child)  # exact at the end
        keepable = (is_maker > 0) & (state.order_side == side) & (state.order_remaining <= child)
        keepable = keepable & (child > 0)
        target = torch.where(keepable, state.order_target, fresh)
        return target, slice_of_need, limit_offset, is_maker, improve, aggressive

    def final_cross(
        self, state: BookState, row: torch.Tensor, mid: torch.Tensor, parent: Parent
    ) -> torch.Tensor:
        """At the window's last step, cancel the resting order and cross what is left on snapshot ``row + 1``
        (the ledger books the fill); elsewhere nothing.

        :param state: the state after the step's fill (changed in place).
        :param row: ``[B]`` int64 market row of the step.
        :param mid: ``[B]`` mid of snapshot ``row + 1``.
        :param parent: the books' parent orders.
        :return: ``[B]`` float64 fee of the cross (0 where none).
        """
        ledger = state.ledger
        side, quantity, _ = parent
        at_end = state.step + 1 >= self.horizon
        left = (quantity - ledger.position * side).clamp_min(0.0) * at_end
        levels = self.levels
        book = self._sides.index_select(0, (row + 1) * 2 + (side > 0))
        ticks, sizes = book[:, :levels], book[:, levels:]
        taken, notional, _ = walk_book(ticks, sizes, side, left, side * NO_LIMIT)
        notional = (notional + (left - taken) * ticks[:, -1]) * self.tick  # the rest at the deepest level
        fee = notional * self.taker_rate
        price = notional / left.clamp_min(5e-324)
        crossing = left > 0
        ledger.apply_fill(side * left, price, fee, mid, state.step, side * quantity, crossing)
        keep = (~at_end).double()
        state.order_side = state.order_side * keep
        state.order_tick = state.order_tick * keep
        state.order_ahead = state.order_ahead * keep
        state.order_target = state.order_target * keep
        state.order_remaining = state.order_remaining * keep
        return fee

    def outcome(
        self, state: BookState, cash_before: torch.Tensor, position_before: torch.Tensor, parent: Parent
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's reward (float32 bps, minus its share of the implementation shortfall) and whether the
        parent is done (``[B]`` bool)."""
        ledger = state.ledger
        side, quantity, arrival = parent
        cost = (cash_before - ledger.cash) - (ledger.position - position_before) * arrival
        reward = (cost * (-1e4 * self.reward_scale) / (quantity * arrival)).to(torch.float32)
        done = (ledger.position * side >= quantity) | (state.step >= self.horizon)
        return reward, done

    def features(self, state: BookState, mid: torch.Tensor, parent: Parent | None = None) -> torch.Tensor:
        """``[B, len(EXECUTION_FEATURES)]`` float32 execution features after a step (or a reset; ``parent``
        ``None``: looked up)."""
        side, quantity, arrival = self.parent(state.offset) if parent is None else parent
        remaining = (quantity - state.ledger.position * side) / quantity
        drift = side * (mid - arrival) / arrival * 1e4
        return torch.stack([side, remaining, drift], dim=1).to(torch.float32)

    def start_features(self, offset: torch.Tensor) -> torch.Tensor:
        """The execution features of a fresh episode starting at ``offset``: side, all left, no drift."""
        side = self.side.index_select(0, offset)
        return torch.stack([side, torch.ones_like(side), torch.zeros_like(side)], dim=1).to(torch.float32)
