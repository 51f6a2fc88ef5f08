"""Argument checks every foxenv face shares: a seed and a device, each refused in one line naming the field.

Without them a string seed failed deep inside SB3 (``str + int``), a bool was taken as 0 or 1,
``seed=2**64`` overflowed inside torch and ``device="gpu"`` reached torch's parser, whose error lists every
device type torch knows.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

#: Seeds lie in ``[0, SEED_LIMIT)``: what numpy's, SB3's and torch's seeding all take.
SEED_LIMIT = 2**32


def check_seed(value: Any, name: str = "seed", *, optional: bool = True) -> int | None:
    """``value`` as a seed: an integer (not a bool, a float or a string) in ``[0, 2**32)``.

    :param value: the seed.
    :param name: the argument's name in the error.
    :param optional: ``None`` is accepted (a random seed).
    :return: the seed as an ``int`` (or None).
    :raises ValueError: naming ``name`` and the value.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}={value!r} must be an integer in [0, 2**32), not a {type(value).__name__}")
    if not 0 <= int(value) < SEED_LIMIT:
        raise ValueError(f"{name}={value!r} must lie in [0, 2**32)")
    return int(value)


def check_device(value: Any, name: str = "device", *, available: bool = True) -> torch.device:
    """``value`` as a device foxenv runs on: the CPU, or a CUDA device that is there.

    :param value: ``"cpu"``, ``"cuda"``, ``"cuda:K"`` or a ``torch.device``.
    :param name: the argument's name in the error.
    :param available: also require a CUDA device to be there (False: the name alone is checked, for a
        setting written on one machine and run on another).
    :return: the device.
    :raises ValueError: naming ``name`` and the value (an unknown name, another device type, no GPU).
    """
    if not isinstance(value, str | torch.device):
        raise ValueError(f"{name}={value!r} must be 'cpu' or 'cuda' (a string or torch.device)")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name}={value!r} must be cpu or cuda (cuda:K for the K-th GPU)") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}={value!r} must be cpu or cuda (cuda:K for the K-th GPU)")
    if device.type == "cuda" and available:
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={value!r}: no CUDA device is available (use 'cpu')")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device
