"""BranchingIQN's argument checks, run before SB3 sees the arguments: each error names the argument."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import unwrap_vec_normalize

from sb3_her_ext.validation import (
    check_device,
    check_known_kwargs,
    check_learning_rate,
    check_real,
    is_whole,
)


def _pair(value: float | Sequence[float], field: str) -> tuple[float, float]:
    """A ``(start, end)`` pair from a number (constant) or a pair."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        return check_real(f"{field}[0]", value[0]), check_real(f"{field}[1]", value[1])
    if isinstance(value, str | bool) or not isinstance(value, int | float):
        raise ValueError(f"{field}={value!r} must be a number or a (start, end) pair")
    return check_real(field, value), check_real(field, value)


#: progress_remaining values at which a callable learning rate is checked at construction
_SCHEDULE_CHECKPOINTS: tuple[float, ...] = (1.0, 0.5, 0.0)


def check_learning_rate_schedule(learning_rate: Any) -> None:
    """A ValueError naming ``learning_rate`` unless it is a finite number > 0, or a callable whose values at
    progress 1, 0.5 and 0 are (each update checks its own value too).

    :param learning_rate: the ``learning_rate`` argument.
    """
    if not callable(learning_rate):
        check_learning_rate("learning_rate", learning_rate)
        return
    for progress in _SCHEDULE_CHECKPOINTS:
        check_learning_rate("learning_rate", learning_rate(progress), progress)


def reject_vec_normalize(env: Any) -> None:
    """A ValueError when ``env`` is (or wraps) SB3's ``VecNormalize``, which BranchingIQN does not support.

    :param env: the env given to the model (None: nothing to check).
    """
    if env is not None and not isinstance(env, str) and unwrap_vec_normalize(env) is not None:
        raise ValueError(
            "env is wrapped in VecNormalize, which BranchingIQN does not support (its replay buffer lives on "
            "the device and stores observations as the env gives them): normalise inside the env instead "
            "(PopArt already normalises the returns), or pass the env without VecNormalize"
        )


