"""Before the first trial: the space fitted to the study's action face and trial budget, every value checked.

:func:`fit_space` leaves out what a trial cannot use and says so: on the joint action face the branched
parameters (:data:`tuning.space.BRANCHED_PARAMS`: per-branch exploration, the vaccine, hindsight);
``algorithm.target_update_interval`` is searched only up to a quarter of the trial's steps
(:data:`MIN_TARGET_UPDATES`), so that every trial updates its target network. :func:`check_space` then
builds BranchingIQN (on the CPU, with a replay buffer of one batch) at every corner of every parameter
(``low``, the highest reachable value, each choice, each constant) over the study's base config: a value no
trial can use is one ``ValueError`` naming the parameter and the value, before any trial runs, instead of a
study of failed trials.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import optuna

from foxhunt.runs import RunConfig, make_env
from tuning.space import Param, face_space, to_run_config

#: The searched target network interval (environment steps).
TARGET_UPDATE = "algorithm.target_update_interval"

#: A trial updates its target network at least this many times: ``algorithm.target_update_interval``
#: (environment steps) is searched up to ``steps // MIN_TARGET_UPDATES``.
MIN_TARGET_UPDATES = 4


def fit_space(space: Mapping[str, Param | Any], base: RunConfig) -> tuple[dict[str, Param | Any], list[str]]:
    """``space`` fitted to the base config's action face and the trial's steps.

    :param space: a space from :func:`tuning.space.load_space`.
    :param base: the study's base run config (its face and ``steps``).
    :return: ``(space, notes)``: the fitted space, and one line per change for the user.
    """
    face = base.resolved_action_face()
    fitted = face_space(space, face)
    dropped = [name for name, spec in space.items() if spec is not None and fitted.get(name) is None]
    notes = [f"not searched on the {face} action face, where they do nothing: {', '.join(dropped)}"
             for _ in [0] if dropped]
    spec = fitted.get(TARGET_UPDATE)
    bound = max(base.steps // MIN_TARGET_UPDATES, 1)
    if isinstance(spec, Param) and spec.type == "int" and spec.high > bound:
        why = f"a trial of {base.steps} steps updates its target network at least {MIN_TARGET_UPDATES} times"
        if spec.low >= bound:
            fitted[TARGET_UPDATE] = bound
            notes.append(f"{TARGET_UPDATE} fixed at {bound}, not searched in [{spec.low}, {spec.high}]: "
                         + why)
        else:
            step = int(spec.step or 1)
            high = spec.low + (bound - spec.low) // step * step
            fitted[TARGET_UPDATE] = dataclasses.replace(spec, high=high)
            notes.append(f"{TARGET_UPDATE} searched in [{spec.low}, {high}], not up to {spec.high}: {why}")
    return fitted, notes


def corners(spec: Param) -> list[Any]:
    """The extreme values a trial can draw from ``spec``: ``low`` and the highest reachable value, or each
    choice.

    :param spec: a searched parameter.
    :return: the values.
    """
    if spec.type == "categorical":
        return list(spec.choices)
    if spec.step is None or spec.log:
        return [spec.low, spec.high]
    return [spec.low, spec.low + (spec.high - spec.low) // spec.step * spec.step]


def to_distribution(spec: Param) -> optuna.distributions.BaseDistribution:
    """The Optuna distribution ``spec`` suggests from (``trial.suggest_*``'s).

    :param spec: a searched parameter.
    :return: the distribution.
    """
    if spec.type == "categorical":
        return optuna.distributions.CategoricalDistribution(list(spec.choices))
    if spec.type == "int":
        return optuna.distributions.IntDistribution(int(spec.low), int(spec.high), log=spec.log,
                                                    step=int(spec.step or 1))
    return optuna.distributions.FloatDistribution(spec.low, spec.high, log=spec.log, step=spec.step)


def check_space(space: Mapping[str, Param | Any], base: RunConfig) -> None:
    """Raise one ``ValueError`` naming the parameter and the value when a trial could draw a value that the
    run cannot use.

    :param space: a fitted space (:func:`fit_space`).
    :param base: the study's base run config.
    """
    from sb3_her_ext.algorithm import BranchingIQN

    candidates: list[tuple[str, Any]] = []
    for name, spec in space.items():
        if isinstance(spec, Param):
            for field in ("low", "high"):
                value = getattr(spec, field)
                if value is not None and not math.isfinite(value):
                    raise ValueError(f"space parameter {name!r}: {field}={value} must be finite")
            try:
                to_distribution(spec)
            except (ValueError, TypeError) as error:
                raise ValueError(f"space parameter {name!r}: {error}") from None
            candidates += [(name, value) for value in corners(spec)]
        elif spec is not None:
            candidates.append((name, spec))
    if not candidates:
        return
    # the spaces of the env the trials train on; built once, on the CPU (only its spaces are used)
    cpu = dataclasses.replace(base, device="cpu", device_loop=False, cuda_graph=False)
    env = make_env(cpu, base.seed, split=base.train_split())
    try:
        for name, value in candidates:
            try:
                config = to_run_config(base, {name: value})
                model_kwargs = config.resolved_model_kwargs()
                policy_kwargs = config.resolved_policy_kwargs()
                # BranchingIQN's argument checks with the run's own buffer size, then its policy and buffer
                # built with a buffer of one batch
                BranchingIQN("MlpPolicy", env, seed=base.seed, device="cpu", policy_kwargs=policy_kwargs,
                             **model_kwargs, _init_setup_model=False)
                batch = model_kwargs.get("batch_size", 32)
                BranchingIQN("MlpPolicy", env, seed=base.seed, device="cpu", policy_kwargs=policy_kwargs,
                             **{**model_kwargs, "buffer_size": batch})
            except (ValueError, TypeError, RuntimeError) as error:
                message = " ".join(str(error).split()) or type(error).__name__
                raise ValueError(f"space parameter {name!r}={value!r} cannot be used: {message}") from None
    finally:
        env.close()
