"""Helpers shared by the prioritized-replay op tests: an empty replay state and a batch of rows."""

from __future__ import annotations

import torch

import cuda_ext
from cuda_ext import PushRows, ReplayStorage


def make_state(capacity: int, obs_dim: int = 3, n_branches: int = 4, device: str = "cpu") -> dict:
    """An empty replay ring (:meth:`cuda_ext.ReplayStorage.zeros`) as a dict of its tensors.

    :param capacity: rows C.
    :param obs_dim: observation width D.
    :param n_branches: action branches NB.
    :param device: where the tensors live.
    :return: dict of the state tensors, by :class:`~cuda_ext.ReplayStorage` field name.
    """
    return ReplayStorage.zeros(capacity, obs_dim, n_branches, device).tensors()


def make_rows(
    n: int,
    obs_dim: int = 3,
    n_branches: int = 4,
    wants: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    device: str = "cpu",
) -> dict:
    """A batch of incoming rows with distinct contents (real rows: priority term 0, multiplier 1).

    :param n: rows N.
    :param obs_dim: observation width D.
    :param n_branches: action branches NB.
    :param wants: which rows want a slot (default: all).
    :param generator: random source (default: contents ``0 .. n-1`` by row).
    :param device: where the tensors live.
    :return: dict of the ``new_*`` arguments of ``per_push``.
    """
    if generator is None:
        base = torch.arange(n, dtype=torch.float32).unsqueeze(1)
        new_obs = base + torch.arange(obs_dim) / 10
    else:
        new_obs = torch.randn(n, obs_dim, generator=generator)
    return {
        "new_obs": new_obs.to(device),
        "new_next_obs": (new_obs + 100).to(device),
        "new_action": (torch.arange(n).unsqueeze(1) % 3).expand(n, n_branches).contiguous().to(device),
        "new_reward": torch.arange(n, dtype=torch.float32, device=device) * 0.5,
        "new_done": (torch.arange(n, device=device) % 2).float(),
        "new_kind": (torch.arange(n, device=device) % 4).to(torch.int8),
        "wants": torch.ones(n, dtype=torch.bool, device=device) if wants is None else wants.to(device),
        "new_priority": torch.zeros(n, device=device),
        "max_multiplier": torch.ones(n, device=device),
    }


def push(state: dict, rows: dict, alpha: float = 0.6) -> torch.Tensor:
    """Call :func:`cuda_ext.per_push` on a state and a batch.

    :param state: from :func:`make_state` (mutated).
    :param rows: from :func:`make_rows`.
    :param alpha: priority exponent.
    :return: the slots.
    """
    new_rows = PushRows(
        obs=rows["new_obs"], next_obs=rows["new_next_obs"], action=rows["new_action"],
        reward=rows["new_reward"], done=rows["new_done"], kind=rows["new_kind"], wants=rows["wants"],
        priority=rows["new_priority"], max_multiplier=rows["max_multiplier"],
    )
    return cuda_ext.per_push(ReplayStorage(**state), new_rows, alpha=alpha)


def full_rebuild(tree: torch.Tensor) -> torch.Tensor:
    """Oracle: every internal node recomputed level by level as ``left + right`` with plain tensor ops (the
    kernels' arithmetic, any size), in place.

    :param tree: sum tree ``[2P] float64``.
    :return: the same tensor.
    """
    start = tree.shape[0] // 2
    while start > 1:
        tree[start // 2 : start] = tree[start : 2 * start : 2] + tree[start + 1 : 2 * start : 2]
        start //= 2
    return tree
