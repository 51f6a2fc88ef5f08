"""Per-branch exploration: ε and bonus schedules, per-branch settings, and the ``branch_select`` call.

Every branch ``b`` explores with its own rate ``ε_b = min(1, ε · mult_b)``, where ``ε`` follows DQN's
linear schedule (``mult_b`` is 1 unless given). The branches one names (none by default) sample from a
Boltzmann distribution over their scores instead of taking the argmax. Scores carry an optimism bonus
``α · IQR + β · ensemble-std`` whose ``α`` is annealed linearly over training. The selection itself
is one ``cuda_ext.branch_select`` call; its uniforms are drawn on the device from the
algorithm's generator, so the same seed on the same device gives the same actions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch as th

import cuda_ext
from sb3_her_ext.branches import branch_index, default_branch_names

__all__ = [
    "branch_epsilons",
    "branch_index",
    "default_branch_names",
    "linear_anneal",
    "resolve_boltzmann_branches",
    "resolve_exploration_mults",
    "select_actions",
]


def resolve_exploration_mults(
    mults: Sequence[float] | Mapping[int | str, float] | None, branch_names: Sequence[str]
) -> list[float]:
    """Per-branch ε multipliers from a list, a dict (by name or index) or the defaults.

    Branches a dict leaves out keep the default multiplier 1.

    :param mults: ``None`` for the defaults, a sequence of length ``NB``, or a mapping branch → multiplier.
    :param branch_names: the names of the ``NB`` branches, in order.
    :return: one non-negative multiplier per branch.
    """
    resolved = [1.0] * len(branch_names)
    if mults is None:
        return resolved
    if isinstance(mults, Mapping):
        for key, value in mults.items():
            resolved[branch_index(key, branch_names, "exploration_mults")] = float(value)
    elif isinstance(mults, Sequence) and not isinstance(mults, str):
        if len(mults) != len(branch_names):
            raise ValueError(
                f"exploration_mults has length {len(mults)} but the action space has "
                f"{len(branch_names)} branches {list(branch_names)}"
            )
        resolved = [float(value) for value in mults]
    else:
        raise ValueError(f"exploration_mults={mults!r} must be a list, tuple or dict")
    for name, value in zip(branch_names, resolved, strict=True):
        if not value >= 0.0:
            raise ValueError(f"exploration_mults[{name!r}]={value} must be >= 0")
    return resolved


def resolve_boltzmann_branches(
    branches: Sequence[int | str] | None, branch_names: Sequence[str]
) -> list[bool]:
    """Per-branch Boltzmann flags.

    :param branches: the branches (names or indices) that sample from a Boltzmann distribution; ``None``
        or empty: none.
    :param branch_names: the names of the ``NB`` branches, in order.
    :return: one flag per branch.
    """
    if branches is None:
        branches = []
    if isinstance(branches, str | int):
        raise ValueError(f"boltzmann_branches={branches!r} must be a list of branch names or indices")
    flags = [False] * len(branch_names)
    for key in branches:
        flags[branch_index(key, branch_names, "boltzmann_branches")] = True
    return flags


def linear_anneal(start: float, end: float, progress_remaining: float) -> float:
    """Linear interpolation over the whole of training.

    :param start: value at ``progress_remaining = 1`` (start of training).
    :param end: value at ``progress_remaining = 0`` (end of training).
    :param progress_remaining: SB3's progress, from 1 down to 0.
    :return: ``start + (1 - progress_remaining) * (end - start)``.
    """
    progress = min(max(1.0 - progress_remaining, 0.0), 1.0)
    return start + progress * (end - start)


def branch_epsilons(epsilon: float | th.Tensor, mults: th.Tensor) -> th.Tensor:
    """Per-branch exploration rates ``ε_b = min(1, ε · mult_b)``.

    :param epsilon: the scheduled ε: a number, or a 0-dim float32 tensor on ``mults``' device (a captured
        CUDA graph reads it; the same float32 product as the number).
    :param mults: ``[NB]`` float32 multipliers.
    :return: ``[NB]`` float32 rates.
    """
    return th.clamp(mults * epsilon, max=1.0)


def select_actions(
    q: th.Tensor,
    iqr: th.Tensor,
    ens_std: th.Tensor,
    n_actions: th.Tensor,
    eps: th.Tensor,
    boltzmann: th.Tensor,
    iqr_bonus: float | th.Tensor,
    ensemble_bonus: float,
    generator: th.Generator | None,
    uniforms: tuple[th.Tensor, th.Tensor] | None = None,
) -> th.Tensor:
    """Exploratory actions through ``cuda_ext.branch_select``.

    :param q: ``[B, NB, A]`` action values (padded actions ``-inf``).
    :param iqr: ``[B, NB, A]`` quantile IQRs.
    :param ens_std: ``[B, NB, A]`` ensemble standard deviations.
    :param n_actions: ``[NB]`` int64 number of valid actions per branch.
    :param eps: ``[NB]`` float32 per-branch ε.
    :param boltzmann: ``[NB]`` bool, branches that sample from a Boltzmann distribution.
    :param iqr_bonus: weight ``α`` of the IQR bonus: a number, or a 0-dim float32 tensor on ``q``'s device
        (a captured CUDA graph reads it). A tensor weight multiplies ``iqr`` before the kernel (which takes
        ``α`` as a host number): the same float32 product on the CPU; on a GPU the kernel's own ``q + α·iqr``
        may round once (a fused multiply-add) where this rounds twice.
    :param ensemble_bonus: weight ``β`` of the ensemble-std bonus.
    :param generator: generator on ``q``'s device for the uniforms (``None``: the global one).
    :param uniforms: ``(u_explore, u_action)``, each ``[B, NB]`` float32, drawn by the caller (autoregressive
        branches select branch by branch with one draw); None: drawn here from ``generator``.
    :return: ``[B, NB]`` int64 actions.
    """
    batch, n_branches = q.shape[0], q.shape[1]
    if uniforms is None:
        u_explore = th.rand((batch, n_branches), generator=generator, device=q.device, dtype=th.float32)
        u_action = th.rand((batch, n_branches), generator=generator, device=q.device, dtype=th.float32)
    else:
        u_explore, u_action = uniforms
    iqr, alpha = iqr.float(), iqr_bonus
    if isinstance(iqr_bonus, th.Tensor):
        iqr, alpha = iqr * iqr_bonus, 1.0
    return cuda_ext.branch_select(
        q.float(), iqr, ens_std.float(), n_actions=n_actions, eps=eps, boltzmann=boltzmann,
        u_explore=u_explore, u_action=u_action, alpha=float(alpha), beta=float(ensemble_bonus),
    )
