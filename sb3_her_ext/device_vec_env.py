"""The device vector env protocol: what :mod:`sb3_her_ext.collect` needs of an env to run on the device.

A device vector env is an SB3 ``VecEnv`` (so SB3's setup, ``evaluate_policy`` and ``save``/``load`` keep
working through its numpy face) that also steps on torch tensors on its own device, with no host copy
and no host sync:

* :meth:`DeviceVecEnv.current_obs`: ``[N, D]`` float32 observations after the last reset or step (of
  either face);
* :meth:`DeviceVecEnv.step_tensors`: one vector step on ``[N, NB]`` int64 actions, with same-step
  autoreset, returning a :class:`DeviceStep`.

Duck-typed: ``sb3_her_ext`` never imports an env package; ``foxhunt.device_lob_env.DeviceLOBVecEnv`` is the
foxenv implementation. Test with :func:`is_device_vec_env`, not ``isinstance`` alone: SB3's
``VecEnvWrapper`` forwards unknown attributes to the env it wraps, so a ``VecNormalize`` around a device env
would pass ``isinstance`` while its tensor face would bypass the wrapper.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch

#: Info key of the timeout flag (SB3's name): ``truncated and not terminated``.
TIMEOUT_KEY = "TimeLimit.truncated"


class DeviceStep(NamedTuple):
    """One vector step of a :class:`DeviceVecEnv`: every field a tensor on the env's device.

    :param obs: ``[N, D]`` float32 observations to act on next: a finished env's is already the first
        observation of its next episode.
    :param reward: ``[N]`` float32 rewards of the step.
    :param done: ``[N]`` bool, the episode ended (terminated or truncated).
    :param final_obs: ``[N, D]`` float32 observations the step produced before any reset (the transition's
        next observation; equal to ``obs`` where not ``done``).
    :param infos: ``{key: [N] tensor}`` per-env info of the step before any reset, with
        :data:`TIMEOUT_KEY` (bool) marking timeouts: the replay buffer's tensor path.
    :param episode_return: ``[N]`` float64 return of the episode that ended (valid where ``done``).
    :param episode_length: ``[N]`` int64 length of the episode that ended (valid where ``done``).
    """

    obs: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    final_obs: torch.Tensor
    infos: dict[str, torch.Tensor]
    episode_return: torch.Tensor
    episode_length: torch.Tensor


@runtime_checkable
class DeviceVecEnv(Protocol):
    """An SB3 ``VecEnv`` that also steps on device tensors (see the module docstring).

    :ivar num_envs: number of envs ``N``.
    :ivar device: the device of every tensor the env takes and returns.
    """

    num_envs: int
    device: torch.device

    def current_obs(self) -> torch.Tensor:
        """``[N, D]`` float32 observations after the last ``reset``, ``step`` or :meth:`step_tensors`.

        :return: a tensor on :attr:`device` (not to be modified in place).
        """
        ...

    def step_tensors(self, actions: torch.Tensor) -> DeviceStep:
        """Step every env on ``actions`` and reset the finished ones in the same step (no host sync on an
        accelerator).

        :param actions: ``[N, NB]`` int64 actions on :attr:`device`.
        :return: the step's tensors.
        """
        ...


def is_device_vec_env(env: object) -> bool:
    """Whether ``env`` itself implements :class:`DeviceVecEnv`: the protocol's members present and its methods
    defined by ``env``'s class (a wrapper that forwards attributes to a device env is not one).

    :param env: any env.
    :return: True for a device vector env.
    """
    return isinstance(env, DeviceVecEnv) and all(
        callable(getattr(type(env), name, None)) for name in ("current_obs", "step_tensors")
    )
