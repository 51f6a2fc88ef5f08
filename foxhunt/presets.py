"""``foxhunt train``'s presets, as configs, and the choices made for a run before it starts.

The config tree's fields (:mod:`foxhunt.config`, :class:`foxhunt.runs.RunConfig`) carry the defaults; this
module holds what is chosen over them:

- the presets, as :class:`~foxhunt.runs.RunConfig` instances: :data:`CPU` (``foxhunt
  train``, a few minutes on a laptop CPU), :data:`GPU` (``foxhunt train --device cuda``: thousands of books
  through the device loop) and :data:`FAST` (``foxhunt train --recipe fast``; :data:`RECIPES` names the
  fields it sets, as ``--hyperparams`` takes them);
- the choices that depend on the run (:func:`resolve`, the fields of :data:`foxhunt.config.AUTO`): the
  replay sizes of its device (:data:`DEVICE_SIZES`), the CUDA graphs and device loop on CUDA, and the trading
  settings of its action face.

:mod:`sb3_her_ext` is a generic SB3 algorithm: equal bottleneck widths, ε multiplier 1, no Boltzmann branch
unless asked. The values that suit foxenv's four-branch trading action (direction, magnitude, order,
urgency) live here. BranchingIQN sees the action through one of two faces (:data:`ACTION_FACES`):
``"branched"``, the four branches, or ``"joint"``, one branch of the 81 joint actions (code
``27 d + 9 m + 3 o + u``, :func:`foxhunt.envs.decode_joint`); the per-branch settings apply to the branched
face only.
"""

from __future__ import annotations

from typing import Any

import torch as th

from foxenv import spec
from foxhunt.config import ACTION_FACE, ACTION_FACES, AlgorithmSettings, PolicySettings
from foxhunt.runs import RunConfig

__all__ = ["ACTION_FACE", "ACTION_FACES", "CPU", "FAST", "GPU", "RECIPES", "resolve"]

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

#: ``foxhunt train``: the tree's defaults (15,000 steps on 8 books, a few minutes on a 2-core laptop CPU).
CPU = RunConfig()
#: ``foxhunt train --device cuda``: 2,000,000 steps on 1,024 books through the device loop.
GPU = RunConfig(device="cuda", n_envs=1024, steps=2_000_000, checkpoint_every=500_000)
#: ``foxhunt train --recipe fast``: the settings that learned the weak planted signal (strength 1) to 50 % of
#: the oracle's held-out PnL in a median 8.8 s of training on one H200 and 101 s on a 2-core CPU, 5/5 seeds
#: each (``benchmarks/RESULTS.md``, "Time to score"): 64 books, a rollout of 8 vector steps then 8 gradient
#: steps (one graph replay on a GPU), learning rate 1e-3, discount 0.9, one ensemble head, C51 loss weight 0,
#: with the GPU's replay sizes on any device (batch 256, 20k random steps first, a target update every 20k
#: steps, 500k rows) and 2^20 env steps (checkpoints every 2^18).
FAST = RunConfig(
    n_envs=64, steps=2**20, checkpoint_every=2**18,
    algorithm=AlgorithmSettings(learning_rate=1e-3, gamma=0.9, c51_alpha=0.0, train_freq=8, gradient_steps=8,
                                batch_size=256, learning_starts=20_000, target_update_interval=20_000,
                                buffer_size=500_000),
    policy=PolicySettings(n_ensemble=1),
)


def changes(config: RunConfig, base: RunConfig = CPU) -> dict[str, Any]:
    """The fields of ``config`` that differ from ``base``'s, by dotted name (as ``--hyperparams`` takes them).

    :param config: a config.
    :param base: the config it is compared with (default: the tree's defaults).
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

    mine, theirs = flat(config.to_dict()), flat(base.to_dict())
    return {name: value for name, value in mine.items() if theirs[name] != value}


#: ``foxhunt train --recipe NAME``: the fields a recipe sets (over the defaults, or ``--config``'s file)
#: unless the command line gives them, by dotted name.
RECIPES: dict[str, dict[str, Any]] = {"fast": changes(FAST)}


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


def auto_values(config: RunConfig) -> dict[str, Any]:
    """What the fields of :data:`foxhunt.config.AUTO` are for ``config``'s run (its device, steps, books,
    action face and data), whether or not they are set.

    :param config: a config.
    :return: dotted field name -> value.
    """
    cuda = th.device(config.device).type == "cuda"
    sizes = DEVICE_SIZES["cuda" if cuda else "cpu"]
    values: dict[str, Any] = {f"algorithm.{name}": value for name, value in sizes.items()}
    values["algorithm.learning_starts"] = min(sizes["learning_starts"], max(config.steps // 4, config.n_envs))
    values["algorithm.diagnostics_interval"] = min(sizes["diagnostics_interval"], max(config.steps // 4, 1))
    values.update({"cuda_graph": cuda, "device_loop": cuda, **face_settings(config.action_face)})
    if config.data == "synthetic":
        values["env.market_seed"] = 0
    return values


def resolve(config: RunConfig) -> RunConfig:
    """``config`` with each field of :data:`foxhunt.config.AUTO` that is ``None`` set to its run's choice
    (:func:`auto_values`): every value the run will use. Resolving a resolved config changes nothing.

    :param config: a config.
    :return: the resolved config.
    """
    tree = config.to_dict()

    def unset(name: str) -> bool:
        section, _, field = name.rpartition(".")
        return (tree[section] if section else tree)[field] is None

    chosen = {name: value for name, value in auto_values(config).items() if unset(name)}
    return config.with_values(chosen) if chosen else config


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
