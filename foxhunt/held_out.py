"""Scoring a policy on a run's held-out data in the middle of training, without touching its random streams.

:func:`foxhunt.runs.held_out_metrics` (``foxhunt train --eval-freq``, :mod:`foxhunt.eval_callback`) and
``foxhunt tune``'s trials (:mod:`tuning.evaluation`) score through :func:`score_held_out`, on the same
held-out data as the final evaluation that :func:`foxhunt.runs.train` writes to ``evaluation.json``, so
tuned, monitored and reported numbers mean the same thing. (No import of :mod:`foxhunt.runs` here: it
imports this module.)
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from foxenv.config import split_env_kwargs

if TYPE_CHECKING:
    from foxhunt.runs import RunConfig


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


def score_held_out(model: Any, config: RunConfig, seed: int, market_seed: int) -> dict[str, Any]:
    """Score ``model``'s deterministic policy on ``config``'s held-out data (its ``eval_split``) for
    ``config.eval_steps`` steps, with random streams of its own (:func:`isolated_rng`).

    :param model: a BranchingIQN (anything with SB3's ``predict``).
    :param config: the run's config (data, books, device, env settings, ``eval_split``).
    :param seed: the seed of the episode windows (:func:`foxhunt.runs.eval_seed`).
    :param market_seed: the synthetic held-out market's seed (:func:`foxhunt.runs.eval_market_seed`).
    :return: the evaluation's metrics dict (``sharpe``, PnL after fees, ...), with
        ``mean_episode_reward`` (the mean total reward of the finished episodes, NaN without one).
    """
    with isolated_rng(seed, config.device):
        return _score(model, config, seed, market_seed)


def _score(model: Any, config: RunConfig, seed: int, market_seed: int) -> dict[str, Any]:
    from foxhunt.evaluation.api import evaluate
    from foxhunt.evaluation.rollout import finished_episode_rewards

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
        seed=seed,
        market_seed=market_seed,
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
