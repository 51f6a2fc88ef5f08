"""Action branches: how many actions each has, their names, and per-branch arguments keyed by index or name.

A ``MultiDiscrete`` action space has one branch per entry, a ``Discrete`` one has one branch. Branches are
named by the env's ``branch_names`` attribute when it publishes one, else ``"0", "1", ...``; per-branch
arguments (ε multipliers, Boltzmann branches, bottleneck widths, the vaccine's branch) accept either the
index or the name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces


def branch_action_dims(action_space: spaces.Space) -> list[int]:
    """Number of actions of each branch: ``[n]`` for ``Discrete(n)``, ``nvec`` for a 1-D ``MultiDiscrete``.

    The one check of the action space shared by the policy, the replay buffer and the algorithm.

    :param action_space: the action space; actions must start at 0.
    :return: one action count per branch.
    """
    if isinstance(action_space, spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"action_space.start={int(action_space.start)} must be 0")
        return [int(action_space.n)]
    shown = " ".join(str(action_space).split())
    if isinstance(action_space, spaces.MultiDiscrete):
        if action_space.nvec.ndim != 1:
            raise ValueError(f"action_space={shown} is not supported: "
                             f"action_space.nvec.shape={action_space.nvec.shape} must be 1-D")
        if np.any(action_space.start != 0):
            raise ValueError(f"action_space.start={action_space.start.tolist()} must be all 0")
        return [int(n) for n in action_space.nvec]
    raise ValueError(f"action_space={shown} is not supported: it must be MultiDiscrete (1-D) or Discrete")


def env_branch_names(env: Any, n_branches: int) -> list[str]:
    """Branch names the (vector) env publishes (``branch_names``), else :func:`default_branch_names`."""
    if env is not None and env.has_attr("branch_names"):
        names = [str(name) for name in env.get_attr("branch_names")[0]]
        if len(names) != n_branches:
            raise ValueError(f"env branch_names={names} has {len(names)} names for {n_branches} branches")
        return names
    return list(default_branch_names(n_branches))


def default_branch_names(n_branches: int) -> tuple[str, ...]:
    """Branch names used when the env publishes none.

    :param n_branches: number of action branches.
    :return: ``"0", "1", ..., str(n_branches - 1)``.
    """
    return tuple(str(b) for b in range(n_branches))


def branch_index(key: int | str, branch_names: Sequence[str], field: str) -> int:
    """Resolve a branch given by index or by name.

    :param key: a branch index (``0 <= key < NB``) or one of ``branch_names``.
    :param branch_names: the names of the ``NB`` branches, in order.
    :param field: the argument name, quoted in errors.
    :return: the branch index.
    """
    n_branches = len(branch_names)
    if isinstance(key, bool | np.bool_):
        raise ValueError(f"{field}: branch key {key!r} must be an index or a branch name")
    if isinstance(key, int | np.integer):
        if not 0 <= key < n_branches:
            raise ValueError(f"{field}: branch index {key} must lie in [0, {n_branches})")
        return int(key)
    if isinstance(key, str) and key in branch_names:
        return list(branch_names).index(key)
    raise ValueError(f"{field}: unknown branch {key!r}; branches are {list(branch_names)}")
