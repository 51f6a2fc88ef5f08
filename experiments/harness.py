"""Shared pieces of the experiments: agents by name, markets, one training run, scoring, tables and plots.

An *agent* is a named recipe (:class:`AgentSpec`): BranchingIQN with foxhunt's presets plus overrides, or
SB3 DQN / sb3-contrib QR-DQN on :class:`~foxhunt.envs.FlatActionVecEnv` with the same network widths,
batch, buffer, learning rate, replay ratio and step budget; custom agents (:func:`define_agent`) are a
known agent with more overrides. Every agent trains on the same training market and is scored with
:func:`foxhunt.evaluation.evaluate_policies` on a held-out one (another synthetic market seed, or a LOBSTER
folder's test split).

BranchingIQN agents collect through the device loop (:mod:`sb3_her_ext.device_loop`, on a
:class:`~foxhunt.device_env.DeviceLOBVecEnv`) when :attr:`Budget.device_loop` resolves on (by default on
CUDA), DQN / QR-DQN through SB3's loop; each run records which (``run.json``'s ``loop``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
import subprocess
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback

from foxenv import spec
from foxenv.config import EnvConfig
from foxhunt.runs import RunConfig
from sb3_her_ext.algorithm import BranchingIQN  # its import sets CUBLAS_WORKSPACE_CONFIG before CUDA work

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
#: Features the lean configuration switches off (all but prioritized replay, as issue 16's lean run).
LEAN_OFF: tuple[str, ...] = tuple(name for name in FEATURES if name != "per")
#: Agents trained when ``--agents`` is not given.
DEFAULT_AGENTS: tuple[str, ...] = ("iqn", "iqn_lean", "dqn", "qrdqn")


@dataclass
class AgentSpec:
    """How to build one agent.

    :param name: its name in tables.
    :param kind: ``"iqn"`` (BranchingIQN), ``"dqn"`` or ``"qrdqn"`` (over the 81 flat actions).
    :param model_kwargs: overrides of the model's arguments (BranchingIQN: also ``hindsight``).
    :param policy_kwargs: overrides of the policy's arguments.
    :param base: a custom agent's base agent (``--agent-kwargs``); None for the built-in ones.
    :param face: BranchingIQN's action: ``"branched"`` (foxenv's four branches) or ``"joint"`` (one branch
        of the 81 joint actions, :class:`~foxhunt.envs.FlatActionVecEnv`, as DQN / QR-DQN see it).
    """

    name: str
    kind: str
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    base: str | None = None
    face: str = "branched"


def _merge(features: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    model: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    for feature in features:
        model.update(FEATURES[feature][0])
        policy.update(FEATURES[feature][1])
    return model, policy


def agent_spec(name: str) -> AgentSpec:
    """The recipe of an agent name.

    Names: ``iqn`` (presets, hindsight on), ``iqn_joint`` (presets on the joint face: one branch of the 81
    joint actions, without the per-branch settings, hindsight and the vaccine), ``iqn_lean`` (every feature
    of :data:`LEAN_OFF` off),
    ``iqn-no_<feature>`` (presets with one feature off), ``iqn_lean+<feature>`` (lean with one feature back
    on), ``dqn``, ``qrdqn``.

    :param name: the agent's name.
    :return: its spec.
    :raises ValueError: naming the agent when the name is unknown.
    """
    if name in _CUSTOM:
        return _CUSTOM[name]
    builtin = _builtin_spec(name)
    if builtin is not None:
        return builtin
    known = ", ".join([*DEFAULT_AGENTS, *ablation_agents(), *addback_agents(), *_CUSTOM])
    raise ValueError(f"agents holds {name!r}; known agents are {known}")


def _builtin_spec(name: str) -> AgentSpec | None:
    """The recipe of a built-in agent name, or None."""
    if name in ("dqn", "qrdqn"):
        return AgentSpec(name, name, face="joint")
    if name == "iqn":
        return AgentSpec(name, "iqn", {"hindsight": True})
    if name == "iqn_lean":
        return AgentSpec(name, "iqn", *_merge(LEAN_OFF))
    if name == "iqn_joint":  # hindsight and the vaccine read the direction / magnitude branches
        return AgentSpec(name, "iqn", {"hindsight": False, "vaccine_interval": 0}, face="joint")
    if name.startswith("iqn-no_") and name[len("iqn-no_"):] in FEATURES:
        model, policy = _merge([name[len("iqn-no_"):]])
        return AgentSpec(name, "iqn", {"hindsight": True, **model}, policy)
    if name.startswith("iqn_lean+") and name[len("iqn_lean+"):] in LEAN_OFF:
        model, policy = _merge([f for f in LEAN_OFF if f != name[len("iqn_lean+"):]])
        model.setdefault("hindsight", True)
        return AgentSpec(name, "iqn", model, policy)
    return None


def ablation_agents() -> list[str]:
    """``iqn-no_<feature>`` for every feature: the presets with one feature off."""
    return [f"iqn-no_{feature}" for feature in FEATURES]


def addback_agents() -> list[str]:
    """``iqn_lean+<feature>``: the lean configuration with one feature back on."""
    return [f"iqn_lean+{feature}" for feature in LEAN_OFF]


# ------------------------------------------------------------------------------------------- custom agents

#: Agents defined on the command line (``--agent-kwargs NAME=JSON``), by name; :func:`agent_spec` reads it.
_CUSTOM: dict[str, AgentSpec] = {}
#: Keys of a custom agent's JSON definition.
DEFINITION_KEYS = ("base", "model", "policy")
#: Agent names: what a folder name and a table row can hold ("/" separates a run's agent from its seed).
_NAME = re.compile(r"[A-Za-z0-9_.+\-]+")
#: Arguments the harness itself sets (the env, the seed, the device, ...), not an agent's to choose.
_RESERVED_MODEL = {"self", "policy", "env", "seed", "device", "policy_kwargs", "diagnostics_path",
                   "tensorboard_log", "_init_setup_model"}
_RESERVED_POLICY = {"self", "observation_space", "action_space", "lr_schedule", "n_market_features",
                    "branch_names"}
#: Arguments that take a Python class, which JSON cannot give.
_CLASS_VALUED = {"activation_fn", "optimizer_class", "features_extractor_class", "replay_buffer_class"}


def _classes(kind: str) -> tuple[type, type]:
    """The algorithm and policy classes of an agent kind."""
    if kind == "iqn":
        return BranchingIQN, BranchingIQN.policy_aliases["MlpPolicy"]
    if kind == "dqn":
        from stable_baselines3 import DQN

        return DQN, DQN.policy_aliases["MlpPolicy"]
    from sb3_contrib import QRDQN

    return QRDQN, QRDQN.policy_aliases["MlpPolicy"]


def _check_keys(where: str, given: Mapping[str, Any], cls: type, reserved: set[str]) -> None:
    """A ValueError naming ``where.key`` for a key ``cls`` does not take (or that the harness sets)."""
    import inspect

    accepted = set(inspect.signature(cls.__init__).parameters) - reserved - _CLASS_VALUED
    for key in given:
        if key in _CLASS_VALUED:
            raise ValueError(f"{where}.{key}: takes a Python class, which a JSON definition cannot give")
        if key not in accepted:
            raise ValueError(f"{where}.{key} is not an argument of {cls.__name__} that an agent may set; "
                             f"known: {', '.join(sorted(accepted))}")


def define_agent(name: str, definition: Mapping[str, Any] | str) -> AgentSpec:
    """Define (register) a custom agent: a known agent (``base``) with model and policy overrides on top.

    ``definition`` (a mapping or its JSON text): ``{"base": "iqn_lean", "model": {...}, "policy": {...}}``.
    ``base`` (default ``"iqn"``) is any agent :func:`agent_spec` knows, custom ones defined before included;
    ``model`` and ``policy`` replace the base's entries of the same name (a whole value each: a dict value
    such as ``exploration_mults`` is replaced, not merged), on top of foxhunt's presets as every agent.
    Their keys must be arguments of the base's algorithm (BranchingIQN, SB3 DQN or sb3-contrib QR-DQN)
    and of its policy; the values are checked when the model is built.

    :param name: the new agent's name (letters, digits, ``_ . + -``; not a built-in agent nor a baseline).
    :param definition: its definition.
    :return: its spec, which :func:`agent_spec` returns from now on.
    :raises ValueError: naming the agent and the bad field.
    """
    from foxhunt.evaluation.baselines import BASELINES

    where = f"agent-kwargs {name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"agent-kwargs name {name!r} must be letters, digits, '_', '.', '+' or '-'")
    if name in BASELINES or _builtin_spec(name) is not None:
        raise ValueError(f"{where}: {name!r} is a built-in agent or baseline; give the new one another name")
    if name in _CUSTOM:
        raise ValueError(f"{where}: {name!r} is defined twice")
    if isinstance(definition, str):
        try:
            definition = json.loads(definition)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(definition, Mapping):
        raise ValueError(f"{where}={definition!r} must be a JSON object with keys {DEFINITION_KEYS}")
    for key in definition:
        if key not in DEFINITION_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; the keys are {', '.join(DEFINITION_KEYS)}")
    base_name = definition.get("base", "iqn")
    if not isinstance(base_name, str):
        raise ValueError(f"{where}.base={base_name!r} must be an agent name")
    if base_name == name:
        raise ValueError(f"{where}.base={base_name!r} is the agent itself")
    try:
        base = agent_spec(base_name)
    except ValueError as error:
        raise ValueError(f"{where}.base: {error}") from None
    parts = {}
    for part in ("model", "policy"):
        value = definition.get(part, {})
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}.{part}={value!r} must be a JSON object of arguments")
        parts[part] = dict(value)
    algorithm, policy = _classes(base.kind)
    _check_keys(f"{where}.model", parts["model"], algorithm, _RESERVED_MODEL)
    _check_keys(f"{where}.policy", parts["policy"], policy, _RESERVED_POLICY)
    spec_ = AgentSpec(name, base.kind, {**base.model_kwargs, **parts["model"]},
                      {**base.policy_kwargs, **parts["policy"]}, base=base_name, face=base.face)
    _CUSTOM[name] = spec_
    return spec_


def parse_agent_kwargs(text: str) -> AgentSpec:
    """Define a custom agent from one ``--agent-kwargs`` value, ``NAME=JSON`` (see :func:`define_agent`).

    :param text: e.g. ``'iqn_x={"base": "iqn_lean", "model": {"learning_rate": 1e-4}}'``.
    :return: the agent's spec.
    :raises ValueError: naming the bad part.
    """
    name, sep, definition = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"agent-kwargs={text!r} must be NAME=JSON, e.g. "
                         "'iqn_x={\"base\": \"iqn_lean\", \"model\": {\"learning_rate\": 1e-4}}'")
    return define_agent(name.strip(), definition)


def custom_agents() -> dict[str, AgentSpec]:
    """The custom agents defined so far, by name."""
    return dict(_CUSTOM)


def clear_custom_agents() -> None:
    """Forget every custom agent (each command defines its own)."""
    _CUSTOM.clear()


def hindsight_arms(name: str) -> tuple[str, str]:
    """The two arms of a hindsight comparison of BranchingIQN agent ``name``: ``(hindsight on, off)``.

    ``iqn`` gives ``("iqn", "iqn-no_hindsight")``. Another agent is one arm itself (the one its own
    ``hindsight`` setting makes it); the other is ``<name>+hindsight`` or ``<name>-no_hindsight``, a built-in
    agent where one has that name (``iqn_lean+hindsight``), else defined here as a custom agent.

    :param name: a BranchingIQN agent.
    :return: the names of the arms.
    :raises ValueError: when ``name`` is not a BranchingIQN agent.
    """
    spec_ = agent_spec(name)
    if spec_.kind != "iqn":
        raise ValueError(f"agent={name!r} is a {spec_.kind} agent; hindsight is BranchingIQN's")
    on = bool(spec_.model_kwargs.get("hindsight", True))
    other = f"{name}-no_hindsight" if on else f"{name}+hindsight"
    if _builtin_spec(other) is None and other not in _CUSTOM:
        _CUSTOM[other] = AgentSpec(other, "iqn", {**spec_.model_kwargs, "hindsight": not on},
                                   dict(spec_.policy_kwargs), base=name)
    return (name, other) if on else (other, name)


def check_env_overrides(env_overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The env overrides as a dict, every key an :class:`~foxenv.config.EnvConfig` field.

    :param env_overrides: e.g. ``{"reward_scale": 0.01}``.
    :return: a copy.
    :raises ValueError: naming a key that is not an env setting (markets are set by their own options).
    """
    if not isinstance(env_overrides, Mapping):
        raise ValueError(f"env-kwargs={env_overrides!r} must be a JSON object of env settings")
    fields = [f.name for f in dataclasses.fields(EnvConfig)]
    for key in env_overrides:
        if key not in fields:
            raise ValueError(f"env-kwargs.{key} is not an env setting (foxenv.config.EnvConfig); known: "
                             f"{', '.join(fields)} (markets have their own options)")
    return dict(env_overrides)


