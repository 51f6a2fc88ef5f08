"""Helpers shared by the prioritized-replay op tests: an empty replay state and a batch of rows."""

from __future__ import annotations

import torch

from cuda_ext.ops_per import new_tree


def make_state(capacity: int, obs_dim: int = 3, n_branches: int = 4, device: str = "cpu") -> dict:
    """An empty replay ring (layout of ``cuda_ext/README.md``).

    :param capacity: rows C.
    :param obs_dim: observation width D.
    :param n_branches: action branches NB.
    :param device: where the tensors live.
    :return: dict of the state tensors.
    """
    return {
        "obs": torch.zeros(capacity, obs_dim, device=device),
        "next_obs": torch.zeros(capacity, obs_dim, device=device),
        "action": torch.zeros(capacity, n_branches, dtype=torch.int64, device=device),
        "reward": torch.zeros(capacity, device=device),
        "done": torch.zeros(capacity, device=device),
        "kind": torch.zeros(capacity, dtype=torch.int8, device=device),
        "tree": new_tree(capacity, device),
        "head_size": torch.zeros(2, dtype=torch.int64, device=device),
        "max_priority": torch.ones(1, device=device),
    }


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
    """Call ``per_push`` on a state and a batch.

    :param state: from :func:`make_state` (mutated).
    :param rows: from :func:`make_rows`.
    :param alpha: priority exponent.
    :return: the slots.
    """
    return torch.ops.cuda_ext.per_push(
        state["obs"],
        state["next_obs"],
        state["action"],
        state["reward"],
        state["done"],
        state["kind"],
        state["tree"],
        state["head_size"],
        state["max_priority"],
        rows["new_obs"],
        rows["new_next_obs"],
        rows["new_action"],
        rows["new_reward"],
        rows["new_done"],
        rows["new_kind"],
        rows["wants"],
        rows["new_priority"],
        rows["max_multiplier"],
        alpha,
    )


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
