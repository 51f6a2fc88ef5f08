"""Several independent models trained at once in one process: one thread each, on its own CUDA stream.

One small agent leaves a large GPU mostly idle: its steps are launch-bound graph replays. K agents (seeds, or
trials with other hyperparameters) trained by K Python threads, each on a CUDA stream of its own, overlap
their kernels, and each gets the results it gets alone (tested bit for bit on the CPU and on CUDA), because:

- every draw of a model's training comes from its own generators (the model's ``generator``, the replay
  buffer's ``generator`` and Philox state, the env's, the collector's warm-up generator), never from a
  process-wide one, so one model's draws do not move another's;
- building a model seeds and draws the process-wide generators (SB3's ``set_random_seed``, the network's
  initialisation, the buffer's seed): ``BranchingIQN`` builds under :data:`MODEL_BUILD_LOCK`, so that
  models built in several threads at once each see their own seed's numbers;
- CUDA graphs are captured one at a time (:func:`cuda_ext.graph_capture.capture`'s lock) in the
  ``thread_local`` error mode, so another thread's work during a capture neither breaks it nor is captured;
- ``torch.cuda.stream`` is thread-local: each thread's kernels go to a stream that no other thread holds
  (:func:`own_stream`; torch's pool hands the same stream to several callers, and a capture records whatever
  is queued to its stream), so the models' kernels run side by side and no model waits on another's.

On the CPU the same threads run (torch releases the GIL inside its ops); the results are again each model's
own. Usage::

    models = [BranchingIQN("MlpPolicy", make_env(seed), seed=seed, device="cuda") for seed in range(5)]
    learn_concurrently(models, 200_000)        # the five models, trained at once; raises naming a failure
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import get_device

from cuda_ext.graph_capture import thread_streams

__all__ = ["MODEL_BUILD_LOCK", "ConcurrentTrainingError", "StopOnEvent", "holding_build_lock",
           "learn_concurrently", "own_stream", "run_concurrently", "run_in_processes"]

T = TypeVar("T")

#: held while a model is built: SB3 seeds the process-wide generators and the build draws from them
MODEL_BUILD_LOCK = threading.RLock()

F = TypeVar("F", bound=Callable[..., Any])


def holding_build_lock(method: F) -> F:
    """``method`` run under :data:`MODEL_BUILD_LOCK` (for a model's ``_setup_model``)."""

    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with MODEL_BUILD_LOCK:
            return method(*args, **kwargs)

    return locked  # type: ignore[return-value]


class ConcurrentTrainingError(RuntimeError):
    """A task of :func:`run_concurrently` failed; the message names it, ``__cause__`` is its exception.

    :param name: the failed task's name.
    :param error: its exception.
    :param n_failed: how many tasks failed in all.
    """

    def __init__(self, name: str, error: BaseException, n_failed: int = 1) -> None:
        others = f" ({n_failed - 1} other task(s) failed too)" if n_failed > 1 else ""
        super().__init__(f"{name} failed: {type(error).__name__}: {error}{others}")
        self.name = name
        self.error = error


@contextlib.contextmanager
def own_stream(device: th.device | str | None) -> Iterator[th.cuda.Stream | None]:
    """Make a CUDA stream that no other thread holds the current stream of this thread while inside, with a
    side stream of its own for warm-ups (:func:`cuda_ext.graph_capture.thread_streams`; nothing on another
    device); at the end wait for its work, so what it computed can be read on any stream.

    :param device: the device the work runs on (streams are made for a CUDA device only).
    :return: the stream, or None.
    """
    device = get_device(device) if device is not None else None  # "auto" too
    if device is None or device.type != "cuda":
        yield None
        return
    with thread_streams(device) as stream:
        yield stream


def run_concurrently(tasks: Sequence[Callable[[], T]], names: Sequence[str] | None = None,
                     devices: Sequence[th.device | str | None] | None = None,
                     on_failure: Callable[[], None] | None = None) -> list[T]:
    """Run each task in a thread of its own (on a CUDA stream of its own when its device is CUDA) and
    return their results in order (a single task runs in the calling thread, on a stream of its own).

    :param tasks: functions of no arguments.
    :param names: a name per task for errors (default ``task i``).
    :param devices: per task, the device whose stream it gets (None: no stream of its own).
    :param on_failure: called (once, from the failing thread) when a task raises, e.g. to ask the others
        to stop early.
    :return: the tasks' results.
    :raises ConcurrentTrainingError: naming the first task that failed (its exception as the cause), after
        every thread has ended.
    """
    n = len(tasks)
    names = [f"task {i}" for i in range(n)] if names is None else [str(name) for name in names]
    devices = [None] * n if devices is None else list(devices)
    if len(names) != n or len(devices) != n:
        raise ValueError(f"names ({len(names)}) and devices ({len(devices)}) must have one entry per task "
                         f"({n})")
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n
    failed = threading.Event()

    def run(i: int) -> None:
        try:
            with own_stream(devices[i]):
                results[i] = tasks[i]()
        except BaseException as error:  # re-raised in the calling thread, naming the task
            errors[i] = error
            if not failed.is_set():
                failed.set()
                if on_failure is not None:
                    on_failure()

    if n == 1:
        run(0)
    else:
        threads = [threading.Thread(target=run, args=(i,), name=names[i], daemon=True) for i in range(n)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:  # Ctrl-C while waiting: ask the tasks to stop, wait for them, re-raise
            if on_failure is not None:
                on_failure()
            for thread in threads:
                thread.join()
            raise
    failures = [(name, error) for name, error in zip(names, errors, strict=True) if error is not None]
    if failures:
        name, error = failures[0]
        raise ConcurrentTrainingError(name, error, len(failures)) from error
    return results


def run_in_processes(function: Callable[..., T], arguments: Sequence[tuple[Any, ...]],
                     names: Sequence[str] | None = None, processes: int | None = None) -> list[T]:
    """``function(*args)`` for each entry of ``arguments``, each in a fresh (spawned) process, up to
    ``processes`` at once; their results in order.

    Threads (:func:`run_concurrently`) share one interpreter: the host side of K models (a step's
    bookkeeping, its graph launches) takes turns on the GIL, and on one GPU K small models trained by threads
    take about K times one model's wall (``benchmarks/concurrent_seeds.py``). Processes have an interpreter
    and a CUDA context each: their host work runs side by side and the GPU interleaves their kernels. Each
    task starts a process of its own (a CUDA context and the imports, seconds), and its results are those of
    the same call in any other fresh process.

    :param function: a module-level function (it is pickled by reference).
    :param arguments: per task, the positional arguments (picklable).
    :param names: a name per task for errors (default ``task i``).
    :param processes: tasks running at once (default: all).
    :return: the tasks' results (picklable).
    :raises ConcurrentTrainingError: naming the first task that failed (its exception as the cause), after
        every task has ended.
    """
    n = len(arguments)
    names = [f"task {i}" for i in range(n)] if names is None else [str(name) for name in names]
    if len(names) != n:
        raise ValueError(f"names ({len(names)}) must have one entry per task ({n})")
    workers = n if processes is None else int(processes)
    if workers < 1:
        raise ValueError(f"processes={processes!r} must be >= 1")
    results: list[Any] = [None] * n
    failures: list[tuple[str, BaseException]] = []
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(max_workers=min(workers, max(n, 1)), mp_context=context,
                             max_tasks_per_child=1) as pool:
        futures = [pool.submit(function, *args) for args in arguments]
        for i, future in enumerate(futures):
            try:
                results[i] = future.result()
            except BaseException as error:  # re-raised below, naming the task
                failures.append((names[i], error))
    if failures:
        name, error = failures[0]
        raise ConcurrentTrainingError(name, error, len(failures)) from error
    return results


class StopOnEvent(BaseCallback):
    """Stops ``learn`` at its next step once ``event`` is set (another model of the batch failed).

    :param event: the event to watch.
    """

    def __init__(self, event: threading.Event) -> None:
        super().__init__()
        self.event = event

    def _on_step(self) -> bool:
        return not self.event.is_set()


def learn_concurrently(models: Sequence[Any], total_timesteps: int | Sequence[int],
                       callbacks: Sequence[Any] | None = None, names: Sequence[str] | None = None,
                       **learn_kwargs: Any) -> list[Any]:
    """``model.learn`` of every model at once, each in a thread on a CUDA stream of its own; each model ends
    as it ends trained alone with the same seed (its draws come from its own generators).

    Build the models before (serially or not: building takes :data:`MODEL_BUILD_LOCK`); each needs its own
    env. When one model fails the others stop at their next step and the error names the failed model.

    :param models: the models (SB3 algorithms; ``BranchingIQN`` for the guarantee above).
    :param total_timesteps: env steps for every model, or one number per model.
    :param callbacks: per model, SB3 callback(s) for its ``learn`` (None: none).
    :param names: per model, a name for errors (default ``model i (seed s)``).
    :param learn_kwargs: other arguments of every ``learn`` (``log_interval``, ``tb_log_name``, ...).
    :return: what each ``learn`` returned (the models).
    :raises ConcurrentTrainingError: a model's ``learn`` raised (its exception as the cause).
    """
    n = len(models)
    steps = [int(total_timesteps)] * n if isinstance(total_timesteps, int) \
        else [int(s) for s in total_timesteps]
    callbacks = [None] * n if callbacks is None else list(callbacks)
    if len(steps) != n or len(callbacks) != n:
        raise ValueError(f"total_timesteps ({len(steps)}) and callbacks ({len(callbacks)}) must have one "
                         f"entry per model ({n})")
    if len({id(model) for model in models}) != n or len({id(model.get_env()) for model in models}) != n:
        raise ValueError("models: each model must appear once and have an env of its own")
    names = [f"model {i} (seed {getattr(model, 'seed', None)})" for i, model in enumerate(models)] \
        if names is None else list(names)
    stop = threading.Event()

    def task(i: int) -> Callable[[], Any]:
        user = callbacks[i]
        own = [] if user is None else list(user) if isinstance(user, list | tuple) else [user]
        chain = [StopOnEvent(stop), *own]
        return lambda: models[i].learn(steps[i], callback=chain, **learn_kwargs)

    return run_concurrently([task(i) for i in range(n)], names, [model.device for model in models], stop.set)
