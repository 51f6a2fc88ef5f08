"""The typed sections of a run's config: env, algorithm (BranchingIQN) and policy settings.

:class:`foxhunt.runs.RunConfig` is the root of the tree: its own fields are the run's (data, sizes, device,
seed, face, evaluation, checkpoints) and ``env``, ``algorithm`` and ``policy`` are these sections. Each field
carries the value ``foxhunt train`` runs with; the few that depend on the run (its device, steps, action face
or data) default to ``None`` and are chosen before it starts (:data:`AUTO`, :func:`resolve`),
so a run's ``config.json`` holds every value that ran (``null`` only where :data:`NULL_MEANS` says what it
means). Every field is type-checked on construction (:func:`check_fields`), and names itself by its dotted
path (``RunConfig.algorithm.learning_rate``), which ``foxhunt train`` turns into the flag
(``--algorithm.learning-rate``).

This module also finds the attribute docstrings of a dataclass (:func:`field_docs`): the CLI's help.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any

#: The action faces BranchingIQN can train on: foxenv's four branches, or one branch of 81 joint actions.
ACTION_FACES: tuple[str, ...] = ("branched", "joint")
#: The action face of a run that names none: the joint face, which learned the planted signal where the four
#: independent branches did not (experiments/README.md).
ACTION_FACE = "joint"


def set_fields(settings: Any) -> dict[str, Any]:
    """A section's fields that are set (not ``None``): the keyword arguments it gives its library."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
            if getattr(settings, f.name) is not None}


@dataclass
class EnvSettings:
    """The env: foxenv's ``EnvConfig`` fields and the market's options. The defaults are foxenv's but for
    ``episode_length`` (README: "Library defaults and foxhunt train's")."""

    episode_length: int = 500
    """Steps before an episode is truncated (a LOBSTER split shorter than that gets episodes that fit)."""
    max_position: float = 100.0  # Largest absolute position, in lots.
    levels: int = 10  # Book levels per side in the observation.
    maker_fee_bps: float = 0.0  # Fee on resting fills, basis points of notional (negative: a rebate).
    taker_fee_bps: float = 0.5  # Fee on Market and IoC fills, basis points of notional.
    reward_scale: float = 1.0  # Reward = change of equity times this (minus the inventory penalty).
    inventory_penalty: float = 0.0  # Per-step penalty times (position / max_position) ** 2.
    max_drawdown: float | None = None
    """End a book's episode when its equity falls this far below its peak (``None``: never)."""
    queue_power: float = 2.0  # Exponent of the ProbQueue cancellation split.
    return_horizons: list[int] = field(default_factory=lambda: [1, 5, 20, 100])
    """Steps of the mid returns in the observation."""
    vol_window: int = 20  # Steps of 1-step returns in the realised-volatility feature.
    flow_window: int = 10  # Steps summed in the signed trade-flow feature.
    fill_model: str = "conservative"  # How a resting order fills: ``conservative`` or ``optimistic``.
    order_latency: int = 0  # Steps a new LimitMaker order waits before it rests in the book.
    action_grid: str | dict[str, Any] = "default"
    """The action grid: ``default`` ([3, 3, 3, 3], 81 joint codes), ``wide`` ([3, 10, 3, 12], 1,080), or a
    JSON mapping of ``foxenv.spec.ActionGrid`` fields."""
    task: str = "trade"  # ``trade`` or ``execute``: work a parent order (foxenv.execution).
    exec_side: str = "both"  # The execute task's side: ``buy``, ``sell`` or ``both``.
    exec_quantity: float = 100.0  # The parent quantity: shares, or a share of the window's volume.
    exec_quantity_unit: str = "shares"  # ``shares`` or ``volume``.
    exec_child_sizes: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0, 2.0])
    """The execute task's child sizes in TWAP slices."""
    market_seed: int | None = None
    """Synthetic market's seed (auto: 0 on synthetic data, none on LOBSTER data; evaluation: + 1, + 2 on
    validation)."""
    market: dict[str, Any] = field(default_factory=dict)
    """Other market options (synthetic generator knobs such as ``signal_strength``; LOBSTER loading
    options)."""

    def kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments: the fields set (``return_horizons`` a tuple, as foxenv's config is
        hashed), and ``market``'s entries."""
        fields = {k: v for k, v in set_fields(self).items() if k != "market"}
        return {**fields, "return_horizons": tuple(self.return_horizons),
                "exec_child_sizes": tuple(self.exec_child_sizes), **self.market}


