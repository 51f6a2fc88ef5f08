"""Argument checks shared by the op references and their fake implementations.

Each raises ``ValueError`` naming the argument and its bad value, so a bad call fails at the op boundary
instead of deep inside torch. They read only metadata (dtype, shape, device): no host sync.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_same_device", "check_tensor"]


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