# ------------------------------------------------------------------------------------------------ markets


@dataclass
class MarketSetup:
    """The training market and how the held-out evaluation finds its own.

    :param data: ``"synthetic"`` or a LOBSTER folder.
    :param signal_strength: synthetic: the planted signal's strength (0 = none).
    :param signal_horizon: synthetic: the planted signal's horizon.
    :param market_steps: synthetic: steps of each generated market.
    :param train_market_seed: synthetic: the training market's seed.
    :param eval_market_seed: synthetic: the held-out market's seed (must differ).
    :param step_events: LOBSTER: messages per step (``None``: ``load_market``'s default).
    :param levels: book levels of the market (``None``: the default); the env's ``levels`` must match.
    """

    data: str = "synthetic"
    signal_strength: float = 0.0
    signal_horizon: int = 1
    market_steps: int = 20_000
    train_market_seed: int = 0
    eval_market_seed: int = 1
    step_events: int | None = None
    levels: int | None = None

    def __post_init__(self) -> None:
        if self.synthetic and self.train_market_seed == self.eval_market_seed:
            raise ValueError(f"eval_market_seed={self.eval_market_seed} equals the training market's seed")
        if not self.synthetic and not Path(self.data).is_dir():
            raise ValueError(f"data={self.data!r} must be 'synthetic' or a LOBSTER folder")
        if self.synthetic and self.step_events is not None:
            raise ValueError(f"step_events={self.step_events}: only a LOBSTER market has messages per step")
        if not self.synthetic and self.signal_strength:
            raise ValueError(f"signal_strength={self.signal_strength}: a planted signal needs synthetic data")

    @property
    def synthetic(self) -> bool:
        """Whether the market is generated."""
        return self.data == "synthetic"

    @property
    def planted(self) -> bool:
        """Whether the market has a planted signal (the oracle joins the baselines)."""
        return self.synthetic and self.signal_strength > 0

    def market_kwargs(self) -> dict[str, Any]:
        """:func:`foxhunt.evaluation.build_market`'s options (synthetic: steps and signal)."""
        common = {} if self.levels is None else {"levels": self.levels}
        if not self.synthetic:
            return common if self.step_events is None else {**common, "step_events": self.step_events}
        return {**common, "num_steps": self.market_steps, "signal_strength": self.signal_strength,
                "signal_horizon": self.signal_horizon}

    def train_market(self, device: str) -> Any:
        """The training market (synthetic seed ``train_market_seed``, or the LOBSTER train split)."""
        from foxhunt.evaluation import build_market

        return build_market(self.data, split="train", market_seed=self.train_market_seed, device=device,
                            **self.market_kwargs())

    def describe(self) -> str:
        """One line naming the markets."""
        if not self.synthetic:
            return f"LOBSTER {self.data}: train split -> test split"
        signal = (f"planted signal strength {self.signal_strength}, horizon {self.signal_horizon}"
                  if self.planted else "no planted signal")
        return (f"synthetic ({signal}), markets of {self.market_steps} steps: train market seed "
                f"{self.train_market_seed} -> held-out market seed {self.eval_market_seed}")


