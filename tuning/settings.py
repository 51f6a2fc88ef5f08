"""A study's settings (``foxhunt tune``'s study options), in a module light enough for the command's parser:
it imports no Optuna, no torch (``foxhunt tune --help`` answers at once)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from foxhunt.runs import check_eval_split

#: The pruners and samplers ``foxhunt tune`` knows (:func:`tuning.study.make_pruner`, ``make_sampler``).
PRUNERS: tuple[str, ...] = ("median", "hyperband", "none")
SAMPLERS: tuple[str, ...] = ("tpe", "random")

#: ``--metric`` names and the keys that hold each in an evaluation's metrics (the first present is used;
#: ``total_pnl`` is the name of the PnL before the evaluation recorder). All are maximised.
METRICS: dict[str, tuple[str, ...]] = {
    "sharpe": ("sharpe",),
    "pnl": ("pnl", "total_pnl"),
    "mean_episode_reward": ("mean_episode_reward",),
}


def check_metric(metric: str) -> str:
    """``metric`` if it is a name of :data:`METRICS`, else ``ValueError`` naming it.

    :param metric: ``"sharpe"``, ``"pnl"`` (PnL after fees) or ``"mean_episode_reward"``.
    :return: the metric.
    """
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not a known metric; choose one of {sorted(METRICS)}")
    return metric


@dataclasses.dataclass
class StudySettings:
    """Everything ``foxhunt tune`` needs beyond the base config and the space.

    :param study_name: the study's name in the storage.
    :param out: the study folder.
    :param storage: an SQLAlchemy URL; ``None``: ``sqlite:///<out>/study.db``.
    :param n_trials: trials this worker runs (``None``: until ``timeout``).
    :param timeout: seconds after which this worker starts no new trial (``None``: no limit).
    :param metric: a name of :data:`~tuning.objective.METRICS`.
    :param pruner: a name of :data:`PRUNERS`.
    :param sampler: a name of :data:`SAMPLERS`.
    :param sampler_seed: the sampler's seed.
    :param n_startup_trials: random trials of TPE, and completed trials before the median pruner acts.
    :param n_evaluations: evaluation points per trial.
    :param resume: continue an existing study.
    :param heartbeat_interval: seconds between heartbeats.
    :param grace_period: seconds without a heartbeat after which a trial is retried.
    :param max_retry: retries of one stale trial.
    :param progress: show the progress bar over trials.
    :param eval_split: what trials are scored on: ``"validation"`` (model selection never sees the test
        data; ``foxhunt train --config best_config.json --eval-split test`` then scores the best on it) or
        ``"test"``.
    :param worker: this worker's name in its printed lines (``None``: none; a launcher's workers are
        ``worker K/N``).
    :param write_outputs: write ``best_config.json`` and the plots when this worker ends (a launcher's
        workers leave them to the launcher).
    :param trials_per_process: trials this worker runs at once, each in a thread and on a CUDA stream of its
        own (Optuna's ``n_jobs``; a trial's result does not depend on the others: sb3_her_ext.concurrent);
        several small trials then share one GPU. With ``--n-workers`` each worker runs this many. Threads
        share the GIL: on one H200 five small runs in threads took 6x one run's wall, in processes about one
        run's (``benchmarks/concurrent_seeds.py``), so many trials on one GPU run faster as workers
        (``--n-workers auto --workers-per-gpu K``).
    """

    study_name: str = "foxhunt"
    out: str | Path = "studies/foxhunt"
    storage: str | None = None
    n_trials: int | None = 20
    timeout: float | None = None
    metric: str = "sharpe"
    pruner: str = "median"
    sampler: str = "tpe"
    sampler_seed: int | None = 0
    n_startup_trials: int = 5
    n_evaluations: int = 4
    resume: bool = False
    heartbeat_interval: int = 60
    grace_period: int = 120
    max_retry: int | None = 3
    progress: bool = True
    eval_split: str = "validation"
    worker: str | None = None
    write_outputs: bool = True
    trials_per_process: int = 1

    def __post_init__(self) -> None:
        check_metric(self.metric)
        check_eval_split(self.eval_split, "eval_split")
        if self.pruner not in PRUNERS:
            raise ValueError(f"pruner={self.pruner!r} is not a known pruner; choose one of {list(PRUNERS)}")
        if self.sampler not in SAMPLERS:
            raise ValueError(
                f"sampler={self.sampler!r} is not a known sampler; choose one of {list(SAMPLERS)}"
            )
        if self.n_trials is not None and (isinstance(self.n_trials, bool) or self.n_trials < 1):
            raise ValueError(f"n_trials={self.n_trials!r} must be >= 1")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r} must be > 0 seconds")
        if self.n_trials is None and self.timeout is None:
            raise ValueError("give n_trials or timeout (or both): a study needs an end")
        if self.n_startup_trials < 0:
            raise ValueError(f"n_startup_trials={self.n_startup_trials} must be >= 0")
        if not self.study_name:
            raise ValueError(f"study_name={self.study_name!r} must not be empty")
        if isinstance(self.trials_per_process, bool) or not isinstance(self.trials_per_process, int) \
                or self.trials_per_process < 1:
            raise ValueError(f"trials_per_process={self.trials_per_process!r} must be an integer >= 1")
        for name, low, none_ok in (("sampler_seed", 0, True), ("max_retry", 0, True),
                                   ("heartbeat_interval", 1, False), ("grace_period", 1, False)):
            value = getattr(self, name)
            if value is None and none_ok:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (
                    name == "sampler_seed" and value >= 2**32):
                option = "--" + name.replace("_", "-")
                bound = "in [0, 2**32)" if name == "sampler_seed" else f">= {low}"
                raise ValueError(f"{option} {value!r}: {name} must be an integer {bound}")

    def storage_url(self) -> str:
        """The storage URL (the study folder's SQLite file unless ``storage`` names one)."""
        if self.storage is not None:
            return self.storage
        return f"sqlite:///{(Path(self.out) / 'study.db').resolve()}"
