"""Trading defaults that BranchingIQN receives as arguments.

:mod:`sb3_her_ext` is a generic SB3 algorithm: equal bottleneck widths, ε multiplier 1, no Boltzmann
branch unless asked. The values that suit foxenv's four-branch trading action (direction, magnitude,
order, urgency) live here, and :mod:`foxhunt.runs` passes them in.
"""

from __future__ import annotations

from typing import Any

from foxenv import spec

#: foxenv's four action branches, in order (foxenv publishes them as ``branch_names``).
BRANCH_NAMES: tuple[str, ...] = spec.BRANCH_NAMES
#: Market-feature bottleneck width of each branch: the magnitude branch reads the most of the market.
BOTTLENECK_DIMS: dict[str, int] = {"direction": 4, "magnitude": 8, "order": 6, "urgency": 4}
#: Per-branch ε multipliers: explore sizes and order types more than the direction.
EXPLORATION_MULTS: dict[str, float] = {"direction": 1.0, "magnitude": 2.0, "order": 1.5, "urgency": 1.5}
#: Branches that explore by Boltzmann sampling over their scores instead of uniformly.
BOLTZMANN_BRANCHES: tuple[str, ...] = ("order", "urgency")
#: The branch whose actions stratify the gradient vaccine's batch (a third each of Small, Half, Full).
VACCINE_BRANCH = "magnitude"

#: ``foxhunt train``'s sizes: a few minutes on a 2-core laptop CPU.
CPU_TRAIN_STEPS = 15_000
CPU_N_ENVS = 8
#: ``foxhunt train --device cuda``'s sizes: thousands of books through the device loop.
GPU_TRAIN_STEPS = 2_000_000
GPU_N_ENVS = 1024
GPU_CHECKPOINT_EVERY = 500_000
#: Steps of a generated synthetic market (the training and the evaluation market each).
SYNTHETIC_MARKET_STEPS = 20_000

#: BranchingIQN settings of ``foxhunt train`` (small networks so a CPU run stays short).
MODEL_KWARGS: dict[str, Any] = {
    "learning_rate": 3e-4,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "batch_size": 64,
    "gamma": 0.99,
    "train_freq": 1,
    "gradient_steps": 1,
    "target_update_interval": 2_000,
    "exploration_fraction": 0.3,
    "exploration_final_eps": 0.05,
    "diagnostics_interval": 500,
}
#: What changes on a GPU: a batch worth a graphed step (replay ratio 0.25 at 1024 books) and a buffer and
#: intervals that fit thousands of books a step.
GPU_MODEL_KWARGS: dict[str, Any] = {
    "batch_size": 256,
    "buffer_size": 500_000,
    "learning_starts": 20_000,
    "target_update_interval": 20_000,
    "diagnostics_interval": 20_000,
}
#: Policy settings of ``foxhunt train``.
POLICY_KWARGS: dict[str, Any] = {
    "net_arch": [64, 64],
    "n_ensemble": 3,
    "n_cos": 32,
    "n_quantiles": 16,
    "n_quantiles_target": 16,
    "n_quantiles_act": 16,
    "n_atoms": 51,
}
#: Environment settings of ``foxhunt train``.
ENV_KWARGS: dict[str, Any] = {"episode_length": 500}


def trading_algorithm_kwargs() -> dict[str, Any]:
    """The trading-specific arguments of :class:`~sb3_her_ext.BranchingIQN` for foxenv's action.

    :return: keyword arguments (``exploration_mults``, ``boltzmann_branches``, ``vaccine_branch``) to merge
        into the model's; ``policy_kwargs`` entries come from :func:`trading_policy_kwargs`.
    """
    return {
        "exploration_mults": dict(EXPLORATION_MULTS),
        "boltzmann_branches": list(BOLTZMANN_BRANCHES),
        "vaccine_branch": VACCINE_BRANCH,
    }


def trading_policy_kwargs() -> dict[str, Any]:
    """The trading-specific policy arguments (per-branch bottleneck widths by branch name).

    The names resolve through the ``branch_names`` that :class:`~foxhunt.envs.LOBVecEnv` publishes (the
    algorithm hands them to the policy); a policy built by hand needs ``branch_names=BRANCH_NAMES`` too.

    :return: keyword arguments to merge into ``policy_kwargs``.
    """
    return {"bottleneck_dims": dict(BOTTLENECK_DIMS)}
