"""The device collector: ``BranchingIQN.learn`` on a :class:`~sb3_her_ext.device_env.DeviceVecEnv`.

SB3's ``collect_rollouts`` syncs the device on every vector step: it copies observations to the host and
actions back, builds one info dict per env and walks them in Python. :meth:`DeviceCollector.collect_rollouts`
does the same work on device tensors. Per vector step, with no host sync and no Python loop over envs:

1. act: before ``learning_starts`` uniform random actions (drawn on the device from the collector's own
   generator); after, the algorithm's ``explore``, i.e. what ``BranchingIQN.predict(deterministic=False)``
   does, without the copy to the host;
2. env step: :meth:`~sb3_her_ext.device_env.DeviceVecEnv.step_tensors` (same-step autoreset);
3. replay push of the transition and the info tensors through the buffer's tensor path (``add`` with a
   dict of tensors; hindsight tracking and injection happen there), after the NaN guard checked the rewards
   and observations (:mod:`sb3_her_ext.guard`: on a GPU it records a failure on the device and the flush
   below raises it);
4. SB3's bookkeeping: ``num_timesteps``, callbacks, progress, ``_on_step`` (target update, schedules,
   diagnostics at their interval).

Gradient steps stay where SB3 runs them: ``learn`` calls ``train`` after each rollout. Where the
configuration qualifies, the rollout and its gradient steps run instead as ONE CUDA graph replay
(:mod:`sb3_her_ext.collect.fused`), and ``train`` then only keeps count: on CUDA with ``cuda_graph=True``
(or with ``eager=True``, on any device: the block run without capture, as the tests' reference), for the
learn loop's own rollouts past ``learning_starts``, on an env with the static face, with a
``callback_stride`` that is a multiple of ``train_freq`` (callbacks run between replays), until a capture
fails (it warns once and the device loop takes over). :meth:`DeviceCollector.unsupported_reason` names what
stops a rollout; with ``graph_collect=True`` a rollout past ``learning_starts`` that does not qualify warns
once. With ``fuse_random_rollouts=True`` (:meth:`DeviceCollector.configure`) the rollouts that lie wholly
before ``learning_starts`` run fused as well, as random blocks (uniform random actions from the warm-up
generator, no gradient step); a random block whose capture fails turns only the random blocks off. A fused
rollout works at block granularity: a callback's ``on_step`` and its stop take effect after
the block (its transitions are stored and its gradient steps done, where the device loop stores nothing of
the step a callback stopped at); diagnostics lines, flushes and log dumps due inside a block are written at
its end (the line then already counts the block's gradient steps).

What crosses to the host, and when (one sync each time):

* episode statistics accumulate on the device (:class:`~sb3_her_ext.collect.episodes.EpisodeStats`) and go
  into ``ep_info_buffer`` / the episode count at flush points: whenever the diagnostics line is due (so its
  ``ep_rew_mean`` is fresh), every ``stats_interval`` env steps, at the end of training and when a callback
  stops it. ``dump_logs`` runs at a flush where the episode count crossed a multiple of ``log_interval``;
* the counts of actions taken (the diagnostics' ``action_mix``) accumulate on the device and are added to
  the diagnostics at each flush (and by :meth:`DeviceCollector.flush_action_counts`, before a checkpoint).

Callbacks: ``on_step`` runs every ``callback_stride`` vector steps (default 1, SB3's cadence). A callback's
``n_calls`` then counts strides, so frequencies given in calls (``EvalCallback``'s ``eval_freq``,
``CheckpointCallback``'s ``save_freq``) are in units of ``callback_stride`` vector steps; ``num_timesteps``
is exact. The locals a callback sees hold device tensors (``actions``, ``new_obs``, ``rewards``, ``dones``,
``infos`` as a dict of tensors). Progress bars advance by the steps in between.

Random draws: after ``learning_starts`` the same draws as SB3's loop in the same order, so on a CPU the two
loops give the same replay contents and parameters. Before it, SB3 draws each env's action with
``action_space.sample()`` (numpy); here they come from a device generator: the same uniform distribution,
other numbers.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit

from sb3_her_ext.collect.episodes import EpisodeStats, random_actions, record_steps
from sb3_her_ext.collect.fused import STATIC_FACE, CaptureError, FusedBlock
from sb3_her_ext.collect.protocol import CollectingAlgorithm
from sb3_her_ext.device_env import DeviceStep, is_device_vec_env
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

#: Why a rollout is not fused while the observation normalizer waits for replay rows (learning_starts < 2):
#: a passing state, like the random warm-up, so graph_collect=True does not warn about it.
NORMALIZER_PENDING = "the observation normalizer is not fitted yet (fewer than 2 replay rows)"


@dataclass(frozen=True)
class CollectorSettings:
    """Settings of a :class:`DeviceCollector` (see :meth:`DeviceCollector.configure`).

    :param callback_stride: callbacks' ``on_step`` runs every this many vector steps (their ``n_calls``
        then counts strides); >= 1.
    :param stats_interval: env steps between host reads of the episode statistics (besides the other
        flush points); ``None``: the algorithm's ``diagnostics_interval``.
    :param eager: run the fused block without capturing it, on any device (the CPU included): the function
        a graph would capture, for tests and as the reference of graph replays.
    :param fuse_random_rollouts: run the rollouts before ``learning_starts`` (uniform random actions) as
        fused random blocks too (:data:`~sb3_her_ext.collect.fused.RANDOM`), where the configuration
        qualifies and the whole rollout lies before ``learning_starts``: the same draws and replay contents as
        the device loop, its eager vector steps replaced by graph replays.
    """

    callback_stride: int = 1
    stats_interval: int | None = None
    eager: bool = False
    fuse_random_rollouts: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.callback_stride, bool) or not isinstance(self.callback_stride, int) \
                or self.callback_stride < 1:
            raise ValueError(f"callback_stride={self.callback_stride!r} must be an integer >= 1")
        if self.stats_interval is not None and (
            isinstance(self.stats_interval, bool) or not isinstance(self.stats_interval, int)
            or self.stats_interval < 1
        ):
            raise ValueError(f"stats_interval={self.stats_interval!r} must be an integer >= 1 or None")
        for name in ("eager", "fuse_random_rollouts"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")


class _Rollout(NamedTuple):
    """The arguments of one ``collect_rollouts`` call (a callback's locals hold them)."""

    env: Any
    callback: BaseCallback
    train_freq: TrainFreq
    replay_buffer: Any
    learning_starts: int
    log_interval: int | None


class DeviceCollector:
    """Collects rollouts for one algorithm on a device vector env, and owns what that takes between calls:
    the settings, the episode statistics and action counts on the device, the warm-up generator, the fused
    block with its graphs, and the host counters of callbacks and flushes. Held by the algorithm
    (``BranchingIQN.collector``); made with it, not saved with it.

    :param algorithm: the algorithm it collects for (held by a weak reference: the algorithm holds this).
    """

    def __init__(self, algorithm: CollectingAlgorithm) -> None:
        self._algorithm = weakref.ref(algorithm)
        self.settings = CollectorSettings()
        #: the finished episodes and the ``[NB, A]`` action counts since the last flush (made at first use)
        self.stats: EpisodeStats | None = None
        self.action_counts: th.Tensor | None = None
        self.warmup_generator: th.Generator | None = None
        #: the fused block (its graphs and counters), or None before the first fused rollout
        self.block: FusedBlock | None = None
        #: why the fused path is off for good (a failed capture), or None
        self.failed: str | None = None
        #: why the random blocks are off for good (their capture failed), or None
        self.random_failed: str | None = None
        self._warned: set[str] = set()
        self._fused_trained = False  # the last fused rollout ran the coming train() call's gradient steps
        self._n_actions: th.Tensor | None = None
        self._branch_values: th.Tensor | None = None
        self._ep_info_buffer: Any = None  # the deque the stats feed; a new one (a new learn) restarts them
        self.vector_steps = 0  # since the start of this learn
        self.steps_since_callback = 0
        self.last_stats_step = 0
        self.start_time = 0.0

    @property
    def algorithm(self) -> CollectingAlgorithm:
        """The algorithm this collector collects for."""
        algorithm = self._algorithm()
        if algorithm is None:
            raise ReferenceError("the algorithm of this DeviceCollector no longer exists")
        return algorithm

    def configure(self, callback_stride: int = 1, stats_interval: int | None = None,
                  eager: bool = False, fuse_random_rollouts: bool = False) -> None:
        """Set the settings (:class:`CollectorSettings`; every one not given goes back to its default). They
        last as long as the algorithm object (not saved). A change of ``eager`` drops the fused block.

        :param callback_stride: callbacks' ``on_step`` every this many vector steps.
        :param stats_interval: env steps between host reads of the episode statistics.
        :param eager: run fused blocks without capturing them.
        :param fuse_random_rollouts: run the rollouts before ``learning_starts`` as fused random blocks.
        """
        settings = CollectorSettings(callback_stride, stats_interval, eager, fuse_random_rollouts)
        if settings.eager != self.settings.eager:
            self.block = None
        self.settings = settings

    def supports(self, env: Any, train_freq: TrainFreq, action_noise: Any = None) -> bool:
        """Whether :meth:`collect_rollouts` can collect on ``env`` (else SB3's loop runs): a
        :class:`~sb3_her_ext.device_env.DeviceVecEnv` (not a wrapper of one) on the algorithm's device, a
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

    def unsupported_reason(self, env: Any, train_freq: TrainFreq, learning_starts: int) -> str | None:
        """Why the fused path cannot run this rollout (see the module docstring), or None when it can.

        :param env: the device vector env (one :meth:`supports`).
        :param train_freq: the rollout length, in steps.
        :param learning_starts: env steps of random actions.
        :return: the reason, or None.
        """
        algorithm = self.algorithm
        if algorithm.graph_collect is False:
            return "graph_collect=False"
        if not self.settings.eager:
            if algorithm.device.type != "cuda":
                return f"device={algorithm.device}: CUDA graphs need a CUDA device"
            if not algorithm.cuda_graph:
                return "cuda_graph=False"
        if self.failed is not None:
            return self.failed
        missing = [name for name in STATIC_FACE if not callable(getattr(env, name, None))]
        if missing:
            return f"the env has no {missing} (the static face a graph needs)"
        buffer = algorithm.replay_buffer
        if not isinstance(buffer, PrioritizedHindsightReplayBuffer):
            return f"replay buffer {type(buffer).__name__} (needs PrioritizedHindsightReplayBuffer)"
        if train_freq.frequency != algorithm.train_freq.frequency:
            return (f"a rollout of {train_freq.frequency} steps is not the learn loop's (train_freq="
                    f"{algorithm.train_freq.frequency}): its gradient steps would not follow it")
        if algorithm.num_timesteps < learning_starts:
            random = (f"num_timesteps={algorithm.num_timesteps} < learning_starts={learning_starts} "
                      "(random actions)")
            if not self.settings.fuse_random_rollouts:
                return random
            if self.random_failed is not None:
                return f"{random}; random blocks are off: {self.random_failed}"
            if algorithm.num_timesteps + train_freq.frequency * env.num_envs > learning_starts:
                return f"{random}, and the rollout reaches past learning_starts"
        stride = self.settings.callback_stride
        if stride % train_freq.frequency:
            return f"callback_stride={stride} is not a multiple of train_freq={train_freq.frequency}"
        # fitted by train() on the host, before any graph that acts through it (random blocks do not)
        if algorithm.policy.observation_normalizer_pending and algorithm.num_timesteps >= learning_starts:
            return NORMALIZER_PENDING
        return None

    # ------------------------------------------------------------------ rollouts

    def collect_rollouts(self, env: Any, callback: BaseCallback, train_freq: TrainFreq, replay_buffer: Any,
                         learning_starts: int = 0, log_interval: int | None = None) -> RolloutReturn:
        """SB3's ``collect_rollouts`` on device tensors: ``train_freq`` vector steps (module docstring), as
        one fused block when the configuration qualifies.

        :param env: the device vector env (the algorithm's env).
        :param callback: SB3's callback (``on_step`` every ``callback_stride`` vector steps).
        :param train_freq: the rollout length, in steps.
        :param replay_buffer: the algorithm's buffer (its tensor path).
        :param learning_starts: env steps of uniform random actions.
        :param log_interval: episodes between ``dump_logs``.
        :return: SB3's ``RolloutReturn`` (its episode count: the episodes read at this call's flushes).
        """
        rollout = _Rollout(env, callback, train_freq, replay_buffer, learning_starts, log_interval)
        fused = self.collect_and_train(*rollout)
        if fused is not None:
            return fused
        algorithm = self.algorithm
        self._ready(th.device(env.device))
        assert self.stats is not None and self.action_counts is not None
        n_envs = env.num_envs
        algorithm.policy.set_training_mode(False)
        callback.on_rollout_start()
        obs = env.current_obs()
        steps = episodes = 0
        finished = False
        while steps < train_freq.frequency:
            # 1. act
            if algorithm.num_timesteps < learning_starts:
                assert self._n_actions is not None and self.warmup_generator is not None
                actions = random_actions(self._n_actions, self.warmup_generator, n_envs)
            else:
                actions = algorithm.explore(obs)
            # 2. env step
            step = env.step_tensors(actions)
            algorithm.num_timesteps += n_envs
            steps += 1
            stopped = self._callback_step(rollout, 1, actions, step, steps, episodes)
            if stopped is not None:  # SB3 stores nothing of the step a callback stopped at
                return RolloutReturn(steps * n_envs, episodes + stopped, continue_training=False)
            record_steps(self.stats, self.action_counts, step.done, step.episode_return, step.episode_length,
                         actions, self._branch_values)
            # 3. replay push (the transition's next obs is the one before any reset); the NaN guard checks the
            #    rows first (CPU: raises; GPU: records the failure and pushes zeros in place of NaN/inf)
            final_obs, reward = step.final_obs, step.reward
            if algorithm.guard is not None:
                (obs, final_obs), reward = algorithm.guard.check_env_tensors(algorithm.num_timesteps,
                                                                             (obs, final_obs), reward)
            replay_buffer.add(obs, final_obs, actions, reward, step.done, step.infos)
            obs = step.obs
            # 4. SB3's bookkeeping; the episode statistics reach the host only at flush points
            finished = algorithm.update_progress()
            episodes += self._flush_when_due(log_interval, algorithm.after_env_step)
        if finished:
            episodes += self._end_of_training(callback, n_envs, log_interval)
        callback.on_rollout_end()
        return RolloutReturn(steps * n_envs, episodes, continue_training=True)

    def collect_and_train(self, env: Any, callback: BaseCallback, train_freq: TrainFreq, replay_buffer: Any,
                          learning_starts: int = 0, log_interval: int | None = None) -> RolloutReturn | None:
        """One rollout and its gradient steps as one fused block when the configuration qualifies
        (:meth:`unsupported_reason`), with the host bookkeeping around it (callbacks at block ends); the next
        ``train`` call then only keeps count. Arguments as :meth:`collect_rollouts`.

        :return: SB3's ``RolloutReturn``, or None: not fused (the caller runs the device loop).
        """
        algorithm = self.algorithm
        reason = self.unsupported_reason(env, train_freq, learning_starts)
        if reason is not None:
            if (algorithm.graph_collect is True and algorithm.num_timesteps >= learning_starts
                    and reason != NORMALIZER_PENDING):
                self._warn_once(f"graph_collect=True, but this rollout runs through the device loop: "
                                f"{reason}")
            return None
        self._ready(th.device(env.device))
        assert self.stats is not None and self.action_counts is not None
        steps, n_envs = train_freq.frequency, env.num_envs
        state = (self.stats, self.action_counts)
        # the random blocks' draws: the device loop's warm-up generator (a block made with it runs both kinds)
        generator = self.warmup_generator if self.settings.fuse_random_rollouts else None
        if self.block is None or not self.block.matches(algorithm, env, *state, steps, generator):
            self.block = FusedBlock(algorithm, env, *state, steps, capture=not self.settings.eager,
                                    random_generator=generator,
                                    n_actions=self._n_actions if generator is not None else None)
        random = algorithm.num_timesteps < learning_starts  # unsupported_reason checked the whole rollout
        # as SB3's loop: before the rollout's first step (a checkpoint written here holds the state before it;
        # a capture that fails below hands the rollout to the device loop, which calls it again)
        callback.on_rollout_start()
        saved = algorithm.counters()
        key = self.block.prepare(algorithm, random=random)
        try:
            actions, step = self.block.run(algorithm, key)
        except CaptureError as error:
            algorithm.restore_counters(saved)
            if random:  # the learning rollouts may still capture: only the random blocks are off
                self.random_failed = f"capture failed ({error})"
                self._warn_once(f"the random rollouts' CUDA graph is off for this model: "
                                f"{self.random_failed}; the device loop runs them instead")
                return None
            self.failed = f"capture failed ({error})"
            self._warn_once(f"the fused collect + train CUDA graph is off for this model: {self.failed}; the "
                            "device loop runs instead")
            return None
        algorithm.count_gradient_steps(len(key or ()))  # they ran with the block: train() skips them
        rollout = _Rollout(env, callback, train_freq, replay_buffer, learning_starts, log_interval)
        stopped = self._callback_step(rollout, steps, actions, step, steps, 0)
        if stopped is not None:  # the block is stored and trained already (module docstring)
            return RolloutReturn(steps * n_envs, stopped, continue_training=False)
        episodes = self._flush_when_due(log_interval, self._diagnostics_line)
        if algorithm.update_progress():  # (the block's last step set it already: is the total reached?)
            episodes += self._end_of_training(callback, n_envs, log_interval)
        callback.on_rollout_end()
        self._fused_trained = bool(key)
        return RolloutReturn(steps * n_envs, episodes, continue_training=True)

    def take_fused_training(self) -> bool:
        """Whether the last rollout was a fused block that already ran the coming ``train`` call's gradient
        steps (then ``train`` runs none); answered once."""
        trained, self._fused_trained = self._fused_trained, False
        return trained

    # ------------------------------------------------------------------ host bookkeeping

    def _ready(self, device: th.device) -> None:
        """Make the device state at first use; restart the statistics at a new ``learn``."""
        algorithm = self.algorithm
        if self._ep_info_buffer is not algorithm.ep_info_buffer:  # a new learn (SB3 made a new deque)
            self._ep_info_buffer = algorithm.ep_info_buffer
            window = algorithm.ep_info_buffer.maxlen or 100
            if self.stats is not None and self.stats.window == window:
                self.stats.restart()  # the same tensors: a captured graph writes them
            else:
                self.stats = EpisodeStats(window, device)
            self.vector_steps = self.steps_since_callback = 0
            self.last_stats_step = algorithm.num_timesteps
            self.start_time = time.time()
        # made once: an algorithm's device does not change (and "cuda" != "cuda:0" as devices: never compare)
        if self.action_counts is None:
            dims = algorithm.action_dims
            self.action_counts = th.zeros(len(dims), max(dims), dtype=th.int64, device=device)
            self._n_actions = th.tensor(dims, dtype=th.int64, device=device)
            self._branch_values = th.arange(max(dims), device=device)
        if self.warmup_generator is None:
            self.warmup_generator = th.Generator(device=device)
            seed = algorithm.seed if algorithm.seed is not None else int(np.random.randint(2**31))
            self.warmup_generator.manual_seed(int(seed) + 1)  # a stream of its own: not the selection's

    def _callback_step(self, rollout: _Rollout, steps: int, actions: th.Tensor, step: DeviceStep,
                       collected_steps: int, collected_episodes: int) -> int | None:
        """Count ``steps`` vector steps; at each ``callback_stride``-th, advance the progress bars and run the
        callback on the last step's locals. When the callback stops training: flush, dump the logs when due
        and end the rollout.

        :return: None to go on; else (the callback stopped) the episodes the flush read.
        """
        algorithm, callback, n_envs = self.algorithm, rollout.callback, rollout.env.num_envs
        self.vector_steps += steps
        self.steps_since_callback += steps
        if self.vector_steps % self.settings.callback_stride:
            return None
        advance_bars(callback, (self.steps_since_callback - 1) * n_envs)
        self.steps_since_callback = 0
        callback.update_locals({
            "self": algorithm, **rollout._asdict(), "actions": actions, "buffer_actions": actions,
            "new_obs": step.obs, "rewards": step.reward, "dones": step.done, "infos": step.infos,
            "num_collected_steps": collected_steps, "num_collected_episodes": collected_episodes,
        })
        if callback.on_step():
            return None
        episodes, dump = self.flush(rollout.log_interval)
        if dump:
            algorithm.dump_logs()
        callback.on_rollout_end()
        return episodes

    def _flush_when_due(self, log_interval: int | None, end_step: Callable[[], Any]) -> int:
        """After a vector step (or a block): flush when the diagnostics line or the statistics are due, then
        ``end_step`` (the algorithm's ``_on_step``, or a block's diagnostics line), then the log dump.

        :return: the episodes the flush read (0 without one).
        """
        algorithm = self.algorithm
        stats_interval = self.settings.stats_interval or algorithm.diagnostics_interval
        episodes, dump = 0, False
        if algorithm.diagnostics_due() or algorithm.num_timesteps - self.last_stats_step >= stats_interval:
            episodes, dump = self.flush(log_interval)
        end_step()
        if dump:
            algorithm.dump_logs()
        return episodes

    def _diagnostics_line(self) -> None:
        """A diagnostics line when due (after a fused block: its ``_on_step`` calls are done)."""
        if self.algorithm.diagnostics_due():
            self.algorithm.log_diagnostics()

    def _end_of_training(self, callback: BaseCallback, n_envs: int, log_interval: int | None) -> int:
        """The last flush of a ``learn`` (progress bars to the end)."""
        episodes, dump = self.flush(log_interval)
        advance_bars(callback, self.steps_since_callback * n_envs)
        self.steps_since_callback = 0
        if dump:
            self.algorithm.dump_logs()
        return episodes

    def flush(self, log_interval: int | None) -> tuple[int, bool]:
        """Bring the device-side statistics to the host: finished episodes, action counts; then raise what the
        NaN guard recorded (one sync).

        :param log_interval: episodes between ``dump_logs``.
        :return: ``(episodes ended since the last flush, whether the logs are due)``.
        """
        assert self.stats is not None and self.action_counts is not None
        algorithm = self.algorithm
        episodes, finished, counts = self.stats.read(also=self.action_counts)  # the interval's one sync
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
        saved now (a checkpoint) holds them; nothing before the first device rollout."""
        if self.action_counts is not None:
            self._hand_over_counts(self.action_counts.cpu().numpy())

    def _hand_over_counts(self, counts: np.ndarray) -> None:
        """Zero the device counts and add their host copy ``counts`` to the diagnostics."""
        assert self.action_counts is not None
        counts = counts.astype(np.int64).reshape(self.action_counts.shape)
        self.action_counts.zero_()
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
