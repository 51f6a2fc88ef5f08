"""A study: storage (SQLite by default, any SQLAlchemy URL), sampler, pruner, the optimisation loop, outputs.

Crash safety: the storage runs with heartbeats. A trial whose worker died (SIGKILL, lost machine) stops
beating; after ``grace_period`` seconds the next worker to start a trial marks it FAIL and queues a copy
with the same parameters (Optuna's stale-heartbeat retry callback, up to ``max_retry`` times), which the
next free worker runs. Completed trials are committed to the storage as they finish, so a dead worker
loses none. A trial whose objective *raises* is different: it is marked FAIL (its error kept in the
trial's user attribute ``error``), it is not retried (the same parameters would raise again), and the
worker goes on with the next trial. A trial whose final metric is NaN is marked FAIL too.

Study folder (``out``)::

    study.db            the SQLite storage (unless --storage names another)
    trials/<number>/    each trial's run folder (foxhunt.runs); trials/<number>.log its printed output
    best_config.json    the best trial's RunConfig (foxhunt train --config best_config.json; add
                        --eval-split test for its score on the test data, which trials never see)
    *.png               optimization history, parameter importances, parallel coordinates
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from tqdm.auto import tqdm

from foxhunt.runs import RunConfig, check_eval_split
from tuning.evaluation import held_out_metrics
from tuning.objective import METRICS, Evaluate, Objective, check_metric
from tuning.space import Param

PRUNERS: tuple[str, ...] = ("median", "hyperband", "none")
SAMPLERS: tuple[str, ...] = ("tpe", "random")

#: Parameters shown in parallel_coordinate.png (the most important ones).
PARALLEL_PARAMS = 8

# renamed in optuna 4.9; the old name stays as a deprecated alias until 6.0
RetryCallback = (
    getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    or optuna.storages.RetryFailedTrialCallback
)


def make_sampler(name: str, seed: int | None, n_startup_trials: int = 5) -> optuna.samplers.BaseSampler:
    """The study's sampler.

    :param name: ``"tpe"`` (multivariate TPE, grouped for the conditional hindsight fields) or
        ``"random"`` (a fixed-budget random baseline).
    :param seed: the sampler's seed (give each worker of one study its own).
    :param n_startup_trials: random trials before TPE models the space.
    :return: the sampler.
    """
    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                multivariate=True, group=True, seed=seed, n_startup_trials=n_startup_trials
            )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler={name!r} is not a known sampler; choose one of {list(SAMPLERS)}")


def make_pruner(name: str, n_startup_trials: int = 5, n_evaluations: int = 4) -> optuna.pruners.BasePruner:
    """The study's pruner; a trial's steps are its evaluation points ``1..n_evaluations``.

    :param name: ``"median"`` (rl-zoo3's: warm-up of a third of the evaluations), ``"hyperband"`` or
        ``"none"``.
    :param n_startup_trials: completed trials before the median pruner prunes.
    :param n_evaluations: evaluation points per trial.
    :return: the pruner.
    """
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=n_startup_trials, n_warmup_steps=n_evaluations // 3
        )
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=n_evaluations, reduction_factor=3)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"pruner={name!r} is not a known pruner; choose one of {list(PRUNERS)}")


def make_storage(
    url: str, heartbeat_interval: int = 60, grace_period: int = 120, max_retry: int | None = 3
) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats and the stale-trial retry callback.

    :param url: an SQLAlchemy URL (``sqlite:///study.db``, ``postgresql://user@host/db``, ...).
    :param heartbeat_interval: seconds between a running trial's heartbeats.
    :param grace_period: seconds without a heartbeat after which a running trial is stale.
    :param max_retry: retries of one stale trial (``None``: no limit).
    :return: the storage.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(
            f"storage={url!r} is not an SQLAlchemy URL (e.g. sqlite:///study.db, "
            "postgresql://user@host:5432/db)"
        )
    for name, value in (("heartbeat_interval", heartbeat_interval), ("grace_period", grace_period)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1 (seconds)")
    if grace_period <= heartbeat_interval:
        raise ValueError(f"grace_period={grace_period} must exceed heartbeat_interval={heartbeat_interval}")
    try:
        with warnings.catch_warnings():  # heartbeats and the retry callback are flagged experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=RetryCallback(max_retry=max_retry),
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
            )
    except Exception as error:  # SQLAlchemy raises ArgumentError, NoSuchModuleError, OperationalError, ...
        shown = shown_url(url)
        message = str(error).replace(url, shown)
        raise ValueError(f"storage={shown!r} cannot be opened: {type(error).__name__}: {message}") from None


def shown_url(url: str) -> str:
    """``url`` with its password masked (``***``), for messages and logs."""
    try:
        import sqlalchemy

        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not parseable: nothing to hide
        return url


def open_study(
    name: str,
    storage: optuna.storages.BaseStorage,
    metric: str,
    resume: bool,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    attrs: Mapping[str, Any] | None = None,
) -> optuna.Study:
    """Create the study, or (``resume``) load it if it exists; an existing study without ``resume`` raises.

    :param name: the study name.
    :param storage: the storage.
    :param metric: the metric the study maximises (a resumed study must have the same one).
    :param resume: continue an existing study (and create it when it does not exist, so that N workers
        started at once with ``resume`` share one study).
    :param sampler: the sampler.
    :param pruner: the pruner.
    :param attrs: study user attributes recorded at creation (settings, for the record).
    :return: the study.
    """
    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    if name in existing and not resume:
        raise ValueError(
            f"study {name!r} already exists in the storage; pass --resume to continue it or "
            "choose another --study-name"
        )
    if name in existing and existing[name].user_attrs.get("metric", metric) != metric:
        raise ValueError(
            f"study {name!r} maximises metric={existing[name].user_attrs['metric']!r}, not metric={metric!r}"
        )
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        direction="maximize",
        load_if_exists=resume,
    )
    if "metric" not in study.user_attrs:
        study.set_user_attr("metric", metric)
        for key, value in (attrs or {}).items():
            study.set_user_attr(key, value)
    return study


def trial_line(trial: FrozenTrial, metric: str) -> str:
    """One line describing a finished trial.

    :param trial: the finished trial.
    :param metric: the study's metric name.
    :return: ``trial N STATE metric=value in Ts (...)``.
    """
    seconds = (
        (trial.datetime_complete - trial.datetime_start).total_seconds()
        if trial.datetime_complete and trial.datetime_start
        else float("nan")
    )
    line = f"trial {trial.number} {trial.state.name}"
    if trial.state == TrialState.COMPLETE:
        line += f" {metric}={trial.value:.6g}"
    elif trial.state == TrialState.PRUNED and trial.intermediate_values:
        step = max(trial.intermediate_values)
        line += f" at evaluation {step} ({metric}={trial.intermediate_values[step]:.6g})"
    elif trial.state == TrialState.FAIL and "error" in trial.user_attrs:
        line += f" ({trial.user_attrs['error']})"
    retried = trial.system_attrs.get("failed_trial")
    if retried is not None:
        line += f" [retry of trial {retried}]"
    return line + f" in {seconds:.1f}s"


def write_best_config(study: optuna.Study, path: str | Path) -> Path | None:
    """Write the best trial's RunConfig (``RunConfig.load`` reads it; ``out`` unset, progress on).

    :param study: the study.
    :param path: the JSON file.
    :return: the path, or ``None`` when no trial completed.
    """
    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.value is not None and math.isfinite(t.value)
    ]
    if not complete:
        return None
    best = max(complete, key=lambda t: t.value)
    config = RunConfig.from_dict(best.user_attrs["run_config"])
    return dataclasses.replace(config, out=None, progress=True).save(path)


def write_plots(study: optuna.Study, out: str | Path) -> list[Path]:
    """Optimization history, parameter importances and parallel coordinates as PNGs in ``out``.

    A plot that needs more trials than the study has (importances need two completed trials with
    varying parameters) is skipped with a warning.

    :param study: the study.
    :param out: the study folder.
    :return: the files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    written = []
    top = None  # the parallel coordinates of every parameter are unreadable: the most important ones
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.simplefilter("ignore", UserWarning)  # "too few trials": the ranking is still usable
            top = list(optuna.importance.get_param_importances(study))[:PARALLEL_PARAMS]
    except Exception:  # fewer than two completed trials, or no parameter varies
        top = None
    plots = {
        "optimization_history": ovm.plot_optimization_history,
        "param_importances": ovm.plot_param_importances,
        "parallel_coordinate": lambda s: ovm.plot_parallel_coordinate(s, params=top),
    }
    for name, plot in plots.items():
        try:
            with warnings.catch_warnings():
                # optuna's experimental-feature and matplotlib's flat-axis warnings say nothing to the user
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter("ignore", UserWarning)
                ax = plot(study)
            figure = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            figure.set_size_inches(max(figure.get_size_inches()[0], 10), max(figure.get_size_inches()[1], 6))
            path = Path(out) / f"{name}.png"
            figure.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(figure)
            written.append(path)
        except Exception as error:  # optuna raises ValueError/RuntimeError when a plot has too few trials
            warnings.warn(f"{name}.png not written: {error}", stacklevel=2)
    return written


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

    def storage_url(self) -> str:
        """The storage URL (the study folder's SQLite file unless ``storage`` names one)."""
        if self.storage is not None:
            return self.storage
        return f"sqlite:///{(Path(self.out) / 'study.db').resolve()}"


def tune(
    base: RunConfig,
    space: Mapping[str, Param | Any],
    settings: StudySettings,
    evaluate: Evaluate = held_out_metrics,
) -> optuna.Study:
    """Run this worker's share of a study, then write ``best_config.json`` and the plots.

    :param base: the base run config of every trial.
    :param space: the search space.
    :param settings: the study's settings.
    :param evaluate: the held-out scoring of intermediate evaluations.
    :return: the study.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the study prints its own line per trial
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    storage = make_storage(
        settings.storage_url(), settings.heartbeat_interval, settings.grace_period, settings.max_retry
    )
    sampler = make_sampler(settings.sampler, settings.sampler_seed, settings.n_startup_trials)
    pruner = make_pruner(settings.pruner, settings.n_startup_trials, settings.n_evaluations)
    attrs = {
        "metric_keys": list(METRICS[settings.metric]),
        "sampler": settings.sampler,
        "pruner": settings.pruner,
        "n_evaluations": settings.n_evaluations,
        "base_config": base.to_dict(),
        "eval_split": settings.eval_split,
    }
    study = open_study(settings.study_name, storage, settings.metric, settings.resume, sampler, pruner, attrs)
    objective = Objective(base, space, settings.metric, out / "trials", settings.n_evaluations, evaluate,
                          settings.eval_split)

    bar = tqdm(
        total=settings.n_trials,
        desc=f"study {settings.study_name}",
        unit="trial",
        disable=not settings.progress,
    )

    def report(study: optuna.Study, trial: FrozenTrial) -> None:
        bar.update(1)
        best = ""
        try:
            best = f" | best {settings.metric}={study.best_value:.6g} (trial {study.best_trial.number})"
        except ValueError:  # no completed trial yet
            pass
        tqdm.write(trial_line(trial, settings.metric) + best)

    started = time.perf_counter()
    try:
        study.optimize(
            objective,
            n_trials=settings.n_trials,
            timeout=settings.timeout,
            catch=(Exception,),
            callbacks=[report],
            gc_after_trial=True,
        )
    finally:
        bar.close()
    best_path = write_best_config(study, out / "best_config.json")
    plots = write_plots(study, out)
    counts = {state.name: len(study.get_trials(deepcopy=False, states=(state,))) for state in TrialState}
    print(
        f"study {settings.study_name}: {counts} in the storage; this worker "
        f"{time.perf_counter() - started:.1f}s"
    )
    if best_path is not None:
        print(
            f"best {settings.metric}={study.best_value:.6g} on the {settings.eval_split} data "
            f"(trial {study.best_trial.number}); config: {best_path}"
        )
        if settings.eval_split == "validation":
            print(f"its score on the untouched test data: foxhunt train --config {best_path} "
                  "--eval-split test")
    if plots:
        print("plots: " + ", ".join(str(p) for p in plots))
    return study
