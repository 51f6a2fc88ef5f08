"""The action and info contract of every foxenv face, defined once.

An action is four integers, one per branch, ``(direction, magnitude, order, urgency)``, each in
``[0, 3)``:

- ``direction``: the sign of the target position, :data:`DIRECTIONS` (short, flat, long);
- ``magnitude``: the size of the target position as a fraction of ``max_position``, :data:`MAGNITUDES`;
  the target is ``DIRECTIONS[direction] * MAGNITUDES[magnitude] * max_position``;
- ``order``: how the position is worked, :data:`ORDER_TYPES` (a Market order walks the book, a
  post-only LimitMaker order rests at the own touch, an IoC order takes up to a limit);
- ``urgency``: :data:`URGENCIES`; a Market order works 1/3, 2/3 or all of the needed change, an IoC
  order's limit lies 0, 1 or 3 ticks beyond the opposite touch, a LimitMaker order rests one tick behind,
  at, or one tick inside the own touch (see :mod:`foxenv.matching`).

Every step's info holds :data:`INFO_KEYS` (one ``[B]`` tensor each from the core, one Python scalar each
from :class:`~foxenv.gym_env.LOBEnv`). :func:`check_actions` is the one action check every face applies;
the tensor faces apply it in two halves, :func:`check_action_tensor` (dtype and shape: tensor metadata) and
:func:`check_action_values` (the range, a host read), or, where that read would sync (an accelerator, a CUDA
graph), :class:`ActionRangeFlag`, a device flag raised at the next sync point.

**Action grids.** What each magnitude and urgency index means is an :class:`ActionGrid`
(``EnvConfig.action_grid``): data, not code. :data:`DEFAULT_GRID` is the contract above,
``MultiDiscrete([3, 3, 3, 3])`` (81 joint codes); :data:`WIDE_GRID` (``"wide"``) is
``MultiDiscrete([3, 10, 3, 12])``, 1,080 joint codes: ten sizes and twelve price levels per order type, a
space where one flat head over every combination is the hard way (issue 23). The module-level constants
(:data:`ACTION_NVEC`, :data:`MAGNITUDES`, :data:`JOINT_ACTIONS`) are the default grid's; every check takes
the grid's ``nvec``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

#: Names of the action's branches, in order.
BRANCH_NAMES: tuple[str, ...] = ("direction", "magnitude", "order", "urgency")
#: Number of choices of each branch (the ``MultiDiscrete`` action space's ``nvec``).
ACTION_NVEC: tuple[int, ...] = (3, 3, 3, 3)
#: Sign of the target position by ``direction`` index: short, flat, long.
DIRECTIONS: tuple[int, ...] = (-1, 0, 1)
#: Target position size by ``magnitude`` index, as a fraction of ``EnvConfig.max_position``.
MAGNITUDES: tuple[float, ...] = (0.25, 0.5, 1.0)
#: Order type by ``order`` index.
ORDER_TYPES: tuple[str, ...] = ("market", "limit_maker", "ioc")
#: Index of the post-only resting order in :data:`ORDER_TYPES` (the only one paying the maker fee).
LIMIT_MAKER: int = ORDER_TYPES.index("limit_maker")
#: Urgency by ``urgency`` index.
URGENCIES: tuple[str, ...] = ("passive", "normal", "aggressive")
#: Keys of a step's info, in the order the core builds it.
INFO_KEYS: tuple[str, ...] = (
    "mid",
    "best_bid",
    "best_ask",
    "position",
    "trade_closed",
    "trade_pnl",
    "trade_lots",
    "entry_mid",
    "equity",
    "fees",
    "cash",
    "realized_pnl",
    "unrealized_pnl",
    "order_active",
    "order_price",
    "order_queue_ahead",
    "order_remaining",
    "step",
)

assert len(BRANCH_NAMES) == len(ACTION_NVEC)
assert (len(DIRECTIONS), len(MAGNITUDES), len(ORDER_TYPES), len(URGENCIES)) == ACTION_NVEC


def _whole(value: Any) -> bool:
    """An int, or a finite float without a fraction (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())


class JointCodes:
    """The joint action codes of an action grid, from its ``nvec`` (choices per branch): shared by
    :class:`ActionGrid` and :class:`foxenv.execution.ExecutionGrid`."""

    nvec: tuple[int, ...]

    @property
    def joint_actions(self) -> int:
        """Number of joint codes, the product of ``nvec``."""
        return math.prod(self.nvec)

    @property
    def code_weights(self) -> tuple[int, ...]:
        """Weights of the joint code ``sum(action * code_weights)``: ``(M 3 U, 3 U, U, 1)`` on a trading
        grid."""
        return tuple(math.prod(self.nvec[i + 1:]) for i in range(len(self.nvec)))


