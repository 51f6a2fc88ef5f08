"""The device collector: ``BranchingIQN.learn`` on a :class:`~sb3_her_ext.device_vec_env.DeviceVecEnv`.

SB3's loop syncs the device on every vector step: it copies observations to the host and actions back, builds
one info dict per env and walks them in Python. On a device env, :meth:`DeviceCollector.learn` replaces it by
a short loop over training blocks (:class:`~sb3_her_ext.collect.block.TrainBlock`): per rollout of
``train_freq`` vector steps, run the block (the steps, then the rollout's gradient steps), add its steps to
the host counters, call the callbacks, flush and log at the block's end. SB3's own loop still runs for any
other VecEnv.

A rollout is one block, except where SB3's loop changes what it does inside a rollout: the steps before
``learning_starts`` act randomly (a random block of those steps, then a block of the rest), and the
observation normalizer, when it still waits for replay rows, is fitted between the steps and the gradient
steps (a block of the steps, the fit, a block of the gradient steps alone). The blocks give SB3's loop's
replay contents, parameters, optimizer state, counters and schedules bit for bit on the CPU (past
``learning_starts``: the warm-up's random actions come from a device generator, SB3's from numpy).

What differs from SB3's loop, by design (a block runs without a host sync):

* callbacks run at block ends: ``on_step`` once per rollout (``n_calls`` counts rollouts; frequencies in
  calls, e.g. ``EvalCallback``'s ``eval_freq``, are in rollouts; ``num_timesteps`` is exact) and they see the
  model, not the loop's locals; a callback that stops training stops after the block (its transitions are
  stored and its gradient steps done, where SB3's loop stores nothing of the step it stopped at);
* a diagnostics line due inside a block is written at its end, after its gradient steps (its loss means then
  count them);
* episode statistics and action counts accumulate on the device and reach the host at flush points: when the
  diagnostics line is due, every ``stats_interval`` env steps, at the end of training and when a callback
  stops it (one sync each; ``dump_logs`` runs at a flush where the episode count crossed a multiple of
  ``log_interval``).
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback
from stable_baselines3.common.type_aliases import MaybeCallback, TrainFreq, TrainFrequencyUnit

from sb3_her_ext.collect.block import TrainBlock
from sb3_her_ext.collect.protocol import CollectingAlgorithm
from sb3_her_ext.device_vec_env import DeviceStep, is_device_vec_env
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer


@dataclass(frozen=True)
class CollectorSettings:
    """Settings of a :class:`DeviceCollector` (see :meth:`DeviceCollector.configure`).

    :param stats_interval: env steps between host reads of the episode statistics (besides the other
        flush points); ``None``: the algorithm's ``diagnostics_interval``.
    """

    stats_interval: int | None = None

    def __post_init__(self) -> None:
        if self.stats_interval is not None and (
            isinstance(self.stats_interval, bool) or not isinstance(self.stats_interval, int)
            or self.stats_interval < 1
        ):
            raise ValueError(f"stats_interval={self.stats_interval!r} must be an integer >= 1 or None")


class DeviceCollector:
    """Trains one algorithm on a device vector env, and owns what that takes between ``learn`` calls: the
    settings, the training block (its device state and graphs) and the host counters of flushes. Held by the
    algorithm (``BranchingIQN.collector``); made with it, not saved with it.

    :param algorithm: the algorithm it trains (held by a weak reference: the algorithm holds this).
    """

    def __init__(self, algorithm: CollectingAlgorithm) -> None:
        self._algorithm = weakref.ref(algorithm)
        self.settings = CollectorSettings()
        #: the training block (its device state and graphs), or None before the first device ``learn``
        self.block: TrainBlock | None = None
        self._warned: set[str] = set()
        self._ep_info_buffer: Any = None  # the deque the stats feed; a new one (a new learn) restarts them
        self.last_stats_step = 0
        self.start_time = 0.0

    @property
    def algorithm(self) -> CollectingAlgorithm:
        """The algorithm this collector trains."""
        algorithm = self._algorithm()
        if algorithm is None:
            raise ReferenceError("the algorithm of this DeviceCollector no longer exists")
        return algorithm

    def configure(self, stats_interval: int | None = None) -> None:
        """Set the settings (:class:`CollectorSettings`; every one not given goes back to its default). They
        last as long as the algorithm object (not saved).

        :param stats_interval: env steps between host reads of the episode statistics.
        """
        self.settings = CollectorSettings(stats_interval)

    def supports(self, env: Any, train_freq: TrainFreq, action_noise: Any = None) -> bool:
        """Whether :meth:`learn` can train on ``env`` (else SB3's loop runs): a
        :class:`~sb3_her_ext.device_vec_env.DeviceVecEnv` (not a wrapper of one) on the algorithm's device, a
        :class:`~sb3_her_ext.replay.PrioritizedHindsightReplayBuffer`, ``train_freq`` in steps, no action
        noise."""
        algorithm = self.algorithm
        return (
            is_device_vec_env(env)
            and th.device(env.device).type == algorithm.device.type
            and isinstance(algorithm.replay_buffer, PrioritizedHindsightReplayBuffer)
            and train_freq.unit == TrainFrequencyUnit.STEP
            and action_noise is None
        )

    def capture_reason(self) -> str | None:
        """Why the blocks run eagerly rather than as CUDA graph replays, or None when they are captured."""
        algorithm = self.algorithm
        if algorithm.graph_collect is False:
            return "graph_collect=False"
        if algorithm.device.type != "cuda":
            return f"device={algorithm.device}: CUDA graphs need a CUDA device"
        if not algorithm.cuda_graph:
            return "cuda_graph=False"
        block = self.block
        if block is not None and block.failed is not None:
            return block.failed
        if block is not None and not block.static:
            return "the env has no static face (step_tensors_static, ...: what a graph needs)"
        return None

    # ------------------------------------------------------------------ the loop

    def learn(self, total_timesteps: int, callback: MaybeCallback = None, log_interval: int | None = 4,
              tb_log_name: str = "run", reset_num_timesteps: bool = True, progress_bar: bool = False) -> Any:
        """SB3's ``learn`` as a loop over training blocks (module docstring); arguments as SB3's.

        :return: the algorithm.
        """
        algorithm = self.algorithm
        total_timesteps, callback = algorithm._setup_learn(total_timesteps, callback, reset_num_timesteps,
                                                           tb_log_name, progress_bar)
        callback.on_training_start(locals(), globals())
        block = self.ready()
        block.load(algorithm)
        while algorithm.num_timesteps < total_timesteps:
            callback.on_rollout_start()
            self.run_rollout()
            if not self._rollout_end(callback, log_interval):
                break
        callback.on_training_end()
        return algorithm

    def ready(self) -> TrainBlock:
        """The training block for the algorithm's env and settings (made, or remade when they changed);
        the episode statistics restarted at a new ``learn`` (SB3 made a new ``ep_info_buffer``)."""
        algorithm = self.algorithm
        env = algorithm.env
        capture = (algorithm.device.type == "cuda" and algorithm.cuda_graph
                   and algorithm.graph_collect is not False)
        window = algorithm.ep_info_buffer.maxlen or 100
        if self.block is None or not self.block.matches(algorithm, env, window, capture):
            old = self.block
            if old is not None and self._ep_info_buffer is algorithm.ep_info_buffer:
                self.flush(None)  # what the old block counted, before its tensors go
            self.block = TrainBlock(algorithm, env, window, capture)
            if old is not None and old.device == self.block.device:  # the warm-up's draws go on
                self.block.warmup_generator.set_state(old.warmup_generator.get_state())
            self._ep_info_buffer = None
        if self._ep_info_buffer is not algorithm.ep_info_buffer:  # a new learn
            self._ep_info_buffer = algorithm.ep_info_buffer
            self.block.stats.restart()  # the same tensors: a captured graph writes them
            self.last_stats_step = algorithm.num_timesteps
            self.start_time = time.time()
        reason = self.capture_reason()
        if algorithm.graph_collect is True and reason is not None:
            self._warn_once(f"graph_collect=True, but the training blocks run eagerly: {reason}")
        return self.block

    def run_rollout(self) -> tuple[th.Tensor | None, DeviceStep | None]:
        """One rollout of ``train_freq`` vector steps and its gradient steps, as SB3's ``learn`` makes them
        (one block, or the pieces of the module docstring); the host counters advanced. No callback, flush
        or log (:meth:`learn` does those at the rollout's end).

        :return: the last vector step's actions and step.
        """
        algorithm = self.algorithm
        assert self.block is not None, "ready() makes the block"
        k, n = algorithm.train_freq.frequency, self.block.n_envs
        first, starts = algorithm.num_timesteps, algorithm.learning_starts
        n_random = min(max(-(-(starts - first) // n), 0), k)  # steps that start before learning_starts
        after = first + k * n
        gradient_steps = 0
        if after > 0 and after > starts:
            gradient_steps = algorithm.gradient_steps if algorithm.gradient_steps >= 0 else k * n
        if algorithm.policy.observation_normalizer_pending and first >= starts:
            algorithm._fit_observation_normalizer(required=False)  # as SB3's loop: before the rollout
        fit_between = gradient_steps > 0 and algorithm.policy.observation_normalizer_pending
        pieces = [[steps, random, 0] for steps, random in ((n_random, True), (k - n_random, False)) if steps]
        if not fit_between:
            pieces[-1][2] = gradient_steps
        outputs: tuple[th.Tensor | None, DeviceStep | None] = (None, None)
        for steps, random, gradients in pieces:
            outputs = self._run(steps, random, gradients)
        if fit_between:  # as train(): the fit before the first gradient step
            algorithm._fit_observation_normalizer()
            self._run(0, False, gradient_steps)
        return outputs

    def _run(self, steps: int, random: bool, gradient_steps: int) -> (
        tuple[th.Tensor | None, DeviceStep | None]
    ):
        """One block: the host counters and schedules advanced past its ``steps`` (SB3's ``_on_step`` values
        at its end), the learning rate set and the vaccine steps planned for its gradient steps, then run."""
        algorithm, block = self.algorithm, self.block
        assert block is not None
        if steps:
            algorithm.num_timesteps += steps * block.n_envs
            algorithm._n_calls += steps - 1
            algorithm.update_progress()
            algorithm.advance_schedules()  # the last call: ε, bonus, β at the block's end (the device's own)
        vaccines: tuple[bool, ...] = ()
        if gradient_steps:
            first = algorithm._n_gradient_steps
            buffer = algorithm.replay_buffer
            vaccines = tuple(algorithm.learner.vaccine_due(first + j + 1, buffer)
                             for j in range(gradient_steps))
            algorithm.policy.set_training_mode(True)
            algorithm._update_learning_rate(algorithm.policy.optimizer)
        outputs = block.run(algorithm, (steps, random, vaccines))
        if gradient_steps:
            algorithm._n_gradient_steps += gradient_steps
            algorithm._n_updates += gradient_steps
            algorithm.logger.record("train/n_updates", algorithm._n_updates, exclude="tensorboard")
        return outputs

    def _rollout_end(self, callback: BaseCallback, log_interval: int | None) -> bool:
        """After a rollout: progress bars, the callback, flushes, the diagnostics line and log dumps.

        :return: whether training goes on (the callback did not stop it).
        """
        algorithm = self.algorithm
        n_envs = algorithm.env.num_envs
        advance_bars(callback, (algorithm.train_freq.frequency - 1) * n_envs)  # a bar adds N per on_step
        if not callback.on_step():
            _, dump = self.flush(log_interval)
            if dump:
                algorithm.dump_logs()
            callback.on_rollout_end()
            return False
        stats_interval = self.settings.stats_interval or algorithm.diagnostics_interval
        dump = False
        if algorithm.diagnostics_due() or algorithm.num_timesteps - self.last_stats_step >= stats_interval:
            dump = self.flush(log_interval)[1]
        if algorithm.diagnostics_due():
            algorithm.log_diagnostics()
        if dump:
            algorithm.dump_logs()
        if algorithm.num_timesteps >= algorithm._total_timesteps:  # the last flush of the learn
            if self.flush(log_interval)[1]:
                algorithm.dump_logs()
        callback.on_rollout_end()
        return True

    # ------------------------------------------------------------------ host reads

    def flush(self, log_interval: int | None) -> tuple[int, bool]:
        """Bring the device-side statistics to the host: finished episodes, action counts; then raise what the
        NaN guard recorded (one sync).

        :param log_interval: episodes between ``dump_logs``.
        :return: ``(episodes ended since the last flush, whether the logs are due)``.
        """
        block, algorithm = self.block, self.algorithm
        assert block is not None
        episodes, finished, counts = block.stats.read(also=block.action_counts)  # the interval's one sync
        total = algorithm.record_episodes(episodes, finished, round(time.time() - self.start_time, 6))
        self._hand_over_counts(counts)
        self.last_stats_step = algorithm.num_timesteps
        if algorithm.guard is not None:  # a sync point: the NaN guard's flags (see sb3_her_ext.guard)
            algorithm.guard.raise_if_tripped()
        check_actions = getattr(algorithm.env, "check_action_flag", None)  # an env's own device flags, if any
        if callable(check_actions):
            check_actions()
        due = bool(log_interval) and total // log_interval > (total - finished) // log_interval
        return finished, due

    def flush_action_counts(self) -> None:
        """Move the action counts accumulated on the device into the diagnostics (one sync), so that state
        saved now (a checkpoint) holds them; nothing before the first device ``learn``."""
        if self.block is not None:
            self._hand_over_counts(self.block.action_counts.cpu().numpy())

    def _hand_over_counts(self, counts: np.ndarray) -> None:
        """Zero the device counts and add their host copy ``counts`` to the diagnostics."""
        assert self.block is not None
        action_counts = self.block.action_counts
        counts = counts.astype(np.int64).reshape(action_counts.shape)
        action_counts.zero_()
        algorithm = self.algorithm
        algorithm.diagnostics.add_action_counts([counts[b, :n] for b, n in enumerate(algorithm.action_dims)])

    def _warn_once(self, message: str) -> None:
        """A RuntimeWarning, once per collector and message."""
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=4)


def _progress_bars(callback: BaseCallback) -> list[ProgressBarCallback]:
    if isinstance(callback, ProgressBarCallback):
        return [callback]
    if isinstance(callback, CallbackList):
        return [bar for child in callback.callbacks for bar in _progress_bars(child)]
    return []


def advance_bars(callback: BaseCallback, steps: int) -> None:
    """Advance progress bars by ``steps`` env steps that ran without an ``on_step``.

    :param callback: SB3's callback (its progress bars).
    :param steps: env steps.
    """
    if steps > 0:
        for bar in _progress_bars(callback):
            bar.pbar.update(steps)
