"""Held-out scoring during training, shared by ``benchmarks/time_to_score.py`` and
``experiments.hindsight_speed``: a model's greedy policy on device tensors, the held-out market with its
oracle's PnL, a callback that scores every so many env steps and stops at a target share of the oracle (or a
cap of training seconds), and one scored training run (:func:`train_scored`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from experiments import runner
from experiments.agents import Agent
from foxhunt.envs import decode_joint


def stream_synchronizer(device: str | th.device) -> Callable[[], None]:
    """A function that waits for the work this thread queued on ``device`` (its current stream; a no-op on
    the CPU): one run's clock, not held up by the other runs of a concurrent batch."""
    device = th.device(device)
    if device.type == "cuda":
        return lambda: th.cuda.current_stream(device).synchronize()
    return lambda: None


class GreedyDevicePolicy:
    """A model's greedy policy as a recorder policy, acting on device tensors (no numpy round trip).

    Works for BranchingIQN (either face), SB3 DQN and sb3-contrib QR-DQN: each policy's ``_predict`` on a
    float32 batch; joint codes (``[B]`` or ``[B, 1]``) are decoded to the four branches
    (:func:`foxhunt.envs.decode_joint`, unchecked: the policy's greedy codes, no host sync).

    :param model: the model.
    :param name: its name in recordings.
    """

    def __init__(self, model: Any, name: str = "model") -> None:
        self.model = model
        self.name = name

    def reset(self, num_books: int, device: th.device) -> None:
        """Nothing to prepare."""

    def act(self, obs: th.Tensor, episode_start: th.Tensor) -> th.Tensor:
        """``[B, 4]`` greedy actions."""
        policy = self.model.policy
        with th.no_grad():
            action = policy._predict(obs.to(policy.device, th.float32), deterministic=True)
        action = action.to(obs.device).long()
        if action.numel() == obs.shape[0]:
            return decode_joint(action, obs.shape[0], check_range=False)
        return action.reshape(obs.shape[0], 4)


class HeldOutScorer:
    """The held-out market, its windows and the oracle's PnL on them; scores a model's greedy policy.

    :param setup: the markets (a planted signal or waves), env settings, device, and the books, steps and seed
        of the windows.
    """

    def __init__(self, setup: runner.Setup) -> None:
        from foxhunt.evaluation import build_market
        from foxhunt.evaluation.api import _oracle_for, split_env_kwargs

        if not setup.planted:
            raise ValueError(f"signal_strength={setup.signal_strength}, market={setup.market}: time to score "
                             "needs a planted signal or waves (an oracle)")
        env_kwargs = setup.config(Agent("scorer"), 0).resolved_env_kwargs()
        env_kwargs.pop("market_seed", None)
        config, extra = split_env_kwargs(env_kwargs)
        market_options = {**extra, **setup.market_kwargs(), "num_steps": setup.market_steps}
        if "levels" in config:
            market_options.setdefault("levels", config["levels"])
        self.market = build_market(setup.data, market_seed=setup.eval_market_seed, device=setup.device,
                                   **market_options)
        config["episode_length"] = min(int(config.get("episode_length", 500)), self.market.num_steps - 1)
        self.config = config
        self.books = setup.eval_envs or 16
        self.steps = setup.eval_steps
        self.seed = setup.eval_seed
        self.device = setup.device
        oracle = _oracle_for(market_options, config, setup.eval_market_seed, self.market.num_steps)
        assert oracle is not None  # planted
        self.oracle_pnl = self.pnl(oracle)
        if not self.oracle_pnl > 0:
            raise ValueError(f"the oracle's held-out PnL is {self.oracle_pnl}: no share of it can be scored")

    def pnl(self, policy: Any) -> float:
        """PnL after fees of ``policy``, summed over the held-out books (the recorder's ``step_pnl``)."""
        from foxhunt.evaluation.recorder import record

        rec = record(policy, self.market, num_books=self.books, num_steps=self.steps, seed=self.seed,
                     env_kwargs=self.config, device=self.device)
        return float(rec.series["step_pnl"].sum())

    def share(self, model: Any) -> float:
        """The greedy policy's held-out PnL over the oracle's."""
        was_training = model.policy.training
        model.policy.set_training_mode(False)
        try:
            return self.pnl(GreedyDevicePolicy(model)) / self.oracle_pnl
        finally:
            model.policy.set_training_mode(was_training)


class ScoreCallback(BaseCallback):
    """Scores the greedy policy every ``every`` env steps; stops at ``target`` or past ``cap_seconds``.

    :param scorer: the held-out scorer.
    :param every: env steps between scores.
    :param target: the share of the oracle's PnL that stops the run.
    :param cap_seconds: training seconds after which the run stops unscored.
    :param learning_starts: the model's ``learning_starts`` (the warm-up's end).
    :param device: the training device (synchronised before each clock read).
    :param stop_at_target: stop the run at the first score ``>= target`` (False: train on to the budget or
        the cap, recording the whole curve; the time to the target is still the first crossing).
    """

    def __init__(self, scorer: HeldOutScorer, every: int, target: float, cap_seconds: float,
                 learning_starts: int, device: str, stop_at_target: bool = True) -> None:
        super().__init__()
        self.stop_at_target = bool(stop_at_target)
        self.scorer, self.every, self.target, self.cap = scorer, int(every), float(target), float(cap_seconds)
        self.learning_starts = int(learning_starts)
        self.sync = stream_synchronizer(device)
        self.next = self.every
        self.points: list[dict[str, float]] = []
        self.score_s = 0.0
        self.warmup_s: float | None = None
        self.reached: dict[str, float] | None = None

    def _on_training_start(self) -> None:
        self.sync()
        self.start = time.perf_counter()

    def train_seconds(self) -> float:
        """Wall seconds of ``learn`` so far, less the scoring (synchronises)."""
        self.sync()
        return time.perf_counter() - self.start - self.score_s

    def _on_step(self) -> bool:
        steps = int(self.num_timesteps)
        if self.warmup_s is None and steps >= self.learning_starts:
            self.warmup_s = self.train_seconds()
        if steps < self.next:
            return True
        while self.next <= steps:
            self.next += self.every
        train_s = self.train_seconds()
        began = time.perf_counter()
        share = self.scorer.share(self.model)
        self.score_s += time.perf_counter() - began
        point = {"steps": steps, "train_s": train_s, "share": share,
                 "updates": float(getattr(self.model, "_n_updates", math.nan))}
        self.points.append(point)
        if share >= self.target and self.reached is None:
            self.reached = point
            if self.stop_at_target:
                return False
        return train_s < self.cap


