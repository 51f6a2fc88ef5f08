"""BranchingIQN's argument checks, run before SB3 sees the arguments: each error names the argument."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv, unwrap_vec_normalize

from sb3_her_ext.branches import branch_action_dims
from sb3_her_ext.replay import HindsightConfig
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


#: real arguments -> the range they lie in ("[0, 1]", "(0, 1]") or a bound ("> 0", ">= 0")
REAL_RANGES: dict[str, str] = {
    "c51_alpha": "[0, 1]", "exploration_initial_eps": "[0, 1]", "exploration_final_eps": "[0, 1]",
    "exploration_fraction": "(0, 1]", "gamma": "[0, 1]", "tau": "(0, 1]", "max_grad_norm": "> 0",
    "vaccine_beta": "(0, 1]", "ensemble_bonus": ">= 0", "per_alpha": ">= 0",
}
#: integer arguments (whole floats accepted and passed on as ints) -> (least value, what an error says)
INTEGER_BOUNDS: dict[str, tuple[int, str]] = {
    "verbose": (0, ">= 0"), "stats_window_size": (1, ">= 1"), "vaccine_interval": (0, ">= 0 (0 = off)"),
    "diagnostics_interval": (1, "> 0"), "target_update_interval": (1, "> 0"), "buffer_size": (1, ">= 1"),
    "batch_size": (1, ">= 1"), "learning_starts": (0, ">= 0"), "gradient_steps": (-1, ">= -1"),
}
#: boolean arguments
BOOLS: tuple[str, ...] = ("nan_guard", "optimize_memory_usage", "compile_loss", "cuda_graph",
                          "counterfactual")


def _in_range(value: float, spec: str) -> bool:
    """Whether ``value`` lies in a :data:`REAL_RANGES` spec."""
    if spec[0] in "[(":
        low, high = (float(bound) for bound in spec[1:-1].split(","))
        return (low <= value if spec[0] == "[" else low < value) and value <= high
    return value > 0 if spec == "> 0" else value >= 0


def check_arguments(*, env: Any, learning_rate: Any, seed: Any, train_freq: Any, iqr_bonus: Any,
                    per_beta: Any, graph_collect: Any = None, device: Any = "auto", policy: Any = None,
                    policy_kwargs: Any = None, **arguments: Any) -> dict[str, Any]:
    """Check BranchingIQN's arguments; a ValueError names the argument and its value.

    :param arguments: the other arguments of ``BranchingIQN.__init__`` (those of :data:`REAL_RANGES`,
        :data:`INTEGER_BOUNDS` and :data:`BOOLS` are checked; the rest pass).
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
    for name in REAL_RANGES:
        check_real(name, arguments[name])
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
        raise ValueError(f"seed={seed!r} must be an integer or None")
    for name in ("verbose", "stats_window_size", *BOOLS[:2]):
        _check_one(name, arguments[name])
    reject_vec_normalize(env)
    for name, spec in REAL_RANGES.items():
        if not _in_range(arguments[name], spec):
            raise ValueError(f"{name}={arguments[name]} must {'lie in' if spec[0] in '[(' else 'be'} {spec}")
    for name in INTEGER_BOUNDS:
        _check_one(name, arguments[name])
    checked: dict[str, Any] = {name: int(arguments[name]) for name in INTEGER_BOUNDS}
    checked["seed"] = None if seed is None else int(seed)
    buffer_size, batch_size = checked["buffer_size"], checked["batch_size"]
    if buffer_size < batch_size:
        raise ValueError(f"buffer_size={buffer_size} must be >= batch_size={batch_size}")
    frequency = train_freq[0] if isinstance(train_freq, tuple) and len(train_freq) == 2 else train_freq
    if not is_whole(frequency) or frequency < 1:
        raise ValueError(f"train_freq={train_freq!r} must be an integer >= 1 or (integer >= 1, unit)")
    for name in BOOLS[2:]:
        _check_one(name, arguments[name])
    if graph_collect is not None and not isinstance(graph_collect, bool):
        raise ValueError(f"graph_collect={graph_collect!r} must be a bool or None")
    if graph_collect is True and not arguments["cuda_graph"]:
        raise ValueError("graph_collect=True needs cuda_graph=True (the captured block holds the gradient "
                         "steps)")
    checked["iqr_bonus_range"] = _pair(iqr_bonus, "iqr_bonus")
    checked["per_beta_range"] = _pair(per_beta, "per_beta")
    if not all(0.0 <= b <= 1.0 for b in checked["per_beta_range"]):
        raise ValueError(f"per_beta={per_beta} must lie in [0, 1]")
    if not all(b >= 0.0 for b in checked["iqr_bonus_range"]):
        raise ValueError(f"iqr_bonus={iqr_bonus} must be >= 0")
    return {name: checked[name] for name in (
        "buffer_size", "batch_size", "learning_starts", "gradient_steps", "target_update_interval",
        "diagnostics_interval", "vaccine_interval", "seed", "iqr_bonus_range", "per_beta_range")}


