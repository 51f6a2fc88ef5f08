"""Small input checks shared by the package's modules (here so ``sb3_her_ext`` imports no env library)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from gymnasium import spaces


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number: an int, or a finite float without a fraction (never raises).

    :param value: anything.
    :return: True for ``3``, ``np.int64(3)``, ``3.0``; False for ``3.5``, NaN, inf, strings, bools.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())


def branch_action_dims(action_space: spaces.Space) -> list[int]:
    """Number of actions of each branch: ``[n]`` for ``Discrete(n)``, ``nvec`` for a 1-D ``MultiDiscrete``.

    The one check of the action space shared by the policy, the replay buffer and the algorithm.

    :param action_space: the action space; actions must start at 0.
    :return: one action count per branch.
    """
    if isinstance(action_space, spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"action_space.start={int(action_space.start)} must be 0")
        return [int(action_space.n)]
    shown = " ".join(str(action_space).split())
    if isinstance(action_space, spaces.MultiDiscrete):
        if action_space.nvec.ndim != 1:
            raise ValueError(f"action_space={shown} is not supported: "
                             f"action_space.nvec.shape={action_space.nvec.shape} must be 1-D")
        if np.any(action_space.start != 0):
            raise ValueError(f"action_space.start={action_space.start.tolist()} must be all 0")
        return [int(n) for n in action_space.nvec]
    raise ValueError(f"action_space={shown} is not supported: it must be MultiDiscrete (1-D) or Discrete")


def check_positive(name: str, value: Any) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is a positive int (bools refused).

    :param name: the argument's name, quoted in the error.
    :param value: the value to check.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")
