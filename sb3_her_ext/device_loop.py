"""The device collection loop: ``BranchingIQN.learn`` on a :class:`~sb3_her_ext.device_env.DeviceVecEnv`.

SB3's ``collect_rollouts`` syncs the device on every vector step: it copies observations to the host and
actions back, builds one info dict per env and walks them in Python. :func:`collect_rollouts` does the same
work on device tensors. Per vector step, with no host sync and no Python loop over envs:

1. act: before ``learning_starts`` uniform random actions (drawn on the device from the loop's own
   generator); after, :func:`explore`, i.e. what ``BranchingIQN.predict(deterministic=False)`` does
   (``policy.action_stats`` → per-branch ε, Boltzmann branches and bonuses through
   :func:`~sb3_her_ext.exploration.select_actions`), without the copy to the host;
2. env step: :meth:`~sb3_her_ext.device_env.DeviceVecEnv.step_tensors` (same-step autoreset);
3. replay push of the transition and the info tensors through the buffer's tensor path (``add`` with a
   dict of tensors; hindsight tracking and injection happen there), after the model's NaN guard checked
   the rewards and observations (:mod:`sb3_her_ext.guard`: on a GPU it records a failure on the device
   and the flush below raises it);
4. SB3's bookkeeping: ``num_timesteps``, callbacks, progress, ``_on_step`` (target update, schedules,
   diagnostics at their interval).

Gradient steps stay where SB3 runs them: ``learn`` calls ``train(gradient_steps, batch_size)`` after each
``collect_rollouts`` of ``train_freq`` vector steps (graphed when the model has ``cuda_graph=True``).
Where the configuration qualifies (CUDA, ``cuda_graph=True``, past ``learning_starts``, a
``callback_stride`` that is a multiple of ``train_freq``, an env with the static face; see
:mod:`sb3_her_ext.graphed_loop`), :func:`collect_rollouts` instead runs the rollout and its gradient steps
as ONE CUDA graph replay, and ``train`` then only keeps count.

What crosses to the host, and when (one sync each time):

* episode statistics accumulate on the device (a ring of the last ``stats_window_size`` finished episodes
  and a count) and go into ``ep_info_buffer`` / ``_episode_num`` at flush points: whenever the model's
  diagnostics line is due (so its ``ep_rew_mean`` is fresh), every ``stats_interval`` env steps, at the
  end of training and when a callback stops it. ``dump_logs`` runs at a flush where the episode count
  crossed a multiple of ``log_interval`` (SB3: at the episode end itself; once per flush here);
* the counts of actions taken (the diagnostics' ``action_mix``) accumulate on the device and are added to
  the diagnostics just before a line is written.

Callbacks: ``on_step`` runs every ``callback_stride`` vector steps (:class:`DeviceLoopSettings`, set with
:func:`configure`; default 1, SB3's cadence). A callback's ``n_calls`` then counts strides, so frequencies
given in calls (``EvalCallback``'s ``eval_freq``, ``CheckpointCallback``'s ``save_freq``) are in units of
``callback_stride`` vector steps; ``num_timesteps`` is exact. The locals a callback sees hold device tensors
(``actions``, ``new_obs``, ``rewards``, ``dones``, ``infos`` as a dict of tensors). Progress bars advance by
the steps in between.

Random draws: after ``learning_starts`` the same draws as SB3's loop in the same order (the policy's
quantile fractions from torch's global generator, the selection's uniforms from the model's generator),
so on a CPU the two loops give the same replay contents and parameters. Before it, SB3 draws each env's
action with ``action_space.sample()`` (numpy); here they come from a device generator: the same uniform
distribution, other numbers.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit

from sb3_her_ext.device_env import DeviceVecEnv, is_device_vec_env
from sb3_her_ext.exploration import branch_epsilons
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

__all__ = [
    "DeviceLoopSettings", "EpisodeStats", "advance_bars", "collect_rollouts", "configure", "count_actions",
    "explore", "flush", "flush_action_counts", "loop_state", "record_steps", "settings_of", "supports",
]


@dataclass(frozen=True)
class DeviceLoopSettings:
    """Settings of the device loop of one model (see :func:`configure`).

    :param callback_stride: callbacks' ``on_step`` runs every this many vector steps (their ``n_calls``
        then counts strides); >= 1.
    :param stats_interval: env steps between host reads of the episode statistics (besides the other
        flush points, see the module docstring); ``None``: the model's ``diagnostics_interval``.
    """

    callback_stride: int = 1
    stats_interval: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.callback_stride, bool) or not isinstance(self.callback_stride, int) \
                or self.callback_stride < 1:
            raise ValueError(f"callback_stride={self.callback_stride!r} must be an integer >= 1")
        if self.stats_interval is not None and (
            isinstance(self.stats_interval, bool) or not isinstance(self.stats_interval, int)
            or self.stats_interval < 1
        ):
            raise ValueError(f"stats_interval={self.stats_interval!r} must be an integer >= 1 or None")


class EpisodeStats:
    """The last ``window`` finished episodes' return and length, and the count of finished episodes, on the
    device; read on the host only by :meth:`read`.

    :param window: episodes kept (SB3's ``stats_window_size``); >= 1.
    :param device: device of the ring.
    """

    def __init__(self, window: int, device: th.device) -> None:
        if int(window) != window or window < 1:
            raise ValueError(f"window={window!r} must be an integer >= 1")
        self.window = int(window)
        self.returns = th.zeros(self.window, dtype=th.float64, device=device)
        self.lengths = th.zeros(self.window, dtype=th.int64, device=device)
        self.count = th.zeros((), dtype=th.int64, device=device)
        #: ``-1 - slot`` per slot (the slot's offset in :meth:`add`'s modular rank)
        self._last_minus_slots = -1 - th.arange(self.window, device=device)
        self.read_count = 0  # the count at the last read (host)

    def add(self, done: th.Tensor, episode_return: th.Tensor, episode_length: th.Tensor) -> None:
        """Record the episodes that ended in one vector step, in env order (no host sync).

        Episode number ``count + r`` (``r``: its rank among this step's, in env order) goes to slot
        ``(count + r) % window``. Each slot gathers the episode of the one rank that lands on it among the
        last ``window`` ranks (a gather, not a scatter: no duplicate writes, deterministic on every device).

        :param done: ``[N]`` bool.
        :param episode_return: ``[N]`` returns (valid where ``done``).
        :param episode_length: ``[N]`` lengths (valid where ``done``).
        """
        ended = th.cumsum(done, 0, dtype=th.int64)  # [N] episodes ended in this step up to each env
        total = ended[-1]
        self.count.add_(total)
        # slot s holds rank  total - 1 - ((count - 1 - s) mod window)  (count after this step); here
        # taken = that rank + 1 (in [total - window + 1, total]), so written where taken >= 1
        taken = total - th.remainder(self.count + self._last_minus_slots, self.window)  # [W]
        # the env of that rank: the first whose prefix count reaches it; 0 where taken <= 0 (not written), and
        # never past the last env (taken <= total = ended[-1])
        env = th.searchsorted(ended, taken)
        written = taken >= 1
        # in place: a captured CUDA graph (sb3_her_ext.graphed_loop) keeps writing the same tensors
        th.where(written, episode_return.to(th.float64)[env], self.returns, out=self.returns)
        th.where(written, episode_length.to(th.int64)[env], self.lengths, out=self.lengths)

    def restart(self) -> None:
        """Forget every episode (a new ``learn``), keeping the tensors (a captured graph writes them)."""
        self.returns.zero_()
        self.lengths.zero_()
        self.count.zero_()
        self.read_count = 0

    def read(self, also: th.Tensor | None = None) -> tuple[list[tuple[float, int]], int, np.ndarray]:
        """The episodes finished since the last read, oldest first: one device-to-host copy (a sync).

        :param also: more numbers to bring over in the same copy (as float64: exact below 2**53).
        :return: ``([(return, length), ...]`` of the last at most ``window`` of them, how many finished,
            ``also``'s values flattened (empty without it)).
        """
        parts = [self.count.reshape(1).to(th.float64), self.returns, self.lengths.to(th.float64)]
        if also is not None:
            parts.append(also.reshape(-1).to(th.float64))
        host = th.cat(parts).cpu().numpy()
        window = self.window
        count = int(host[0])
        returns, lengths = host[1 : 1 + window].tolist(), host[1 + window : 1 + 2 * window].astype(np.int64)
        first = max(self.read_count, count - window)
        n_new, self.read_count = count - self.read_count, count
        episodes = [(returns[k % window], int(lengths[k % window])) for k in range(first, count)]
        return episodes, n_new, host[1 + 2 * window :].copy()


@dataclass
class _LoopState:
    """What the loop keeps for one model between ``collect_rollouts`` calls."""

    settings: DeviceLoopSettings
    stats: EpisodeStats | None = None
    ep_info_buffer: Any = None  # the deque the stats feed; a new one (a new ``learn``) restarts them
    action_counts: th.Tensor | None = None
    warmup_generator: th.Generator | None = None
    vector_steps: int = 0  # since the start of this learn
    steps_since_callback: int = 0
    last_stats_step: int = 0
    start_time: float = 0.0


_STATES: weakref.WeakKeyDictionary[OffPolicyAlgorithm, _LoopState] = weakref.WeakKeyDictionary()


def configure(model: OffPolicyAlgorithm, callback_stride: int = 1, stats_interval: int | None = None) -> None:
    """Set the device loop's settings of ``model`` (see :class:`DeviceLoopSettings`); they last as long as
    the model object (not saved).

    :param model: the algorithm.
    :param callback_stride: callbacks' ``on_step`` every this many vector steps.
    :param stats_interval: env steps between host reads of the episode statistics.
    """
    settings = DeviceLoopSettings(callback_stride, stats_interval)
    state = _STATES.get(model)
    if state is None:
        _STATES[model] = _LoopState(settings)
    else:
        state.settings = settings


def supports(model: OffPolicyAlgorithm, env: Any, train_freq: TrainFreq, action_noise: Any = None) -> bool:
    """Whether :func:`collect_rollouts` can collect for ``model`` on ``env`` (else SB3's loop runs).

    :param model: the algorithm.
    :param env: its (vectorized) env.
    :param train_freq: the rollout length.
    :param action_noise: SB3's action noise (must be None).
    :return: True for a :class:`~sb3_her_ext.device_env.DeviceVecEnv` (:func:`is_device_vec_env`: not a
        wrapper of one) on the model's device, a
        :class:`~sb3_her_ext.replay.PrioritizedHindsightReplayBuffer`, ``train_freq`` in steps, no action
        noise and no ``VecNormalize``.
    """
    return (
        is_device_vec_env(env)
        and th.device(env.device).type == model.device.type
        and isinstance(model.replay_buffer, PrioritizedHindsightReplayBuffer)
        and train_freq.unit == TrainFrequencyUnit.STEP
        and action_noise is None
        and model._vec_normalize_env is None
    )


def explore(model: Any, obs: th.Tensor, exploration_rate: th.Tensor | None = None,
            iqr_bonus: th.Tensor | None = None, branch_rates: th.Tensor | None = None) -> th.Tensor:
    """Exploratory actions on the device: ``BranchingIQN.predict(obs, deterministic=False)`` without the host
    copy (same draws from the same generators, same diagnostics).

    :param model: a ``BranchingIQN``.
    :param obs: ``[N, D]`` observations on the model's device.
    :param exploration_rate: ε as a 0-dim float32 device tensor (a captured graph reads it); None: the
        model's ``exploration_rate``.
    :param iqr_bonus: the IQR bonus weight as a 0-dim float32 device tensor; None: the model's.
    :param branch_rates: the per-branch rates ``[NB]`` float32 that
        :func:`~sb3_her_ext.exploration.branch_epsilons` gives for ε (then ``exploration_rate`` is not read):
        a caller acting for several steps makes them for all steps at once (``branch_epsilons(rates[:, None],
        model._mults)``, ``[k, NB]``) and passes one row per step.
    :return: ``[N, NB]`` int64 actions on the device.
    """
    with th.no_grad():
        if branch_rates is None:
            branch_rates = branch_epsilons(
                model.exploration_rate if exploration_rate is None else exploration_rate, model._mults
            )
        actions, iqr, ens_std = model.policy.explore(
            obs, model._n_actions, branch_rates, model._boltzmann,
            model.iqr_bonus if iqr_bonus is None else iqr_bonus, model.ensemble_bonus, model._generator,
        )
        model.diagnostics.add_selection(iqr, ens_std, model._valid_actions)
    return actions


def count_actions(counts: th.Tensor, actions: th.Tensor, values: th.Tensor) -> None:
    """Add the actions taken to ``counts`` in place (integer sums: exact in any grouping of the steps).

    :param counts: ``[NB, A]`` int64 counts of each branch's actions.
    :param actions: ``[..., NB]`` int64 actions: one vector step ``[N, NB]`` or several ``[k, N, NB]``.
    :param values: ``[A]`` the action values ``0 .. A - 1`` (``arange``, made once by the caller).
    """
    flat = actions.reshape(-1, actions.shape[-1])
    counts += (flat[:, :, None] == values).sum(dim=0)


def record_steps(state: _LoopState, done: th.Tensor, episode_return: th.Tensor, episode_length: th.Tensor,
                 actions: th.Tensor, values: th.Tensor) -> None:
    """The episode statistics and action counts of one vector step, or of ``k`` steps at once (their
    tensors stacked, ``[k, N, ...]``, in step order): the same ring, count and action counts as recording
    the steps one by one (:meth:`EpisodeStats.add` takes the episodes in that order), in the ops of one step.

    :param state: the loop state (its ``stats`` and ``action_counts``).
    :param done: ``[N]`` or ``[k, N]`` bool.
    :param episode_return: returns of the same shape (valid where ``done``).
    :param episode_length: lengths of the same shape (valid where ``done``).
    :param actions: ``[N, NB]`` or ``[k, N, NB]`` int64 actions.
    :param values: ``[A]`` the action values ``0 .. A - 1``.
    """
    assert state.stats is not None and state.action_counts is not None
    state.stats.add(done.reshape(-1), episode_return.reshape(-1), episode_length.reshape(-1))
    count_actions(state.action_counts, actions, values)


def settings_of(model: OffPolicyAlgorithm) -> DeviceLoopSettings:
    """The device loop's settings of ``model`` (the defaults unless :func:`configure` set others).

    :param model: the algorithm.
    :return: its settings.
    """
    state = _STATES.get(model)
    return state.settings if state is not None else DeviceLoopSettings()


def loop_state(model: Any, device: th.device) -> _LoopState:
    """The loop's state of ``model`` (made at its first use; restarted at a new ``learn``).

    :param model: the algorithm.
    :param device: the env's device.
    :return: the state.
    """
    state = _STATES.get(model)
    if state is None:
        state = _STATES[model] = _LoopState(DeviceLoopSettings())
    if state.ep_info_buffer is not model.ep_info_buffer:  # a new learn (SB3 made a new deque)
        state.ep_info_buffer = model.ep_info_buffer
        window = model.ep_info_buffer.maxlen or 100
        if state.stats is not None and state.stats.window == window:
            state.stats.restart()  # the same tensors: a captured graph (graphed_loop) writes them
        else:
            state.stats = EpisodeStats(window, device)
        state.vector_steps = state.steps_since_callback = 0
        state.last_stats_step = model.num_timesteps
        state.start_time = time.time()
    # made once: a model's device does not change (and "cuda" != "cuda:0" as devices, so never compare them)
    if state.action_counts is None:
        state.action_counts = th.zeros(len(model.action_dims), max(model.action_dims), dtype=th.int64,
                                       device=device)
    if state.warmup_generator is None:
        state.warmup_generator = th.Generator(device=device)
        seed = model.seed if model.seed is not None else int(np.random.randint(2**31))
        state.warmup_generator.manual_seed(int(seed) + 1)  # a stream of its own: not the selection's
    return state


def _random_actions(model: Any, state: _LoopState, n_envs: int) -> th.Tensor:
    """Uniform random actions per branch (SB3's warm-up ``action_space.sample()``, on the device)."""
    n_actions = model._n_actions
    uniform = th.rand((n_envs, n_actions.shape[0]), generator=state.warmup_generator, device=n_actions.device)
    return th.minimum((uniform * n_actions).to(th.int64), n_actions - 1)


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


def flush(model: Any, state: _LoopState, log_interval: int | None) -> tuple[int, bool]:
    """Bring the device-side statistics to the host: ``ep_info_buffer``, ``_episode_num``, action counts.

    :param model: the algorithm.
    :param state: its loop state.
    :param log_interval: episodes between ``dump_logs``.
    :return: ``(episodes ended since the last flush, whether the logs are due)``.
    """
    assert state.stats is not None and state.action_counts is not None
    episodes, n_new, counts = state.stats.read(also=state.action_counts)  # the interval's one sync
    counts = counts.astype(np.int64).reshape(state.action_counts.shape)
    elapsed = round(time.time() - state.start_time, 6)
    model.ep_info_buffer.extend({"r": r, "l": length, "t": elapsed} for r, length in episodes)
    before = model._episode_num
    model._episode_num = before + n_new
    state.action_counts.zero_()
    model.diagnostics.add_action_counts([counts[b, :n] for b, n in enumerate(model.action_dims)])
    state.last_stats_step = model.num_timesteps
    guard = getattr(model, "guard", None)
    if guard is not None:  # a sync point: the NaN guard's flags (see sb3_her_ext.guard)
        guard.raise_if_tripped()
    check_actions = getattr(model.env, "check_action_flag", None)  # an env's own device flags, if it has any
    if callable(check_actions):
        check_actions()
    due = bool(log_interval) and model._episode_num // log_interval > before // log_interval
    return n_new, due


def flush_action_counts(model: Any) -> None:
    """Move the action counts accumulated on the device into the model's diagnostics (one sync), so that
    state saved now (a checkpoint) holds them; a model the loop never ran is left alone.

    :param model: the algorithm.
    """
    state = _STATES.get(model)
    if state is None or state.action_counts is None or getattr(model, "diagnostics", None) is None:
        return
    counts = state.action_counts.cpu().numpy().astype(np.int64)
    state.action_counts.zero_()
    model.diagnostics.add_action_counts([counts[b, :n] for b, n in enumerate(model.action_dims)])


def collect_rollouts(
    model: Any,
    env: DeviceVecEnv,
    callback: BaseCallback,
    train_freq: TrainFreq,
    replay_buffer: ReplayBuffer,
    learning_starts: int = 0,
    log_interval: int | None = None,
) -> RolloutReturn:
    """SB3's ``collect_rollouts`` on device tensors: ``train_freq`` vector steps (see the module docstring).

    :param model: a ``BranchingIQN`` (its policy, schedules, diagnostics and ``_on_step``).
    :param env: the device vector env (the model's env).
    :param callback: SB3's callback (``on_step`` every ``callback_stride`` vector steps).
    :param train_freq: the rollout length, in steps.
    :param replay_buffer: the model's buffer (its tensor path).
    :param learning_starts: env steps of uniform random actions.
    :param log_interval: episodes between ``dump_logs``.
    :return: SB3's ``RolloutReturn`` (its episode count: the episodes read at this call's flushes).
    """
    from sb3_her_ext import graphed_loop

    fused = graphed_loop.collect_and_train(model, env, callback, train_freq, replay_buffer, learning_starts,
                                           log_interval)
    if fused is not None:  # the block ran as one CUDA graph (collect + train)
        return fused
    device = th.device(env.device)
    state = loop_state(model, device)
    stride = state.settings.callback_stride
    stats_interval = state.settings.stats_interval or model.diagnostics_interval
    assert state.stats is not None and state.action_counts is not None
    n_envs = env.num_envs
    model.policy.set_training_mode(False)
    callback.on_rollout_start()
    obs = env.current_obs()
    branch_values = th.arange(state.action_counts.shape[1], device=device)
    num_collected_steps = num_collected_episodes = 0
    while num_collected_steps < train_freq.frequency:
        # 1. act
        if model.num_timesteps < learning_starts:
            actions = _random_actions(model, state, n_envs)
        else:
            actions = explore(model, obs)
        # 2. env step
        step = env.step_tensors(actions)
        model.num_timesteps += n_envs
        num_collected_steps += 1
        state.vector_steps += 1
        state.steps_since_callback += 1
        if state.vector_steps % stride == 0:
            advance_bars(callback, (state.steps_since_callback - 1) * n_envs)
            state.steps_since_callback = 0
            callback.update_locals({
                "self": model, "env": env, "callback": callback, "train_freq": train_freq,
                "replay_buffer": replay_buffer, "learning_starts": learning_starts,
                "log_interval": log_interval,
                "actions": actions, "buffer_actions": actions, "new_obs": step.obs, "rewards": step.reward,
                "dones": step.done, "infos": step.infos, "num_collected_steps": num_collected_steps,
                "num_collected_episodes": num_collected_episodes,
            })
            if not callback.on_step():  # SB3 stores nothing of the step a callback stopped at
                episodes, dump = flush(model, state, log_interval)
                if dump:
                    model.dump_logs()
                callback.on_rollout_end()
                return RolloutReturn(num_collected_steps * n_envs, num_collected_episodes + episodes,
                                     continue_training=False)
        record_steps(state, step.done, step.episode_return, step.episode_length, actions, branch_values)
        # 3. replay push (the transition's next obs is the one before any reset); the NaN guard checks the
        #    rows first (CPU: raises; GPU: records the failure and pushes zeros in place of NaN/inf)
        final_obs, reward = step.final_obs, step.reward
        guard = getattr(model, "guard", None)
        if guard is not None:
            (obs, final_obs), reward = guard.check_env_tensors(model.num_timesteps, (obs, final_obs), reward)
        replay_buffer.add(obs, final_obs, actions, reward, step.done, step.infos)
        obs = step.obs
        # 4. SB3's bookkeeping; the episode statistics reach the host only at flush points
        model._update_current_progress_remaining(model.num_timesteps, model._total_timesteps)
        diagnostics_due = model.num_timesteps - model._last_diagnostics_step >= model.diagnostics_interval
        dump = False
        if diagnostics_due or model.num_timesteps - state.last_stats_step >= stats_interval:
            episodes, dump = flush(model, state, log_interval)
            num_collected_episodes += episodes
        model._on_step()
        if dump:
            model.dump_logs()
    if model.num_timesteps >= model._total_timesteps:
        episodes, dump = flush(model, state, log_interval)
        num_collected_episodes += episodes
        advance_bars(callback, state.steps_since_callback * n_envs)
        state.steps_since_callback = 0
        if dump:
            model.dump_logs()
    callback.on_rollout_end()
    return RolloutReturn(num_collected_steps * n_envs, num_collected_episodes, continue_training=True)
