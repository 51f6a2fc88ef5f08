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
from :class:`~foxenv.gym_env.LOBEnv`). :func:`check_actions` is the one action check every face applies.
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
