"""Trading defaults that BranchingIQN receives as arguments.

:mod:`sb3_her_ext` is a generic SB3 algorithm: equal bottleneck widths, ε multiplier 1, no Boltzmann
branch unless asked. The values that suit foxenv's four-branch trading action (direction, magnitude,
order, urgency) live here, and :mod:`foxhunt.runs` passes them in.

BranchingIQN sees the action through one of two faces (:data:`ACTION_FACES`): ``"branched"``, the four
branches, or ``"joint"``, one branch of the 81 joint actions (code ``27 d + 9 m + 3 o + u``,
:func:`foxhunt.envs.decode_joint`). The per-branch arguments apply to the branched face only
(:func:`foxhunt.config.algorithm_presets`, :func:`foxhunt.config.policy_presets`).
"""

from __future__ import annotations

from typing import Any

#: foxenv's four action branches, in order (``foxenv.spec.BRANCH_NAMES``, written out so that building
#: ``foxhunt``'s parser imports no torch; tests/foxhunt/test_cli.py checks they agree).
BRANCH_NAMES: tuple[str, ...] = ("direction", "magnitude", "order", "urgency")
#: Market-feature bottleneck width of each branch: the magnitude branch reads the most of the market.
BOTTLENECK_DIMS: dict[str, int] = {"direction": 4, "magnitude": 8, "order": 6, "urgency": 4}
#: Per-branch ε multipliers: explore sizes and order types more than the direction.
EXPLORATION_MULTS: dict[str, float] = {"direction": 1.0, "magnitude": 2.0, "order": 1.5, "urgency": 1.5}
#: Branches that explore by Boltzmann sampling over their scores instead of uniformly.
BOLTZMANN_BRANCHES: tuple[str, ...] = ("order", "urgency")
#: The branch whose actions stratify the gradient vaccine's batch (a third each of Small, Half, Full).
VACCINE_BRANCH = "magnitude"

#: The action faces BranchingIQN can train on: foxenv's four branches, or one branch of 81 joint actions.
ACTION_FACES: tuple[str, ...] = ("branched", "joint")
#: The action face of a run that names none (``RunConfig.action_face=None``): the joint face, which learned
#: the planted signal where the four independent branches did not (experiments/README.md).
ACTION_FACE = "joint"
#: BranchingIQN arguments of the joint face: the vaccine stratifies by a branch's three values (off, as in the
#: experiment that chose this face).
JOINT_ALGORITHM_KWARGS: dict[str, Any] = {"vaccine_interval": 0}
#: BranchingIQN arguments that name the branched face's branches (dropped on the joint face).
BRANCHED_ALGORITHM_ARGS: tuple[str, ...] = ("exploration_mults", "boltzmann_branches", "vaccine_branch")
#: Policy arguments that name the branched face's branches (dropped on the joint face).
BRANCHED_POLICY_ARGS: tuple[str, ...] = ("bottleneck_dims",)

#: ``foxhunt train``'s sizes: a few minutes on a 2-core laptop CPU.
CPU_TRAIN_STEPS = 15_000
CPU_N_ENVS = 8
#: ``foxhunt train --device cuda``'s sizes: thousands of books through the device loop.
GPU_TRAIN_STEPS = 2_000_000
GPU_N_ENVS = 1024
GPU_CHECKPOINT_EVERY = 500_000
#: Steps of a generated synthetic market (the training and the evaluation market each).
SYNTHETIC_MARKET_STEPS = 20_000
#: Steps of an episode (``EnvSettings.episode_length``).
EPISODE_LENGTH = 500
#: Hidden layer widths of the policy (``PolicySettings.net_arch``): small, so a CPU run stays short.
NET_ARCH: tuple[int, ...] = (64, 64)

#: BranchingIQN's sizes on the CPU (``learning_starts`` and ``diagnostics_interval`` at most a quarter of
#: the run: :func:`foxhunt.config.algorithm_presets`).
CPU_SIZES: dict[str, int] = {"buffer_size": 100_000, "learning_starts": 1_000, "batch_size": 64,
                             "target_update_interval": 2_000, "diagnostics_interval": 500}
#: What changes on a GPU: a batch worth a graphed step (replay ratio 0.25 at 1024 books) and a buffer and
#: intervals that fit thousands of books a step.
GPU_SIZES: dict[str, int] = {"buffer_size": 500_000, "learning_starts": 20_000, "batch_size": 256,
                             "target_update_interval": 20_000, "diagnostics_interval": 20_000}

#: ``foxhunt train --recipe NAME``: config fields by dotted name (as ``--hyperparams`` takes them) that a
#: named recipe sets unless the command line gives them. ``fast``: the settings that learned the weak planted
#: signal (strength 1) to 50 % of the oracle's held-out PnL in a median 8.8 s of training on one H200 and
#: 101 s on a 2-core CPU, 5/5 seeds each (``benchmarks/RESULTS.md``, "Time to score"): 64 books, a rollout of
#: 8 vector steps then 8 gradient steps (one graph replay on a GPU), learning rate 1e-3, discount 0.9, one
#: ensemble head, C51 loss weight 0, with the GPU's replay sizes on any device (batch 256, 20k random steps
#: first, a target update every 20k steps, 500k rows) and 2^20 env steps (checkpoints every 2^18).
RECIPES: dict[str, dict[str, Any]] = {
    "fast": {"n_envs": 64, "steps": 2**20, "checkpoint_every": 2**18,
             "algorithm.learning_rate": 1e-3, "algorithm.gamma": 0.9, "algorithm.c51_alpha": 0.0,
             "algorithm.train_freq": 8, "algorithm.gradient_steps": 8, "algorithm.batch_size": 256,
             "algorithm.learning_starts": 20_000, "algorithm.target_update_interval": 20_000,
             "algorithm.buffer_size": 500_000, "policy.n_ensemble": 1},
}


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
