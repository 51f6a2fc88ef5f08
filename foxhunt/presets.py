"""``foxhunt train``'s presets, as configs, and the trading settings BranchingIQN receives.

The config tree's fields (:mod:`foxhunt.config`, :class:`foxhunt.runs.RunConfig`) carry the defaults; this
module holds what is chosen over them:

- the presets, as :class:`~foxhunt.runs.RunConfig` instances: :data:`CPU` (``foxhunt
  train``, a few minutes on a laptop CPU), :data:`GPU` (``foxhunt train --device cuda``: thousands of books
  through the device loop) and :data:`FAST` (``foxhunt train --recipe fast``; :data:`RECIPES` names the
  fields it sets, as ``--hyperparams`` takes them);
- the trading settings BranchingIQN receives on the branched face (:func:`trading_algorithm_kwargs`,
  :func:`trading_policy_kwargs`; defined in :mod:`foxhunt.config`, whose :func:`~foxhunt.config.resolve`
  chooses them, with the device's sizes :data:`DEVICE_SIZES`, for the fields of
  :data:`foxhunt.config.AUTO`).

:mod:`sb3_her_ext` is a generic SB3 algorithm: equal bottleneck widths, ε multiplier 1, no Boltzmann branch
unless asked. The values that suit foxenv's four-branch trading action (direction, magnitude, order,
urgency) are named here (defined in :mod:`foxhunt.config`). BranchingIQN sees the action through one of two
faces (:data:`ACTION_FACES`): ``"branched"``, the four branches, or ``"joint"``, one branch of the 81 joint
actions (code ``27 d + 9 m + 3 o + u``, :func:`foxhunt.envs.decode_joint`); the per-branch settings apply
to the branched face only.
"""

from __future__ import annotations

from typing import Any

from foxhunt.config import (
    ACTION_FACE,
    ACTION_FACES,
    BOLTZMANN_BRANCHES,
    BOTTLENECK_DIMS,
    BRANCH_NAMES,
    BRANCHED_ALGORITHM_ARGS,
    BRANCHED_POLICY_ARGS,
    DEVICE_SIZES,
    EXPLORATION_MULTS,
    VACCINE_BRANCH,
    AlgorithmSettings,
    PolicySettings,
    face_settings,
)
from foxhunt.runs import RunConfig

#: the trading settings and sizes live beside the config tree that chooses them (:mod:`foxhunt.config`)
__all__ = ["ACTION_FACE", "ACTION_FACES", "BOLTZMANN_BRANCHES", "BOTTLENECK_DIMS", "BRANCHED_ALGORITHM_ARGS",
           "BRANCHED_POLICY_ARGS", "BRANCH_NAMES", "DEVICE_SIZES", "EXPLORATION_MULTS", "GPU_N_ENVS",
           "GPU_STEPS", "RECIPE_NAMES", "VACCINE_BRANCH", "changes", "trading_algorithm_kwargs",
           "trading_policy_kwargs"]
# and, built on first use (module __getattr__): CPU, GPU, FAST, RECIPES

#: ``foxhunt train --device cuda``'s books and steps (the parser's help names them without building a config)
GPU_N_ENVS, GPU_STEPS = 1024, 2_000_000
#: the names of ``foxhunt train --recipe NAME`` (:data:`RECIPES`)
RECIPE_NAMES: tuple[str, ...] = ("fast",)


def _build_presets() -> dict[str, Any]:
    """The preset configs and recipes, built on first use: a :class:`RunConfig` checks its env settings with
    foxenv (torch), which ``foxhunt --help`` must not import."""
    #: ``foxhunt train``: the tree's defaults (15,000 steps on 8 books, a few minutes on a 2-core laptop CPU).
    cpu = RunConfig()
    #: ``foxhunt train --device cuda``: 2,000,000 steps on 1,024 books through the device loop.
    gpu = RunConfig(device="cuda", n_envs=GPU_N_ENVS, steps=GPU_STEPS, checkpoint_every=500_000)
    #: ``foxhunt train --recipe fast``: the settings that learned the weak planted signal (strength 1) to 50 %
    #: of the oracle's held-out PnL in a median 8.8 s of training on one H200 and 101 s on a 2-core CPU, 5/5
    #: seeds each (``benchmarks/RESULTS.md``, "Time to score"): 64 books, a rollout of 8 vector steps then 8
    #: gradient steps (one graph replay on a GPU), learning rate 1e-3, discount 0.9, one ensemble head, C51
    #: loss weight 0, with the GPU's replay sizes on any device (batch 256, 20k random steps first, a target
    #: update every 20k steps, 500k rows) and 2^20 env steps (checkpoints every 2^18).
    fast = RunConfig(
        n_envs=64, steps=2**20, checkpoint_every=2**18,
        algorithm=AlgorithmSettings(learning_rate=1e-3, gamma=0.9, c51_alpha=0.0, train_freq=8,
                                    gradient_steps=8, batch_size=256, learning_starts=20_000,
                                    target_update_interval=20_000, buffer_size=500_000),
        policy=PolicySettings(n_ensemble=1),
    )
    recipes = {"fast": changes(fast, cpu)}
    assert tuple(recipes) == RECIPE_NAMES
    return {"CPU": cpu, "GPU": gpu, "FAST": fast, "RECIPES": recipes}


_BUILT: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """:data:`CPU`, :data:`GPU`, :data:`FAST` and :data:`RECIPES` (``foxhunt train --recipe NAME``: the
    fields a recipe sets over the defaults, or ``--config``'s file, unless the command line gives them, by
    dotted name), built on first use."""
    if name in ("CPU", "GPU", "FAST", "RECIPES"):
        if not _BUILT:
            _BUILT.update(_build_presets())
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def changes(config: RunConfig, base: RunConfig | None = None) -> dict[str, Any]:
    """The fields of ``config`` that differ from ``base``'s, by dotted name (as ``--hyperparams`` takes them).

    :param config: a config.
    :param base: the config it is compared with (default: the tree's defaults, :data:`CPU`).
    :return: dotted field name -> ``config``'s value.
    """
    def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in tree.items():
            if isinstance(value, dict) and prefix == "":
                out.update(flat(value, f"{name}."))
            else:
                out[prefix + name] = value
        return out

    base = RunConfig() if base is None else base
    mine, theirs = flat(config.to_dict()), flat(base.to_dict())
    return {name: value for name, value in mine.items() if theirs[name] != value}




def trading_algorithm_kwargs() -> dict[str, Any]:
    """The trading-specific arguments of :class:`~sb3_her_ext.BranchingIQN` for foxenv's action (the branched
    face's ``exploration_mults``, ``boltzmann_branches``, ``vaccine_branch``).

    :return: keyword arguments to merge into the model's; ``policy_kwargs`` entries come from
        :func:`trading_policy_kwargs`.
    """
    return {name.removeprefix("algorithm."): value for name, value in face_settings("branched").items()
            if name.removeprefix("algorithm.") in BRANCHED_ALGORITHM_ARGS}


def trading_policy_kwargs() -> dict[str, Any]:
    """The trading-specific policy arguments (per-branch bottleneck widths by branch name).

    The names resolve through the ``branch_names`` that :class:`~foxhunt.envs.LOBVecEnv` publishes (the
    algorithm hands them to the policy); a policy built by hand needs ``branch_names=BRANCH_NAMES`` too.

    :return: keyword arguments to merge into ``policy_kwargs``.
    """
    return {"bottleneck_dims": dict(BOTTLENECK_DIMS)}