def check_arguments(
    *,
    env: Any,
    learning_rate: Any,
    buffer_size: Any,
    learning_starts: Any,
    batch_size: Any,
    tau: Any,
    gamma: Any,
    train_freq: Any,
    gradient_steps: Any,
    optimize_memory_usage: Any,
    target_update_interval: Any,
    exploration_fraction: Any,
    exploration_initial_eps: Any,
    exploration_final_eps: Any,
    max_grad_norm: Any,
    stats_window_size: Any,
    verbose: Any,
    seed: Any,
    c51_alpha: Any,
    iqr_bonus: Any,
    ensemble_bonus: Any,
    per_alpha: Any,
    per_beta: Any,
    vaccine_interval: Any,
    vaccine_beta: Any,
    diagnostics_interval: Any,
    compile_loss: Any,
    cuda_graph: Any,
    nan_guard: Any,
    graph_collect: Any = None,
    device: Any = "auto",
    policy: Any = None,
    policy_kwargs: Any = None,
    **_: Any,
) -> dict[str, Any]:
    """Check BranchingIQN's arguments; a ValueError names the argument and its value.

    :return: the integer arguments as ints (whole floats such as ``1e6`` are accepted), the seed as an int,
        and the ``(start, end)`` pairs ``iqr_bonus_range`` and ``per_beta_range``.
    """
    check_learning_rate_schedule(learning_rate)
    check_device("device", device)
    if policy == "MlpPolicy" or isinstance(policy, type):
        from sb3_her_ext.policy import BranchingIQNPolicy

        target = BranchingIQNPolicy if policy == "MlpPolicy" else policy
        check_known_kwargs("policy_kwargs", policy_kwargs, target,
                           skip=("observation_space", "action_space", "lr_schedule"))
    for field, number in (
        ("c51_alpha", c51_alpha),
        ("exploration_initial_eps", exploration_initial_eps),
        ("exploration_final_eps", exploration_final_eps),
        ("exploration_fraction", exploration_fraction),
        ("gamma", gamma),
        ("tau", tau),
        ("max_grad_norm", max_grad_norm),
        ("vaccine_beta", vaccine_beta),
        ("ensemble_bonus", ensemble_bonus),
        ("per_alpha", per_alpha),
    ):
        check_real(field, number)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
        raise ValueError(f"seed={seed!r} must be an integer or None")
    for field, value, least in (("verbose", verbose, 0), ("stats_window_size", stats_window_size, 1)):
        if not is_whole(value) or value < least:
            raise ValueError(f"{field}={value!r} must be an integer >= {least}")
    if not isinstance(nan_guard, bool):
        raise ValueError(f"nan_guard={nan_guard!r} must be a bool")
    if not isinstance(optimize_memory_usage, bool):
        raise ValueError(f"optimize_memory_usage={optimize_memory_usage!r} must be a bool")
    reject_vec_normalize(env)
    if not 0.0 <= c51_alpha <= 1.0:
        raise ValueError(f"c51_alpha={c51_alpha} must lie in [0, 1]")
    for field, value in (
        ("exploration_initial_eps", exploration_initial_eps),
        ("exploration_final_eps", exploration_final_eps),
    ):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{field}={value} must lie in [0, 1]")
    if not 0.0 < exploration_fraction <= 1.0:
        raise ValueError(f"exploration_fraction={exploration_fraction} must lie in (0, 1]")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must lie in [0, 1]")
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau={tau} must lie in (0, 1]")
    if not max_grad_norm > 0.0:
        raise ValueError(f"max_grad_norm={max_grad_norm} must be > 0")
    if not 0.0 < vaccine_beta <= 1.0:
        raise ValueError(f"vaccine_beta={vaccine_beta} must lie in (0, 1]")
    if not ensemble_bonus >= 0.0:
        raise ValueError(f"ensemble_bonus={ensemble_bonus} must be >= 0")
    if not per_alpha >= 0.0:
        raise ValueError(f"per_alpha={per_alpha} must be >= 0")
    if not is_whole(vaccine_interval) or vaccine_interval < 0:
        raise ValueError(f"vaccine_interval={vaccine_interval!r} must be an integer >= 0 (0 = off)")
    if not is_whole(diagnostics_interval) or diagnostics_interval <= 0:
        raise ValueError(f"diagnostics_interval={diagnostics_interval!r} must be an integer > 0")
    if not is_whole(target_update_interval) or target_update_interval <= 0:
        raise ValueError(f"target_update_interval={target_update_interval!r} must be an integer > 0")
    for field, value, least in (
        ("buffer_size", buffer_size, 1),
        ("batch_size", batch_size, 1),
        ("learning_starts", learning_starts, 0),
        ("gradient_steps", gradient_steps, -1),
    ):
        if not is_whole(value) or value < least:
            raise ValueError(f"{field}={value!r} must be an integer >= {least}")
    # whole floats (1e6) are accepted where an integer is needed, and passed on as ints
    buffer_size, batch_size = int(buffer_size), int(batch_size)
    learning_starts, gradient_steps = int(learning_starts), int(gradient_steps)
    target_update_interval, diagnostics_interval = int(target_update_interval), int(diagnostics_interval)
    vaccine_interval = int(vaccine_interval)
    if seed is not None:
        seed = int(seed)
    if buffer_size < batch_size:
        raise ValueError(f"buffer_size={buffer_size} must be >= batch_size={batch_size}")
    frequency = train_freq[0] if isinstance(train_freq, tuple) and len(train_freq) == 2 else train_freq
    if not is_whole(frequency) or frequency < 1:
        raise ValueError(f"train_freq={train_freq!r} must be an integer >= 1 or (integer >= 1, unit)")
    if not isinstance(compile_loss, bool):
        raise ValueError(f"compile_loss={compile_loss!r} must be a bool")
    if not isinstance(cuda_graph, bool):
        raise ValueError(f"cuda_graph={cuda_graph!r} must be a bool")
    if graph_collect is not None and not isinstance(graph_collect, bool):
        raise ValueError(f"graph_collect={graph_collect!r} must be a bool or None")
    if graph_collect is True and not cuda_graph:
        raise ValueError("graph_collect=True needs cuda_graph=True (the fused graph holds graphed gradient "
                         "steps)")
    iqr_bonus_range = _pair(iqr_bonus, "iqr_bonus")
    per_beta_range = _pair(per_beta, "per_beta")
    if not all(0.0 <= b <= 1.0 for b in per_beta_range):
        raise ValueError(f"per_beta={per_beta} must lie in [0, 1]")
    if not all(b >= 0.0 for b in iqr_bonus_range):
        raise ValueError(f"iqr_bonus={iqr_bonus} must be >= 0")

    return {
        "buffer_size": buffer_size,
        "batch_size": batch_size,
        "learning_starts": learning_starts,
        "gradient_steps": gradient_steps,
        "target_update_interval": target_update_interval,
        "diagnostics_interval": diagnostics_interval,
        "vaccine_interval": vaccine_interval,
        "seed": seed,
        "iqr_bonus_range": iqr_bonus_range,
        "per_beta_range": per_beta_range,
    }
