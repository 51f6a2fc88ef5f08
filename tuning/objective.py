"""A study's objective: a trial's RunConfig, trained by :func:`foxhunt.runs.train`, scored on held-out data.

While the agent trains, :class:`TrialEvalCallback` scores the greedy policy on the held-out data at
``n_evaluations`` evenly spaced points and reports each value to Optuna (``trial.report``, step =
evaluation point ``1..n``); when the pruner says so it raises :class:`optuna.TrialPruned`, which stops
training and marks the trial PRUNED. The trial's value is the chosen metric of the run's
``evaluation.json`` (the same held-out evaluation that ``foxhunt train`` reports).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from stable_baselines3.common.callbacks import BaseCallback

from foxhunt.runs import RunConfig, check_eval_split, train
from sb3_her_ext.concurrent import own_stream
from tuning.evaluation import held_out_metrics
from tuning.settings import METRICS, check_metric
from tuning.space import Param, suggest, to_run_config

#: ``(model, config) -> metrics``: the held-out scoring (:func:`tuning.evaluation.held_out_metrics`).
Evaluate = Callable[[Any, RunConfig], Mapping[str, Any]]


class _ThreadStdout(io.TextIOBase):
    """``sys.stdout`` while trials print to their logs: each thread's writes go to the stream it set
    (:func:`thread_stdout`), other threads' to the stdout it replaced (``contextlib.redirect_stdout`` is one
    process-wide swap, which trials running at once in threads would tangle)."""

    def __init__(self, default: Any) -> None:
        super().__init__()
        self.default = default

    def target(self) -> Any:
        return getattr(_THREAD_STDOUT, "stream", None) or self.default

    def write(self, text: str) -> int:
        return self.target().write(text)

    def flush(self) -> None:
        self.target().flush()

    def isatty(self) -> bool:
        return self.target().isatty()

    def fileno(self) -> int:
        return self.target().fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target(), "encoding", "utf-8")


_THREAD_STDOUT = threading.local()
_STDOUT_LOCK = threading.Lock()
_stdout_users = 0


@contextlib.contextmanager
def thread_stdout(stream: Any) -> Iterator[None]:
    """Send this thread's ``print`` output to ``stream`` while inside (other threads' output unchanged).

    :param stream: a text stream.
    """
    global _stdout_users
    with _STDOUT_LOCK:
        if not isinstance(sys.stdout, _ThreadStdout):
            sys.stdout = _ThreadStdout(sys.stdout)
        _stdout_users += 1
    previous = getattr(_THREAD_STDOUT, "stream", None)
    _THREAD_STDOUT.stream = stream
    try:
        yield
    finally:
        _THREAD_STDOUT.stream = previous
        with _STDOUT_LOCK:
            _stdout_users -= 1
            if _stdout_users == 0 and isinstance(sys.stdout, _ThreadStdout):
                sys.stdout = sys.stdout.default


def metric_value(metrics: Mapping[str, Any], metric: str) -> float | None:
    """The value of ``metric`` in an evaluation's metrics, or ``None`` when they do not hold it.

    :param metrics: an evaluation's metrics (``evaluation.json``, or :func:`held_out_metrics`).
    :param metric: a name of :data:`METRICS`.
    :return: the value.
    """
    for key in METRICS[check_metric(metric)]:
        if key in metrics and metrics[key] is not None:
            return float(metrics[key])
    return None


class TrialEvalCallback(BaseCallback):
    """Scores the greedy policy on held-out data at evaluation points; reports to Optuna and prunes.

    :param trial: the Optuna trial.
    :param config: the trial's run config (its held-out data and ``eval_steps``).
    :param metric: a name of :data:`METRICS`.
    :param n_evaluations: evaluation points during training (the end of training is not one of them).
    :param evaluate: the held-out scoring.
    """

    def __init__(
        self,
        trial: optuna.Trial,
        config: RunConfig,
        metric: str,
        n_evaluations: int,
        evaluate: Evaluate = held_out_metrics,
    ) -> None:
        super().__init__()
        self.trial = trial
        self.config = config
        self.metric = check_metric(metric)
        self.n_evaluations = n_evaluations
        self.evaluate = evaluate
        self.evaluations = 0
        self.every = max(max(config.steps // config.n_envs, 1) // (n_evaluations + 1), 1)

    def _on_step(self) -> bool:
        if self.evaluations >= self.n_evaluations or self.n_calls % self.every:
            return True
        self.evaluations += 1
        value = metric_value(self.evaluate(self.model, self.config), self.metric)
        if value is None:
            raise ValueError(f"metric={self.metric!r}: the evaluation reports none of {METRICS[self.metric]}")
        if math.isfinite(value):  # a NaN (no finished episode yet, say) is no evidence either way
            self.trial.report(value, self.evaluations)
        if self.trial.should_prune():
            raise optuna.TrialPruned(
                f"pruned at evaluation {self.evaluations}/{self.n_evaluations} "
                f"(step {self.num_timesteps}): {self.metric}={value:.6g}"
            )
        return True


def trial_overrides() -> dict[str, Any]:
    """RunConfig values every trial gets: no progress bar, and no checkpoints where runs write them."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    return {"progress": False, **({"checkpoint_every": 0} if "checkpoint_every" in fields else {})}