# ------------------------------------------------------------------------------------------------ training


@dataclass
class Budget:
    """What every agent shares: steps, books, device and the common DQN-style knobs.

    :param steps: environment steps of training (summed over books).
    :param n_envs: books stepped together.
    :param device: ``"cpu"`` or ``"cuda"``.
    :param overrides: common overrides of the presets (``learning_rate``, ``batch_size``, ``buffer_size``,
        ``train_freq``, ``gradient_steps``, ``learning_starts``, ...), applied to every agent.
    :param net_arch: hidden layers (BranchingIQN: of each branch; DQN / QR-DQN: of the Q-network).
    :param env_overrides: env settings over the presets (``episode_length``, ``levels``, fees,
        ``reward_scale``, ...; :class:`~foxenv.config.EnvConfig` fields), for training and evaluation alike.
    :param device_loop: BranchingIQN agents collect through the device loop on a
        :class:`~foxhunt.device_env.DeviceLOBVecEnv` (:mod:`sb3_her_ext.device_loop`); ``None``: on exactly
        on CUDA (as :attr:`RunConfig.device_loop`). SB3 DQN / QR-DQN always run SB3's loop.
    :param env_cuda_graph: the device loop's env step (with its autoreset) as a CUDA graph (CUDA only).
    """

    steps: int = 20_000
    n_envs: int = 8
    device: str = "cpu"
    overrides: dict[str, Any] = field(default_factory=dict)
    net_arch: list[int] | None = None
    env_overrides: dict[str, Any] = field(default_factory=dict)
    device_loop: bool | None = None
    env_cuda_graph: bool = False

    def __post_init__(self) -> None:
        self.env_overrides = check_env_overrides(self.env_overrides)
        if self.device_loop is not None and not isinstance(self.device_loop, bool):
            raise ValueError(f"device_loop={self.device_loop!r} must be a bool or None")
        on_cuda = torch.device(self.device).type == "cuda"
        if self.env_cuda_graph and not (on_cuda and self.resolved_device_loop()):
            raise ValueError(f"env_cuda_graph=True needs the device loop on a CUDA device (device="
                             f"{self.device!r}, device_loop={self.device_loop})")

    def run_config(self, seed: int) -> RunConfig:
        """The :class:`RunConfig` whose resolved presets every agent starts from."""
        policy = {"net_arch": list(self.net_arch)} if self.net_arch else {}
        # the harness builds each agent's face itself (AgentSpec.face) from the branched presets
        return RunConfig(steps=self.steps, n_envs=self.n_envs, device=self.device, seed=seed,
                         action_face="branched", model_kwargs=dict(self.overrides), policy_kwargs=policy,
                         env_kwargs=dict(self.env_overrides), device_loop=self.device_loop)

    def resolved_device_loop(self) -> bool:
        """Whether BranchingIQN agents train through the device loop (``device_loop``, or on CUDA)."""
        return RunConfig(device=self.device, device_loop=self.device_loop).resolved_device_loop()

    def loop_of(self, agent: str) -> str:
        """The collection loop agent ``agent`` trains with: ``"device"`` or ``"sb3"``."""
        return LOOP_DEVICE if agent_spec(agent).kind == "iqn" and self.resolved_device_loop() else LOOP_SB3