def _check_one(name: str, value: Any) -> None:
    """A bool of :data:`BOOLS` or a whole number of :data:`INTEGER_BOUNDS`, else a ValueError naming it."""
    if name in BOOLS:
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be a bool")
        return
    least, bound = INTEGER_BOUNDS[name]
    if not is_whole(value) or value < least:
        raise ValueError(f"{name}={value!r} must be an integer {bound}")


def resolve_hindsight(hindsight: bool | str | Mapping[str, Any] | HindsightConfig, env: VecEnv | None) -> (
    HindsightConfig | None
):
    """The replay buffer's hindsight config from the ``hindsight`` argument.

    :param hindsight: ``True`` (defaults), ``False`` (off), ``"auto"`` (on when the env publishes
        ``n_market_features``, the mark of the info contract hindsight reads, and its action has the
        branches hindsight relabels; a joint one-branch face has not), a dict of
        :class:`HindsightConfig` fields, or a config.
    :param env: the (vectorized) env, used by ``"auto"`` and for the fields a dict or ``True`` leaves
        out that the env publishes (``reward_scale``, ``magnitudes``, ``joint_nvec``: an action of joint
        codes, whose branches the relabels decode; ``"auto"`` leaves hindsight off there).
    :return: the config, or ``None`` when hindsight is off.
    """
    if isinstance(hindsight, HindsightConfig):
        return hindsight
    if isinstance(hindsight, bool):
        fields: Mapping[str, Any] | None = {} if hindsight else None
    elif isinstance(hindsight, str) and hindsight == "auto":
        relabels = max(HindsightConfig().direction_branch, HindsightConfig().magnitude_branch)
        fields = ({} if env is not None and env.has_attr("n_market_features")
                  and len(branch_action_dims(env.action_space)) > relabels else None)
    elif isinstance(hindsight, Mapping):
        known = {f.name for f in dataclasses.fields(HindsightConfig)}
        unknown = sorted(set(hindsight) - known)
        if unknown:
            raise ValueError(f"hindsight has unknown fields {unknown}; known fields are {sorted(known)}")
        fields = hindsight
    else:
        raise ValueError(f"hindsight={hindsight!r} must be True, False, 'auto', a dict or a HindsightConfig")
    if fields is None:
        return None
    from_env: dict[str, Any] = {}
    if env is not None and "reward_scale" not in fields and env.has_attr("reward_scale"):
        from_env["reward_scale"] = float(env.get_attr("reward_scale")[0])
    if env is not None and "magnitudes" not in fields and env.has_attr("magnitudes"):
        from_env["magnitudes"] = tuple(float(m) for m in env.get_attr("magnitudes")[0])
    joint_nvec = env.get_attr("joint_nvec")[0] if env is not None and env.has_attr("joint_nvec") else None
    if "joint_nvec" not in fields and joint_nvec is not None:
        from_env["joint_nvec"] = tuple(int(n) for n in joint_nvec)
    return HindsightConfig(**{**from_env, **fields})
