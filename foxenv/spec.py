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
"""

from __future__ import annotations

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

_NVEC = np.array(ACTION_NVEC, dtype=np.int64)


def _out_of_range(name: str, values: np.ndarray, action: Any, shape: tuple[int, ...]) -> ValueError:
    """The error naming the first action value outside its branch's range (``values`` is int64)."""
    index = tuple(int(i) for i in np.argwhere((values < 0) | (values >= _NVEC))[0])
    branch = index[-1]
    value = int(values[index])
    where = f"{name}={action!r}" if len(shape) == 1 else f"{name}[{', '.join(map(str, index))}]={value}"
    return ValueError(
        f"{where} out of range: {BRANCH_NAMES[branch]}={value} must lie in [0, {ACTION_NVEC[branch]})"
    )


def check_actions(
    action: Any, shape: tuple[int, ...], *, name: str = "action", check_range: bool = True
) -> np.ndarray | torch.Tensor:
    """Check actions against the contract: an integer dtype (no floats, no bools), exactly ``shape``
    (no flat or transposed batch is reshaped), and, with ``check_range``, every value in ``[0, nvec)``.

    :param action: a numpy array (or anything ``np.asarray`` takes) or a torch tensor on any device.
    :param shape: the expected shape: ``(4,)`` for one action, ``(B, 4)`` for a batch.
    :param name: the argument's name in error messages (``action`` or ``actions``).
    :param check_range: check the values too; for a tensor on an accelerator this is a host sync.
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
            if ((values < 0) | (values >= _NVEC)).any():
                raise _out_of_range(name, values, action, shape)
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
    if check_range and (array.min() < 0 or (array >= _NVEC).any()):
        raise _out_of_range(name, array, action, shape)
    return array


#: Number of joint actions: one code per combination of the branches, ``27 d + 9 m + 3 o + u``.
JOINT_ACTIONS: int = int(np.prod(ACTION_NVEC))


def check_action_tensor(actions: torch.Tensor, num_envs: int, *, joint: bool, name: str = "actions") -> (
    torch.Tensor
):
    """The host half of the action check of a tensor face: type, integer dtype and shape (tensor metadata:
    no host sync on any device). The values' range is :func:`check_action_values`' (or, where a host read
    would sync, :class:`ActionRangeFlag`'s).

    :param actions: ``[N, 4]`` branch actions, or with ``joint`` ``[N]`` / ``[N, 1]`` codes in
        ``[0, JOINT_ACTIONS)``.
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


def _limits(joint: bool) -> tuple[int, ...]:
    return (JOINT_ACTIONS,) if joint else ACTION_NVEC


def _range_message(name: str, env: int, branch: int, value: int, joint: bool) -> str:
    if joint:
        return f"{name}[{env}]={value} out of range: a joint code must lie in [0, {JOINT_ACTIONS})"
    return (f"{name}[{env}, {branch}]={value} out of range: {BRANCH_NAMES[branch]}={value} must lie in "
            f"[0, {ACTION_NVEC[branch]})")


def check_action_values(actions: torch.Tensor, *, joint: bool, name: str = "actions") -> None:
    """The range half of the action check, on the host (a read of ``actions``: free on the CPU).

    :param actions: ``[N, K]`` integer actions (:func:`check_action_tensor`'s result).
    :param joint: codes (``K`` 1) or branch actions (``K`` 4).
    :param name: the argument's name in error messages.
    :raises ValueError: naming the first value outside its range.
    """
    values = actions.detach().cpu().numpy().astype(np.int64, copy=False)
    limits = np.asarray(_limits(joint), dtype=np.int64)
    bad = (values < 0) | (values >= limits)
    if bad.any():
        env, branch = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(_range_message(name, env, branch, int(values[env, branch]), joint))


class ActionRangeFlag:
    """The range half of the action check where a host read would sync (an accelerator, a CUDA graph): the
    first out-of-range action is recorded in a device flag (tensor ops only, capturable) and
    :meth:`raise_if_set` reports it at the next sync point, as the NaN guard does
    (:mod:`sb3_her_ext.guard`). The out-of-range values are replaced by 0 so that no table is indexed out of
    bounds; the steps taken since are not to be trusted, and the error says so.

    :param device: the env's device.
    :param joint: codes or branch actions.
    :param name: the argument's name in error messages.
    """

    def __init__(self, device: torch.device | str, *, joint: bool, name: str = "actions") -> None:
        self.joint = joint
        self.name = name
        self.device = torch.device(device)
        #: ``[set, env, branch, value]`` of the first out-of-range action (set 0: none yet)
        self.first = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._limits = torch.tensor(_limits(joint), dtype=torch.int64, device=self.device)
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
            raise ValueError(f"{_range_message(self.name, env, branch, value, self.joint)} (a tensor step "
                             f"on {self.device} took it and played 0 in its place; found at the next sync "
                             "point: the steps since are not to be trusted)")
