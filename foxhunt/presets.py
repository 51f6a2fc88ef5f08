"""Trading defaults that BranchingIQN receives as arguments.

:mod:`sb3_her_ext` is a generic SB3 algorithm: equal bottleneck widths, ε multiplier 1, no Boltzmann
branch unless asked. The values that suit foxenv's four-branch trading action (direction, magnitude,
order, urgency) live here, and :mod:`foxhunt.runs` passes them in.

BranchingIQN sees the action through one of two faces (:data:`ACTION_FACES`): ``"branched"``, the four
branches, or ``"joint"``, one branch of the 81 joint actions (code ``27 d + 9 m + 3 o + u``,
:func:`foxhunt.envs.decode_joint`). The per-branch arguments apply to the branched face only
(:func:`face_algorithm_kwargs`, :func:`face_policy_kwargs`).
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


def resolve_action_face(action_face: str | None, field: str = "action_face") -> str:
    """The action face ``action_face`` names (``None``: :data:`ACTION_FACE`).

    :param action_face: ``"branched"``, ``"joint"`` or ``None``.
    :param field: how errors name the value.
    :return: the face.
    :raises ValueError: naming ``field`` and the value when it is not a face of :data:`ACTION_FACES`.
    """
    face = ACTION_FACE if action_face is None else action_face
    if not isinstance(face, str) or face not in ACTION_FACES:
        raise ValueError(f"{field}={action_face!r} must be one of {list(ACTION_FACES)} or None")
    return face


def resolve_hindsight(hindsight: bool | None, action_face: str | None) -> bool:
    """Whether hindsight replay is on for a face: ``None`` is on for the branched face, off for the joint.

    Hindsight relabels the direction and magnitude branches, which the joint face does not have.

    :param hindsight: ``True``, ``False`` or ``None`` (the face's default).
    :param action_face: the face (``None``: :data:`ACTION_FACE`).
    :return: the hindsight flag.
    :raises ValueError: naming ``hindsight`` and ``action_face`` for hindsight on the joint face.
    """
    face = resolve_action_face(action_face)
    if hindsight is None:
        return face == "branched"
    if hindsight and face == "joint":
        raise ValueError(
            f"hindsight={hindsight!r} cannot be used with action_face='joint': hindsight relabels the "
            "direction and magnitude branches, which the joint face does not have (hindsight=False or None)"
        )
    return bool(hindsight)


def face_algorithm_kwargs(action_face: str | None, hindsight: bool | None = None) -> dict[str, Any]:
    """BranchingIQN's trading arguments for an action face, ``hindsight`` included.

    :param action_face: the face (``None``: :data:`ACTION_FACE`).
    :param hindsight: as :func:`resolve_hindsight`.
    :return: on the branched face :func:`trading_algorithm_kwargs` and the hindsight flag; on the joint
        face :data:`JOINT_ALGORITHM_KWARGS` and ``hindsight=False`` (its one branch takes the algorithm's
        generic defaults otherwise).
    """
    face = resolve_action_face(action_face)
    kwargs = trading_algorithm_kwargs() if face == "branched" else dict(JOINT_ALGORITHM_KWARGS)
    return {**kwargs, "hindsight": resolve_hindsight(hindsight, face)}


def face_policy_kwargs(action_face: str | None) -> dict[str, Any]:
    """The policy's trading arguments for an action face.

    :param action_face: the face (``None``: :data:`ACTION_FACE`).
    :return: :func:`trading_policy_kwargs` on the branched face, nothing on the joint face.
    """
    return trading_policy_kwargs() if resolve_action_face(action_face) == "branched" else {}
