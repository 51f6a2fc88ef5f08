"""The in-memory state of a training run that ``model.save`` and ``save_replay_buffer`` leave out.

A resumed run continues bit for bit only if every random stream and counter that the next step reads is
where it was. Besides the model file (network, optimizer, PopArt, GradVac, SB3's counters, ``_last_obs``,
``_episode_num``, schedules' progress) and the replay buffer pickle (storage, priority tree, hindsight
state, the GPU sampler's Philox state), that is:

- the process-wide generators: Python's ``random``, numpy's global one, torch's CPU and CUDA generators
  (training draws from none of them; kept for callers' code; the replay buffer's generator is in its pickle);
- the model's own generators: ``BranchingIQN._generator`` (exploration and quantile fractions) and
  ``action_space``'s numpy generator (uniform actions before ``learning_starts``), both re-seeded by
  ``load``;
- the env: the book core's state tensors and generator (``BatchedLOB.state_dict``) and ``LOBVecEnv``'s
  Monitor-style episode statistics;
- the diagnostics accumulators of the interval in progress (so the next diagnostics line is the one an
  uninterrupted run writes, except for its time and rate).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch as th

#: Fields of ``TrainingDiagnostics`` that belong to the process, not to the run (kept from the fresh one).
_DIAGNOSTICS_LOCAL = ("path", "device", "_last_time")


def rng_state(model: Any) -> dict[str, Any]:
    """Every random generator a training step draws from.

    :param model: the algorithm (its ``_generator`` and ``action_space`` are read when present).
    :return: the states, for :func:`set_rng_state`.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": th.get_rng_state(),
        "cuda": th.cuda.get_rng_state_all() if th.cuda.is_available() and th.cuda.is_initialized() else None,
        "model_generator": None,
        "action_space": None,
    }
    generator = getattr(model, "_generator", None)
    if isinstance(generator, th.Generator):
        state["model_generator"] = generator.get_state()
    space = getattr(model, "action_space", None)
    if space is not None:
        state["action_space"] = space.np_random.bit_generator.state
    return state


def set_rng_state(model: Any, state: dict[str, Any]) -> None:
    """Put back the generators of :func:`rng_state`.

    :param model: the algorithm to restore.
    :param state: the states.
    """
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    th.set_rng_state(state["torch"])
    if state["cuda"] is not None and th.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][: th.cuda.device_count()]):
            th.cuda.set_rng_state(cuda_state, index)
    if state["model_generator"] is not None:
        model._generator.set_state(state["model_generator"])
    if state["action_space"] is not None:
        model.action_space.np_random.bit_generator.state = state["action_space"]


def env_state(env: Any) -> dict[str, Any]:
    """A :class:`~foxhunt.envs.LOBVecEnv`'s state: the book core and the episode statistics.

    :param env: the training env.
    :return: the state, for :func:`set_env_state`.
    """
    return env.state_dict()


def set_env_state(env: Any, state: dict[str, Any]) -> None:
    """Put back an :func:`env_state` (taken from an env of the same market, config and size).

    :param env: the training env.
    :param state: the state.
    :raises ValueError: when the state does not fit the env (the book core names what differs).
    """
    env.load_state_dict(state)


def diagnostics_state(model: Any) -> dict[str, Any]:
    """The diagnostics accumulators of the interval in progress.

    :param model: the algorithm (its ``diagnostics``).
    :return: the state, for :func:`set_diagnostics_state`.
    """
    diagnostics = getattr(model, "diagnostics", None)
    if diagnostics is None:
        return {}
    return {
        key: value.clone() if isinstance(value, th.Tensor) else _copy(value)
        for key, value in vars(diagnostics).items() if key not in _DIAGNOSTICS_LOCAL
    }


def set_diagnostics_state(model: Any, state: dict[str, Any]) -> None:
    """Put back a :func:`diagnostics_state` (after ``learn`` has restarted the diagnostics).

    :param model: the algorithm.
    :param state: the state.
    """
    diagnostics = getattr(model, "diagnostics", None)
    if diagnostics is None:
        return
    for key, value in state.items():
        if isinstance(value, th.Tensor):
            value = value.to(diagnostics.device)
        elif isinstance(value, dict):
            value = {k: v.to(diagnostics.device) if isinstance(v, th.Tensor) else v for k, v in value.items()}
        setattr(diagnostics, key, value)


def _copy(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, th.Tensor):
        return value.clone()
    return value


def training_state(model: Any) -> dict[str, Any]:
    """Everything :func:`rng_state`, :func:`env_state` and :func:`diagnostics_state` hold.

    :param model: the algorithm, with its env.
    :return: ``{"rng", "env", "diagnostics"}``.
    """
    return {
        "rng": rng_state(model),
        "env": env_state(model.get_env()),
        "diagnostics": diagnostics_state(model),
    }
