"""Small input checks shared by the package's modules (here so ``sb3_her_ext`` imports no env library)."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import torch as th


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


def check_ema(beta: Any, eps: Any) -> None:
    """Raise a ValueError unless ``beta`` (an EMA step) is in ``(0, 1]`` and ``eps`` (a guard) is ``> 0``."""
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta={beta} must be in (0, 1]")
    if not eps > 0.0:
        raise ValueError(f"eps={eps} must be > 0")


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


def check_device(name: str, value: Any) -> None:
    """A ValueError naming ``name`` unless ``value`` is ``"auto"``, a device torch can parse that is the CPU
    or an available CUDA device (``"gpu"`` used to reach torch's parser and its list of every device type).

    :param name: the argument's name, quoted in the error.
    :param value: a string or ``torch.device``.
    """
    import torch

    if isinstance(value, str) and value == "auto":
        return
    if not isinstance(value, str | torch.device):
        raise ValueError(f"{name}={value!r} must be 'auto', 'cpu' or 'cuda' (a string or torch.device)")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name}={value!r} must be auto, cpu or cuda (cuda:K for the K-th GPU)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={value!r}: no CUDA device is available (use 'cpu' or 'auto')")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{name}={value!r} must be auto, cpu or cuda (cuda:K for the K-th GPU)")


def check_known_kwargs(name: str, kwargs: Any, target: Any, skip: tuple[str, ...] = ()) -> None:
    """A ValueError naming ``name`` and the keys ``target`` does not take (instead of its ``TypeError``).

    :param name: the argument's name (``policy_kwargs``).
    :param kwargs: the keyword arguments (None: nothing to check).
    :param target: the callable they go to (a class: its ``__init__``).
    :param skip: parameters the caller fills itself.
    """
    import inspect

    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise ValueError(f"{name}={kwargs!r} must be a dict")
    parameters = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    known = sorted(set(parameters) - {"self", *skip})
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"{name} holds unknown keys {unknown}; {getattr(target, '__name__', target)} takes "
                         f"{known}")


def free_memory(device: str | th.device) -> int | None:
    """Free memory of ``device`` in bytes: a CUDA device's free memory, the host's ``MemAvailable``.

    :param device: the device.
    :return: bytes, or None where it cannot be read.
    """
    device = th.device(device)
    if device.type == "cuda":
        free, _ = th.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_allocation(name: str, value: Any, size: float, device: str | th.device) -> None:
    """Refuse, before allocating, ``size`` bytes that ``device`` does not have free.

    :param name: the argument that scales the allocation, named in the error.
    :param value: its value, quoted.
    :param size: the bytes the allocation needs.
    :param device: where it would live.
    :raises ValueError: ``name=value needs about X GB ... and device has Y GB free``.
    """
    free = free_memory(device)
    if free is not None and size > free:
        need, have = (f"{b / 1e9:,.3g}" if b < 1e12 else f"{b / 1e9:,.0f}" for b in (size, free))
        raise ValueError(f"{name}={value!r} needs about {need} GB of memory and {th.device(device)} has "
                         f"{have} GB free; lower {name}")


#: The attribute where an application records what a model and its replay buffer were made on (foxhunt's
#: fingerprint, :data:`foxhunt.fingerprint.ATTRIBUTE`): ``load_replay_buffer`` compares the two.
PROVENANCE_ATTRIBUTE = "foxhunt_fingerprint"
#: Parts of that record that say how an artefact is used, not what it was made on (not compared).
PROVENANCE_NOT_COMPARED = ("code", "evaluation")


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists): a record saved in a model's zip and one pickled
    with its buffer compare equal."""
    import json

    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _first_difference(old: Any, new: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first leaf path where ``old`` and ``new`` differ (a missing key counts as None), or None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            found = _first_difference(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    return None if old == new else (path, old, new)


def provenance_difference(model: Any, buffer: Any) -> tuple[str, Any, Any] | None:
    """Where the records of what ``model`` and ``buffer`` were made on differ (:data:`PROVENANCE_ATTRIBUTE`):
    ``(path, the buffer's value, the model's value)``; None when they agree or either carries none.

    :param model: an algorithm.
    :param buffer: a replay buffer.
    :return: the first difference, or None.
    """
    mine, theirs = getattr(model, PROVENANCE_ATTRIBUTE, None), getattr(buffer, PROVENANCE_ATTRIBUTE, None)
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return None
    compared = [{k: v for k, v in _plain(record).items() if k not in PROVENANCE_NOT_COMPARED}
                for record in (theirs, mine)]
    return _first_difference(*compared)
