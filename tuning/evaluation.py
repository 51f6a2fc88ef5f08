"""The one place where tuning scores a policy on held-out data.

A trial's intermediate values come from :func:`held_out_metrics`, on the same held-out data as the final
evaluation that :func:`foxhunt.runs.train` writes to ``evaluation.json`` (the trial's value), so tuned
and reported numbers mean the same thing: the run's ``eval_split``, the validation data in a study.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from foxenv.config import split_env_kwargs
from foxhunt.runs import RunConfig, eval_seed


@contextlib.contextmanager
def isolated_rng(seed: int, device: str) -> Iterator[None]:
    """Seed torch, numpy and ``random`` for the block, then restore their states.

    An evaluation in the middle of training then neither depends on nor changes the training's random
    streams (a greedy IQN action samples quantile fractions), so a trial trains as ``foxhunt train`` does.
    """
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    numpy_state, python_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(numpy_state)
            random.setstate(python_state)


def held_out_metrics(model: Any, config: RunConfig) -> dict[str, Any]:
    """Score ``model``'s deterministic policy on the run's held-out data for ``config.eval_steps`` steps,
    with random streams of its own (:func:`isolated_rng`).

    :param model: a BranchingIQN (anything with SB3's ``predict``).
    :param config: the run's config (data, books, device, seeds, env settings).
    :return: the evaluation's metrics dict (``sharpe``, PnL after fees, ...), with
        ``mean_episode_reward`` (the mean total reward of the finished episodes, NaN without one).
    """
    with isolated_rng(eval_seed(config), config.device):
        return _score(model, config)


def _score(model: Any, config: RunConfig) -> dict[str, Any]:
    try:
        from foxhunt.evaluation.api import evaluate
    except ImportError:  # before the evaluation recorder: the rollout's evaluate_agent
        from foxhunt.evaluation.rollout import evaluate_agent
        from foxhunt.runs import make_env

        return evaluate_agent(model, make_env(config, eval_seed(config), split=config.eval_split),
                              config.eval_steps)
    from foxhunt.evaluation.rollout import finished_episode_rewards
    from foxhunt.runs import eval_market_seed

    # the settings of foxhunt.runs' final evaluation, without the baselines
    config_kwargs, market_kwargs = split_env_kwargs(config.resolved_env_kwargs())
    market_kwargs.pop("market_seed", None)
    if config.data == "synthetic":
        market_kwargs.setdefault("num_steps", config.synthetic_market_steps)
    result = evaluate(
        model,
        config.data,
        n_envs=config.n_envs,
        steps=config.eval_steps,
        seed=eval_seed(config),
        market_seed=eval_market_seed(config),
        split=config.eval_split,
        env_kwargs=config_kwargs,
        market_kwargs=market_kwargs,
        device=config.device,
        name="policy",
    )
    metrics = dict(result.metrics)
    rewards = finished_episode_rewards(result.recording)
    metrics.setdefault("mean_episode_reward", float(rewards.mean()) if rewards.numel() else math.nan)
    return metrics