def timing_breakdown(points: Sequence[dict[str, float]], warmup_s: float | None,
                     learning_starts: int) -> dict[str, float | None]:
    """Where a run's training seconds went: warm-up, the first interval with gradient steps, steady rate.

    :param points: the scored points in order (``steps``, ``train_s``).
    :param warmup_s: seconds until ``learning_starts`` (None: never reached).
    :param learning_starts: env steps of the warm-up.
    :return: ``warmup_s``, ``first_chunk_s`` (from the warm-up's end to the first point past it) and
        ``steady_s_per_kstep`` (seconds per 1,000 env steps between later points; None with too few).
    """
    trained = [p for p in points if p["steps"] > learning_starts]
    first = None
    if trained and warmup_s is not None:
        first = trained[0]["train_s"] - warmup_s
    steady = None
    if len(trained) >= 2:
        spans = [(b["train_s"] - a["train_s"], b["steps"] - a["steps"])
                 for a, b in zip(trained, trained[1:], strict=False)]
        seconds, steps = sum(s for s, _ in spans), sum(n for _, n in spans)
        steady = 1000.0 * seconds / steps if steps else None
    return {"warmup_s": warmup_s, "first_chunk_s": first, "steady_s_per_kstep": steady}


def train_scored(agent: Agent, seed: int, setup: runner.Setup, scorer: HeldOutScorer, *, every: int,
                 target: float, cap_seconds: float, run_to_budget: bool = False) -> dict[str, Any]:
    """Train ``agent`` with ``seed`` on ``setup``'s training market, scoring it every ``every`` env steps,
    until it scores ``target`` (or past ``cap_seconds`` of training, or at ``setup.steps``).

    :param run_to_budget: train on past the target to the budget (or the cap), scoring the whole curve.
    :return: the run's record: ``reached``, ``seconds`` and ``steps`` at the first score ``>= target``, the
        best and final shares, the scored ``points`` and the timing breakdown.
    """
    if agent.algorithm != "iqn":  # BranchingIQN seeds itself when it is built (under the build lock)
        th.manual_seed(seed)
    loop = setup.loop_of(agent)
    model = runner.build(agent, seed, setup)
    if hasattr(model, "diagnostics_interval"):
        model.diagnostics_interval = 0
    learning_starts = int(model.learning_starts)
    callback = ScoreCallback(scorer, every, target, cap_seconds, learning_starts,
                             setup.device, stop_at_target=not run_to_budget)
    if loop == runner.LOOP_DEVICE:  # the episode statistics read once per score interval
        model.collector.configure(stats_interval=max(every, 1))
    began = time.perf_counter()
    model.learn(setup.steps, callback=callback, log_interval=10**9)
    wall = time.perf_counter() - began
    unscored = not callback.points or callback.points[-1]["steps"] < model.num_timesteps
    if (callback.reached is None or run_to_budget) and unscored:
        # the last stretch after the last score: score the end of training too
        train_s = callback.train_seconds()
        began = time.perf_counter()
        share = scorer.share(model)
        callback.score_s += time.perf_counter() - began
        callback.points.append({"steps": int(model.num_timesteps), "train_s": train_s, "share": share,
                                "updates": float(getattr(model, "_n_updates", math.nan))})
        if callback.reached is None and share >= target and train_s <= cap_seconds:
            callback.reached = callback.points[-1]
    reached = callback.reached
    return {
        "agent": agent.name, "seed": seed, "loop": loop, "reached": reached is not None,
        "seconds": reached["train_s"] if reached else None, "steps": reached["steps"] if reached else None,
        "best_share": max((p["share"] for p in callback.points), default=math.nan),
        "final_share": callback.points[-1]["share"] if callback.points else math.nan,
        "trained_s": callback.points[-1]["train_s"] if callback.points else None,
        "trained_steps": int(model.num_timesteps), "score_s": callback.score_s, "wall_s": wall,
        "points": callback.points, **timing_breakdown(callback.points, callback.warmup_s, learning_starts),
    }


def train_scored_in_process(agent: Agent, seed: int, setup: runner.Setup, every: int, target: float,
                            cap_seconds: float, run_to_budget: bool = False) -> dict[str, Any]:
    """:func:`train_scored` for a worker process (:func:`sb3_her_ext.concurrent.run_in_processes`): the
    process builds its own :class:`HeldOutScorer` (the held-out market's tensors stay in their process)."""
    return train_scored(agent, seed, setup, HeldOutScorer(setup), every=every, target=target,
                        cap_seconds=cap_seconds, run_to_budget=run_to_budget)