@dataclasses.dataclass
class Objective:
    """``objective(trial) -> float``: one training run of the trial's config, scored on held-out data.

    :param base: the study's base config (data, steps, device, seed, overrides); trials override it.
    :param space: the search space (:func:`tuning.space.load_space`).
    :param metric: a name of :data:`METRICS`.
    :param trials_dir: run folders go to ``trials_dir/<trial number>``, their output to ``<number>.log``.
    :param n_evaluations: evaluation points reported to the pruner during each trial.
    :param evaluate: the held-out scoring of intermediate evaluations.
    :param eval_split: what trials are scored on (:attr:`RunConfig.eval_split`): ``"validation"`` keeps the
        test data out of model selection; ``"test"`` scores them where ``foxhunt train`` reports.
    :param own_streams: see the field.
    """

    base: RunConfig
    space: Mapping[str, Param | Any]
    metric: str
    trials_dir: Path
    n_evaluations: int = 4
    evaluate: Evaluate = held_out_metrics
    eval_split: str = "validation"
    own_streams: bool = False
    """Train each trial on a CUDA stream of its own (trials run at once in threads: trials_per_process)."""
    storage_error: BaseException | None = dataclasses.field(default=None, init=False)
    """The storage's error that ended a trial (read-only, full, lost): the study stops on it
    (:func:`tuning.study.optimize`), since the next trial would meet it too."""

    def __post_init__(self) -> None:
        check_metric(self.metric)
        if (
            isinstance(self.n_evaluations, bool)
            or not isinstance(self.n_evaluations, int)
            or self.n_evaluations < 1
        ):
            raise ValueError(f"n_evaluations={self.n_evaluations!r} must be an integer >= 1")
        check_eval_split(self.eval_split, "eval_split")

    def config(self, trial: optuna.Trial) -> RunConfig:
        """The trial's run config (its parameters over the base; its own run folder; no progress bar)."""
        values = suggest(trial, self.space, action_face=self.base.resolved_action_face())
        out = Path(self.trials_dir) / f"{trial.number:05d}"
        return dataclasses.replace(to_run_config(self.base, values), out=str(out), eval_split=self.eval_split,
                                   **trial_overrides())

    def __call__(self, trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        try:
            config = self.config(trial)
            trial.set_user_attr("run_config", config.to_dict())
            callback = TrialEvalCallback(trial, config, self.metric, self.n_evaluations, self.evaluate)
            Path(self.trials_dir).mkdir(parents=True, exist_ok=True)
            # train prints its evaluation: it goes to the trial's log, the study prints one line per trial
            with (
                open(Path(self.trials_dir) / f"{trial.number:05d}.log", "w") as log,
                thread_stdout(log),
                own_stream(config.device if self.own_streams else None),
            ):
                run = train(config, callback=callback)
            value = metric_value(json.loads((run / "evaluation.json").read_text()), self.metric)
            if value is None:  # a metric the run's report leaves out: the same evaluation, here
                value = metric_value(self.evaluate(callback.model, config), self.metric)
        except optuna.TrialPruned:
            raise
        except Exception as error:
            if isinstance(error, optuna.exceptions.StorageInternalError | sqlalchemy.exc.SQLAlchemyError):
                self.storage_error = error  # not the trial's failure: nothing could record it
                raise
            message = " ".join(str(error).split())  # one line, also for errors without a message
            trial.set_user_attr("error", f"{type(error).__name__}: {message}".rstrip(": "))
            raise
        return math.nan if value is None else value