@dataclass
class AlgorithmSettings:
    """BranchingIQN's arguments. A field whose default is ``None`` is chosen for the run (its device, steps
    or action face) before it starts (:data:`AUTO`); the others are concrete, BranchingIQN's own defaults
    but where the README's table says otherwise."""

    learning_rate: float = 3e-4  # Adam's learning rate.
    buffer_size: int | None = None  # Replay rows (auto: 100,000; 500,000 on CUDA).
    learning_starts: int | None = None
    """Steps of random actions before training (auto: 1,000, 20,000 on CUDA, at most a quarter of the
    run)."""
    batch_size: int | None = None  # Rows per gradient step (auto: 64; 256 on CUDA).
    tau: float = 1.0  # Soft update coefficient of the target network.
    gamma: float = 0.99  # Discount factor.
    train_freq: int = 1  # Env steps (of all books) between training rounds.
    gradient_steps: int = 1  # Gradient steps per training round.
    optimize_memory_usage: bool = False  # SB3's memory-saving replay (the device replay needs False).
    target_update_interval: int | None = None
    """Env steps between target-network updates (auto: 2,000; 20,000 on CUDA)."""
    exploration_fraction: float = 0.3  # Fraction of training over which ε anneals.
    exploration_initial_eps: float = 1.0  # ε at the start.
    exploration_final_eps: float = 0.05  # ε at the end.
    max_grad_norm: float = 10.0  # Gradient clipping norm.
    stats_window_size: int = 100  # Episodes averaged in the logged episode statistics.
    verbose: int = 0  # SB3 verbosity.
    c51_alpha: float = 0.5  # Weight of the C51 head's loss beside the quantile loss, in [0, 1].
    exploration_mults: dict[str, float] | list[float] | None = None
    """Per-branch ε multipliers (auto: :data:`EXPLORATION_MULTS` on the branched face, none on
    the joint face's one branch)."""
    boltzmann_branches: list[str] | list[int] | None = None
    """Branches exploring by Boltzmann sampling (auto: order and urgency on the branched face, none on the
    joint face)."""
    iqr_bonus: float | list[float] = field(default_factory=lambda: [0.3, 0.05])
    """Optimism bonus on the quantiles' spread: a number or a (start, end) pair annealed over training."""
    ensemble_bonus: float = 0.2  # Optimism bonus on the ensemble's disagreement.
    per_alpha: float = 0.6  # Prioritized replay's exponent.
    per_beta: float | list[float] = field(default_factory=lambda: [0.4, 1.0])
    """Importance-sampling exponent: a number or a (start, end) pair."""
    vaccine_interval: int | None = None
    """Gradient steps between GradVac vaccine steps, 0: off (auto: 5 on the branched face, 0 on the
    joint)."""
    vaccine_beta: float = 0.01  # GradVac's moving-average rate.
    vaccine_branch: str | int | None = None
    """The branch stratifying the vaccine's batch (auto: magnitude on the branched face, none on the
    joint)."""
    diagnostics_interval: int | None = None
    """Env steps between diagnostics lines (auto: 500, 20,000 on CUDA, at most a quarter of the run)."""
    compile_loss: bool = False  # torch.compile the loss.
    nan_guard: bool = True  # Stop on a non-finite loss or parameter.
    graph_collect: bool | None = None
    """The rollout as one fused CUDA graph (``None``: each rollout that can run as one does)."""
    counterfactual: bool = False
    """Learn from every action's exact outcome from each replayed state
    (``sb3_her_ext.counterfactual_targets``; the run then collects through the device loop, without
    hindsight)."""

    kwargs = set_fields


