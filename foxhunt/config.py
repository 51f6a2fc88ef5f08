"""The typed sections of a run's config: env, algorithm (BranchingIQN) and policy settings.

:class:`foxhunt.runs.RunConfig` is the root of the tree: its own fields are the run's (data, sizes, device,
seed, face, evaluation, checkpoints) and ``env``, ``algorithm`` and ``policy`` are these sections. A
section field left ``None`` takes the library's default (foxenv's ``EnvConfig``, ``BranchingIQN``, its
policy) or a preset that depends on the run (device, steps, action face), decided in one place:
:func:`algorithm_presets` and :func:`policy_presets`. Every field is type-checked on construction
(:func:`check_fields`), and names itself by its dotted path (``RunConfig.algorithm.learning_rate``), which
``foxhunt train`` turns into the flag (``--algorithm.learning-rate``).

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

from foxhunt import presets


def set_fields(settings: Any) -> dict[str, Any]:
    """A section's fields that are set (not ``None``): the keyword arguments it gives its library."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
            if getattr(settings, f.name) is not None}


@dataclass
class EnvSettings:
    """The env: foxenv's ``EnvConfig`` fields (``None``: foxenv's default) and the market's options."""

    episode_length: int = presets.EPISODE_LENGTH
    """Steps before an episode is truncated (a LOBSTER split shorter than that gets episodes that fit)."""
    max_position: float | None = None  # Largest absolute position, in lots.
    levels: int | None = None  # Book levels per side in the observation.
    maker_fee_bps: float | None = None  # Fee on resting fills, basis points of notional (negative: a rebate).
    taker_fee_bps: float | None = None  # Fee on Market and IoC fills, basis points of notional.
    reward_scale: float | None = None  # Reward = change of equity times this (minus the inventory penalty).
    inventory_penalty: float | None = None  # Per-step penalty times (position / max_position) ** 2.
    max_drawdown: float | None = None
    """End a book's episode when its equity falls this far below its peak (``None``: never)."""
    queue_power: float | None = None  # Exponent of the ProbQueue cancellation split.
    return_horizons: list[int] | None = None  # Steps of the mid returns in the observation.
    vol_window: int | None = None  # Steps of 1-step returns in the realised-volatility feature.
    flow_window: int | None = None  # Steps summed in the signed trade-flow feature.
    fill_model: str | None = None  # How a resting order fills: ``conservative`` or ``optimistic``.
    order_latency: int | None = None  # Steps a new LimitMaker order waits before it rests in the book.
    action_grid: str | dict[str, Any] | None = None
    """The action grid: ``default`` ([3, 3, 3, 3], 81 joint codes), ``wide`` ([3, 10, 3, 12], 1,080), or a
    JSON mapping of ``foxenv.spec.ActionGrid`` fields."""
    task: str | None = None  # ``trade`` (the default) or ``execute``: work a parent order (foxenv.execution).
    exec_side: str | None = None  # The execute task's side: ``buy``, ``sell`` or ``both`` (the default).
    exec_quantity: float | None = None  # The parent quantity: shares, or a share of the window's volume.
    exec_quantity_unit: str | None = None  # ``shares`` (the default) or ``volume``.
    exec_child_sizes: list[float] | None = None  # Child sizes in TWAP slices (default: 0, 0.5, 1, 2).
    market_seed: int | None = None  # Synthetic market's seed (None: 0; evaluation: + 1, + 2 on validation).
    market: dict[str, Any] = field(default_factory=dict)
    """Other market options (synthetic generator knobs such as ``signal_strength``; LOBSTER loading
    options)."""

    def kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments: the fields set, and ``market``'s entries."""
        return {**{k: v for k, v in set_fields(self).items() if k != "market"}, **self.market}


