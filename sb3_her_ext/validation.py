"""Small input checks shared by the package's modules (here so ``sb3_her_ext`` imports no env library)."""

from __future__ import annotations

import math
import numbers
from typing import Any


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number: an int, or a finite float without a fraction (never raises).

    :param value: anything.
    :return: True for ``3``, ``np.int64(3)``, ``3.0``; False for ``3.5``, NaN, inf, strings, bools.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())
