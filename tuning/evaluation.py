"""The one place where tuning scores a policy on held-out data (the evaluation issue's recorder goes here).

Both the intermediate values a trial reports and its final value (``evaluation.json`` of the run, written
by :func:`foxhunt.runs.train`) come from :func:`foxhunt.evaluation.rollout.evaluate_agent`, so tuned and
reported numbers mean the same thing.
"""

from __future__ import annotations

from typing import Any


def held_out_metrics(model: Any, env: Any, num_steps: int) -> dict[str, Any]:
    """Score ``model``'s deterministic policy on ``env`` for ``num_steps`` vector steps.

    :param model: a BranchingIQN (anything with SB3's ``predict``).
    :param env: the held-out vector env (:func:`foxhunt.runs.make_env` with the ``"test"`` split).
    :param num_steps: vector steps (>= 2).
    :return: the metrics dict (``sharpe``, ``total_pnl``, ``mean_episode_reward``, ...).
    """
    from foxhunt.evaluation.rollout import evaluate_agent

    return evaluate_agent(model, env, num_steps)
