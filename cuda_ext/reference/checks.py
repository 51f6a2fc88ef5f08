"""Argument checks shared by the op references and their fake implementations.

Each raises ``ValueError`` naming the argument and its bad value, so a bad call fails at the op boundary
instead of deep inside torch. They read only metadata (dtype, shape, device): no host sync.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["check_same_device", "check_scalar", "check_tensor"]


def check_tensor(name: str, tensor: Tensor, dtype: torch.dtype, shape: tuple[int | None, ...]) -> None:
    """Raise ``ValueError`` unless ``tensor`` has ``dtype`` and ``shape`` (``None`` matches any size).

    :param name: the argument name used in the message.
    :param tensor: the tensor to check.
    :param dtype: the required dtype.
    :param shape: the required shape; ``None`` entries are free.
    """
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{name}={tensor!r} must be a Tensor")
    if tensor.dtype != dtype:
        raise ValueError(f"{name}.dtype={tensor.dtype} must be {dtype}")
    sizes_ok = tensor.dim() == len(shape) and all(
        s is None or s == t for s, t in zip(shape, tensor.shape, strict=True)
    )
    if not sizes_ok:
        want = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name}.shape={tuple(tensor.shape)} must be {want}")


def check_same_device(**tensors: Tensor) -> None:
    """Raise ``ValueError`` unless all ``tensors`` live on the device of the first one.

    :param tensors: the tensors by argument name; the first one sets the device.
    """
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first:
            raise ValueError(f"{name}.device={device} must match {first_name}.device={first}")


def check_scalar(name: str, value: float, low: float | None = None, high: float | None = None,
                 low_open: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number in ``[low, high]`` (``(low, high]`` with
    ``low_open``; a ``None`` bound is no bound). NaN and infinities are refused: every comparison with NaN is
    false, so a NaN threshold or exponent would silently switch a kernel's decisions off.

    :param name: the argument name used in the message.
    :param value: the scalar.
    :param low: the lower bound, or None.
    :param high: the upper bound, or None.
    :param low_open: exclude ``low`` itself.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name}={value} must be {'>' if low_open else '>='} {low}")
    if high is not None and value > high:
        raise ValueError(f"{name}={value} must be <= {high}")