@dataclass
class PolicySettings:
    """The policy's arguments: concrete, the policy's own defaults but where the README's table says
    otherwise (``bottleneck_dims``: chosen for the action face, :data:`AUTO`)."""

    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the shared trunk (small, so a CPU run stays short)."""
    n_ensemble: int = 3  # Q-heads of the ensemble.
    n_cos: int = 32  # Cosine features of the quantile embedding.
    n_quantiles: int = 16  # Quantiles sampled for the online estimate.
    n_quantiles_target: int = 16  # Quantiles sampled for the target.
    n_quantiles_act: int = 16  # Quantiles sampled when acting.
    n_atoms: int = 51  # Atoms of the C51 head.
    v_min: float = -10.0  # Lowest atom of the C51 head.
    v_max: float = 10.0  # Highest atom of the C51 head.
    popart: bool = True  # Normalise the returns with PopArt.
    popart_beta: float = 3e-4  # PopArt's moving-average rate.
    bottleneck_dims: dict[str, int] | list[int] | None = None
    """Per-branch market-feature bottleneck widths (auto: :data:`BOTTLENECK_DIMS` on the
    branched face, none on the joint)."""
    n_market_features: int | None = None  # Leading observation features that are market features (None: all).
    shared_tau_embedding: bool = True  # One quantile embedding shared by the heads.
    normalize_observations: bool = True  # Normalise observations with running statistics.
    branch_coupling: str = "independent"
    """``independent`` (BDQ) or ``autoregressive`` (each branch conditioned on the earlier branches'
    sub-actions; ``sb3_her_ext.networks``)."""
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)  # Keyword arguments of the optimizer.

    kwargs = set_fields


#: The config fields (dotted) whose default ``None`` is chosen for the run before it starts
#: (:func:`resolve`), and how; ``config.json`` records the choice.
AUTO: dict[str, str] = {
    "hindsight": "on for the branched action face, off for the joint (and with algorithm.counterfactual)",
    "cuda_graph": "on exactly on CUDA",
    "device_loop": "on on CUDA and with algorithm.counterfactual",
    "env.market_seed": "0 on synthetic data (LOBSTER data: none)",
    "algorithm.buffer_size": "the device's size (DEVICE_SIZES)",
    "algorithm.learning_starts": "the device's size, at most a quarter of the run",
    "algorithm.batch_size": "the device's size",
    "algorithm.target_update_interval": "the device's size",
    "algorithm.diagnostics_interval": "the device's size, at most a quarter of the run",
    "algorithm.vaccine_interval": "5 on the branched face, 0 (off) on the joint",
    "algorithm.exploration_mults": "per branch on the branched face (none on the joint)",
    "algorithm.boltzmann_branches": "order and urgency on the branched face (none on the joint)",
    "algorithm.vaccine_branch": "magnitude on the branched face (none on the joint)",
    "policy.bottleneck_dims": "per branch on the branched face (none on the joint)",
}
#: The config fields whose ``None`` is itself the value that runs (and what it means), so ``config.json``
#: may hold ``null`` there; every other field holds the value that ran.
NULL_MEANS: dict[str, str] = {
    "out": "a new runs/<timestamp>-<random> folder",
    "env.max_drawdown": "no drawdown stop",
    "env.market_seed": "LOBSTER data: no generated market",
    "algorithm.graph_collect": "each rollout that can run as one CUDA graph does",
    "algorithm.exploration_mults": "the joint face's one branch: ε unscaled",
    "algorithm.boltzmann_branches": "the joint face: no Boltzmann branch",
    "algorithm.vaccine_branch": "the joint face: the vaccine is off",
    "policy.bottleneck_dims": "the joint face: no per-branch bottleneck",
    "policy.n_market_features": "every observation feature is a market feature",
}


# ------------------------------------------------------------------------------------------ choices for a run

#: foxenv's action branches, in order (foxenv.spec.BRANCH_NAMES written out: the parser imports no torch).
BRANCH_NAMES: tuple[str, ...] = ("direction", "magnitude", "order", "urgency")
#: Market-feature bottleneck width of each branch: the magnitude branch reads the most of the market.
BOTTLENECK_DIMS: dict[str, int] = {"direction": 4, "magnitude": 8, "order": 6, "urgency": 4}
#: Per-branch ε multipliers: explore sizes and order types more than the direction.
EXPLORATION_MULTS: dict[str, float] = {"direction": 1.0, "magnitude": 2.0, "order": 1.5, "urgency": 1.5}
#: Branches that explore by Boltzmann sampling over their scores instead of uniformly.
BOLTZMANN_BRANCHES: tuple[str, ...] = ("order", "urgency")
#: The branch whose actions stratify the gradient vaccine's batch (a third each of Small, Half, Full).
VACCINE_BRANCH = "magnitude"
#: BranchingIQN arguments that name the branched face's branches (none on the joint face).
BRANCHED_ALGORITHM_ARGS: tuple[str, ...] = ("exploration_mults", "boltzmann_branches", "vaccine_branch")
#: Policy arguments that name the branched face's branches (none on the joint face).
BRANCHED_POLICY_ARGS: tuple[str, ...] = ("bottleneck_dims",)

#: BranchingIQN's replay sizes by device type (``learning_starts`` and ``diagnostics_interval`` at most a
#: quarter of the run): on CUDA a batch worth a graphed step (replay ratio 0.25 at 1024 books) and a buffer
#: and intervals that fit thousands of books a step.
DEVICE_SIZES: dict[str, dict[str, int]] = {
    "cpu": {"buffer_size": 100_000, "learning_starts": 1_000, "batch_size": 64,
            "target_update_interval": 2_000, "diagnostics_interval": 500},
    "cuda": {"buffer_size": 500_000, "learning_starts": 20_000, "batch_size": 256,
             "target_update_interval": 20_000, "diagnostics_interval": 20_000},
}


def face_settings(face: str) -> dict[str, Any]:
    """The settings an action face chooses (the fields of :data:`foxhunt.config.AUTO` left ``None``).

    :param face: ``"branched"`` or ``"joint"``.
    :return: dotted field name -> value. On the branched face: hindsight, the per-branch trading settings and
        the vaccine stratified by the magnitude branch; on the joint face (one branch of 81 codes): no
        hindsight and the vaccine off (it stratifies by one branch's three values), no per-branch setting.
    """
    if face == "joint":
        return {"hindsight": False, "algorithm.vaccine_interval": 0}
    return {"hindsight": True, "algorithm.vaccine_interval": 5,
            "algorithm.exploration_mults": dict(EXPLORATION_MULTS),
            "algorithm.boltzmann_branches": list(BOLTZMANN_BRANCHES),
            "algorithm.vaccine_branch": VACCINE_BRANCH,
            "policy.bottleneck_dims": dict(BOTTLENECK_DIMS)}


def auto_values(config: Any) -> dict[str, Any]:
    """What the fields of :data:`foxhunt.config.AUTO` are for ``config``'s run (its device, steps, books,
    action face and data), whether or not they are set.

    :param config: a :class:`~foxhunt.runs.RunConfig`.
    :return: dotted field name -> value.
    """
    cuda = str(config.device).split(":")[0] == "cuda"
    sizes = DEVICE_SIZES["cuda" if cuda else "cpu"]
    values: dict[str, Any] = {f"algorithm.{name}": value for name, value in sizes.items()}
    values["algorithm.learning_starts"] = min(sizes["learning_starts"], max(config.steps // 4, config.n_envs))
    values["algorithm.diagnostics_interval"] = min(sizes["diagnostics_interval"], max(config.steps // 4, 1))
    values.update({"cuda_graph": cuda, "device_loop": cuda, **face_settings(config.action_face)})
    if config.env.task == "execute":  # hindsight relabels the trading task's trades: off on the execute task
        values["hindsight"] = False
    if config.algorithm.counterfactual:  # exact targets replace hindsight; the device env replays the rows
        values.update({"hindsight": False, "device_loop": True})
    if config.data == "synthetic":
        values["env.market_seed"] = 0
    return values


def resolve(config: Any) -> Any:
    """``config`` with each field of :data:`foxhunt.config.AUTO` that is ``None`` set to its run's choice
    (:func:`auto_values`): every value the run will use. Resolving a resolved config changes nothing.

    :param config: a :class:`~foxhunt.runs.RunConfig`.
    :return: the resolved config.
    """
    tree = config.to_dict()

    def unset(name: str) -> bool:
        section, _, leaf = name.rpartition(".")
        return (tree[section] if section else tree)[leaf] is None

    chosen = {name: value for name, value in auto_values(config).items() if unset(name)}
    return config.with_values(chosen) if chosen else config


# ------------------------------------------------------------------------------------------ checks


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` (a JSON-able subset: scalars, lists, dicts, unions)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    args = typing.get_args(hint)
    if origin in (list, tuple):
        return isinstance(value, list | tuple) and all(_matches(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()
        )
    raise TypeError(f"no check for the type {hint!r}")


_TYPE_NAMES = {bool: "a bool", int: "an integer", float: "a finite number", str: "a string",
               type(None): "None"}


def type_name(hint: Any) -> str:
    """How an error names the type ``hint`` (``"an integer or None"``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) in (list, tuple):
        return f"a list of {type_name(typing.get_args(hint)[0]).removeprefix('a ').removeprefix('an ')}s"
    if typing.get_origin(hint) is dict:
        return "a mapping"
    return _TYPE_NAMES.get(hint, str(hint))


