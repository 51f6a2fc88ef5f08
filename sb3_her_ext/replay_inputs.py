"""How :meth:`sb3_her_ext.replay.PrioritizedHindsightReplayBuffer.add` reads its inputs: numpy (SB3's path)
or tensors, SB3's list of per-env info dicts or a dict of ``[n_envs]`` tensors (the device env's), as rows on
the buffer's device; the functions take the buffer for its ``n_envs`` and ``device``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from sb3_her_ext.counterfactual import STATE_KEY

__all__ = ["counterfactual_states", "info_tensors", "to_rows"]

_TIMEOUT_KEY = "TimeLimit.truncated"


def _to_device(buffer: Any, value: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device=buffer.device, dtype=dtype)
    return torch.as_tensor(np.asarray(value), device=buffer.device).to(dtype)


def to_rows(buffer: Any, name: str, value: Any, dtype: torch.dtype, width: int | None) -> torch.Tensor:
    """``value`` as ``buffer.n_envs`` rows (``[n]``, or ``[n, width]``) of ``dtype`` on the buffer's device.

    :raises ValueError: naming ``name``, for another number of values.
    """
    tensor = _to_device(buffer, value, dtype)
    n = buffer.n_envs
    expected = n if width is None else n * width
    if tensor.numel() != expected:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}: expected {n} rows"
            + ("" if width is None else f" of {width} values")
        )
    return tensor.reshape(n) if width is None else tensor.reshape(n, width)


def info_tensors(buffer: Any, infos: Sequence[Mapping[str, Any]] | Mapping[str, Any],
             keys: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Gather ``keys`` as ``[n_envs]`` device tensors (``trade_closed`` bool, the others float32), and the
    timeout flags (None when the infos have none).

    SB3's list of per-env dicts is converted with one host-side comprehension per key (as SB3's own
    ``ReplayBuffer`` does for ``TimeLimit.truncated``); a dict of ``[n_envs]`` tensors is used as is, the
    float keys of another dtype converted together (one stack and one cast instead of one cast per key).
    """
    if isinstance(infos, Mapping):
        present = set(infos)
        missing = [k for k in keys if k not in present]
        if missing:
            raise ValueError(f"infos are missing keys {missing} that hindsight needs")
        out: dict[str, torch.Tensor] = {}
        pending: list[str] = []  # float tensors of another dtype: converted together
        for k in keys:
            value = infos[k]
            if k == "trade_closed" and isinstance(value, torch.Tensor) and value.dtype == torch.bool:
                out[k] = to_rows(buffer, f"infos[{k!r}]", value, torch.bool, None)
            elif k == "trade_closed":  # a number is true when nonzero as float32
                out[k] = to_rows(buffer, f"infos[{k!r}]", value, torch.float32, None) != 0
            elif isinstance(value, torch.Tensor) and value.dtype != torch.float32:
                pending.append(k)
            else:
                out[k] = to_rows(buffer, f"infos[{k!r}]", value, torch.float32, None)
        _convert_together(buffer, pending, infos, out)
        timeout = infos.get(_TIMEOUT_KEY)
    else:
        if len(infos) != buffer.n_envs:
            raise ValueError(f"infos has {len(infos)} entries: expected one per env ({buffer.n_envs})")
        missing = [k for k in keys if any(k not in info for info in infos)]
        if missing:
            raise ValueError(f"infos are missing keys {missing} that hindsight needs")
        out = {}
        if keys:
            table = np.array([[info[k] for k in keys] for info in infos], dtype=np.float64)
            values = torch.as_tensor(table, device=buffer.device).to(torch.float32)
            out = {k: values[:, j] for j, k in enumerate(keys)}
            if "trade_closed" in out:
                out["trade_closed"] = out["trade_closed"] != 0
        timeout = np.array([info.get(_TIMEOUT_KEY, False) for info in infos], dtype=bool)
    if timeout is not None:
        timeout = to_rows(buffer, f"infos[{_TIMEOUT_KEY!r}]", timeout, torch.bool, None)
    return out, timeout


def _convert_together(buffer: Any, keys: list[str], infos: Mapping[str, Any],
                  out: dict[str, torch.Tensor]) -> None:
    """Add ``keys`` (tensors, not float32) to ``out`` as float32 ``[n_envs]`` rows: the keys of one dtype
    stacked and cast once, each key a row of the result (the values of one cast per key)."""
    for dtype in dict.fromkeys(infos[k].dtype for k in keys):
        group = [k for k in keys if infos[k].dtype == dtype]
        rows = [to_rows(buffer, f"infos[{k!r}]", infos[k], dtype, None) for k in group]  # checks the shapes
        if len(rows) == 1:
            out[group[0]] = rows[0].to(torch.float32)
            continue
        for k, row in zip(group, torch.stack(rows).to(torch.float32), strict=True):
            out[k] = row


def counterfactual_states(buffer: Any,
                          infos: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> torch.Tensor:
    """The envs' pre-step states of a step (:data:`~sb3_her_ext.counterfactual.STATE_KEY`) as
    ``[n_envs, buffer.counterfactual_state_dim]`` float64 rows on the buffer's device.

    :param buffer: the buffer.
    :param infos: a dict holding an ``[n_envs, S]`` float64 tensor under the key, or SB3's list of per-env
        dicts each holding an ``[S]`` float64 array.
    :return: the states.
    :raises ValueError: naming the key, where it is missing or holds another dtype or shape.
    """
    dim = buffer.counterfactual_state_dim
    fix = (f"(counterfactual_state_dim={dim}): call the env's record_counterfactual_states(True) before it "
           "steps")
    if isinstance(infos, Mapping):
        if STATE_KEY not in infos:
            raise ValueError(f"infos lack {STATE_KEY!r} {fix}")
        value = infos[STATE_KEY]
    else:
        if len(infos) != buffer.n_envs:
            raise ValueError(f"infos has {len(infos)} entries: expected one per env ({buffer.n_envs})")
        missing = [i for i, info in enumerate(infos) if STATE_KEY not in info]
        if missing:
            raise ValueError(f"infos[{missing[0]}] lacks {STATE_KEY!r} {fix}")
        value = np.stack([np.asarray(info[STATE_KEY]) for info in infos])
    dtype = value.dtype
    if dtype not in (torch.float64, np.float64):  # a narrower float would not restore the state exactly
        raise ValueError(f"infos[{STATE_KEY!r}] dtype {dtype} must be float64")
    return to_rows(buffer, f"infos[{STATE_KEY!r}]", value, torch.float64, dim)
