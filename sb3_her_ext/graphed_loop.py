"""One CUDA graph per training block: collect ``train_freq`` vector steps AND run the ``gradient_steps``
gradient steps that follow them, as ONE graph replay (issue 14).

The device loop (:mod:`sb3_her_ext.device_loop`) already runs a vector step without a host sync, but as
~40 kernel launches of acting, env step and replay push, and each gradient step as its own graph replay
(:mod:`sb3_her_ext.graphed_step`). At a few books that launch latency is the whole cost. Here the block
``k = train_freq`` vector steps + ``g`` gradient steps is :meth:`FusedBlock.block`, captured once per
*key* and replayed; between replays the host only does bookkeeping.

What the block does, in the device loop's order (so, run eagerly, it gives the device loop's results: same
replay contents, same parameters; tested on the CPU): for each of the ``k`` vector steps, act
(:func:`~sb3_her_ext.device_loop.explore` with ε and the IQR bonus read from device tensors), env step
(the env's ``step_tensors_static``), episode statistics and action counts, the NaN guard's check (with the
step number read from a device tensor), replay push with hindsight; then the target network's Polyak
updates due in those steps (masked by device flags: the online network does not change while collecting,
so applying them after the collection is the same arithmetic); then ``g`` gradient steps
(:meth:`~sb3_her_ext.learner.Learner.train_step_in_graph`: PER β read from a device tensor).

Before each replay the host advances ``num_timesteps``, the progress, ``_n_calls`` and the schedules
exactly as the device loop's ``_on_step`` would step by step, and copies the values every step of the block
reads (ε and the IQR bonus per step, the target update flags, PER β, the first step number) into one
device tensor (one host-to-device copy from pinned memory, no sync); the learning rate is written in
place into the capturable optimizer's tensor. After the replay: callbacks, episode statistics flushes,
diagnostics lines and log dumps, at the block's end.

Keys and captures: which of the ``g`` gradient steps are vaccine steps depends on the step count (a host
decision), so each pattern is its own graph: at most ``vaccine_interval`` of them (one when ``g`` is a
multiple of it, or with ``vaccine_interval=0``). Each key runs ``WARMUP_BLOCKS`` blocks eagerly (on a side
stream), then is captured once and replayed from then on: no recapture after that (tested). The model's
generator (action selection, quantile fractions) and the env's generators are registered with every graph
(``CUDAGraph.register_generator_state``), so each replay draws fresh numbers from the same streams the
eager block would; torch's default generator (the acting fractions, the vaccine batch) is graph-safe
itself. A new env, buffer, policy or optimizer (``set_env``, ``load_replay_buffer``, ``load``), or another
``train_freq``, ``gradient_steps`` or ``batch_size``, starts a new :class:`FusedBlock` (new captures; each
graph keeps a memory pool of its own). :func:`configure` with ``eager=True`` runs the blocks without
capturing them, on any device: the CPU tests compare that with the device loop, the GPU tests with the
replays.

Which configurations qualify (:func:`unsupported_reason` says why one does not; then the device loop runs
that rollout as before):

* a CUDA device with ``cuda_graph=True`` and ``graph_collect`` not False: capture needs CUDA, and the
  gradient steps inside the graph need the capturable optimizer that ``cuda_graph=True`` sets up;
* the device loop runs at all (:func:`sb3_her_ext.device_loop.supports`: a device vector env, the
  prioritized hindsight buffer, ``train_freq`` in steps, no action noise), for the learn loop's rollout
  (of the model's own ``train_freq``: its gradient steps follow it);
* the env offers the static face ``step_tensors_static`` / ``pin_static_state`` / ``set_current_obs`` /
  ``graph_generators`` (``foxhunt.device_env.DeviceLOBVecEnv`` does): a graph must read and write its
  state in place, cannot replay the env's own graph inside it, and a replay runs no Python (so the env is
  told where its current observations are);
* the whole block acts with the policy: ``num_timesteps >= learning_starts`` at its start (the random
  warm-up is a host decision per step; those rollouts run through the device loop);
* the policy's observation normalizer, if it has one, is fitted (a fit reads the replay rows on the host);
* ``callback_stride`` (:func:`sb3_her_ext.device_loop.configure`) is a multiple of ``train_freq``:
  callbacks can only run between replays, so a stride that ends inside a block cannot be honoured (the
  default stride 1 qualifies with ``train_freq=1``);
* no capture of this model has failed: a failed capture warns once (naming the reason) and the model
  keeps the device loop.

Differences from the device loop, all at block granularity: a callback's ``on_step`` and its stop take
effect after the block (its transitions are stored and its gradient steps done, where the device loop stores
nothing of the step a callback stopped at and skips the training); diagnostics lines, episode flushes
and log dumps due inside a block are written at its end (the line then already counts the block's gradient
steps). On a GPU the IQR bonus multiplies the IQRs before the selection kernel (see
:func:`~sb3_her_ext.exploration.select_actions`) and PER weights are recomputed from the sampled leaves with
β as a tensor (:meth:`~sb3_her_ext.replay.PrioritizedHindsightReplayBuffer.sample_with_beta`): each may
differ from the device loop's in the last bit there; on the CPU both are the same numbers.

Throughput: benchmarks/RESULTS.md ("BranchingIQN one graph" rows of ``benchmarks/train_throughput.py``).
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq

from cuda_ext.graph_capture import capture
from sb3_her_ext import device_loop
from sb3_her_ext.device_env import DeviceStep
from sb3_her_ext.exploration import branch_epsilons
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

__all__ = ["FusedBlock", "block_of", "collect_and_train", "configure", "reset", "unsupported_reason"]

#: what an env needs for the fused graph, besides the device vector env protocol
STATIC_FACE = ("step_tensors_static", "pin_static_state", "set_current_obs", "graph_generators")


class CaptureError(RuntimeError):
    """The fused block could not be captured (the message names the reason)."""


@dataclass
class _Settings:
    eager: bool = False


_SETTINGS: weakref.WeakKeyDictionary[Any, _Settings] = weakref.WeakKeyDictionary()
_BLOCKS: weakref.WeakKeyDictionary[Any, FusedBlock] = weakref.WeakKeyDictionary()
#: reasons of failed captures, per model: the fused path is not tried again
_FAILED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
#: the warnings given per model (each once)
_WARNED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _warn_once(model: Any, message: str) -> None:
    """A RuntimeWarning, once per model and message."""
    seen = _WARNED.setdefault(model, set())
    if message not in seen:
        seen.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def configure(model: Any, eager: bool = False) -> None:
    """Settings of the fused path of ``model`` (they last as long as the model object; not saved).

    :param model: a ``BranchingIQN``.
    :param eager: run the fused block without capturing it, on any device (the CPU included): the function
        a graph would capture, for tests and as the reference of graph replays.
    """
    if not isinstance(eager, bool):
        raise ValueError(f"eager={eager!r} must be a bool")
    _SETTINGS[model] = _Settings(eager=eager)
    _BLOCKS.pop(model, None)


def block_of(model: Any) -> FusedBlock | None:
    """The model's current fused block (its graphs and counters), or None before the first.

    :param model: a ``BranchingIQN``.
    :return: the block.
    """
    return _BLOCKS.get(model)


def reset(model: Any) -> None:
    """Drop the model's fused block and its graphs (the next qualifying rollout starts a new one). Call it
    after replacing state tensors a graph holds in a way :class:`FusedBlock` cannot see, e.g. loading an
    optimizer state dict into the model in place.

    :param model: a ``BranchingIQN``.
    """
    _BLOCKS.pop(model, None)


def _parts(model: Any, env: Any, state: Any) -> tuple[Any, ...]:
    """The objects and state tensors a captured block reads and writes (compared by identity)."""
    buffer, diagnostics, guard = model.replay_buffer, model.diagnostics, getattr(model, "guard", None)
    return (
        env, buffer, buffer.storage, buffer.hindsight_state, model.policy, model.policy.optimizer,
        state.stats, state.action_counts, diagnostics._train_sums, diagnostics._train_counts,
        diagnostics._select_count, *diagnostics._select_sums.values(), guard,
        *((guard.first, guard.steps) if guard is not None else ()),
    )


def _gradient_steps(model: Any, steps: int, n_envs: int) -> int:
    """Gradient steps after a rollout of ``steps`` vector steps (SB3's ``learn``: -1, one per env step)."""
    return model.gradient_steps if model.gradient_steps >= 0 else steps * n_envs


#: Why a rollout is not fused while the observation normalizer waits for replay rows (learning_starts < 2):
#: a passing state, like the random warm-up, so graph_collect=True does not warn about it.
NORMALIZER_PENDING = "the observation normalizer is not fitted yet (fewer than 2 replay rows)"


def unsupported_reason(model: Any, env: Any, train_freq: TrainFreq, learning_starts: int) -> str | None:
    """Why the fused path cannot run this rollout (see the module docstring), or None when it can.

    :param model: the algorithm (the device loop already supports it and ``env``).
    :param env: its device vector env.
    :param train_freq: the rollout length, in steps.
    :param learning_starts: env steps of random actions.
    :return: the reason, or None.
    """
    settings = _SETTINGS.get(model) or _Settings()
    if getattr(model, "graph_collect", None) is False:
        return "graph_collect=False"
    if not settings.eager:
        if model.device.type != "cuda":
            return f"device={model.device}: CUDA graphs need a CUDA device"
        if not model.cuda_graph:
            return "cuda_graph=False"
    if model in _FAILED:
        return _FAILED[model]
    missing = [name for name in STATIC_FACE if not callable(getattr(env, name, None))]
    if missing:
        return f"the env has no {missing} (the static face a graph needs)"
    if not isinstance(model.replay_buffer, PrioritizedHindsightReplayBuffer):
        return f"replay buffer {type(model.replay_buffer).__name__} (needs PrioritizedHindsightReplayBuffer)"
    if train_freq.frequency != model.train_freq.frequency:
        return (f"a rollout of {train_freq.frequency} steps is not the learn loop's (train_freq="
                f"{model.train_freq.frequency}): its gradient steps would not follow it")
    if model.num_timesteps < learning_starts:
        return f"num_timesteps={model.num_timesteps} < learning_starts={learning_starts} (random actions)"
    stride = device_loop.settings_of(model).callback_stride
    if stride % train_freq.frequency:
        return f"callback_stride={stride} is not a multiple of train_freq={train_freq.frequency}"
    if model.policy.observation_normalizer_pending:  # fitted by train() on the host, before any graph
        return NORMALIZER_PENDING
    return None


class FusedBlock:
    """The fused block of one model on one env: its static tensors, its graphs (one per key) and counters.

    :param model: a ``BranchingIQN``.
    :param env: the device vector env with the static face.
    :param state: the device loop's state of the model (episode statistics, action counts).
    :param steps: vector steps per block (``train_freq``).
    :param capture: capture CUDA graphs (else every block runs eagerly).
    """

    #: eager blocks of each key before its capture (optimizer state, library workspaces, compiles)
    WARMUP_BLOCKS = 2

    def __init__(self, model: Any, env: Any, state: Any, steps: int, capture: bool) -> None:
        device = th.device(env.device)
        self.env = env
        self.state = state
        self.steps = int(steps)
        self.capture = capture
        self.gradient_steps = _gradient_steps(model, self.steps, env.num_envs)
        self.batch_size = int(model.batch_size)
        #: the objects the graphs hold on to: a new one of any of them needs a new block
        self.parts = _parts(model, env, state)
        # the schedule: per step ε, IQR bonus and target update flag, then β and the first step's number
        self.schedule = th.zeros(3 * self.steps + 2, dtype=th.float64, device=device)
        #: the observations a block starts from and ends with (the graph reads and writes them; the env's
        #: current observations between blocks)
        self.obs = env.current_obs().clone()
        self.branch_values = th.arange(state.action_counts.shape[1], device=device)
        interval = max(model.target_update_interval // model.n_envs, 1)
        #: target updates a block can hold at most (due calls in ``steps`` consecutive ones)
        self.max_target_updates = math.ceil(self.steps / interval)
        self.generators = [model._generator, *env.graph_generators()]
        self.graphs: dict[tuple[bool, ...], th.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[bool, ...], tuple[th.Tensor, DeviceStep]] = {}
        #: the buffer's tree flag and last weights a block leaves (set by its Python, which a replay skips)
        self.left_by_block: dict[tuple[bool, ...], tuple[bool, th.Tensor]] = {}
        self.warmup_left: dict[tuple[bool, ...], int] = {}
        #: graphs captured, graph replays and eager blocks so far
        self.captures = 0
        self.replays = 0
        self.eager_blocks = 0

    def matches(self, model: Any, env: Any, state: Any, steps: int) -> bool:
        """Whether this block still fits the model (same objects, same sizes)."""
        parts = _parts(model, env, state)
        return (len(parts) == len(self.parts) and all(a is b for a, b in zip(parts, self.parts, strict=True))
                and steps == self.steps
                and _gradient_steps(model, steps, env.num_envs) == self.gradient_steps
                and int(model.batch_size) == self.batch_size)

    # ------------------------------------------------------------------ the captured function

    def block(self, model: Any, key: tuple[bool, ...]) -> tuple[th.Tensor, DeviceStep]:
        """``steps`` vector steps then ``len(key)`` gradient steps (``key``: which are vaccine steps), reading
        every host-decided value from :attr:`schedule` (the function a graph captures; no host sync).

        :param model: the ``BranchingIQN``.
        :param key: per gradient step, whether it is a vaccine step.
        :return: the last vector step's actions and step (a callback's locals).
        """
        env, state, k = self.env, self.state, self.steps
        schedule, buffer = self.schedule, model.replay_buffer
        guard = getattr(model, "guard", None)
        first_step = schedule[3 * k + 1].to(th.int64)
        rates = schedule[: 2 * k].float()  # ε and the IQR bonus of every step, cast once
        branch_rates = branch_epsilons(rates[:k, None], model._mults)  # [k, NB]: every step's, made once
        # the NaN guard's step number after each vector step, made once
        numbers = first_step + th.arange(1, k + 1, device=first_step.device) * env.num_envs
        obs = self.obs
        actions: th.Tensor | None = None
        step: DeviceStep | None = None
        taken: list[tuple[th.Tensor, ...]] = []  # per step: done, return, length, actions (recorded below)
        model.policy.set_training_mode(False)
        for i in range(k):
            # 1. act; 2. env step; 3. NaN guard, replay push (the device loop's order; the statistics after)
            actions = device_loop.explore(model, obs, iqr_bonus=rates[k + i], branch_rates=branch_rates[i])
            step = env.step_tensors_static(actions)
            taken.append((step.done, step.episode_return, step.episode_length, actions))
            final_obs, reward = step.final_obs, step.reward
            if guard is not None:
                (obs, final_obs), reward = guard.check_env_tensors(numbers[i], (obs, final_obs), reward)
            buffer.add(obs, final_obs, actions, reward, step.done, step.infos)
            obs = step.obs
        # the block's episode statistics and action counts in one go: the same as step by step
        device_loop.record_steps(state, *(th.stack(column) for column in zip(*taken, strict=True)),
                                 self.branch_values)
        self.obs.copy_(obs)
        self._target_updates(model, schedule[2 * k : 3 * k].sum())
        if key:
            model.policy.set_training_mode(True)
            beta = schedule[3 * k]
            for vaccine in key:
                model.learner.train_step_in_graph(buffer, self.batch_size, vaccine, beta)
        assert actions is not None and step is not None
        return actions, step

    def _target_updates(self, model: Any, count: th.Tensor) -> None:
        """``count`` (a device number) Polyak updates of the target network, as ``polyak_update`` makes them
        (``target·(1 − τ) + τ·online``); each of the :attr:`max_target_updates` slots masked by ``count``."""
        params = [p.data for p in model.q_net.parameters()]
        targets = [p.data for p in model.q_net_target.parameters()]
        tau = model.tau
        with th.no_grad():
            for j in range(self.max_target_updates):
                due = (count > j).to(targets[0].dtype)
                updated = th._foreach_mul(targets, 1 - tau)
                th._foreach_add_(updated, params, alpha=tau)
                # target·(1 − due) + updated·due: exactly one of the two where due is 0 or 1
                th._foreach_mul_(updated, due)
                th._foreach_mul_(targets, 1 - due)
                th._foreach_add_(targets, updated)

    # ------------------------------------------------------------------ host side

    def prepare(self, model: Any) -> tuple[bool, ...]:
        """Advance the host bookkeeping over the block as the device loop would step by step, and copy the
        values the block reads into :attr:`schedule`.

        :return: the block's key (per gradient step: a vaccine step).
        """
        k, n = self.steps, self.env.num_envs
        values = [0.0] * (3 * k + 2)
        values[3 * k + 1] = float(model.num_timesteps)
        for i in range(k):
            values[i], values[k + i] = float(model.exploration_rate), float(model.iqr_bonus)
            model.num_timesteps += n
            model._update_current_progress_remaining(model.num_timesteps, model._total_timesteps)
            model._n_calls += 1
            values[2 * k + i] = 1.0 if model._target_update_due() else 0.0
            model._update_schedules()
        values[3 * k] = float(model.replay_buffer.beta)
        if self.schedule.is_cuda:  # pinned: an asynchronous copy (the host allocator keeps it until done)
            self.schedule.copy_(th.tensor(values, dtype=th.float64).pin_memory(), non_blocking=True)
        else:
            self.schedule.copy_(th.tensor(values, dtype=th.float64))
        learner = model.learner
        first = model._n_gradient_steps
        buffer = model.replay_buffer
        key = tuple(learner.vaccine_due(first + j + 1, buffer) for j in range(self.gradient_steps))
        if key:
            model.policy.set_training_mode(True)
            model._update_learning_rate(model.policy.optimizer)
        return key

    def run(self, model: Any, key: tuple[bool, ...]) -> tuple[th.Tensor, DeviceStep]:
        """One block: a replay of ``key``'s graph, or an eager block (warm-up, or no capture), or the
        capture (then its first replay).

        :raises CaptureError: the capture failed (nothing of the block ran; the env's state is rolled back).
        """
        env, buffer = self.env, model.replay_buffer
        env.pin_static_state()
        current = env.current_obs()
        if current is not self.obs:  # another path stepped or reset the env since
            self.obs.copy_(current)
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            # what the block's Python left at capture (a replay runs none): the buffer's tree flag, the last
            # batch's weights
            buffer._tree_stale, buffer.last_weights = self.left_by_block[key]
            outputs = self.outputs[key]
        elif not self.capture:
            outputs = self.block(model, key)
            self.eager_blocks += 1
        elif self.warmup_left.setdefault(key, self.WARMUP_BLOCKS) > 0 or th.cuda.get_sync_debug_mode():
            # warm-up; or a sync debug mode is on (a capture begins with a device sync): eager until it is off
            self.warmup_left[key] = max(self.warmup_left[key] - 1, 0)
            side = th.cuda.Stream()
            side.wait_stream(th.cuda.current_stream())
            with th.cuda.stream(side):
                outputs = self.block(model, key)
            th.cuda.current_stream().wait_stream(side)
            self.eager_blocks += 1
        else:
            outputs = self._capture(model, key)
        env.set_current_obs(self.obs, outputs[1].infos)  # the block copied the last step's there
        return outputs

    def _capture(self, model: Any, key: tuple[bool, ...]) -> tuple[th.Tensor, DeviceStep]:
        """Capture ``key``'s block, then replay it once (the block's real run)."""
        buffer = model.replay_buffer
        left = buffer._tree_stale, buffer.last_weights
        stream = th.cuda.current_stream()
        graph = th.cuda.CUDAGraph()
        try:
            for generator in self.generators:
                graph.register_generator_state(generator)
            with capture(graph):
                outputs = self.block(model, key)
        except Exception as error:  # anything a capture refuses: nothing of the block ran
            th.cuda.set_stream(stream)  # a capture that failed to end leaves its own stream current
            self.env.pin_static_state(rollback=True)
            buffer._tree_stale, buffer.last_weights = left
            try:
                _end_generator_captures(self.generators)
            except Exception as cleanup:  # named in the error: eager draws may fail after this
                raise CaptureError(f"{type(error).__name__}: {error}; then the generators could not leave "
                                   f"capture mode ({type(cleanup).__name__}: {cleanup})") from error
            raise CaptureError(f"{type(error).__name__}: {error}") from error
        self.graphs[key], self.outputs[key] = graph, outputs
        self.left_by_block[key] = (buffer._tree_stale, buffer.last_weights)
        self.captures += 1
        graph.replay()
        self.replays += 1
        return outputs


def _end_generator_captures(generators: list[th.Generator]) -> None:
    """Take ``generators`` out of graph-capture mode after a capture that failed before its end.

    A capture registers each generator (its state starts counting offsets for the graph); a capture that
    raises never reaches the epilogue that stops this, and the next eager draw then fails with "Offset
    increment outside graph capture". An empty capture with the same generators runs prologue and epilogue.
    """
    graph = th.cuda.CUDAGraph()
    for generator in generators:
        graph.register_generator_state(generator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the CUDA graph is empty"
        with capture(graph):
            pass


@dataclass
class _HostCounters:
    """What :meth:`FusedBlock.prepare` advances, to put back when a capture fails."""

    num_timesteps: int
    n_calls: int
    progress: float
    exploration_rate: float
    iqr_bonus: float
    beta: float

    @classmethod
    def of(cls, model: Any) -> _HostCounters:
        return cls(model.num_timesteps, model._n_calls, model._current_progress_remaining,
                   model.exploration_rate, model.iqr_bonus, model.replay_buffer.beta)

    def restore(self, model: Any) -> None:
        model.num_timesteps, model._n_calls = self.num_timesteps, self.n_calls
        model._current_progress_remaining = self.progress
        model.exploration_rate, model.iqr_bonus = self.exploration_rate, self.iqr_bonus
        model.replay_buffer.beta = self.beta


def collect_and_train(
    model: Any,
    env: Any,
    callback: BaseCallback,
    train_freq: TrainFreq,
    replay_buffer: Any,
    learning_starts: int = 0,
    log_interval: int | None = None,
) -> RolloutReturn | None:
    """One rollout of ``train_freq`` vector steps and its gradient steps as one fused block, when the
    configuration qualifies (:func:`unsupported_reason`); the host bookkeeping of
    :func:`sb3_her_ext.device_loop.collect_rollouts` and ``train`` around it.

    :param model: a ``BranchingIQN``.
    :param env: its device vector env.
    :param callback: SB3's callback (``on_step`` at block ends, every ``callback_stride`` vector steps).
    :param train_freq: the rollout length, in steps.
    :param replay_buffer: the model's buffer.
    :param learning_starts: env steps of uniform random actions.
    :param log_interval: episodes between ``dump_logs``.
    :return: SB3's ``RolloutReturn``, or None: not fused (the caller runs the device loop).
    """
    reason = unsupported_reason(model, env, train_freq, learning_starts)
    if reason is not None:
        if (getattr(model, "graph_collect", None) is True and model.num_timesteps >= learning_starts
                and reason != NORMALIZER_PENDING):
            _warn_once(model, f"graph_collect=True, but this rollout runs through the device loop: {reason}")
        return None
    device = th.device(env.device)
    state = device_loop.loop_state(model, device)
    steps = train_freq.frequency
    block = _BLOCKS.get(model)
    if block is None or not block.matches(model, env, state, steps):
        settings = _SETTINGS.get(model) or _Settings()
        block = _BLOCKS[model] = FusedBlock(model, env, state, steps, capture=not settings.eager)
    # as SB3's loop: before the rollout's first step (a checkpoint written here holds the state before it; a
    # capture that fails below hands the rollout to the device loop, which calls it again)
    callback.on_rollout_start()
    saved = _HostCounters.of(model)
    key = block.prepare(model)
    try:
        actions, step = block.run(model, key)
    except CaptureError as error:
        saved.restore(model)
        reason = f"capture failed ({error})"
        _FAILED[model] = reason
        _warn_once(model, f"the fused collect + train CUDA graph is off for this model: {reason}; the device "
                   "loop runs instead")
        return None
    # the gradient steps ran with the block: train()'s bookkeeping here, and train() skips them
    gradient_steps = len(key)
    model._n_gradient_steps += gradient_steps
    model._n_updates += gradient_steps
    if gradient_steps:
        model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    return _after_block(model, env, callback, train_freq, replay_buffer, learning_starts, log_interval,
                        state, actions, step, gradient_steps)


def _after_block(model: Any, env: Any, callback: BaseCallback, train_freq: TrainFreq, replay_buffer: Any,
                 learning_starts: int, log_interval: int | None, state: Any, actions: th.Tensor,
                 step: DeviceStep, gradient_steps: int) -> RolloutReturn:
    """The device loop's host work of the block's last step: callbacks, flushes, diagnostics, logs."""
    steps, n_envs = train_freq.frequency, env.num_envs
    stride = state.settings.callback_stride
    stats_interval = state.settings.stats_interval or model.diagnostics_interval
    state.vector_steps += steps
    state.steps_since_callback += steps
    collected = steps * n_envs
    episodes_total = 0
    if state.vector_steps % stride == 0:
        device_loop.advance_bars(callback, (state.steps_since_callback - 1) * n_envs)
        state.steps_since_callback = 0
        callback.update_locals({
            "self": model, "env": env, "callback": callback, "train_freq": train_freq,
            "replay_buffer": replay_buffer, "learning_starts": learning_starts, "log_interval": log_interval,
            "actions": actions, "buffer_actions": actions, "new_obs": step.obs, "rewards": step.reward,
            "dones": step.done, "infos": step.infos, "num_collected_steps": steps,
            "num_collected_episodes": 0,
        })
        if not callback.on_step():  # the block is stored and trained already (module docstring)
            episodes, dump = device_loop.flush(model, state, log_interval)
            if dump:
                model.dump_logs()
            callback.on_rollout_end()
            return RolloutReturn(collected, episodes, continue_training=False)
    diagnostics_due = model.num_timesteps - model._last_diagnostics_step >= model.diagnostics_interval
    dump = False
    if diagnostics_due or model.num_timesteps - state.last_stats_step >= stats_interval:
        episodes, dump = device_loop.flush(model, state, log_interval)
        episodes_total += episodes
    if diagnostics_due:
        model.log_diagnostics()
    if dump:
        model.dump_logs()
    if model.num_timesteps >= model._total_timesteps:
        episodes, dump = device_loop.flush(model, state, log_interval)
        episodes_total += episodes
        device_loop.advance_bars(callback, state.steps_since_callback * n_envs)
        state.steps_since_callback = 0
        if dump:
            model.dump_logs()
    callback.on_rollout_end()
    model._graph_trained = gradient_steps > 0
    return RolloutReturn(collected, episodes_total, continue_training=True)