def check_fields(settings: Any, prefix: str) -> None:
    """A ``ValueError`` naming the first field of the dataclass ``settings`` whose value is not of its type.

    :param settings: a dataclass instance.
    :param prefix: how errors name its fields (``"RunConfig.algorithm."``).
    """
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            continue
        if not _matches(value, hints[f.name]):
            raise ValueError(f"{prefix}{f.name}={value!r} must be {type_name(hints[f.name])}")


def section_from_dict(cls: type, values: Any, prefix: str) -> Any:
    """A section from a mapping; unknown keys raise ``ValueError`` naming them."""
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ValueError(f"{prefix.rstrip('.')}={values!r} must be a mapping of {cls.__name__} fields")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {prefix.rstrip('.')} fields {unknown}; known fields are {sorted(known)}")
    return cls(**values)


def field_docs(cls: type) -> dict[str, str]:
    """The docs of a dataclass's fields: the string under each field or the comment ending its line, else
    its ``:param NAME:`` line in the class docstring; one line each.

    :param cls: a dataclass defined in a source file.
    :return: field name -> its doc with whitespace collapsed.
    """
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    params = re.findall(r":param (\w+): (.*?)(?=\n\s*:|\Z)", inspect.getdoc(cls) or "", re.S)
    docs = {name: " ".join(text.split()) for name, text in params}
    lines = source.splitlines()
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment = re.search(r"  # (.*)$", lines[node.end_lineno - 1])
            docs.update({node.target.id: comment[1]} if comment else {})
    for node, following in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs
