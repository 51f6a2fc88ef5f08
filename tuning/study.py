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

import contextlib
import dataclasses
import math
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState
from tqdm.auto import tqdm

from cuda_ext.graph_capture import collect_garbage
from foxhunt.runs import RunConfig
from tuning.evaluation import held_out_metrics
from tuning.objective import Evaluate, Objective
from tuning.preflight import check_space, fit_space, to_distribution
from tuning.settings import METRICS, PRUNERS, SAMPLERS, StudySettings
from tuning.space import Param

#: Parameters shown in parallel_coordinate.png (the most important ones).
PARALLEL_PARAMS = 8

# renamed in optuna 4.9; the old name stays as a deprecated alias until 6.0
RetryCallback = (
    getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    or optuna.storages.RetryFailedTrialCallback
)


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s draws in a study sampled with ``seed`` (numpy's ``SeedSequence``).

    :param seed: the sampler's seed.
    :param number: the trial's number in the study.
    :return: a seed in ``[0, 2**32)``.
    """
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """A sampler whose draws for each trial are seeded by ``(seed, trial number)``.

    An Optuna sampler holds one random stream per process: a study resumed with the same seed, or a second
    worker started with it, replays the stream, and its first trials repeat the parameters of the study's
    first trials. Here each trial gets a sampler of its own (``make(trial_seed(seed, number))``); a trial
    number is unique in a study, so no two trials of a study draw from one stream, whichever worker runs
    them and whenever, and a study stays reproducible from its seed.

    :param make: ``seed -> sampler`` (:func:`make_base_sampler`).
    :param seed: the study's sampler seed (``None``: unseeded draws).
    """

    def __init__(self, make: Callable[[int | None], optuna.samplers.BaseSampler], seed: int | None) -> None:
        self.make = make
        self.seed = seed
        self._samplers: dict[int, optuna.samplers.BaseSampler] = {}

    def _of(self, trial: FrozenTrial) -> optuna.samplers.BaseSampler:
        sampler = self._samplers.get(trial.number)
        if sampler is None:
            seed = None if self.seed is None else trial_seed(self.seed, trial.number)
            sampler = self._samplers[trial.number] = self.make(seed)
        return sampler

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return self._of(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]) -> dict:
        return self._of(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: optuna.distributions.BaseDistribution) -> Any:
        return self._of(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._of(trial).before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._of(trial).after_trial(study, trial, state, values)
        self._samplers.pop(trial.number, None)

    def reseed_rng(self) -> None:
        """Nothing: each trial's draws are seeded by ``(seed, trial number)`` already. (Optuna reseeds the
        sampler each time a thread of ``n_jobs`` takes a trial, which would reseed the trials other threads
        are sampling: ``--trials-per-process``.)"""


def make_sampler(name: str, seed: int | None, n_startup_trials: int = 5) -> optuna.samplers.BaseSampler:
    """The study's sampler, its draws for each trial seeded by ``(seed, trial number)``
    (:class:`TrialSeededSampler`: resumed studies and workers started with one seed propose new parameters).

    :param name: ``"tpe"`` (multivariate TPE, grouped for the conditional hindsight fields) or
        ``"random"`` (a fixed-budget random baseline).
    :param seed: the sampler's seed.
    :param n_startup_trials: random trials before TPE models the space.
    :return: the sampler.
    """
    if name not in SAMPLERS:
        raise ValueError(f"sampler={name!r} is not a known sampler; choose one of {list(SAMPLERS)}")
    return TrialSeededSampler(lambda trial_seed: make_base_sampler(name, trial_seed, n_startup_trials), seed)


def make_base_sampler(name: str, seed: int | None, n_startup_trials: int = 5) -> optuna.samplers.BaseSampler:
    """One of Optuna's samplers (:func:`make_sampler` makes one per trial).

    :param name: ``"tpe"`` or ``"random"``.
    :param seed: its seed.
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


#: Attempts at creating a storage's tables or a study while other workers create them (:func:`retry_races`).
CREATE_ATTEMPTS = 10