@dataclass(frozen=True)
class ActionGrid(JointCodes):
    """What each value of the magnitude and urgency branches means: the action space as data.

    The direction (short, flat, long) and order (Market, LimitMaker, IoC) branches are fixed; the grid sets
    the sizes and, for each urgency index ``u`` (one branch shared by the three order types, so that the
    action stays four branches), what the order does. Higher ``u`` is more aggressive for every order type:

    - Market works ``market_slices[u]`` of the needed position change this step;
    - IoC takes liquidity up to ``ioc_offsets[u]`` ticks beyond the opposite touch and cancels the rest;
    - post-only LimitMaker rests ``maker_offsets[u]`` ticks off the own-side touch: ``-k`` is ``k`` ticks
      behind it (a lower bid, a higher ask), 0 at it, 1 one tick inside it when the spread is at least two
      ticks (else at it: a post-only order never reaches the opposite touch). More than one tick inside is
      not a grid value: its price would depend on the spread, which the action table cannot hold.

    ``nvec = (3, len(magnitudes), 3, U)``; the joint code is ``((d * M + m) * 3 + o) * U + u``
    (:attr:`code_weights`), ``27 d + 9 m + 3 o + u`` on the default grid. Every grid holds the actions the
    baselines take (:attr:`full_size`, :attr:`whole_gap`, :attr:`at_touch`): a size of 1.0, a Market slice of
    1.0 and a LimitMaker offset of 0.

    :param name: how reports and errors name the grid.
    :param magnitudes: target sizes as fractions of ``max_position``, increasing, each in ``(0, 1]``, with
        1.0.
    :param market_slices: per urgency, the share of the need a Market order works, each in ``(0, 1]``, with
        1.0.
    :param ioc_offsets: per urgency, the IoC limit in whole ticks beyond the opposite touch, each >= 0.
    :param maker_offsets: per urgency, the LimitMaker price in whole ticks off the own touch, each <= 1,
        with 0.
    """

    name: str
    magnitudes: tuple[float, ...]
    market_slices: tuple[float, ...]
    ioc_offsets: tuple[int, ...]
    maker_offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"action_grid.name={self.name!r} must be a non-empty string")
        for field in ("magnitudes", "market_slices", "ioc_offsets", "maker_offsets"):
            value = getattr(self, field)
            if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__len__") or len(value) < 2:
                raise ValueError(f"action_grid.{field}={value!r} must be a sequence of at least 2 numbers (a "
                                 "branch of one value is no choice)")
            for item in value:
                if isinstance(item, bool) or not isinstance(item, numbers.Real) or not math.isfinite(item):
                    raise ValueError(f"action_grid.{field}={list(value)} must hold finite numbers, got "
                                     f"{item!r}")
        for field in ("magnitudes", "market_slices"):
            value = getattr(self, field)
            bad = [v for v in value if not 0 < v <= 1]
            if bad:
                raise ValueError(f"action_grid.{field}={list(value)} must each lie in (0, 1], got {bad[0]}")
            if 1.0 not in value:
                raise ValueError(f"action_grid.{field}={list(value)} must hold 1.0 (the baselines' "
                                 f"{'full size' if field == 'magnitudes' else 'whole-gap Market order'})")
        if any(b <= a for a, b in zip(self.magnitudes, self.magnitudes[1:], strict=False)):
            raise ValueError(f"action_grid.magnitudes={list(self.magnitudes)} must be strictly increasing")
        for field, ok, rule in (("ioc_offsets", lambda v: v >= 0, "whole ticks >= 0"),
                                ("maker_offsets", lambda v: v <= 1, "whole ticks <= 1 (at most one inside)")):
            value = getattr(self, field)
            bad = [v for v in value if not (_whole(v) and ok(v))]
            if bad:
                raise ValueError(f"action_grid.{field}={list(value)} must be {rule}, got {bad[0]}")
        if 0 not in self.maker_offsets:
            raise ValueError(f"action_grid.maker_offsets={list(self.maker_offsets)} must hold 0 (a "
                             "LimitMaker order at the touch, the baselines' maker)")
        sizes = {f: len(getattr(self, f)) for f in ("market_slices", "ioc_offsets", "maker_offsets")}
        if len(set(sizes.values())) != 1:
            raise ValueError("action_grid: market_slices, ioc_offsets and maker_offsets must have one value "
                             f"per urgency each, got lengths {sizes}")
        object.__setattr__(self, "magnitudes", tuple(float(v) for v in self.magnitudes))
        object.__setattr__(self, "market_slices", tuple(float(v) for v in self.market_slices))
        object.__setattr__(self, "ioc_offsets", tuple(int(v) for v in self.ioc_offsets))
        object.__setattr__(self, "maker_offsets", tuple(int(v) for v in self.maker_offsets))

    @property
    def nvec(self) -> tuple[int, ...]:
        """Choices per branch: ``(3, len(magnitudes), 3, urgencies)``."""
        return (len(DIRECTIONS), len(self.magnitudes), len(ORDER_TYPES), len(self.ioc_offsets))

    @property
    def full_size(self) -> int:
        """Magnitude index of the full ``max_position``."""
        return self.magnitudes.index(1.0)

    @property
    def whole_gap(self) -> int:
        """Urgency index of a Market order working all of the need at once."""
        return self.market_slices.index(1.0)

    @property
    def at_touch(self) -> int:
        """Urgency index of a LimitMaker order at the own-side touch."""
        return self.maker_offsets.index(0)

    def labels(self) -> dict[str, tuple[str, ...]]:
        """The name of each value of each branch, for action mixes: the default grid's words (quarter, half,
        full; passive, normal, aggressive), else each size as its fraction (``"0.1"``) and each urgency as
        its index (``"u0"``: what it does differs by order type)."""
        if self == DEFAULT_GRID:
            sizes, urgencies = ("quarter", "half", "full"), URGENCIES
        else:
            sizes = tuple(f"{m:g}" for m in self.magnitudes)
            urgencies = tuple(f"u{u}" for u in range(self.nvec[3]))
        values = (("short", "flat", "long"), sizes, ORDER_TYPES, urgencies)
        return dict(zip(BRANCH_NAMES, values, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """The grid as JSON-able values (what :func:`action_grid` takes back)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


#: Today's grid: sizes a quarter, half and all of ``max_position``; Market works a third, two thirds or all
#: of the need; IoC limits 0, 1, 3 ticks beyond the opposite touch; LimitMaker one behind, at, one inside.
DEFAULT_GRID = ActionGrid("default", MAGNITUDES, (1.0 / 3.0, 2.0 / 3.0, 1.0), (0, 1, 3), (-1, 0, 1))
#: The wide grid (issue 23), ``MultiDiscrete([3, 10, 3, 12])``, 3 x 10 x 3 x 12 = 1,080 joint codes: sizes
#: 0.1, 0.2, ..., 1.0 of ``max_position``; per urgency u = 0..11, Market works (u + 1) / 12 of the need, IoC
#: takes up to u ticks beyond the opposite touch, LimitMaker rests 10 - u ticks behind the own touch (u = 10:
#: at it, u = 11: one inside). Each branch's values are ordered, so a per-branch head can generalise along
#: them, where a flat head over 1,080 codes must learn every combination on its own.
WIDE_GRID = ActionGrid("wide", tuple(k / 10 for k in range(1, 11)), tuple(k / 12 for k in range(1, 13)),
                       tuple(range(12)), tuple(range(-10, 2)))
#: The named grids ``EnvConfig.action_grid`` takes.
ACTION_GRIDS: dict[str, ActionGrid] = {grid.name: grid for grid in (DEFAULT_GRID, WIDE_GRID)}


def action_grid(value: Any) -> ActionGrid:
    """The grid ``value`` names: an :class:`ActionGrid`, a name of :data:`ACTION_GRIDS`, or a mapping of
    :class:`ActionGrid`'s fields (a custom grid; ``name`` defaults to ``"custom"``).

    :raises ValueError: one line naming the bad value.
    """
    if isinstance(value, ActionGrid):
        return value
    if isinstance(value, str):
        if value not in ACTION_GRIDS:
            raise ValueError(f"action_grid={value!r} must be one of {sorted(ACTION_GRIDS)} or a mapping of "
                             "ActionGrid fields (magnitudes, market_slices, ioc_offsets, maker_offsets)")
        return ACTION_GRIDS[value]
    if isinstance(value, Mapping):
        fields = ("name", "magnitudes", "market_slices", "ioc_offsets", "maker_offsets")
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"action_grid has unknown fields {unknown}; its fields are {list(fields)}")
        missing = [f for f in fields[1:] if f not in value]
        if missing:
            raise ValueError(f"action_grid={dict(value)!r} lacks {missing}")
        grid = ActionGrid(**{"name": "custom", **value})
        named = ACTION_GRIDS.get(grid.name)
        if named is not None and named != grid:
            raise ValueError(f"action_grid.name={grid.name!r} names a built-in grid, whose values differ; "
                             "give the custom grid another name")
        return grid
    raise ValueError(f"action_grid={value!r} must be a grid name {sorted(ACTION_GRIDS)}, a mapping of "
                     "ActionGrid fields or an ActionGrid")


def _out_of_range(name: str, values: np.ndarray, action: Any, shape: tuple[int, ...],
                  nvec: tuple[int, ...]) -> ValueError:
    """The error naming the first action value outside its branch's range (``values`` is int64)."""
    index = tuple(int(i) for i in np.argwhere((values < 0) | (values >= np.asarray(nvec)))[0])
    branch = index[-1]
    value = int(values[index])
    where = f"{name}={action!r}" if len(shape) == 1 else f"{name}[{', '.join(map(str, index))}]={value}"
    return ValueError(
        f"{where} out of range: {BRANCH_NAMES[branch]}={value} must lie in [0, {nvec[branch]})"
    )


def check_actions(
    action: Any, shape: tuple[int, ...], *, name: str = "action", check_range: bool = True,
    nvec: tuple[int, ...] = ACTION_NVEC,
) -> np.ndarray | torch.Tensor:
    """Check actions against the contract: an integer dtype (no floats, no bools), exactly ``shape``
    (no flat or transposed batch is reshaped), and, with ``check_range``, every value in ``[0, nvec)``.

    :param action: a numpy array (or anything ``np.asarray`` takes) or a torch tensor on any device.
    :param shape: the expected shape: ``(4,)`` for one action, ``(B, 4)`` for a batch.
    :param name: the argument's name in error messages (``action`` or ``actions``).
    :param check_range: check the values too; for a tensor on an accelerator this is a host sync.
    :param nvec: choices per branch (the env's :attr:`ActionGrid.nvec`; default: :data:`ACTION_NVEC`).
    :return: a tensor as given (unchanged), or a contiguous int64 numpy array.
    :raises ValueError: naming ``name`` and the value, when the type, dtype, shape or a value is wrong.
    """
    if isinstance(action, torch.Tensor):
        if action.dtype.is_floating_point or action.dtype.is_complex or action.dtype == torch.bool:
            raise ValueError(f"{name} dtype {action.dtype} must be an integer dtype ({name}={action!r})")
        if tuple(action.shape) != shape:
            raise ValueError(f"{name} shape {tuple(action.shape)} must be {shape} ({name}={action!r})")
        if check_range:
            values = action.detach().cpu().numpy().astype(np.int64, copy=False)
            if ((values < 0) | (values >= np.asarray(nvec))).any():
                raise _out_of_range(name, values, action, shape, nvec)
        return action
    try:
        array = np.asarray(action)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={action!r} must be an integer array of shape {shape}") from None
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} dtype {array.dtype} must be an integer dtype ({name}={action!r})")
    if array.shape != shape:
        raise ValueError(f"{name} shape {array.shape} must be {shape} ({name}={action!r})")
    array = np.ascontiguousarray(array, dtype=np.int64)
    if check_range and (array.min() < 0 or (array >= np.asarray(nvec)).any()):
        raise _out_of_range(name, array, action, shape, nvec)
    return array


#: Number of joint actions: one code per combination of the branches, ``27 d + 9 m + 3 o + u``.
JOINT_ACTIONS: int = int(np.prod(ACTION_NVEC))


def check_action_tensor(actions: torch.Tensor, num_envs: int, *, joint: bool, name: str = "actions") -> (
    torch.Tensor
):
    """The host half of the action check of a tensor face: type, integer dtype and shape (tensor metadata:
    no host sync on any device). The values' range is :func:`check_action_values`' (or, where a host read
    would sync, :class:`ActionRangeFlag`'s).

    :param actions: ``[N, 4]`` branch actions, or with ``joint`` ``[N]`` / ``[N, 1]`` codes.
    :param num_envs: ``N``.
    :param joint: the joint face (codes) or the branched one.
    :param name: the argument's name in error messages.
    :return: ``actions`` as ``[N, K]`` (``K`` 1 on the joint face, 4 on the branched one), unchanged in dtype.
    :raises ValueError: naming ``name``, for a non-tensor, a float, bool or complex dtype, or another shape.
    """
    if not isinstance(actions, torch.Tensor):
        raise ValueError(f"{name} of type {type(actions).__name__} must be a torch.Tensor on the tensor face")
    if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
        raise ValueError(f"{name} dtype {actions.dtype} must be an integer dtype (a float code such as 1.5 "
                         "is not rounded)")
    shapes = ((num_envs,), (num_envs, 1)) if joint else ((num_envs, len(ACTION_NVEC)),)
    if tuple(actions.shape) not in shapes:
        face = "joint face takes codes" if joint else "branched face takes actions"
        raise ValueError(f"{name} shape {tuple(actions.shape)}: the {face} of shape "
                         f"{' or '.join(map(str, shapes))}")
    return actions.reshape(num_envs, 1 if joint else len(ACTION_NVEC))


def _limits(joint: bool, nvec: tuple[int, ...]) -> tuple[int, ...]:
    return (math.prod(nvec),) if joint else tuple(nvec)


def _range_message(name: str, env: int, branch: int, value: int, joint: bool, nvec: tuple[int, ...]) -> str:
    if joint:
        return f"{name}[{env}]={value} out of range: a joint code must lie in [0, {math.prod(nvec)})"
    return (f"{name}[{env}, {branch}]={value} out of range: {BRANCH_NAMES[branch]}={value} must lie in "
            f"[0, {nvec[branch]})")


def check_action_values(actions: torch.Tensor, *, joint: bool, name: str = "actions",
                        nvec: tuple[int, ...] = ACTION_NVEC) -> None:
    """The range half of the action check, on the host (a read of ``actions``: free on the CPU).

    :param actions: ``[N, K]`` integer actions (:func:`check_action_tensor`'s result).
    :param joint: codes (``K`` 1) or branch actions (``K`` 4).
    :param name: the argument's name in error messages.
    :param nvec: choices per branch (the env's grid).
    :raises ValueError: naming the first value outside its range.
    """
    values = actions.detach().cpu().numpy().astype(np.int64, copy=False)
    limits = np.asarray(_limits(joint, nvec), dtype=np.int64)
    bad = (values < 0) | (values >= limits)
    if bad.any():
        env, branch = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(_range_message(name, env, branch, int(values[env, branch]), joint, nvec))


class ActionRangeFlag:
    """The range half of the action check where a host read would sync (an accelerator, a CUDA graph): the
    first out-of-range action is recorded in a device flag (tensor ops only, capturable) and
    :meth:`raise_if_set` reports it at the next sync point, as the NaN guard does
    (:mod:`sb3_her_ext.guard`). The out-of-range values are replaced by 0 so that no table is indexed out of
    bounds; the steps taken since are not to be trusted, and the error says so.

    :param device: the env's device.
    :param joint: codes or branch actions.
    :param name: the argument's name in error messages.
    :param nvec: choices per branch (the env's grid).
    """

    def __init__(self, device: torch.device | str, *, joint: bool, name: str = "actions",
                 nvec: tuple[int, ...] = ACTION_NVEC) -> None:
        self.joint = joint
        self.name = name
        self.nvec = tuple(int(n) for n in nvec)
        self.device = torch.device(device)
        #: ``[set, env, branch, value]`` of the first out-of-range action (set 0: none yet)
        self.first = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._limits = torch.tensor(_limits(joint, self.nvec), dtype=torch.int64, device=self.device)
        self._one = torch.ones((), dtype=torch.int64, device=self.device)

    def record(self, actions: torch.Tensor) -> torch.Tensor:
        """Record the first out-of-range value of ``actions`` (no sync) and return them with every such value
        replaced by 0.

        :param actions: ``[N, K]`` int64 actions on the flag's device.
        :return: ``[N, K]`` int64 actions, each in range.
        """
        bad = (actions < 0) | (actions >= self._limits)
        width = actions.shape[1]
        index = bad.reshape(-1).to(torch.int64).argmax()
        entry = torch.stack([self._one, index // width, index % width, actions.reshape(-1).take(index)])
        self.first.copy_(torch.where(bad.any() & (self.first[0] == 0), entry, self.first))
        return actions.masked_fill(bad, 0)

    def raise_if_set(self) -> None:
        """Read the flag (a sync) and raise ``ValueError`` naming the first out-of-range action (the flag is
        cleared, so the error is raised once)."""
        found, env, branch, value = (int(v) for v in self.first.tolist())
        if found:
            self.first.zero_()
            message = _range_message(self.name, env, branch, value, self.joint, self.nvec)
            raise ValueError(f"{message} (a tensor step on {self.device} took it and played 0 in its place; "
                             "found at the next sync point: the steps since are not to be trusted)")
