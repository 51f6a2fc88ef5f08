"""Many workers of one study from one command: ``foxhunt tune --n-workers N|auto``.

The launcher checks the space and creates the study, then starts each worker as a process of its own
(``spawn``), all sharing the study's storage: ``--n-workers auto`` starts ``--workers-per-gpu`` workers
on each visible GPU (``cuda:0``, ``cuda:1``, ...; ``CUDA_VISIBLE_DEVICES`` chooses which are visible);
``--n-workers N`` starts N workers on ``--device`` (``cpu``; ``cuda`` spreads them over the visible GPUs in
turn; ``cuda:K`` puts them all on GPU K). ``--n-trials`` is the launcher's total, shared out among the
workers. When they have ended, the launcher writes ``best_config.json`` and the plots.

A worker that dies (SIGKILL, out of memory) loses nothing completed: its running trial stops beating and,
after ``--grace-period``, another worker marks it FAIL and runs it again (Optuna's heartbeat and
``RetryFailedTrialCallback``); the trials it had not started are not run, and the launcher exits 1 naming
it. Several hosts run the same command against one storage URL (README, "Tuning").
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from foxhunt.runs import RunConfig
from tuning.evaluation import held_out_metrics
from tuning.objective import Evaluate
from tuning.preflight import check_space, fit_space
from tuning.space import Param
from tuning.study import (
    StudyFailed,
    StudySettings,
    first_failure,
    make_pruner,
    make_sampler,
    make_storage,
    open_study,
    state_counts,
    storage_errors,
    study_attrs,
    tune,
    write_outputs,
)


def parse_n_workers(value: str) -> int | None:
    """``--n-workers``: ``"auto"`` (``None``: one per visible GPU) or an integer >= 1.

    :param value: the option's text.
    :return: the number, or ``None`` for ``auto``.
    """
    if value == "auto":
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"--n-workers={value!r} must be an integer >= 1 or 'auto'") from None
    if number < 1:
        raise ValueError(f"--n-workers={value!r} must be an integer >= 1 or 'auto'")
    return number


def worker_devices(n_workers: int | None, device: str | None, gpu_count: int, workers_per_gpu: int = 1
                   ) -> list[str]:
    """The device of each worker.

    :param n_workers: the number of workers, or ``None`` (``auto``): ``workers_per_gpu`` on each GPU.
    :param device: ``--device`` (``None``: not given): ``cpu``, ``cuda`` (the GPUs in turn) or ``cuda:K``.
    :param gpu_count: the visible GPUs.
    :param workers_per_gpu: workers on each GPU with ``auto``.
    :return: one device per worker.
    """
    if isinstance(workers_per_gpu, bool) or not isinstance(workers_per_gpu, int) or workers_per_gpu < 1:
        raise ValueError(f"--workers-per-gpu={workers_per_gpu!r} must be an integer >= 1")
    if n_workers is None:
        if device is not None and device != "cuda":
            raise ValueError(f"--n-workers=auto starts workers on every visible GPU; --device={device!r} "
                             "contradicts it (give --n-workers N with --device)")
        if gpu_count < 1:
            raise ValueError("--n-workers=auto starts one worker per visible GPU, and no GPU is visible "
                             "(give --n-workers N for CPU workers)")
        return [f"cuda:{gpu}" for gpu in range(gpu_count) for _ in range(workers_per_gpu)]
    device = device or "cpu"
    if device == "cuda":
        if gpu_count < 1:
            raise ValueError("--device='cuda': no CUDA device is available")
        return [f"cuda:{k % gpu_count}" for k in range(n_workers)]
    return [device] * n_workers


def shares(n_trials: int | None, n_workers: int) -> list[int | None]:
    """Each worker's trials: ``n_trials`` shared out as evenly as it goes (``None``: each until timeout).

    :param n_trials: the launcher's total.
    :param n_workers: the workers.
    :return: one count per worker (workers with none are left out).
    """
    if n_trials is None:
        return [None] * n_workers
    counts = [n_trials // n_workers + (k < n_trials % n_workers) for k in range(n_workers)]
    return [count for count in counts if count > 0]


def _worker(base: RunConfig, space: Mapping[str, Any], settings: StudySettings, evaluate: Evaluate) -> None:
    """One worker process: its share of the study; an error is one line and exit status 2."""
    try:
        tune(base, space, settings, evaluate)
    except StudyFailed:  # the launcher says so, once
        sys.exit(0)
    except (ValueError, OSError) as error:
        print(f"{settings.worker}: error: {' '.join(str(error).split())}", file=sys.stderr, flush=True)
        sys.exit(2)


def _exit_on_term(signum: int, frame: Any) -> None:
    """SIGTERM as ``SystemExit``, so that the launcher's ``finally`` stops its workers."""
    raise SystemExit(128 + signum)