def retry_races(create: Callable[[], Any], attempts: int = CREATE_ATTEMPTS) -> Any:
    """``create()``, tried again after a short random pause when another process created the same thing
    at the same moment.

    N workers started at once on a new storage all create its tables (PostgreSQL: ``CREATE TYPE
    studydirection``, a ``UniqueViolation`` for all but one) and all create the study: the losers' DDL
    transactions roll back, and the next attempt finds what the winner made.

    :param create: the creation (``RDBStorage(url)``, ``create_study(load_if_exists=True)``).
    :param attempts: tries before the error is raised.
    :return: what ``create`` returns.
    """
    for attempt in range(attempts):
        try:
            return create()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                sqlalchemy.exc.OperationalError) as error:
            raced = isinstance(error, sqlalchemy.exc.IntegrityError) or any(
                word in str(error).lower() for word in ("already exists", "duplicate", "database is locked")
            )
            if not raced or attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.05, 0.3) * (attempt + 1))
    raise AssertionError("unreachable")


#: SQLAlchemy's dialect -> the driver package ``foxhunt[postgres]`` installs, named in the error without it.
DRIVERS: dict[str, str] = {"postgresql": "psycopg[binary] (pip install 'foxhunt[postgres]')"}


def make_storage(
    url: str, heartbeat_interval: int = 60, grace_period: int = 120, max_retry: int | None = 3
) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats and the stale-trial retry callback; its tables are created safely
    while other workers create them too (:func:`retry_races`).

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
    shown = shown_url(url)

    def create() -> optuna.storages.RDBStorage:
        with warnings.catch_warnings():  # heartbeats and the retry callback are flagged experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=RetryCallback(max_retry=max_retry),
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
            )

    try:
        return retry_races(create)
    except ImportError:  # optuna's "Failed to import DB access module": the URL's driver is missing
        dialect = url.split("://", 1)[0].split("+", 1)[0]
        driver = DRIVERS.get(dialect, f"the SQLAlchemy driver of {dialect}:// URLs")
        raise ValueError(f"storage={shown!r} needs {driver}, which is not installed") from None
    except Exception as error:  # SQLAlchemy raises ArgumentError, NoSuchModuleError, OperationalError, ...
        raise ValueError(f"storage={shown!r} cannot be opened: {one_line(error, url)}") from None


def one_line(error: BaseException, url: str | None = None) -> str:
    """``Type: message`` of an error on one line (a database error's first line), the URL's password masked.

    :param error: the error.
    :param url: the storage URL to mask in the message.
    :return: the line.
    """
    cause = getattr(error, "orig", None) or error  # SQLAlchemy wraps the driver's error
    message = (str(cause).strip().splitlines() or [""])[0]
    if url:
        message = message.replace(url, shown_url(url))
    return f"{type(cause).__name__}: {message}"


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """A database error inside the block (a read-only or full storage, a lost server) as one ``OSError``
    line naming the storage; completed trials are already committed.

    :param url: the storage URL (its password masked in the message).
    """
    try:
        yield
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:
        if isinstance(error, optuna.exceptions.StorageInternalError) and error.__cause__ is not None:
            error = error.__cause__  # optuna's wrapper of the database's error
        raise OSError(f"storage={shown_url(url)!r} failed: {one_line(error, url)} (a read-only or full "
                      "storage, or a lost server; the trials it completed are kept)") from None


def shown_url(url: str) -> str:
    """``url`` with its password masked (``***``), for messages and logs."""
    try:
        import sqlalchemy

        parsed = sqlalchemy.engine.make_url(url)
        return url if parsed.password is None else parsed.render_as_string(hide_password=True)
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
    taken = (f"study {name!r} already exists in the storage; pass --resume to continue it or "
             "choose another --study-name")
    if name in existing and not resume:
        raise ValueError(taken)
    if name in existing and existing[name].user_attrs.get("metric", metric) != metric:
        raise ValueError(
            f"study {name!r} maximises metric={existing[name].user_attrs['metric']!r}, not metric={metric!r}"
        )
    try:
        study = retry_races(lambda: optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction="maximize",
            load_if_exists=resume,
        ))
    except optuna.exceptions.DuplicatedStudyError:  # another worker created it since the check above
        raise ValueError(taken) from None
    if "metric" not in study.user_attrs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric])  # optuna-dashboard's name of the objective
        study.set_user_attr("metric", metric)
        for key, value in (attrs or {}).items():
            study.set_user_attr(key, value)
    check_same_space(study, (attrs or {}).get("space"))
    return study