@dataclass
class AlgorithmSettings:
    """BranchingIQN's arguments (``None``: the preset of :func:`algorithm_presets`, else BranchingIQN's
    default)."""

    learning_rate: float = 3e-4  # Adam's learning rate.
    buffer_size: int | None = None  # Replay rows (preset: 100,000; 500,000 on CUDA).
    learning_starts: int | None = None
    """Steps of random actions before training (preset: 1,000, 20,000 on CUDA, at most a quarter of the
    run)."""
    batch_size: int | None = None  # Rows per gradient step (preset: 64; 256 on CUDA).
    tau: float | None = None  # Soft update coefficient of the target network.
    gamma: float = 0.99  # Discount factor.
    train_freq: int = 1  # Env steps (of all books) between training rounds.
    gradient_steps: int = 1  # Gradient steps per training round.
    optimize_memory_usage: bool | None = None  # SB3's memory-saving replay (the device replay needs False).
    target_update_interval: int | None = None
    """Env steps between target-network updates (preset: 2,000; 20,000 on CUDA)."""
    exploration_fraction: float = 0.3  # Fraction of training over which ε anneals.
    exploration_initial_eps: float | None = None  # ε at the start.
    exploration_final_eps: float = 0.05  # ε at the end.
    max_grad_norm: float | None = None  # Gradient clipping norm.
    stats_window_size: int | None = None  # Episodes averaged in the logged episode statistics.
    verbose: int | None = None  # SB3 verbosity.
    c51_alpha: float | None = None  # Weight of the C51 head's loss beside the quantile loss, in [0, 1].
    exploration_mults: dict[str, float] | list[float] | None = None
    """Per-branch ε multipliers (preset on the branched face: ``foxhunt.presets.EXPLORATION_MULTS``)."""
    boltzmann_branches: list[str] | list[int] | None = None
    """Branches exploring by Boltzmann sampling (preset on the branched face: order and urgency)."""
    iqr_bonus: float | list[float] | None = None
    """Optimism bonus on the quantiles' spread: a number or a (start, end) pair annealed over training."""
    ensemble_bonus: float | None = None  # Optimism bonus on the ensemble's disagreement.
    per_alpha: float | None = None  # Prioritized replay's exponent.
    per_beta: float | list[float] | None = None
    """Importance-sampling exponent: a number or a (start, end) pair."""
    vaccine_interval: int | None = None
    """Gradient steps between GradVac vaccine steps, 0: off (preset on the joint face: 0)."""
    vaccine_beta: float | None = None  # GradVac's moving-average rate.
    vaccine_branch: str | int | None = None
    """The branch stratifying the vaccine's batch (preset on the branched face: magnitude)."""
    diagnostics_interval: int | None = None
    """Env steps between diagnostics lines (preset: 500, 20,000 on CUDA, at most a quarter of the run)."""
    compile_loss: bool | None = None  # torch.compile the loss.
    nan_guard: bool | None = None  # Stop on a non-finite loss or parameter.
    graph_collect: bool | None = None  # The rollout as one fused CUDA graph (None: wherever it can run).

    kwargs = set_fields


@dataclass
class PolicySettings:
    """The policy's arguments (``None``: the preset of :func:`policy_presets`, else the policy's default)."""

    net_arch: list[int] = field(default_factory=lambda: list(presets.NET_ARCH))
    """Hidden layer widths of the shared trunk."""
    n_ensemble: int = 3  # Q-heads of the ensemble.
    n_cos: int = 32  # Cosine features of the quantile embedding.
    n_quantiles: int = 16  # Quantiles sampled for the online estimate.
    n_quantiles_target: int = 16  # Quantiles sampled for the target.
    n_quantiles_act: int = 16  # Quantiles sampled when acting.
    n_atoms: int = 51  # Atoms of the C51 head.
    v_min: float | None = None  # Lowest atom of the C51 head.
    v_max: float | None = None  # Highest atom of the C51 head.
    popart: bool | None = None  # Normalise the returns with PopArt.
    popart_beta: float | None = None  # PopArt's moving-average rate.
    bottleneck_dims: dict[str, int] | list[int] | None = None
    """Per-branch market-feature bottleneck widths (preset on the branched face:
    ``foxhunt.presets.BOTTLENECK_DIMS``)."""
    n_market_features: int | None = None  # Leading observation features that are market features (None: all).
    shared_tau_embedding: bool | None = None  # One quantile embedding shared by the heads.
    normalize_observations: bool | None = None  # Normalise observations with running statistics.
    branch_coupling: str | None = None
    """``independent`` (BDQ) or ``autoregressive`` (each branch conditioned on the earlier branches'
    sub-actions; ``sb3_her_ext.networks``)."""
    optimizer_kwargs: dict[str, Any] | None = None  # Keyword arguments of the optimizer.

    kwargs = set_fields


# ------------------------------------------------------------------------------------------ presets


def algorithm_presets(face: str, *, cuda: bool, steps: int, n_envs: int) -> dict[str, Any]:
    """BranchingIQN's presets for a run: sizes (a GPU's on CUDA, scaled to short runs) and the face's
    trading arguments (:func:`foxhunt.presets.trading_algorithm_kwargs` on the branched face, the vaccine off
    on the joint face).

    :param face: the run's action face.
    :param cuda: whether the run is on a CUDA device.
    :param steps: the run's environment steps.
    :param n_envs: the run's books.
    :return: arguments that the run's :class:`AlgorithmSettings` override where set.
    """
    sizes = presets.GPU_SIZES if cuda else presets.CPU_SIZES
    return {
        **sizes,
        "learning_starts": min(sizes["learning_starts"], max(steps // 4, n_envs)),
        "diagnostics_interval": min(sizes["diagnostics_interval"], max(steps // 4, 1)),
        **(presets.trading_algorithm_kwargs() if face == "branched" else presets.JOINT_ALGORITHM_KWARGS),
    }


def policy_presets(face: str) -> dict[str, Any]:
    """The policy's presets for a face: per-branch bottlenecks on the branched face, none on the joint."""
    return presets.trading_policy_kwargs() if face == "branched" else {}


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
