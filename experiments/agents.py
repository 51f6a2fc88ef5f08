"""Agents by name: an agent is an algorithm name and the settings it changes over the experiment's shared
:class:`~foxhunt.runs.RunConfig`.

* ``iqn``: BranchingIQN with foxhunt's presets on the branched face, hindsight on; ``iqn_joint``: the joint
  face (one branch of the 81 joint codes; the presets drop the per-branch settings, hindsight and the
  vaccine); ``iqn_fast``: the joint face with ``foxhunt train --recipe fast``'s algorithm and policy
  settings (the recipe's book count is the experiment's ``--n-envs``); ``iqn_lean``: every feature of
  :data:`LEAN_OFF` off; ``iqn-no_<feature>``: the presets with one feature of :data:`FEATURES` off;
  ``iqn_lean+<feature>``: lean with one feature back on;
* ``dqn``, ``qrdqn``: SB3 DQN and sb3-contrib QR-DQN (the ``bench`` extra) on the joint face, with the
  arguments they share with BranchingIQN taken from the same config (:data:`SHARED_DQN_KWARGS`);
* custom agents (``--agent-kwargs NAME=JSON``): a known agent with more model and policy arguments, kept in
  a :class:`Roster` (one per command).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from foxenv import spec
from foxhunt.presets import RECIPES

#: The algorithms an agent can name.
ALGORITHMS: tuple[str, ...] = ("iqn", "dqn", "qrdqn")
#: Each BranchingIQN plan feature and the overrides that switch it off: ``(model kwargs, policy kwargs)``.
FEATURES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "hindsight": ({"hindsight": False}, {}),
    "ensemble": ({}, {"n_ensemble": 1}),
    "popart": ({}, {"popart": False}),
    "iqr_bonus": ({"iqr_bonus": 0.0}, {}),
    "ensemble_bonus": ({"ensemble_bonus": 0.0}, {}),
    "eps_mults": ({"exploration_mults": {name: 1.0 for name in spec.BRANCH_NAMES}}, {}),
    "boltzmann": ({"boltzmann_branches": []}, {}),
    "vaccine": ({"vaccine_interval": 0}, {}),
    "c51": ({"c51_alpha": 0.0}, {}),
    "bottlenecks": ({}, {"bottleneck_dims": {name: 64 for name in spec.BRANCH_NAMES}}),
    "per": ({"per_alpha": 0.0}, {}),
}
#: Features the lean configuration switches off (all but prioritized replay).
LEAN_OFF: tuple[str, ...] = tuple(name for name in FEATURES if name != "per")
#: Agents trained when ``--agents`` is not given.
DEFAULT_AGENTS: tuple[str, ...] = ("iqn", "iqn_lean", "dqn", "qrdqn")
#: Arguments BranchingIQN shares with SB3 DQN / QR-DQN (same name, same meaning).
SHARED_DQN_KWARGS = ("learning_rate", "buffer_size", "learning_starts", "batch_size", "gamma", "train_freq",
                     "gradient_steps", "target_update_interval", "exploration_fraction",
                     "exploration_final_eps", "tau", "max_grad_norm")
#: Keys of a custom agent's JSON definition.
DEFINITION_KEYS = ("base", "model", "policy")
#: What a folder name and a table row can hold ("/" separates a run's agent from its seed).
_NAME = re.compile(r"[A-Za-z0-9_.+\-]+")
#: Arguments the experiment sets (the env, the seed, the device, ...), not an agent's to choose.
_RESERVED = {"self", "policy", "env", "seed", "device", "policy_kwargs", "diagnostics_path",
             "tensorboard_log", "_init_setup_model", "observation_space", "action_space", "lr_schedule",
             "n_market_features", "branch_names"}
#: Arguments that take a Python class, which JSON cannot give.
_CLASS_VALUED = {"activation_fn", "optimizer_class", "features_extractor_class", "replay_buffer_class"}


@dataclass(frozen=True)
class Agent:
    """One agent: an algorithm and what it changes over the shared config.

    :param name: its name in tables and folders.
    :param algorithm: one of :data:`ALGORITHMS`.
    :param model: model arguments over the config's (BranchingIQN: ``RunConfig`` model settings, with
        ``hindsight``; DQN / QR-DQN: their own arguments, over :data:`SHARED_DQN_KWARGS` of the config).
    :param policy: policy arguments, likewise.
    :param action_face: BranchingIQN's face, ``"branched"`` or ``"joint"`` (the peers act on the joint one).
    :param base: a custom agent's base agent; None for the built-in ones.
    """

    name: str
    algorithm: str = "iqn"
    model: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    action_face: str = "branched"
    base: str | None = None

    def record(self) -> dict[str, Any]:
        """The agent as JSON-able values (what a run folder records and ``--reuse`` compares)."""
        return json.loads(json.dumps(vars(self)))


def _features_off(features: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    model: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    for feature in features:
        model.update(FEATURES[feature][0])
        policy.update(FEATURES[feature][1])
    return model, policy


def _recipe_part(recipe: str, section: str) -> dict[str, Any]:
    """The fields of ``foxhunt train --recipe`` ``recipe`` in one section (``"algorithm."``), bare-named."""
    return {key.removeprefix(section): value for key, value in RECIPES[recipe].items()
            if key.startswith(section)}


def builtin_agent(name: str) -> Agent | None:
    """The built-in agent of that name (see the module docstring), or None."""
    if name in ("dqn", "qrdqn"):
        return Agent(name, name, action_face="joint")
    if name == "iqn":
        return Agent(name, model={"hindsight": True})
    if name == "iqn_joint":
        return Agent(name, action_face="joint")
    if name == "iqn_fast":
        return Agent(name, model=_recipe_part("fast", "algorithm."), policy=_recipe_part("fast", "policy."),
                     action_face="joint")
    if name == "iqn_lean":
        return Agent(name, "iqn", *_features_off(LEAN_OFF))
    feature = name.removeprefix("iqn-no_")
    if name.startswith("iqn-no_") and feature in FEATURES:
        model, policy = _features_off([feature])
        return Agent(name, "iqn", {"hindsight": True, **model}, policy)
    feature = name.removeprefix("iqn_lean+")
    if name.startswith("iqn_lean+") and feature in LEAN_OFF:
        model, policy = _features_off(f for f in LEAN_OFF if f != feature)
        return Agent(name, "iqn", {**model, "hindsight": model.get("hindsight", True)}, policy)
    return None


def ablation_agents() -> list[str]:
    """``iqn-no_<feature>`` for every feature: the presets with one feature off."""
    return [f"iqn-no_{feature}" for feature in FEATURES]


def addback_agents() -> list[str]:
    """``iqn_lean+<feature>``: the lean configuration with one feature back on."""
    return [f"iqn_lean+{feature}" for feature in LEAN_OFF]


def algorithm_classes(algorithm: str) -> tuple[type, type]:
    """The model and policy classes of an algorithm name."""
    if algorithm == "iqn":
        from sb3_her_ext.algorithm import BranchingIQN

        return BranchingIQN, BranchingIQN.policy_aliases["MlpPolicy"]
    if algorithm == "dqn":
        from stable_baselines3 import DQN

        return DQN, DQN.policy_aliases["MlpPolicy"]
    if algorithm == "qrdqn":
        try:
            from sb3_contrib import QRDQN
        except ImportError:
            raise ValueError("agent 'qrdqn' needs sb3-contrib: pip install -e '.[bench]'") from None
        return QRDQN, QRDQN.policy_aliases["MlpPolicy"]
    raise ValueError(f"algorithm={algorithm!r} must be one of {ALGORITHMS}")


def _check_keys(where: str, given: Mapping[str, Any], cls: type, extra: Iterable[str] = ()) -> None:
    """A ValueError naming ``where.key`` for a key ``cls`` does not take (or that the experiment sets)."""
    accepted = (set(inspect.signature(cls.__init__).parameters) | set(extra)) - _RESERVED - _CLASS_VALUED
    for key in given:
        if key in _CLASS_VALUED:
            raise ValueError(f"{where}.{key}: takes a Python class, which a JSON definition cannot give")
        if key not in accepted:
            raise ValueError(f"{where}.{key} is not an argument of {cls.__name__} that an agent may set; "
                             f"known: {', '.join(sorted(accepted))}")


class Roster:
    """The agents a command knows: the built-in ones and the custom ones it defined, in order."""

    def __init__(self, definitions: Iterable[str] = ()) -> None:
        self.custom: dict[str, Agent] = {}
        for text in definitions:
            self.parse(text)

    def get(self, name: str) -> Agent:
        """The agent of that name.

        :raises ValueError: naming the agent when the name is unknown.
        """
        agent = self.custom.get(name) or builtin_agent(name)
        if agent is None:
            known = ", ".join([*DEFAULT_AGENTS, "iqn_joint", *ablation_agents(), *addback_agents(),
                               *self.custom])
            raise ValueError(f"agents holds {name!r}; known agents are {known}")
        return agent

    def define(self, name: str, definition: Mapping[str, Any] | str) -> Agent:
        """Define a custom agent: a known agent (``base``, default ``iqn``) with ``model`` and ``policy``
        arguments over it (each key replaces the base's), e.g. ``{"base": "iqn_lean", "model":
        {"learning_rate": 1e-4}}``; the keys must be arguments of the base's algorithm and policy.

        :raises ValueError: naming the agent and the bad field.
        """
        from foxhunt.evaluation.baselines import BASELINES

        where = f"agent-kwargs {name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"agent-kwargs name {name!r} must be letters, digits, '_', '.', '+' or '-'")
        if name in BASELINES or builtin_agent(name) is not None:
            raise ValueError(f"{where}: {name!r} is a built-in agent or baseline; give the new one another "
                             "name")
        if name in self.custom:
            raise ValueError(f"{where}: {name!r} is defined twice")
        if isinstance(definition, str):
            try:
                definition = json.loads(definition)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error})") from None
        if not isinstance(definition, Mapping):
            raise ValueError(f"{where}={definition!r} must be a JSON object with keys {DEFINITION_KEYS}")
        unknown = [key for key in definition if key not in DEFINITION_KEYS]
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; the keys are "
                             f"{', '.join(DEFINITION_KEYS)}")
        base_name = definition.get("base", "iqn")
        if not isinstance(base_name, str) or base_name == name:
            raise ValueError(f"{where}.base={base_name!r} must be the name of another agent")
        try:
            base = self.get(base_name)
        except ValueError as error:
            raise ValueError(f"{where}.base: {error}") from None
        parts = {part: definition.get(part, {}) for part in ("model", "policy")}
        for part, value in parts.items():
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}.{part}={value!r} must be a JSON object of arguments")
        algorithm, policy = algorithm_classes(base.algorithm)
        _check_keys(f"{where}.model", parts["model"], algorithm, ["hindsight"] * (base.algorithm == "iqn"))
        _check_keys(f"{where}.policy", parts["policy"], policy)
        agent = replace(base, name=name, model={**base.model, **parts["model"]},
                        policy={**base.policy, **parts["policy"]}, base=base_name)
        self.custom[name] = agent
        return agent

    def parse(self, text: str) -> Agent:
        """Define a custom agent from one ``--agent-kwargs`` value, ``NAME=JSON`` (see :meth:`define`)."""
        name, sep, definition = text.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"agent-kwargs={text!r} must be NAME=JSON, e.g. "
                             "'iqn_x={\"base\": \"iqn_lean\", \"model\": {\"learning_rate\": 1e-4}}'")
        return self.define(name.strip(), definition)

    def hindsight_arms(self, name: str) -> tuple[str, str]:
        """The two arms of a hindsight comparison of BranchingIQN agent ``name``: ``(hindsight on, off)``.

        ``name`` is one arm (the one its own ``hindsight`` makes it, by default on for the branched face and
        off for the joint one); the other is ``<name>-no_hindsight`` or ``<name>+hindsight``, a built-in agent
        where one has that name (``iqn_lean+hindsight``), else defined here.

        :raises ValueError: when ``name`` is not a BranchingIQN agent.
        """
        agent = self.get(name)
        if agent.algorithm != "iqn":
            raise ValueError(f"agent={name!r} is not a BranchingIQN agent; hindsight is BranchingIQN's")
        on = bool(agent.model.get("hindsight", agent.action_face == "branched"))
        other = f"{name}-no_hindsight" if on else f"{name}+hindsight"
        if builtin_agent(other) is None and other not in self.custom:
            self.custom[other] = replace(agent, name=other, model={**agent.model, "hindsight": not on},
                                         base=name)
        return (name, other) if on else (other, name)