def launch(
    base: RunConfig,
    space: Mapping[str, Param | Any],
    settings: StudySettings,
    devices: list[str],
    evaluate: Evaluate = held_out_metrics,
    full: RunConfig | None = None,
) -> int:
    """Create the study, run one worker process per device of ``devices`` on it, write its outputs.

    :param base: the base run config (each worker's with its own ``device``).
    :param space: the search space.
    :param settings: the study's settings; ``n_trials`` is the total over the workers.
    :param devices: one device per worker (:func:`worker_devices`).
    :param evaluate: the held-out scoring (a module-level function: it goes to the workers by pickle).
    :param full: the config whose evaluation and checkpoints ``best_config.json`` takes.
    :return: 0, or 1 when a worker died or failed (named on stderr).
    :raises StudyFailed: when every trial of the study failed.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    fitted, notes = fit_space(space, base)
    check_space(fitted, base)
    for note in notes:
        print(note)
    Path(settings.out).mkdir(parents=True, exist_ok=True)
    url = settings.storage_url()
    storage = make_storage(url, settings.heartbeat_interval, settings.grace_period, settings.max_retry)
    with storage_errors(url):  # created once here, so the workers only load it
        open_study(settings.study_name, storage, settings.metric, settings.resume,
                   make_sampler(settings.sampler, settings.sampler_seed, settings.n_startup_trials),
                   make_pruner(settings.pruner, settings.n_startup_trials, settings.n_evaluations),
                   study_attrs(base, fitted, settings))
    counts = shares(settings.n_trials, len(devices))
    context = multiprocessing.get_context("spawn")
    processes = []
    stop_on_term = threading.current_thread() is threading.main_thread()
    if stop_on_term:  # `kill LAUNCHER` stops its workers too (the finally below)
        previous = signal.signal(signal.SIGTERM, _exit_on_term)
    status = 0
    try:
        for k, count in enumerate(counts):
            name = f"worker {k + 1}/{len(counts)}"
            worker_settings = dataclasses.replace(settings, n_trials=count, resume=True, progress=False,
                                                  write_outputs=False, worker=name)
            worker_base = dataclasses.replace(base, device=devices[k])
            process = context.Process(target=_worker, args=(worker_base, space, worker_settings, evaluate),
                                      name=name)
            process.start()
            print(f"{name}: pid {process.pid} on {devices[k]}, {count or 'timeout-bound'} trials", flush=True)
            processes.append(process)
        for process in processes:
            process.join()
            if process.exitcode != 0:
                status = 1
                how = (f"was killed by signal {-process.exitcode}" if process.exitcode < 0
                       else f"exited {process.exitcode}")
                print(f"foxhunt: {process.name} (pid {process.pid}) {how}; its running trial is re-run by "
                      "another worker after --grace-period, the trials it had not started are not run",
                      file=sys.stderr)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join()
        if stop_on_term:
            signal.signal(signal.SIGTERM, previous)
    study = optuna.load_study(study_name=settings.study_name, storage=storage)
    with storage_errors(url):
        write_outputs(study, settings, full)
        print(f"study {settings.study_name}: {state_counts(study)} in the storage")
        failure = first_failure(study)
    if failure is not None:
        raise StudyFailed(failure)
    return status
