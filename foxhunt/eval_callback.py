"""Evaluations during training (``foxhunt train --eval-freq N``), with SB3 ``EvalCallback``'s semantics.

Every ``N`` environment steps :class:`RunEvalCallback` scores the greedy policy on the run's validation data
(:func:`foxhunt.runs.held_out_metrics` with ``eval_split="validation"``: LOBSTER's validation split, or
the synthetic validation market; never the test data of the final evaluation, so picking the best model does
not see the test set), with random streams of its own (training goes on as without it, bit for bit on the
CPU). Each evaluation

- records ``eval/<metric>`` in SB3's logger (TensorBoard) and prints one line,
- appends a line to ``RUN_DIR/evaluations.jsonl`` (``timesteps``, the metrics, ``best``),
- saves the model as ``RUN_DIR/best_model.zip`` when its ``eval_metric`` is the best so far.

A resumed run reads the best so far back from ``evaluations.jsonl``, whose lines after the checkpoint are
dropped (the resumed run evaluates those steps again).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from stable_baselines3.common.callbacks import BaseCallback

if TYPE_CHECKING:
    from foxhunt.runs import RunConfig

#: the file of the evaluations in a run folder
EVALUATIONS_FILE = "evaluations.jsonl"
#: the best model in a run folder
BEST_MODEL_FILE = "best_model.zip"
#: the metrics' keys in an evaluation's metrics dict (the first present is the metric's value)
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "sharpe": ("sharpe",),
    "pnl": ("pnl", "total_pnl"),
    "mean_episode_reward": ("mean_episode_reward",),
}


def metric_of(metrics: Mapping[str, Any], metric: str) -> float:
    """The value of ``metric`` in an evaluation's ``metrics`` (NaN when it reports none).

    :param metrics: the evaluation's metrics dict.
    :param metric: a name of :data:`METRIC_KEYS`.
    :return: the value.
    """
    for key in METRIC_KEYS[metric]:
        if metrics.get(key) is not None:
            return float(metrics[key])
    return math.nan


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are numbers (bools and nested values left out), as floats."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def read_evaluations(path: Path, up_to: int | None = None) -> list[dict[str, Any]]:
    """The lines of an ``evaluations.jsonl``; with ``up_to``, those at or before that step, and the file is
    cut back to them (a resumed run writes the later ones again).

    :param path: the file (missing: no lines).
    :param up_to: the step the run resumes from.
    :return: the evaluations, in order.
    """
    if not path.is_file():
        return []
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            if up_to is None:
                raise ValueError(f"{path}: line {number} is not valid JSON") from None
            break  # the torn last line of a killed write
    if up_to is not None:
        lines = [line for line in lines if int(line["timesteps"]) <= up_to]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


class RunEvalCallback(BaseCallback):
    """Score the greedy policy on the validation data every ``config.eval_freq`` environment steps; keep the
    best model (SB3's ``EvalCallback`` for a foxhunt run).

    :param config: the run's config (``eval_freq``, ``eval_metric``, its data, books and ``eval_steps``).
    :param run_dir: the run folder (``evaluations.jsonl`` and ``best_model.zip`` go there).
    :param evaluate: the held-out scoring, ``(model, config) -> metrics``
        (:func:`foxhunt.runs.held_out_metrics`; it gets the config with ``eval_split="validation"``).
    :param resumed: the run resumes from a checkpoint: the best so far is read back from
        ``evaluations.jsonl`` (cut back to the checkpoint's step).
    :param stream: where the console lines go (default ``sys.stdout``).
    """

    def __init__(self, config: RunConfig, run_dir: str | Path,
                 evaluate: Callable[[Any, RunConfig], Mapping[str, Any]], resumed: bool = False,
                 stream: TextIO | None = None) -> None:
        super().__init__()
        if config.eval_freq < 1:
            raise ValueError(f"RunConfig.eval_freq={config.eval_freq} must be >= 1 for evaluations")
        self.config = dataclasses.replace(config, eval_split="validation")
        self.every = int(config.eval_freq)
        self.metric = config.eval_metric
        self.run_dir = Path(run_dir)
        self.resumed = resumed
        self.evaluate = evaluate
        self.stream = stream
        self.best = -math.inf
        self.best_step: int | None = None
        self.done = 0  # multiples of ``every`` evaluated

    @property
    def path(self) -> Path:
        """``RUN_DIR/evaluations.jsonl``."""
        return self.run_dir / EVALUATIONS_FILE

    def _on_training_start(self) -> None:
        step = self.model.num_timesteps
        self.done = step // self.every
        lines = read_evaluations(self.path, up_to=step) if self.resumed else []
        if not self.resumed and self.path.exists():
            self.path.unlink()  # a new run's file starts empty
        for line in lines:
            value = line.get(self.metric)
            if value is not None and math.isfinite(value) and value > self.best:
                self.best, self.best_step = value, int(line["timesteps"])

    def _on_step(self) -> bool:
        if self.model.num_timesteps // self.every > self.done:
            self.done = self.model.num_timesteps // self.every
            self.evaluation()
        return True

    def _on_training_end(self) -> None:
        if self.best_step is not None:
            print(f"best model: {self.run_dir / BEST_MODEL_FILE} ({self.metric} {self.best:.4g} on the "
                  f"validation data at step {self.best_step:,})", file=self.stream or sys.stdout, flush=True)

    def evaluation(self) -> dict[str, Any]:
        """Score the policy now; log, append the line, keep the model if it is the best.

        :return: the line written to ``evaluations.jsonl``.
        """
        metrics = _scalars(self.evaluate(self.model, self.config))
        value = metric_of(metrics, self.metric)
        best = math.isfinite(value) and value > self.best
        step = int(self.model.num_timesteps)
        if best:
            self.best, self.best_step = value, step
            self._save_best()
        line = {"timesteps": step, **{k: v if math.isfinite(v) else None for k, v in metrics.items()},
                self.metric: value if math.isfinite(value) else None, "best": best}
        with self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
        for name, number in metrics.items():
            self.logger.record(f"eval/{name}", number)
        if math.isfinite(self.best):
            self.logger.record(f"eval/best_{self.metric}", self.best)
        self.logger.record("time/total_timesteps", step, exclude="tensorboard")
        self.logger.dump(step)
        print(self.line(step, value, metrics, best), file=self.stream or sys.stdout, flush=True)
        return line

    def line(self, step: int, value: float, metrics: Mapping[str, float], best: bool) -> str:
        """The console line of an evaluation."""
        others = ", ".join(f"{name} {metrics[name]:.4g}" for name in ("pnl", "mean_episode_reward")
                           if name != self.metric and name in metrics)
        kept = (f"new best, saved {self.run_dir / BEST_MODEL_FILE}" if best
                else "no best yet" if self.best_step is None
                else f"best {self.best:.4g} at step {self.best_step:,}")
        return (f"eval at step {step:,} (validation data): {self.metric} {value:.4g}"
                f"{', ' + others if others else ''}; {kept}")

    def _save_best(self) -> None:
        """Save the model as ``best_model.zip`` (written aside, then moved: never half a file)."""
        path = self.run_dir / BEST_MODEL_FILE
        partial = self.run_dir / "best_model.partial.zip"
        self.model.save(partial)
        os.replace(partial, path)
