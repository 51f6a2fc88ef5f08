"""A tiny training run for the checkpoint, resume and fault tests (seconds on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from foxhunt.runs import RunConfig


class Crash(Exception):
    """Stands for a crash of the training process."""


class CrashAt(BaseCallback):
    """Raise :class:`Crash` once ``at`` environment steps are done."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.at:
            raise Crash
        return True


#: BranchingIQN's sizes of :func:`small_config`.
SMALL_MODEL_KWARGS: dict[str, int] = {"buffer_size": 500, "batch_size": 16, "learning_starts": 100,
                                      "diagnostics_interval": 90, "target_update_interval": 50}


def small_config(out: Path | None, **overrides: Any) -> RunConfig:
    """600 steps on 2 books: episodes end, the 500-row buffer wraps, every part of a step runs.

    :param out: the run folder.
    :param overrides: other RunConfig fields.
    :return: the config.
    """
    values: dict[str, Any] = dict(
        out=None if out is None else str(out), steps=600, n_envs=2, seed=5, eval_steps=5, progress=False,
        synthetic_market_steps=1500, checkpoint_every=200, keep_checkpoints=0,
        model_kwargs=dict(SMALL_MODEL_KWARGS),
        env_kwargs={"episode_length": 60},
    )
    values.update(overrides)
    return RunConfig(**values)


def assert_same_model(first: Path, second: Path) -> None:
    """The two model files hold equal parameters, buffers (PopArt, GradVac) and optimizer state, bit for bit.

    :param first: a ``model.zip``.
    :param second: another.
    """
    from sb3_her_ext import BranchingIQN

    a, b = BranchingIQN.load(first), BranchingIQN.load(second)
    assert a.num_timesteps == b.num_timesteps and a._n_updates == b._n_updates
    assert a._episode_num == b._episode_num
    state_a, state_b = a.policy.state_dict(), b.policy.state_dict()
    assert list(state_a) == list(state_b)
    different = [name for name in state_a if not th.equal(state_a[name], state_b[name])]
    assert not different, different
    assert th.equal(a.vaccine.target_cos, b.vaccine.target_cos)
    opt_a, opt_b = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    assert opt_a.keys() == opt_b.keys()
    for key in opt_a:
        for name, value in opt_a[key].items():
            assert th.equal(value, opt_b[key][name]), (key, name)
