"""The one place where tuning scores a policy on held-out data.

A trial's intermediate values come from :func:`held_out_metrics`, on the same held-out data as the final
evaluation that :func:`foxhunt.runs.train` writes to ``evaluation.json`` (the trial's value), so tuned
and reported numbers mean the same thing.
"""

from __future__ import annotations

import math
from typing import Any

from foxhunt.runs import RunConfig, eval_seed


def held_out_metrics(model: Any, config: RunConfig) -> dict[str, Any]:
    """Score ``model``'s deterministic policy on the run's held-out data for ``config.eval_steps`` steps.

    :param model: a BranchingIQN (anything with SB3's ``predict``).
    :param config: the run's config (data, books, device, seeds, env settings).
    :return: the evaluation's metrics dict (``sharpe``, PnL after fees, ...), with
        ``mean_episode_reward`` (the mean total reward of the finished episodes, NaN without one).
    """
    try:
        from foxhunt.evaluation.api import evaluate, split_env_kwargs
    except ImportError:  # before the evaluation recorder: the rollout's evaluate_agent
        from foxhunt.evaluation.rollout import evaluate_agent
        from foxhunt.runs import make_env

        return evaluate_agent(model, make_env(config, eval_seed(config), split="test"), config.eval_steps)
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
        split="test",
        env_kwargs=config_kwargs,
        market_kwargs=market_kwargs,
        device=config.device,
        name="policy",
    )
    metrics = dict(result.metrics)
    rewards = finished_episode_rewards(result.recording)
    metrics.setdefault("mean_episode_reward", float(rewards.mean()) if rewards.numel() else math.nan)
    return metrics
