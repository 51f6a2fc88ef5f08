"""The search space of a study: fields of the run config tree by dotted name, declared in one place.

:data:`DEFAULT_SPACE` names every tunable parameter with its default distribution. Most are fields of
:class:`foxhunt.runs.RunConfig` by dotted name (``algorithm.learning_rate``, ``policy.popart``), and a space
file may search any other field the same way (``env.episode_length``, ``algorithm.tau``); a few set part of
a field: ``algorithm.exploration_mults.BRANCH``, ``algorithm.boltzmann_branches.BRANCH`` (on or off),
``algorithm.iqr_bonus.start``/``.end`` and ``policy.net_width`` (every layer of ``policy.net_arch``).

A space file (YAML or JSON, a mapping ``name -> spec``) overrides entries by name; a spec is one of::

    algorithm.learning_rate: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
    algorithm.target_update_interval: {type: int, low: 500, high: 5000, step: 500}
    algorithm.batch_size: {type: categorical, choices: [32, 64, 128]}
    algorithm.gamma: 0.99          # a constant: fixed, not searched
    policy.net_width: null         # not searched: the preset applies

The names of earlier versions (``learning_rate``, ``net_width``, ``exploration_mult_order``, ...) are read as
their dotted names (:data:`ALIASES`). A name that is neither raises ``ValueError`` naming it.
:func:`to_run_config` turns a trial's values into a :class:`~foxhunt.runs.RunConfig`.

On the joint action face (``RunConfig.action_face="joint"``: one branch of 81 joint actions) the
parameters of the four branches, the vaccine (which stratifies by a branch) and hindsight
(:data:`BRANCHED_PARAMS`) do not apply: :func:`suggest` given that face samples none of them
(:func:`face_space`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from foxhunt import presets
from foxhunt.runs import RunConfig, field_names, resolve_action_face

_SPEC_KEYS = {"type", "low", "high", "log", "step", "choices"}
_TYPES = ("float", "int", "categorical")


@dataclass(frozen=True)
class Param:
    """One searched parameter: an Optuna distribution by its ``suggest_*`` arguments.

    :param type: ``"float"``, ``"int"`` or ``"categorical"``.
    :param low: lowest value (float and int).
    :param high: highest value (float and int).
    :param log: sample on a log scale (float and int).
    :param step: grid step (float and int; ``None``: continuous float, step 1 for int).
    :param choices: the values of a categorical parameter.
    """

    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] | None = None

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        """The trial's value of this parameter.

        :param trial: the Optuna trial.
        :param name: the parameter's name.
        :return: the suggested value.
        """
        if self.type == "float":
            return trial.suggest_float(name, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(
                name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return trial.suggest_categorical(name, list(self.choices))


def _float(low: float, high: float, log: bool = False) -> Param:
    return Param("float", low, high, log=log)


def _int(low: int, high: int, log: bool = False) -> Param:
    return Param("int", low, high, log=log)


def _choice(*choices: Any) -> Param:
    return Param("categorical", choices=tuple(choices))


#: Every tunable parameter and its default distribution (a constant value fixes a parameter).
DEFAULT_SPACE: dict[str, Param | Any] = {
    # BranchingIQN (DQN's names)
    "algorithm.learning_rate": _float(1e-5, 3e-3, log=True),
    "algorithm.gamma": _choice(0.9, 0.95, 0.98, 0.99, 0.995),
    "algorithm.batch_size": _choice(32, 64, 128, 256),
    "algorithm.train_freq": _choice(1, 2, 4, 8),
    "algorithm.gradient_steps": _choice(1, 2, 4),
    "algorithm.target_update_interval": _int(250, 10_000, log=True),
    "algorithm.exploration_fraction": _float(0.05, 0.5),
    "algorithm.exploration_final_eps": _float(0.01, 0.2, log=True),
    # per-branch ε multipliers and Boltzmann exploration (foxenv's branches)
    **{f"algorithm.exploration_mults.{name}": _float(0.5, 3.0) for name in presets.BRANCH_NAMES},
    **{f"algorithm.boltzmann_branches.{name}": _choice(False, True) for name in presets.BRANCH_NAMES},
    # optimism bonuses: iqr_bonus anneals linearly from start to end over training
    "algorithm.iqr_bonus.start": _float(0.0, 1.0),
    "algorithm.iqr_bonus.end": _float(0.0, 0.2),
    "algorithm.ensemble_bonus": _float(0.0, 1.0),
    "algorithm.c51_alpha": _float(0.0, 1.0),
    "algorithm.vaccine_interval": _choice(0, 1, 5, 20),
    # policy
    "policy.popart": _choice(True, False),
    "policy.net_width": _choice(32, 64, 128, 256),
    # hindsight replay (RunConfig.hindsight: on or off)
    "hindsight": _choice(True, False),
}
#: The parameters that set part of a field (the others are fields of the config tree by dotted name).
PART_PARAMS: tuple[str, ...] = tuple(name for name in DEFAULT_SPACE if name not in field_names())

#: Parameters that apply to the branched action face only: the per-branch exploration, the vaccine (which
#: stratifies by a branch's three values) and hindsight (which relabels the direction and magnitude
#: branches).
BRANCHED_PARAMS: tuple[str, ...] = (
    *(f"algorithm.exploration_mults.{name}" for name in presets.BRANCH_NAMES),
    *(f"algorithm.boltzmann_branches.{name}" for name in presets.BRANCH_NAMES),
    "algorithm.vaccine_interval",
    "hindsight",
)

#: The names of earlier versions' space files -> their dotted names.
ALIASES: dict[str, str] = {
    **{name.split(".")[-1]: name for name in DEFAULT_SPACE if name.startswith(("algorithm.", "policy."))
       and name.count(".") == 1},
    **{f"exploration_mult_{b}": f"algorithm.exploration_mults.{b}" for b in presets.BRANCH_NAMES},
    **{f"boltzmann_{b}": f"algorithm.boltzmann_branches.{b}" for b in presets.BRANCH_NAMES},
    "iqr_bonus_start": "algorithm.iqr_bonus.start",
    "iqr_bonus_end": "algorithm.iqr_bonus.end",
}


def _known(name: str, where: str) -> str:
    """The dotted name of a space parameter (an alias resolved); ``ValueError`` naming an unknown one."""
    name = ALIASES.get(name, name)
    if name not in DEFAULT_SPACE and name not in field_names():
        raise ValueError(f"{where}: unknown parameter {name!r}; known parameters are {sorted(DEFAULT_SPACE)} "
                         "and any RunConfig field by dotted name")
    return name


def parse_param(name: str, spec: Any) -> Param | Any:
    """One entry of a space file: a spec mapping becomes a :class:`Param`; a constant or ``None`` stays.

    :param name: the parameter's name (quoted in errors).
    :param spec: a mapping with ``type`` and its bounds or choices, a constant, or ``None``.
    :return: the parameter, or the constant.
    """
    if not isinstance(spec, Mapping):
        if isinstance(spec, list | dict):
            raise ValueError(f"space parameter {name!r}: {spec!r} must be a spec mapping or a constant")
        return spec
    if set(spec) == {"name", "attributes"}:  # Optuna's distribution JSON (distribution_to_json)
        return param_of_distribution(name, spec)
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise ValueError(
            f"space parameter {name!r}: unknown spec keys {unknown}; known keys are {sorted(_SPEC_KEYS)}"
        )
    kind = spec.get("type")
    if kind not in _TYPES:
        raise ValueError(f"space parameter {name!r}: type={kind!r} must be one of {list(_TYPES)}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"space parameter {name!r}: choices={choices!r} must be a non-empty list")
        extra = sorted(set(spec) - {"type", "choices"})
        if extra:
            raise ValueError(f"space parameter {name!r}: a categorical takes only choices, not {extra}")
        return Param("categorical", choices=tuple(choices))
    if "choices" in spec:
        raise ValueError(f"space parameter {name!r}: choices belong to type categorical, not {kind}")
    low, high = spec.get("low"), spec.get("high")
    for field, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"space parameter {name!r}: {field}={value!r} must be a number")
    if not low < high:
        raise ValueError(f"space parameter {name!r}: low={low} must be < high={high}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"space parameter {name!r}: log={log!r} must be true or false")
    if log and low <= 0:
        raise ValueError(f"space parameter {name!r}: log=true needs low > 0, got low={low}")
    step = spec.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int | float) or step <= 0):
        raise ValueError(f"space parameter {name!r}: step={step!r} must be a number > 0")
    if log and step is not None:
        raise ValueError(f"space parameter {name!r}: log and step cannot be combined")
    if kind == "int":
        for field, value in (("low", low), ("high", high), ("step", step)):
            if value is not None and int(value) != value:
                raise ValueError(
                    f"space parameter {name!r}: {field}={value!r} must be an integer for type int"
                )
    return Param(
        kind,
        float(low) if kind == "float" else int(low),
        float(high) if kind == "float" else int(high),
        log=log,
        step=step,
    )


def param_of_distribution(name: str, spec: Mapping[str, Any]) -> Param:
    """A space file's entry in Optuna's distribution JSON (``{"name": "FloatDistribution", "attributes":
    {...}}``, as ``optuna.distributions.distribution_to_json`` writes it and the study records its space).

    :param name: the parameter's name (quoted in errors).
    :param spec: the entry.
    :return: the parameter.
    """
    try:
        distribution = optuna.distributions.json_to_distribution(json.dumps(spec))
    except Exception as error:  # optuna raises ValueError, KeyError, TypeError on a malformed entry
        raise ValueError(f"space parameter {name!r}: {dict(spec)!r} is not an Optuna distribution: "
                         f"{type(error).__name__}: {error}") from None
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return Param("categorical", choices=tuple(distribution.choices))
    kind = "int" if isinstance(distribution, optuna.distributions.IntDistribution) else "float"
    step = None if distribution.step in (None, 1) and kind == "int" else distribution.step
    return parse_param(name, {"type": kind, "low": distribution.low, "high": distribution.high,
                              "log": distribution.log, **({"step": step} if step is not None else {})})


def load_space(path: str | Path | None = None) -> dict[str, Param | Any]:
    """The default space with a YAML or JSON file's entries replacing those of the same name.

    :param path: a ``.yaml``/``.yml``/``.json`` file holding a mapping ``name -> spec``; ``None``: the
        default space.
    :return: the space, ``name -> Param`` (searched), a constant (fixed) or ``None`` (preset).
    """
    space = dict(DEFAULT_SPACE)
    if path is None:
        return space
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"space file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix.lower() == ".json":
            entries = json.loads(text)
        else:
            import yaml

            entries = yaml.safe_load(text)
    except Exception as error:  # yaml and json raise their own error classes
        raise ValueError(f"space file {str(path)!r} is not valid YAML/JSON: {error}") from None
    if entries is None:
        entries = {}
    if not isinstance(entries, dict):
        raise ValueError(
            f"space file {str(path)!r} must hold a mapping name -> spec, got {type(entries).__name__}"
        )
    for name, spec in entries.items():
        space[_known(name, f"space file {str(path)!r}")] = parse_param(name, spec)
    return space


def face_space(space: Mapping[str, Param | Any], action_face: str | None) -> dict[str, Param | Any]:
    """``space`` for an action face: on the joint face :data:`BRANCHED_PARAMS` are not searched (``None``).

    :param space: a space from :func:`load_space`.
    :param action_face: ``"branched"``, ``"joint"`` or ``None`` (:data:`foxhunt.presets.ACTION_FACE`).
    :return: the space (a copy).
    :raises ValueError: naming the parameter for ``hindsight`` fixed on with the joint face.
    """
    face = resolve_action_face(action_face)
    space = dict(space)
    if face == "joint":
        if space.get("hindsight") is True:
            raise ValueError("space parameter 'hindsight': true cannot be used with action_face='joint' "
                             "(hindsight relabels the branches the joint face does not have)")
        space.update(dict.fromkeys(name for name in BRANCHED_PARAMS if name in space))
    return space


def suggest(trial: optuna.Trial, space: Mapping[str, Param | Any],
            action_face: str | None = None) -> dict[str, Any]:
    """The trial's values of every parameter of ``space`` (constants included; ``None`` left out).

    On the joint action face no parameter of :data:`BRANCHED_PARAMS` is suggested (:func:`face_space`).

    :param trial: the Optuna trial.
    :param space: a space from :func:`load_space`.
    :param action_face: the face of the trial's runs (the base config's
        ``RunConfig.resolved_action_face()``); ``None``: :data:`foxhunt.presets.ACTION_FACE`.
    :return: ``name -> value``.
    """
    space = face_space(space, action_face)
    return {name: spec.suggest(trial, name) if isinstance(spec, Param) else spec
            for name, spec in space.items() if spec is not None}


def to_run_config(base: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    """``base`` with a trial's parameter values applied (:meth:`RunConfig.with_values`).

    :param base: the study's base config (data, steps, device, seed, and any settings of its own).
    :param values: ``name -> value`` from :func:`suggest` (dotted names, or the names of :data:`ALIASES`).
    :return: the trial's run config.
    """
    values = {_known(name, "space values"): value for name, value in values.items()}
    branched = sorted(set(values) & set(BRANCHED_PARAMS) - {"algorithm.vaccine_interval"})
    if branched and base.resolved_action_face() == "joint":
        raise ValueError(
            f"space parameter(s) {branched} apply to the branched action face, and the base config has "
            "action_face='joint' (suggest them with suggest(..., action_face='joint'), which leaves them out)"
        )
    fields = {name: value for name, value in values.items() if name not in PART_PARAMS}
    algorithm, policy = base.resolved_model_kwargs(), base.resolved_policy_kwargs()
    mults = {b: values[f"algorithm.exploration_mults.{b}"] for b in presets.BRANCH_NAMES
             if f"algorithm.exploration_mults.{b}" in values}
    if mults:
        fields["algorithm.exploration_mults"] = {**presets.EXPLORATION_MULTS,
                                                 **algorithm.get("exploration_mults", {}), **mults}
    flags = {b: values[f"algorithm.boltzmann_branches.{b}"] for b in presets.BRANCH_NAMES
             if f"algorithm.boltzmann_branches.{b}" in values}
    if flags:
        current = algorithm.get("boltzmann_branches", presets.BOLTZMANN_BRANCHES)
        fields["algorithm.boltzmann_branches"] = [b for b in presets.BRANCH_NAMES
                                                  if flags.get(b, b in current)]
    if "algorithm.iqr_bonus.start" in values or "algorithm.iqr_bonus.end" in values:
        bonus = base.algorithm.iqr_bonus
        start, end = (0.3, 0.05) if bonus is None else bonus if isinstance(bonus, list) else (bonus, bonus)
        fields["algorithm.iqr_bonus"] = [float(values.get("algorithm.iqr_bonus.start", start)),
                                         float(values.get("algorithm.iqr_bonus.end", end))]
    if "policy.net_width" in values:
        fields["policy.net_arch"] = [int(values["policy.net_width"])] * len(policy["net_arch"])
    return base.with_values(fields)