def space_record(space: Mapping[str, Param | Any]) -> dict[str, Any]:
    """A space as the study records it: each searched parameter as Optuna's distribution JSON
    (``optuna.distributions.distribution_to_json``), each fixed one as ``{"fixed": value}``.

    :param space: a fitted space (:func:`tuning.preflight.fit_space`).
    :return: ``name -> record`` (parameters not set left out).
    """
    return {
        name: optuna.distributions.distribution_to_json(to_distribution(spec)) if isinstance(spec, Param)
        else {"fixed": spec}
        for name, spec in space.items()
        if spec is not None
    }


def check_same_space(study: optuna.Study, space: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` naming the first parameter whose distribution differs from the study's record:
    the workers of one study (resumed, on other hosts) must search one space.

    :param study: the study (its user attribute ``space``: :func:`space_record`).
    :param space: this worker's record (``None``: nothing to compare).
    """
    recorded = study.user_attrs.get("space")
    if space is None or recorded is None or recorded == space:
        return
    for name in sorted(set(recorded) | set(space)):
        theirs, ours = recorded.get(name), space.get(name)
        if theirs != ours:
            def shown(record: Any) -> str:
                if record is None:
                    return "not set"
                if isinstance(record, str):
                    return repr(optuna.distributions.json_to_distribution(record))
                return f"fixed at {record['fixed']!r}"

            raise ValueError(
                f"study {study.study_name!r} searches space parameter {name!r} {shown(theirs)}, this worker "
                f"{shown(ours)}: give every worker of a study the same --space, --steps and --action-face"
            )


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


#: RunConfig fields that are a trial's budget rather than its parameters: ``best_config.json`` takes them
#: from the full run (:func:`write_best_config`).
BUDGET_FIELDS: tuple[str, ...] = ("eval_steps", "checkpoint_every", "keep_checkpoints", "progress")


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The completed trial of the highest finite value (``None``: none completed)."""
    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.value is not None and math.isfinite(t.value)
    ]
    return max(complete, key=lambda t: t.value) if complete else None


def write_best_config(study: optuna.Study, path: str | Path, full: RunConfig | None = None) -> Path | None:
    """Write the best trial's RunConfig with a full run's budget: the trial's parameters, steps and data,
    and ``full``'s evaluation and checkpoints (:data:`BUDGET_FIELDS`: a trial runs without checkpoints and
    may be scored on fewer steps); ``out`` unset. ``RunConfig.load`` reads it.

    :param study: the study.
    :param path: the JSON file.
    :param full: the config whose :data:`BUDGET_FIELDS` the full run takes (``None``: ``RunConfig()``'s).
    :return: the path, or ``None`` when no trial completed.
    """
    best = best_trial(study)
    if best is None:
        return None
    full = RunConfig() if full is None else full
    config = RunConfig.from_dict(best.user_attrs["run_config"])
    budget = {name: getattr(full, name) for name in BUDGET_FIELDS}
    return dataclasses.replace(config, out=None, **budget).save(path)


#: Completed trials below which ``param_importances.png`` is not drawn: fANOVA's ranking of a handful of
#: trials is noise (Optuna itself draws it from two).
MIN_IMPORTANCE_TRIALS = 10


def write_plots(study: optuna.Study, out: str | Path) -> list[Path]:
    """Optimization history, parameter importances and parallel coordinates as PNGs in ``out``, their value
    axes named with the study's metric (``sharpe``, not Optuna's "Objective Value").

    A plot that needs more trials than the study has is skipped with a warning: importances need
    :data:`MIN_IMPORTANCE_TRIALS` completed trials, the other plots one.

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
    metric = study.user_attrs.get("metric", "objective")
    plots = {
        "optimization_history": lambda s: ovm.plot_optimization_history(s, target_name=metric),
        "param_importances": lambda s: ovm.plot_param_importances(s, target_name=metric),
        "parallel_coordinate": lambda s: ovm.plot_parallel_coordinate(s, params=top, target_name=metric),
    }
    completed = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if completed < MIN_IMPORTANCE_TRIALS:
        del plots["param_importances"]
        warnings.warn(f"param_importances.png not written: {completed} completed trials, importances need "
                      f"at least {MIN_IMPORTANCE_TRIALS}", stacklevel=2)
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


def study_attrs(base: RunConfig, space: Mapping[str, Param | Any], settings: StudySettings) -> dict[str, Any]:
    """The study's user attributes recorded at its creation (the space: :func:`space_record`).

    :param base: the base run config.
    :param space: the fitted space.
    :param settings: the study's settings.
    :return: ``name -> value``.
    """
    return {
        "metric_keys": list(METRICS[settings.metric]),
        "sampler": settings.sampler,
        "pruner": settings.pruner,
        "n_evaluations": settings.n_evaluations,
        "base_config": base.to_dict(),
        "eval_split": settings.eval_split,
        "space": space_record(space),
    }


class StudyFailed(RuntimeError):
    """Every trial of the study failed: the message names the first failure's reason."""


def first_failure(study: optuna.Study) -> str | None:
    """``None`` when a trial of the study completed or was pruned (or none failed); else the first failed
    trial's reason, one line.

    :param study: the study.
    :return: the reason.
    """
    trials = study.get_trials(deepcopy=False)
    if any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials):
        return None
    failed = [t for t in trials if t.state == TrialState.FAIL]
    if not failed:
        return None
    first = min(failed, key=lambda t: t.number)
    reason = first.user_attrs.get("error") or "its worker stopped beating (killed?)"
    return (f"every trial of study {study.study_name!r} failed ({len(failed)}); the first, trial "
            f"{first.number}: {reason}")


def tune(
    base: RunConfig,
    space: Mapping[str, Param | Any],
    settings: StudySettings,
    evaluate: Evaluate = held_out_metrics,
    full: RunConfig | None = None,
) -> optuna.Study:
    """Check the space, run this worker's share of a study, then write ``best_config.json`` and the plots.

    Before the first trial the space is fitted to the base config's action face and steps and every value a
    trial can draw is checked (:mod:`tuning.preflight`): a value no run can use is a ``ValueError``.

    :param base: the base run config of every trial.
    :param space: the search space.
    :param settings: the study's settings.
    :param evaluate: the held-out scoring of intermediate evaluations.
    :param full: the config whose evaluation and checkpoints ``best_config.json`` takes
        (:func:`write_best_config`; ``None``: ``RunConfig()``'s).
    :return: the study.
    :raises StudyFailed: when every trial of the study failed.
    :raises OSError: when the storage fails (read-only, full, lost), one line.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the study prints its own line per trial
    space, notes = fit_space(space, base)
    if not settings.worker:  # a launcher's workers: the launcher checked it
        check_space(space, base)
    tag = f"{settings.worker}: " if settings.worker else ""
    for note in notes if not settings.worker else ():  # a launcher's workers: the launcher said them
        print(note)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    url = settings.storage_url()
    storage = make_storage(url, settings.heartbeat_interval, settings.grace_period, settings.max_retry)
    sampler = make_sampler(settings.sampler, settings.sampler_seed, settings.n_startup_trials)
    pruner = make_pruner(settings.pruner, settings.n_startup_trials, settings.n_evaluations)
    with storage_errors(url):
        study = open_study(settings.study_name, storage, settings.metric, settings.resume, sampler, pruner,
                           study_attrs(base, space, settings))
        objective = Objective(base, space, settings.metric, out / "trials", settings.n_evaluations, evaluate,
                              settings.eval_split, own_streams=settings.trials_per_process > 1)
        started = time.perf_counter()
        optimize(study, objective, settings, tag)
        if objective.storage_error is not None:
            raise objective.storage_error
        if settings.write_outputs:
            write_outputs(study, settings, full)
        print(f"{tag}study {settings.study_name}: {state_counts(study)} in the storage; this worker "
              f"{time.perf_counter() - started:.1f}s")
        failure = first_failure(study)
    if failure is not None:
        raise StudyFailed(failure)
    return study


def optimize(study: optuna.Study, objective: Objective, settings: StudySettings, tag: str = "") -> None:
    """Run this worker's trials, one line each (``tag`` first), a progress bar over them unless off.

    :param study: the study.
    :param objective: the objective.
    :param settings: the study's settings (trials, timeout, metric, progress).
    :param tag: the worker's name in its lines.
    """
    # The bar ends at the budget: over trials when a number is given, else over the timeout's seconds.
    by_time = settings.n_trials is None
    bar = tqdm(
        total=settings.timeout if by_time else settings.n_trials,
        desc=f"study {settings.study_name}",
        unit="s" if by_time else "trial",
        disable=not settings.progress,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}]" if by_time else None,
    )
    started = time.monotonic()

    concurrent = settings.trials_per_process > 1

    def report(study: optuna.Study, trial: FrozenTrial) -> None:
        if concurrent:  # Optuna's gc_after_trial, but never while another trial captures a CUDA graph
            collect_garbage()
        if objective.storage_error is not None:  # said by tune, as one line
            study.stop()
            return
        done = min(time.monotonic() - started, bar.total) if by_time else min(bar.n + 1, bar.total)
        bar.update(done - bar.n)
        best = ""
        try:
            best = f" | best {settings.metric}={study.best_value:.6g} (trial {study.best_trial.number})"
        except ValueError:  # no completed trial yet
            pass
        tqdm.write(tag + trial_line(trial, settings.metric) + best, file=sys.stdout)

    try:
        study.optimize(
            objective,
            n_trials=settings.n_trials,
            timeout=settings.timeout,
            catch=(Exception,),
            callbacks=[report],
            gc_after_trial=not concurrent,
            n_jobs=settings.trials_per_process,
        )
    except AssertionError as error:
        # Optuna's _run_trial asserts "Should not reach." when the storage fails while it records a
        # trial's end (a disk that fills mid-trial): the storage's error is the assertion's context.
        cause = storage_cause(error)
        if cause is None:
            raise
        raise cause from None
    finally:
        bar.close()


def storage_cause(error: BaseException) -> BaseException | None:
    """The database error in ``error``'s chain of causes and contexts, or ``None``."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, sqlalchemy.exc.SQLAlchemyError | optuna.exceptions.StorageInternalError):
            return link
        link = link.__cause__ or link.__context__
    return None


def state_counts(study: optuna.Study) -> dict[str, int]:
    """The number of the study's trials in each state."""
    return {state.name: len(study.get_trials(deepcopy=False, states=(state,))) for state in TrialState}


def write_outputs(study: optuna.Study, settings: StudySettings, full: RunConfig | None = None) -> None:
    """Write ``best_config.json`` (a full run's budget: :func:`write_best_config`) and the plots to the
    study folder, and say where.

    :param study: the study.
    :param settings: the study's settings (folder, metric, split).
    :param full: the config whose evaluation and checkpoints the best config takes.
    """
    out = Path(settings.out)
    best_path = write_best_config(study, out / "best_config.json", full)
    plots = write_plots(study, out)
    if best_path is not None:
        best = best_trial(study)
        trial = best.user_attrs["run_config"]
        written = RunConfig.load(best_path)
        print(
            f"best {settings.metric}={best.value:.6g} on the {settings.eval_split} data "
            f"(trial {best.number}); config: {best_path}"
        )
        print(f"  its parameters with a full run's evaluation and checkpoints: "
              f"eval_steps={written.eval_steps}, checkpoint_every={written.checkpoint_every} "
              f"(the trial ran eval_steps={trial['eval_steps']}, "
              f"checkpoint_every={trial['checkpoint_every']})")
        if settings.eval_split == "validation":
            print(f"its score on the untouched test data: foxhunt train --config {best_path} "
                  "--eval-split test")
    if plots:
        print("plots: " + ", ".join(str(p) for p in plots))
