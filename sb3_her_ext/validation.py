"""Small input checks shared by the package's modules (here so ``sb3_her_ext`` imports no env library)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number: an int, or a finite float without a fraction (never raises).

    :param value: anything.
    :return: True for ``3``, ``np.int64(3)``, ``3.0``; False for ``3.5``, NaN, inf, strings, bools.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())


def check_positive(name: str, value: Any) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is a positive int (bools refused).

    :param name: the argument's name, quoted in the error.
    :param value: the value to check.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")


def check_real(name: str, value: Any) -> float:
    """``value`` as a float, or a ValueError naming ``name``: a real number, finite (bools and strings
    refused).

    :param name: the argument's name, quoted in the error.
    :param value: the value to check.
    :return: ``float(value)``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}={value!r} must be a number, not a {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be finite")
    return float(value)


def check_learning_rate(name: str, value: Any, progress: float | None = None) -> float:
    """A learning rate (one value of a schedule): a finite number > 0, else a ValueError naming ``name``.

    :param name: the argument's name, quoted in the error.
    :param value: the rate.
    :param progress: the progress remaining the schedule was evaluated at (None: a constant).
    :return: ``float(value)``.
    """
    where = "" if progress is None else f" (the schedule's value at progress_remaining={progress:g})"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}={value!r}{where} must be a number, not a {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r}{where} must be finite and > 0")
    return float(value)