#: The two training loops a run can record: BranchingIQN's device loop, SB3's numpy loop.
LOOP_DEVICE, LOOP_SB3 = "device", "sb3"


#: foxhunt's per-branch BranchingIQN arguments, dropped on the joint face (one branch named "action").
JOINT_DROPS_MODEL = ("exploration_mults", "boltzmann_branches", "vaccine_branch")

#: Arguments BranchingIQN shares with SB3 DQN / QR-DQN (same name, same meaning).
SHARED_DQN_KWARGS = ("learning_rate", "buffer_size", "learning_starts", "batch_size", "gamma", "train_freq",
                     "gradient_steps", "target_update_interval", "exploration_fraction",
                     "exploration_final_eps", "tau", "max_grad_norm")


class CurveCallback(BaseCallback):
    """Records ``(env steps, mean episode reward of the last episodes)`` about ``points`` times a run, calls
    ``at_checkpoint(model, k)`` at each of ``checkpoints`` equal fractions of the budget, and counts the
    CUDA graphs a graphed BranchingIQN captured: its gradient-step graphs and its fused collect + train graphs
    (more than one per step kind is a recapture).

    Under the device loop ``on_step`` runs every ``callback_stride`` vector steps and ``ep_info_buffer`` is
    filled at the loop's flushes (:func:`configure_device_loop` sets both from the point spacing), so a
    point may lag its step by up to a quarter of the spacing; checkpoints fall on the first stride at or
    past their mark.

    :param total_steps: the run's step budget.
    :param points: how many curve points to record.
    :param checkpoints: how many checkpoints (the last at the end of training).
    :param at_checkpoint: called with the model and the checkpoint's index.
    """

    def __init__(self, total_steps: int, points: int = 40, checkpoints: int = 0,
                 at_checkpoint: Callable[[Any, int], None] | None = None) -> None:
        super().__init__()
        self.every = max(int(total_steps) // max(points, 1), 1)
        self.next = self.every
        self.curve: list[tuple[int, float]] = []
        self.graphs: list[Any] = []  # the graph objects themselves: an id() could be reused after a free
        self.marks = [round(total_steps * (k + 1) / checkpoints) for k in range(checkpoints)]
        self.at_checkpoint = at_checkpoint
        self.done = 0

    def _on_step(self) -> bool:
        from sb3_her_ext import graphed_loop

        graphs = [getattr(getattr(self.model, name, None), "graph", None)
                  for name in ("_graphed_step", "_graphed_vaccine_step")]
        block = graphed_loop.block_of(self.model)  # the fused collect + train graphs, one per vaccine pattern
        graphs += list(block.graphs.values()) if block is not None else []
        for graph in graphs:
            if graph is not None and not any(known is graph for known in self.graphs):
                self.graphs.append(graph)
        if self.num_timesteps >= self.next:
            self.next += self.every
            episodes = [info["r"] for info in self.model.ep_info_buffer]
            if episodes:
                self.curve.append((int(self.num_timesteps), float(np.mean(episodes))))
        # the last checkpoint waits for the end of training (the final vector step may overshoot a mark)
        while (self.done < len(self.marks) - 1 and self.num_timesteps >= self.marks[self.done]
               and self.at_checkpoint is not None):
            self.at_checkpoint(self.model, self.done)
            self.done += 1
        return True

    def _on_training_end(self) -> None:
        if self.at_checkpoint is not None and self.done < len(self.marks):
            self.at_checkpoint(self.model, self.done)
            self.done += 1


def build_model(spec_: AgentSpec, env: Any, budget: Budget, seed: int, diagnostics_path: str | None) -> Any:
    """An untrained model of ``spec_`` on the training ``env`` (a :class:`~foxhunt.envs.LOBVecEnv`, or its
    :class:`~foxhunt.device_env.DeviceLOBVecEnv` for the device loop; DQN / QR-DQN wrap it in
    :class:`~foxhunt.envs.FlatActionVecEnv`)."""
    config = budget.run_config(seed)
    model_kwargs = config.resolved_model_kwargs()
    if spec_.face == "joint" and not isinstance(env.action_space, spaces.Discrete):
        raise ValueError(f"agent {spec_.name!r} acts on the joint face: its env needs action_face='joint'")
    if spec_.kind == "iqn":
        base_kwargs, base_policy = dict(model_kwargs), dict(config.resolved_policy_kwargs())
        if spec_.face == "joint":  # foxhunt's per-branch trading settings name branches this face lacks
            for key in JOINT_DROPS_MODEL:
                base_kwargs.pop(key, None)
            base_policy.pop("bottleneck_dims", None)
        kwargs = {**base_kwargs, **spec_.model_kwargs}
        hindsight = kwargs.pop("hindsight", True)
        cuda_graph = kwargs.pop("cuda_graph", config.resolved_cuda_graph())
        return BranchingIQN("MlpPolicy", env, seed=seed, device=budget.device, hindsight=hindsight,
                            cuda_graph=cuda_graph, policy_kwargs={**base_policy, **spec_.policy_kwargs},
                            diagnostics_path=diagnostics_path, **kwargs)

    kwargs = {k: model_kwargs[k] for k in SHARED_DQN_KWARGS if k in model_kwargs}
    kwargs.update(spec_.model_kwargs)
    policy_kwargs = {"net_arch": list(config.resolved_policy_kwargs()["net_arch"]), **spec_.policy_kwargs}
    if spec_.kind == "dqn":
        from stable_baselines3 import DQN

        return DQN("MlpPolicy", env, seed=seed, device=budget.device,
                   policy_kwargs=policy_kwargs, **kwargs)
    if spec_.kind == "qrdqn":
        from sb3_contrib import QRDQN

        return QRDQN("MlpPolicy", env, seed=seed, device=budget.device,
                     policy_kwargs=policy_kwargs, **kwargs)
    raise ValueError(f"kind={spec_.kind!r} must be 'iqn', 'dqn' or 'qrdqn'")


def make_train_env(market: Any, setup: MarketSetup, budget: Budget, seed: int, loop: str = LOOP_SB3,
                   face: str = "branched") -> Any:
    """The training env over the already built training ``market``.

    :param loop: ``"sb3"``: a :class:`~foxhunt.envs.LOBVecEnv`; ``"device"``: a
        :class:`~foxhunt.device_env.DeviceLOBVecEnv` (the same books and episodes, plus the tensor face the
        device loop steps), its step CUDA-graphed when ``budget.env_cuda_graph``.
    :param face: ``"joint"`` with the device loop: the device env takes the 81 joint codes itself (on SB3's
        loop :func:`build_model` wraps the env in :class:`~foxhunt.envs.FlatActionVecEnv`).
    """
    from foxhunt.device_env import DeviceLOBVecEnv
    from foxhunt.envs import LOBVecEnv

    env_kwargs = budget.run_config(seed).resolved_env_kwargs()
    env_kwargs.pop("market_seed", None)
    # a short split gets episodes that fit in it (as foxhunt.runs.make_env does)
    env_kwargs["episode_length"] = min(int(env_kwargs["episode_length"]), int(market.num_steps) - 1)
    if loop == LOOP_DEVICE:
        return DeviceLOBVecEnv(budget.n_envs, device=budget.device, seed=seed, data=market,
                               cuda_graph=budget.env_cuda_graph, action_face=face, **env_kwargs)
    if loop != LOOP_SB3:
        raise ValueError(f"loop={loop!r} must be {LOOP_DEVICE!r} or {LOOP_SB3!r}")
    return LOBVecEnv(budget.n_envs, device=budget.device, seed=seed, data=market, action_face=face,
                     **env_kwargs)


def configure_device_loop(model: Any, callback: CurveCallback, n_envs: int) -> None:
    """Device-loop settings that give ``callback`` fresh curve points without a host sync every step:
    episode statistics read four times per curve point, callbacks every quarter of that (at least every
    vector step of ``n_envs`` books).

    :param model: a BranchingIQN that will collect through the device loop.
    :param callback: the run's curve callback (its point spacing ``every``, in env steps).
    :param n_envs: books per vector step.
    """
    from sb3_her_ext import device_loop

    stats_interval = max(callback.every // 4, 1)
    device_loop.configure(model, callback_stride=max(stats_interval // (4 * n_envs), 1),
                          stats_interval=stats_interval)


@dataclass
class TrainedRun:
    """One trained agent: the model, its learning curve, its training time, its folder and the loop that
    collected its experience (``"device"`` or ``"sb3"``)."""

    agent: str
    seed: int
    model: Any
    curve: list[tuple[int, float]]
    seconds: float
    folder: Path
    graph_captures: int = 0
    loop: str = LOOP_SB3


def train_agent(name: str, seed: int, market: Any, setup: MarketSetup, budget: Budget, out: Path,
                progress: bool = False, checkpoints: int = 0,
                at_checkpoint: Callable[[Any, int], None] | None = None) -> TrainedRun:
    """Train agent ``name`` with ``seed`` on ``market``; its folder gets ``diagnostics.jsonl``, the model and
    ``run.json`` (seconds, curve, graph captures, steps, books, the loop, the agent's recipe, env overrides).

    A BranchingIQN agent collects through the device loop when ``budget.loop_of(name)`` says so (a
    ValueError when the model cannot: :func:`sb3_her_ext.device_loop.supports`), else SB3's loop.

    :param checkpoints: call ``at_checkpoint(model, k)`` at this many equal fractions of the budget (one
        ``learn`` call, so exploration and learning-rate schedules run as in a plain run).
    :return: the trained run.
    """
    spec_ = agent_spec(name)
    folder = out / name / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    diagnostics = folder / "diagnostics.jsonl"
    diagnostics.unlink(missing_ok=True)
    torch.manual_seed(seed)
    requested = budget.loop_of(name)
    env = make_train_env(market, setup, budget, seed, requested, spec_.face)
    model = build_model(spec_, env, budget, seed, str(diagnostics) if spec_.kind == "iqn" else None)
    callback = CurveCallback(budget.steps, checkpoints=checkpoints, at_checkpoint=at_checkpoint)
    loop = LOOP_SB3
    if requested == LOOP_DEVICE:
        from sb3_her_ext import device_loop

        if not device_loop.supports(model, model.env, model.train_freq, model.action_noise):
            raise ValueError(f"device_loop: agent {name!r} cannot collect through the device loop "
                             f"(sb3_her_ext.device_loop.supports is False: train_freq={model.train_freq}); "
                             "run it with --device-loop off")
        configure_device_loop(model, callback, budget.n_envs)
        loop = LOOP_DEVICE
    start = time.time()
    model.learn(budget.steps, callback=callback, progress_bar=progress)
    if hasattr(model, "log_diagnostics"):
        model.log_diagnostics()  # the last, partial interval
    seconds = time.time() - start
    model.save(folder / "model.zip")
    write_json(folder / "run.json", {"agent": name, "seed": seed, "seconds": seconds, "curve": callback.curve,
                                     "graph_captures": len(callback.graphs), "steps": budget.steps,
                                     "loop": loop, "n_envs": budget.n_envs, "spec": vars(spec_),
                                     "env_overrides": budget.env_overrides})
    return TrainedRun(name, seed, model, callback.curve, seconds, folder, len(callback.graphs), loop)


def _as_json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), to compare with a record."""
    return json.loads(json.dumps(value))


def finished_record(name: str, seed: int, out: Path, steps: int, budget: Budget | None = None) -> (
    dict[str, Any] | None
):
    """The ``run.json`` of a run :func:`train_agent` finished in ``out`` with the same budget, or None.

    :param name: the agent.
    :param seed: the seed.
    :param out: the experiment folder (``<agent>/seed<k>/model.zip`` and ``run.json``).
    :param steps: the step budget the run must have had.
    :param budget: when given, the run must also have had its loop (a record without one was SB3's loop),
        and, where recorded, its books, env overrides and the agent's current recipe (a custom agent
        redefined under the same name trains again).
    """
    folder = out / name / f"seed{seed}"
    if not (folder / "model.zip").is_file() or not (folder / "run.json").is_file():
        return None
    record = json.loads((folder / "run.json").read_text())
    if int(record.get("steps", -1)) != int(steps):
        return None
    if budget is not None:
        expected = {"loop": budget.loop_of(name), "n_envs": budget.n_envs,
                    "env_overrides": _as_json(budget.env_overrides), "spec": _as_json(vars(agent_spec(name)))}
        recorded = {"loop": LOOP_SB3, **record}
        if any(key in recorded and recorded[key] != value for key, value in expected.items()):
            return None
    return record


def load_run(name: str, seed: int, out: Path, device: str, steps: int, budget: Budget | None = None) -> (
    TrainedRun | None
):
    """A run :func:`train_agent` already finished in ``out`` with the same budget (see
    :func:`finished_record`), loaded on ``device``, or None."""
    record = finished_record(name, seed, out, steps, budget)
    if record is None:
        return None
    folder = out / name / f"seed{seed}"
    kind = agent_spec(name).kind
    if kind == "iqn":
        cls: Any = BranchingIQN
    elif kind == "dqn":
        from stable_baselines3 import DQN as cls
    else:
        from sb3_contrib import QRDQN as cls
    model = cls.load(folder / "model.zip", device=device)
    curve = [tuple(point) for point in record["curve"]]
    captures = int(record["graph_captures"])
    return TrainedRun(name, seed, model, curve, float(record["seconds"]), folder, captures,
                      str(record.get("loop", LOOP_SB3)))


# ------------------------------------------------------------------------------------------------ scoring


@dataclass
class EvalSettings:
    """The held-out evaluation: books, vector steps and the seed of the episode windows.

    :param n_envs: books (``None``: synthetic 16, LOBSTER as many disjoint windows as the test split holds).
    :param steps: vector steps per policy (``None``: one episode per book).
    :param seed: the windows' and the random baseline's seed (the same for every agent).
    """

    n_envs: int | None = 16
    steps: int | None = None
    seed: int = 1000


def evaluate_models(models: Mapping[str, Any], setup: MarketSetup, budget: Budget, settings: EvalSettings,
                    progress: bool = False) -> Any:
    """Score ``models`` (by name) and the baselines together on the held-out market.

    :return: :class:`foxhunt.evaluation.Evaluation` (flat, random, buy-and-hold; the oracle on planted
        markets).
    """
    from foxhunt.evaluation import evaluate_policies

    env_kwargs = budget.run_config(0).resolved_env_kwargs()
    env_kwargs.pop("market_seed", None)
    return evaluate_policies(
        dict(models), setup.data, n_envs=settings.n_envs, steps=settings.steps, seed=settings.seed,
        market_seed=setup.eval_market_seed,
        train_market_seed=setup.train_market_seed if setup.synthetic else None,
        split="test", env_kwargs=env_kwargs, market_kwargs=setup.market_kwargs(), device=budget.device,
        progress=progress,
    )


def run_key(agent: str, seed: int) -> str:
    """The name of one trained run among the evaluated policies."""
    return f"{agent}/seed{seed}"


#: Metrics the tables summarise: key in :func:`compute_metrics`, column title, format.
TABLE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("pnl", "PnL after fees", "{:,.0f}"),
    ("sharpe", "Sharpe / step", "{:.3f}"),
    ("trades", "closed trades", "{:,.0f}"),
    ("maker_share", "maker share", "{:.2f}"),
)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values (NaN when none)."""
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return math.nan, math.nan
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def summarise(evaluation: Any, agents: Sequence[str], seeds: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per agent (over seeds) and per baseline: mean, std and per-seed values of the table's metrics, and
    the share of the oracle's PnL captured when the oracle ran."""
    results = evaluation.results
    oracle = results["oracle"].metrics["pnl"] if "oracle" in results else None
    rows: dict[str, dict[str, Any]] = {}
    groups = {agent: [run_key(agent, s) for s in seeds] for agent in agents}
    groups.update({name: [name] for name in results if "/" not in name})
    for group, keys in groups.items():
        row: dict[str, Any] = {"n": len(keys)}
        for metric, _, _ in TABLE_METRICS:
            values = [float(results[k].metrics.get(metric, math.nan)) for k in keys]
            row[metric] = {"mean": mean_std(values)[0], "std": mean_std(values)[1], "values": values}
        if oracle is not None:
            shares = [float(results[k].metrics["pnl"]) / oracle if oracle else math.nan for k in keys]
            row["oracle_share"] = {"mean": mean_std(shares)[0], "std": mean_std(shares)[1], "values": shares}
        row["baseline"] = "/" not in keys[0]
        rows[group] = row
    return rows


def markdown_table(rows: Mapping[str, Mapping[str, Any]], times: Mapping[str, float] | None = None) -> str:
    """The summary as a markdown table (mean ± std over seeds; baselines have one value)."""
    oracle = any("oracle_share" in row for row in rows.values())
    head = ["policy", "seeds", *[title for _, title, _ in TABLE_METRICS]]
    if oracle:
        head.append("share of oracle PnL")
    if times:
        head.append("train s / seed")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        cells = [name, "baseline" if row["baseline"] else str(row["n"])]
        for metric, _, fmt in TABLE_METRICS:
            value = row[metric]
            if not math.isfinite(value["mean"]):
                cells.append("–")  # e.g. the maker share of a policy that never trades
            elif row["n"] == 1:
                cells.append(fmt.format(value["mean"]))
            else:
                cells.append(f"{fmt.format(value['mean'])} ± {fmt.format(value['std'])}")
        if oracle:
            share = row.get("oracle_share")
            if share is None:
                cells.append("")
            elif row["n"] == 1:
                cells.append(f"{100 * share['mean']:.1f} %")
            else:
                cells.append(f"{100 * share['mean']:.1f} ± {100 * share['std']:.1f} %")
        if times:
            cells.append(f"{times[name]:.0f}" if name in times else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ plots


def _extent(value: Mapping[str, Any]) -> list[float]:
    """The seed values and the ends of the error bar of one bar."""
    return [*value["values"], value["mean"] + value["std"], value["mean"] - value["std"]]


def bar_chart(rows: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> Path:
    """PnL and per-step Sharpe per policy: bars at the seed mean, a dot per seed, error bar = std. The random
    baseline, far below the rest, is drawn off scale with its value written in when it would flatten them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    wide = len(names) > 8
    fig, axes = plt.subplots(2 if wide else 1, 1 if wide else 2,
                             figsize=(min(16.0, 0.6 * len(names) + 4), 9 if wide else 4.5))
    panels = (("pnl", "PnL after fees (currency)"), ("sharpe", "Sharpe per step"))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        means = np.array([rows[n][metric]["mean"] for n in names], dtype=float)
        stds = np.array([rows[n][metric]["std"] for n in names], dtype=float)
        colors = ["0.6" if rows[n]["baseline"] else "C0" for n in names]
        x = np.arange(len(names))
        ax.bar(x, means, yerr=stds, color=colors, capsize=3)
        for i, n in enumerate(names):
            values = rows[n][metric]["values"]
            ax.scatter(np.full(len(values), i), values, color="k", s=10, zorder=3)
        others = [v for n in names if n != "random" for v in _extent(rows[n][metric]) if math.isfinite(v)]
        if "random" in rows and others:
            low, high = min(min(others), 0.0), max(max(others), 0.0)
            pad = 0.1 * (high - low or 1.0)
            value = rows["random"][metric]["mean"]
            if value < low - 2 * pad or value > high + 2 * pad:
                ax.set_ylim(low - pad, high + pad)
                j = names.index("random")
                ax.annotate(f"{value:,.3g}\n(off scale)", (j, low - pad if value < low else high + pad),
                            xytext=(0, 12 if value < low else -24), textcoords="offset points", ha="center",
                            fontsize=7)
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(textwrap.fill(title + "  (grey: baselines; dots: seeds; bars: mean ± std)", 120), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_chart(curves: Mapping[str, Sequence[Sequence[tuple[int, float]]]], path: Path, title: str,
                ylabel: str = "mean episode reward (last 100 episodes)") -> Path:
    """One line per agent (the mean over seeds at the shared points), a thin line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, runs) in enumerate(curves.items()):
        color = f"C{i % 10}"
        for run in runs:
            if run:
                ax.plot(*zip(*run, strict=True), color=color, lw=0.6, alpha=0.35)
        length = min((len(run) for run in runs), default=0)
        if length:
            steps = [runs[0][j][0] for j in range(length)]
            mean = np.mean([[run[j][1] for j in range(length)] for run in runs], axis=0)
            ax.plot(steps, mean, color=color, lw=1.8, label=name)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 100), fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ records


def provenance() -> dict[str, Any]:
    """Commit, date, machine and devices of a result."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
                   f"{torch.get_num_threads()} torch threads)",
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }


def write_json(path: Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON (NaN and infinities as strings)."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, np.generic):
            return clean(value.item())
        return value

    path.write_text(json.dumps(clean(payload), indent=2))
    return path
