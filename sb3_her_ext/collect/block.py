"""The training block: ``k`` vector steps then ``g`` gradient steps over explicit device state (issue 37).

:class:`TrainBlock` holds, as tensors on the device, everything a block reads and advances:

* ``counters``: ``[2]`` int64, the env steps (SB3's ``num_timesteps``) and SB3's ``_on_step`` calls;
* ``total``: the ``learn``'s total env steps (float64; SB3's progress is ``1 - num_timesteps / total``);
* ``carried``: ``[2]`` float64, ε and the IQR bonus the last ``_on_step`` set (what the next step acts with;
  a new ``learn`` starts from the values the last one left, as SB3's loop does);
* the episode statistics and action counts (:class:`~sb3_her_ext.collect.episodes.EpisodeStats`), the NaN
  guard's flags (``guard.first``, ``guard.steps``), the observations a block starts from;
* the random state: the warm-up generator of the random actions; with the algorithm's, the buffer's and the
  env's generators it is registered with every graph, so a replay draws from the same streams an eager block
  would (torch generators rather than key tensors: SB3's loop draws from them in this order, which keeps the
  block bit-equal to it on the CPU).

A block computes its schedules FROM ``counters`` on the device: the env step after each of its vector steps
``t_j = t_0 + j·N``, the progress ``p_j = 1 - t_j / total``, and from it ε (SB3's ``LinearSchedule``), the IQR
bonus and PER β (:func:`~sb3_her_ext.exploration.linear_anneal`: the same formula with fraction 1 and the
progress clamped at 1), each in float64, one IEEE operation per kernel in Python's order (no fused
multiply-add can form across kernels; divisions by device tensors, not by reciprocals), so the values are
SB3's host values bit for bit (tested over many counters and totals, and over whole runs); the target
network's Polyak updates are due at the calls ``c_0 + 1 .. c_0 + k`` divisible by
``target_update_interval // N``. Nothing is copied from the host per block: the host only adds the block's
steps to its own counters (``num_timesteps``, ``_n_calls``) and puts its ε, bonus and β to the values at the
block's end (one schedule call each, the same formulas), for callbacks, logs and ``save``;
:meth:`TrainBlock.load` writes the host counters to the device at the start of each ``learn`` (the only
host-to-device copy of state).

:meth:`TrainBlock.block` is the function: for each of ``k`` vector steps act (uniform random actions from the
warm-up generator in a *random* block, else the algorithm's ``explore`` with ε and the bonus of that step),
env step, NaN guard check, replay push with hindsight; then the steps' episode statistics and action counts;
then the due target updates (the online network does not change while collecting: the same arithmetic as
after each step); then ``g`` gradient steps (PER β of the block's last step). ``random`` and which gradient
steps are vaccine steps are the block's *key*: a random block must not draw from the algorithm's generator
(SB3's loop acts randomly with numpy there, so its exploration stream starts untouched at
``learning_starts``), and a vaccine step has other kernels. A key is ``(k, random, vaccine pattern)``.

:meth:`TrainBlock.run` runs a block: eagerly (the CPU, tests, ``graph_collect=False``, an env without the
static face), or on CUDA with ``cuda_graph=True`` captured once per key after ``WARMUP_BLOCKS`` eager runs
and replayed from then on (no recapture). A capture that fails warns once and leaves the block eager for
good (it changed no state: nothing runs during a capture). The learn loop around it is
:meth:`sb3_her_ext.collect.DeviceCollector.learn`.

On a GPU the IQR bonus multiplies the IQRs before the selection kernel and PER weights are recomputed from
the sampled leaves with β as a tensor: each may differ from SB3's host-number path in the last bit there
(the kernel may fuse a multiply-add); on the CPU both are the same numbers.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.utils import LinearSchedule

from cuda_ext.graph_capture import capture, side_stream
from sb3_her_ext.collect.episodes import EpisodeStats, random_actions, record_steps
from sb3_her_ext.device_vec_env import DeviceStep

#: what an env needs for a captured block, besides the device vector env protocol
STATIC_FACE = ("step_tensors_static", "pin_static_state", "set_current_obs", "graph_generators")
#: A block's key: ``(vector steps, random actions, per gradient step whether it is a vaccine step)``.
BlockKey = tuple[int, bool, tuple[bool, ...]]


class CaptureError(RuntimeError):
    """A block could not be captured (the message names the reason)."""


def has_static_face(env: Any) -> bool:
    """Whether ``env`` can run inside a captured block (:data:`STATIC_FACE`)."""
    return all(callable(getattr(env, name, None)) for name in STATIC_FACE)


def schedule_ranges(algorithm: Any) -> tuple[tuple[float, float, float], ...]:
    """``(start, end, fraction)`` of ε (the algorithm's ``exploration_schedule``, a ``LinearSchedule``), the
    IQR bonus and PER β (fraction 1): the constants of a block's schedules.

    :raises ValueError: ``exploration_schedule`` is not a ``LinearSchedule`` (a block cannot compute it).
    """
    schedule = algorithm.exploration_schedule
    if not isinstance(schedule, LinearSchedule):
        raise ValueError(f"exploration_schedule={schedule!r}: a training block computes only SB3's "
                         "LinearSchedule on the device")
    return ((float(schedule.start), float(schedule.end), float(schedule.end_fraction)),
            (*map(float, algorithm.iqr_bonus_range), 1.0), (*map(float, algorithm.per_beta_range), 1.0))


def _parts(algorithm: Any, env: Any) -> tuple[Any, ...]:
    """The objects a block reads and writes (compared by identity: a new one needs a new block)."""
    buffer, guard = algorithm.replay_buffer, algorithm.guard
    return (
        env, buffer, buffer.storage, buffer.hindsight_state, getattr(buffer, "generator", None),
        algorithm.policy, algorithm.policy.optimizer, *algorithm.diagnostics.device_tensors(), guard,
        *((guard.first, guard.steps) if guard is not None else ()),
    )


class TrainBlock:
    """The training block of one algorithm on one device env: its device state, its graphs (one per key).

    :param algorithm: the algorithm (a ``BranchingIQN``: :class:`~sb3_her_ext.collect.CollectingAlgorithm`).
    :param env: the device vector env.
    :param window: episodes the statistics keep (SB3's ``stats_window_size``).
    :param capture: capture CUDA graphs (else every block runs eagerly); needs CUDA and the static face.
    """

    #: eager blocks of each key before its capture (optimizer state, library workspaces, compiles)
    WARMUP_BLOCKS = 2

    def __init__(self, algorithm: Any, env: Any, window: int, capture: bool) -> None:
        device = th.device(env.device)
        self.device, self.env, self.n_envs = device, env, int(env.num_envs)
        self.static = has_static_face(env)
        self.capture = bool(capture) and self.static and device.type == "cuda"
        self.batch_size = int(algorithm.batch_size)
        self.parts = _parts(algorithm, env)
        # ------------------------------------------------------------ the state
        self.counters = th.zeros(2, dtype=th.int64, device=device)
        self.total = th.ones((), dtype=th.float64, device=device)
        self.carried = th.zeros(2, dtype=th.float64, device=device)
        dims = list(algorithm.action_dims)
        self.stats = EpisodeStats(window, device)
        self.action_counts = th.zeros(len(dims), max(dims), dtype=th.int64, device=device)
        self.n_actions = th.tensor(dims, dtype=th.int64, device=device)
        self.branch_values = th.arange(max(dims), device=device)
        self.obs = env.current_obs().clone()
        self.warmup_generator = th.Generator(device=device)
        seed = algorithm.seed if algorithm.seed is not None else int(np.random.randint(2**31))
        self.warmup_generator.manual_seed(int(seed) + 1)  # a stream of its own: not the exploration's
        # ------------------------------------------------------------ the schedules' constants
        self.ranges = ranges = schedule_ranges(algorithm)
        start = [float(r[0]) for r in ranges]
        span = [float(r[1]) - float(r[0]) for r in ranges]  # (end - start) as Python computes it
        # past the fraction: LinearSchedule (ε) gives its end; linear_anneal (fraction 1) clamps the progress
        # at 1, i.e. gives start + 1.0 * span (the same float64 sum here)
        end = [float(ranges[0][1]), start[1] + span[1], start[2] + span[2]]
        column = {"dtype": th.float64, "device": device}
        self.start, self.span = th.tensor(start, **column)[:, None], th.tensor(span, **column)[:, None]
        self.end = th.tensor(end, **column)[:, None]
        self.fraction = th.tensor([float(r[2]) for r in ranges], **column)[:, None]
        self.one = th.ones((), **column)
        self.interval = max(algorithm.target_update_interval // self.n_envs, 1)
        self.tau = float(algorithm.tau)
        self._offsets: dict[int, th.Tensor] = {}
        self._rates: dict[int, th.Tensor] = {}  # per k: the [2, k] float32 rates a block acts with
        self._advance: dict[int, th.Tensor] = {}  # per k: [k·N, k]
        for k in range(algorithm.train_freq.frequency + 1):  # every block a rollout makes (0 .. train_freq)
            self._constants(k)
        # ------------------------------------------------------------ graphs
        buffer_generator = getattr(algorithm.replay_buffer, "generator", None)
        self.generators = [algorithm.generator, *([buffer_generator] if buffer_generator is not None else []),
                           self.warmup_generator, *(env.graph_generators() if self.static else [])]
        self.graphs: dict[BlockKey, th.cuda.CUDAGraph] = {}
        self.outputs: dict[BlockKey, tuple[th.Tensor | None, DeviceStep | None]] = {}
        self.left_by_block: dict[BlockKey, tuple[bool, th.Tensor]] = {}
        self.warmup_left: dict[BlockKey, int] = {}
        #: why capturing is off for good (a capture failed), or None
        self.failed: str | None = None
        #: graphs captured, graph replays and eager blocks so far
        self.captures = self.replays = self.eager_blocks = 0

    def matches(self, algorithm: Any, env: Any, window: int, capture: bool) -> bool:
        """Whether this block still fits (same objects, sizes and settings)."""
        parts = _parts(algorithm, env)
        return (len(parts) == len(self.parts) and all(a is b for a, b in zip(parts, self.parts, strict=True))
                and int(algorithm.batch_size) == self.batch_size and window == self.stats.window
                and (bool(capture) and self.static and self.device.type == "cuda") == self.capture
                and max(algorithm.target_update_interval // self.n_envs, 1) == self.interval
                and schedule_ranges(algorithm) == self.ranges
                and float(algorithm.tau) == self.tau)

    def load(self, algorithm: Any) -> None:
        """Write the host counters and carried schedule values to the device state (start of a ``learn``)."""
        values = th.tensor([algorithm.num_timesteps, algorithm._n_calls], dtype=th.int64)
        self.counters.copy_(values)
        self.total.fill_(float(algorithm._total_timesteps))
        self.carried.copy_(th.tensor([float(algorithm.exploration_rate), float(algorithm.iqr_bonus)],
                                     dtype=th.float64))

    # ------------------------------------------------------------------ the function a graph captures

    def schedules(self, k: int, acting: bool = True) -> tuple[th.Tensor, th.Tensor | None, th.Tensor,
                                                             th.Tensor | None]:
        """From the counters: the env step after each vector step, the ``[2, k]`` float32 ε and IQR bonus each
        step acts with (None unless ``acting``), PER β after the ``k`` steps (0-dim float64) and the count of
        due target updates (None for ``k = 0``); then the counters and the carried values advanced past the
        ``k`` steps. No host sync; about one kernel per line. The count comes as ``[count, 1 - count]``
        (int64; the second meaningful where ``k <= interval``, i.e. the count is 0 or 1).
        """
        if k not in self._offsets:
            self._constants(k)
        series = self.counters[:, None] + self._offsets[k]  # t_0 + j·N; c_0, c_0 + k, c_0 + interval
        # SB3: progress_remaining = 1.0 - float(num_timesteps) / float(total); (1 - progress_remaining)
        done = 1 - th.addcdiv(self.one, series[0, : k + 1], self.total, value=-1)
        # [3, k + 1]: start + (done · (end - start)) / fraction, rounded as Python does; past it, the end
        values = th.addcdiv(self.start, done * self.span, self.fraction)
        values = th.where(done > self.fraction, self.end, values)
        if not k:
            return series[0, 1:1], None, values[2, 0], None
        rates = None
        if acting:  # step 0 acts with the carried values, step j with those of the step before
            rates = th.cat([self.carried[:, None], values[:2, 1:k]], dim=1, out=self._rates[k])
        self.carried.copy_(values[:2, k])
        # the calls divisible by the interval I in (c_0, c_0 + k], floor((c_0 + k) / I) - floor(c_0 / I), and
        # 1 - that, floor((c_0 + I) / I) - floor((c_0 + k) / I): one subtraction
        floors = th.div(series[1, :3], self.interval, rounding_mode="floor")
        due = floors[1:] - floors[:2]
        self.counters.add_(self._advance[k])
        return series[0, 1 : k + 1], rates, values[2, k], due

    def _constants(self, k: int) -> None:
        """The constant tensors of blocks of ``k`` steps (host-to-device copies: made before any capture)."""
        width = max(k + 1, 3)
        steps = th.zeros(width, dtype=th.int64)  # env steps j·N, j = 0 .. k
        steps[: k + 1] = th.arange(k + 1) * self.n_envs
        calls = th.zeros(width, dtype=th.int64)  # calls 0, k, interval
        calls[:3] = th.tensor([0, k, self.interval])
        self._offsets[k] = th.stack([steps, calls]).to(self.device)
        self._advance[k] = th.tensor([k * self.n_envs, k], dtype=th.int64).to(self.device)
        self._rates[k] = th.empty(2, k, dtype=th.float32, device=self.device)

    def block(self, algorithm: Any, key: BlockKey) -> tuple[th.Tensor | None, DeviceStep | None]:
        """``k`` vector steps then the gradient steps of ``key`` (what a graph captures; no host sync).

        :param algorithm: the algorithm.
        :param key: ``(k, random, vaccine pattern)``.
        :return: the last vector step's actions and step (None, None when ``k`` is 0).
        """
        k, random, vaccines = key
        env, buffer, guard = self.env, algorithm.replay_buffer, algorithm.guard
        numbers, rates, beta, due = self.schedules(k, acting=not random)
        branch_rates = None if rates is None else algorithm.branch_rates(rates[0][:, None])  # [k, NB]
        obs = self.obs if self.static else env.current_obs()
        actions: th.Tensor | None = None
        step: DeviceStep | None = None
        taken: list[tuple[th.Tensor, ...]] = []  # per step: done, return, length, actions
        algorithm.policy.set_training_mode(False)
        for i in range(k):
            if random:
                actions = random_actions(self.n_actions, self.warmup_generator, self.n_envs)
            else:
                assert rates is not None and branch_rates is not None
                actions = algorithm.explore(obs, iqr_bonus=rates[1, i], branch_rates=branch_rates[i])
            step = env.step_tensors_static(actions) if self.static else env.step_tensors(actions)
            taken.append((step.done, step.episode_return, step.episode_length, actions))
            final_obs, reward = step.final_obs, step.reward
            if guard is not None:
                (obs, final_obs), reward = guard.check_env_tensors(numbers[i], (obs, final_obs), reward)
            buffer.add(obs, final_obs, actions, reward, step.done, step.infos)
            obs = step.obs
        if k:
            columns = (th.stack(column) for column in zip(*taken, strict=True))
            record_steps(self.stats, self.action_counts, *columns, self.branch_values)
            if self.static:
                self.obs.copy_(obs)
            assert due is not None
            self._target_updates(algorithm, due, math.ceil(k / self.interval))
        if vaccines:
            algorithm.policy.set_training_mode(True)
            for vaccine in vaccines:
                algorithm.learner.train_step_in_graph(buffer, self.batch_size, vaccine, beta)
        return actions, step

    def _target_updates(self, algorithm: Any, due: th.Tensor, slots: int) -> None:
        """``due[0]`` (a device number) Polyak updates of the target network as ``polyak_update`` makes them
        (``target·(1 − τ) + τ·online``); each of the ``slots`` masked by the count (``due``: ``[count,
        1 - count]``, from :meth:`schedules`)."""
        params = [p.data for p in algorithm.q_net.parameters()]
        targets = [p.data for p in algorithm.q_net_target.parameters()]
        tau = self.tau
        dtype = targets[0].dtype
        with th.no_grad():
            for j in range(slots):
                if slots == 1:  # the count is 0 or 1: the flag and 1 - flag as they are
                    flag, keep = due.to(dtype).unbind()
                else:
                    flag = (due[0] > j).to(dtype)
                    keep = 1 - flag
                if tau == 1.0:  # polyak_update: target·0 + online (alpha 1: the online value as it is)
                    th._foreach_mul_(targets, keep)
                    th._foreach_add_(targets, th._foreach_mul(params, flag))
                    continue
                updated = th._foreach_mul(targets, 1 - tau)
                th._foreach_add_(updated, params, alpha=tau)
                # target·(1 − flag) + updated·flag: exactly one of the two where flag is 0 or 1
                th._foreach_mul_(updated, flag)
                th._foreach_mul_(targets, keep)
                th._foreach_add_(targets, updated)

    # ------------------------------------------------------------------ running it

    def run(self, algorithm: Any, key: BlockKey) -> tuple[th.Tensor | None, DeviceStep | None]:
        """One block: a replay of ``key``'s graph, an eager block (warm-up, no capture), or the capture (then
        its first replay). A capture that fails warns once and runs the block eagerly (nothing of it ran)."""
        env, buffer = self.env, algorithm.replay_buffer
        if self.static:
            env.pin_static_state()
            current = env.current_obs()
            if current is not self.obs:  # another path stepped or reset the env since
                self.obs.copy_(current)
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            buffer.set_host_state(self.left_by_block[key])  # what the block's Python left at capture
            outputs = self.outputs[key]
        elif not self.capture or self.failed is not None:
            outputs = self.block(algorithm, key)
            self.eager_blocks += 1
        elif self.warmup_left.setdefault(key, self.WARMUP_BLOCKS) > 0 or th.cuda.get_sync_debug_mode():
            # warm-up; or a sync debug mode is on (a capture begins with a device sync): eager until it is off
            self.warmup_left[key] = max(self.warmup_left[key] - 1, 0)
            side = side_stream()
            side.wait_stream(th.cuda.current_stream())
            with th.cuda.stream(side):
                outputs = self.block(algorithm, key)
            th.cuda.current_stream().wait_stream(side)
            self.eager_blocks += 1
        else:
            try:
                outputs = self._capture(algorithm, key)
            except CaptureError as error:
                self.failed = f"capture failed ({error})"
                warnings.warn(f"the training block's CUDA graph is off for this model: {self.failed}; "
                              "its blocks run eagerly instead", RuntimeWarning, stacklevel=4)
                outputs = self.block(algorithm, key)
                self.eager_blocks += 1
        if self.static and outputs[1] is not None:
            env.set_current_obs(self.obs, outputs[1].infos)  # the block copied the last step's there
        return outputs

    def _capture(self, algorithm: Any, key: BlockKey) -> tuple[th.Tensor | None, DeviceStep | None]:
        """Capture ``key``'s block, then replay it once (the block's real run)."""
        buffer = algorithm.replay_buffer
        left = buffer.host_state()
        stream = th.cuda.current_stream()
        graph = th.cuda.CUDAGraph()
        try:
            for generator in self.generators:
                graph.register_generator_state(generator)
            with capture(graph):
                outputs = self.block(algorithm, key)
        except Exception as error:  # anything a capture refuses: nothing of the block ran
            th.cuda.set_stream(stream)  # a capture that failed to end leaves its own stream current
            if self.static:
                self.env.pin_static_state(rollback=True)
            buffer.set_host_state(left)
            try:
                _end_generator_captures(self.generators)
            except Exception as cleanup:  # named in the error: eager draws may fail after this
                raise CaptureError(f"{type(error).__name__}: {error}; then the generators could not leave "
                                   f"capture mode ({type(cleanup).__name__}: {cleanup})") from error
            raise CaptureError(f"{type(error).__name__}: {error}") from error
        self.graphs[key], self.outputs[key] = graph, outputs
        self.left_by_block[key] = buffer.host_state()
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
