"""The fused block: one rollout of ``train_freq`` vector steps AND its ``gradient_steps`` gradient steps as
ONE CUDA graph replay (issue 14). Which rollouts run so, and how callbacks and flushes then work: see
:mod:`sb3_her_ext.collect.collector`.

The device loop runs a vector step without a host sync, but as ~40 kernel launches, and each gradient step
as its own graph replay (:mod:`sb3_her_ext.graphed_step`); at a few books that launch latency is the whole
cost. Here ``k = train_freq`` vector steps + ``g`` gradient steps are :meth:`FusedBlock.block`, captured
once per *key* and replayed. What the block does, in the device loop's order (so, run eagerly, it gives the
device loop's results: same replay contents, same parameters; tested on the CPU): for each vector step, act
(the algorithm's ``explore`` with ε and the IQR bonus read from device tensors), env step (the env's
``step_tensors_static``), the NaN guard's check (its step number a device tensor), replay push with
hindsight; then the steps' episode statistics and action counts; then the target network's Polyak updates
due in those steps (masked by device flags: the online network does not change while collecting, so
applying them after the collection is the same arithmetic); then ``g`` gradient steps
(:meth:`~sb3_her_ext.learner.Learner.train_step_in_graph`: PER β read from a device tensor).

A *random block* (key :data:`RANDOM`) is a rollout before ``learning_starts``: the same vector steps with
uniform random actions drawn from the collector's warm-up generator, and no gradient step (SB3 trains only
past ``learning_starts``). The collector runs such rollouts so when asked (``fuse_random_rollouts``), which
turns the warm-up's eager vector steps into graph replays as well.

Before each replay :meth:`FusedBlock.prepare` advances the host counters and schedules exactly as the device
loop would step by step, and copies every value the block reads (ε and the IQR bonus per step, the target
update flags, PER β, the first step number) into one device tensor (one copy from pinned memory, no sync);
the learning rate is written in place into the capturable optimizer's tensor.

Keys and captures: which of the ``g`` gradient steps are vaccine steps is a host decision, so each pattern
is its own graph (at most ``vaccine_interval``). Each key runs ``WARMUP_BLOCKS`` blocks eagerly (on a side
stream), then is captured once and replayed from then on: no recapture (tested). The algorithm's, the
buffer's and the env's generators are registered with every graph, so each replay draws fresh numbers from
the same streams the eager block would (and none from a process-wide generator another model draws from).
A new env, buffer, policy or optimizer, or another ``train_freq``, ``gradient_steps`` or ``batch_size``,
needs a new block (:meth:`FusedBlock.matches`; each graph has a memory pool of its own).

On a GPU the IQR bonus multiplies the IQRs before the selection kernel and PER weights are recomputed from
the sampled leaves with β as a tensor: each may differ from the device loop's in the last bit there; on the
CPU both are the same numbers. Throughput: benchmarks/RESULTS.md ("BranchingIQN one graph" rows).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch as th

from cuda_ext.graph_capture import capture, side_stream
from sb3_her_ext.collect.episodes import EpisodeStats, random_actions, record_steps
from sb3_her_ext.collect.protocol import CollectingAlgorithm
from sb3_her_ext.device_env import DeviceStep

#: what an env needs for the fused graph, besides the device vector env protocol
STATIC_FACE = ("step_tensors_static", "pin_static_state", "set_current_obs", "graph_generators")
#: The key of a random block (a rollout of uniform random actions before ``learning_starts``, no gradient
#: step); the other keys say, per gradient step, whether it is a vaccine step.
RANDOM = None
#: A block's key: :data:`RANDOM`, or per gradient step whether it is a vaccine step.
BlockKey = tuple[bool, ...] | None


class CaptureError(RuntimeError):
    """The fused block could not be captured (the message names the reason)."""


def _parts(algorithm: CollectingAlgorithm, env: Any, stats: EpisodeStats, action_counts: th.Tensor) -> (
    tuple[Any, ...]
):
    """The objects and state tensors a captured block reads and writes (compared by identity)."""
    buffer, guard = algorithm.replay_buffer, algorithm.guard
    return (
        env, buffer, buffer.storage, buffer.hindsight_state, getattr(buffer, "generator", None),
        algorithm.policy, algorithm.policy.optimizer,
        stats, action_counts, *algorithm.diagnostics.device_tensors(), guard,
        *((guard.first, guard.steps) if guard is not None else ()),
    )


def gradient_steps_after(algorithm: CollectingAlgorithm, steps: int, n_envs: int) -> int:
    """Gradient steps after a rollout of ``steps`` vector steps (SB3's ``learn``: -1, one per env step)."""
    return algorithm.gradient_steps if algorithm.gradient_steps >= 0 else steps * n_envs


class FusedBlock:
    """The fused block of one algorithm on one env: its static tensors, its graphs (one per key), counters.

    :param algorithm: the algorithm (a ``BranchingIQN``).
    :param env: the device vector env with the static face (:data:`STATIC_FACE`).
    :param stats: the collector's episode statistics (the block records into them).
    :param action_counts: the collector's ``[NB, A]`` action counts.
    :param steps: vector steps per block (``train_freq``).
    :param capture: capture CUDA graphs (else every block runs eagerly).
    :param random_generator: the generator of the random blocks' actions (the collector's warm-up
        generator); None: this block runs no random block.
    :param n_actions: ``[NB]`` int64 actions of each branch (the random blocks' draws); with
        ``random_generator``.
    """

    #: eager blocks of each key before its capture (optimizer state, library workspaces, compiles)
    WARMUP_BLOCKS = 2

    def __init__(self, algorithm: CollectingAlgorithm, env: Any, stats: EpisodeStats,
                 action_counts: th.Tensor, steps: int, capture: bool,
                 random_generator: th.Generator | None = None, n_actions: th.Tensor | None = None) -> None:
        device = th.device(env.device)
        self.env = env
        self.stats, self.action_counts = stats, action_counts
        self.steps = int(steps)
        self.capture = capture
        self.gradient_steps = gradient_steps_after(algorithm, self.steps, env.num_envs)
        self.batch_size = int(algorithm.batch_size)
        #: the objects the graphs hold on to: a new one of any of them needs a new block
        self.parts = _parts(algorithm, env, stats, action_counts)
        # the schedule: per step ε, IQR bonus and target update flag, then β and the first step's number
        self.schedule = th.zeros(3 * self.steps + 2, dtype=th.float64, device=device)
        #: the observations a block starts from and ends with (the graph reads and writes them; the env's
        #: current observations between blocks)
        self.obs = env.current_obs().clone()
        self.branch_values = th.arange(action_counts.shape[1], device=device)
        interval = max(algorithm.target_update_interval // algorithm.n_envs, 1)
        #: target updates a block can hold at most (due calls in ``steps`` consecutive ones)
        self.max_target_updates = math.ceil(self.steps / interval)
        buffer_generator = getattr(algorithm.replay_buffer, "generator", None)  # its stratified draws
        if (random_generator is None) != (n_actions is None):
            raise ValueError("random_generator and n_actions go together (the random blocks' draws)")
        self.random_generator, self.n_actions = random_generator, n_actions
        self.generators = [algorithm.generator, *([buffer_generator] if buffer_generator is not None else []),
                           *([random_generator] if random_generator is not None else []),
                           *env.graph_generators()]
        self.graphs: dict[BlockKey, th.cuda.CUDAGraph] = {}
        self.outputs: dict[BlockKey, tuple[th.Tensor, DeviceStep]] = {}
        #: the buffer's host state a block leaves (set by its Python, which a replay skips)
        self.left_by_block: dict[BlockKey, tuple[bool, th.Tensor]] = {}
        self.warmup_left: dict[BlockKey, int] = {}
        #: graphs captured, graph replays and eager blocks so far
        self.captures = 0
        self.replays = 0
        self.eager_blocks = 0

    def matches(self, algorithm: CollectingAlgorithm, env: Any, stats: EpisodeStats, action_counts: th.Tensor,
                steps: int, random_generator: th.Generator | None = None) -> bool:
        """Whether this block still fits the algorithm (same objects, same sizes, the same random blocks'
        generator)."""
        parts = _parts(algorithm, env, stats, action_counts)
        return (len(parts) == len(self.parts) and all(a is b for a, b in zip(parts, self.parts, strict=True))
                and random_generator is self.random_generator
                and steps == self.steps
                and gradient_steps_after(algorithm, steps, env.num_envs) == self.gradient_steps
                and int(algorithm.batch_size) == self.batch_size)

    # ------------------------------------------------------------------ the captured function

    def block(self, algorithm: CollectingAlgorithm, key: BlockKey) -> tuple[th.Tensor, DeviceStep]:
        """``steps`` vector steps then ``len(key)`` gradient steps (``key``: which are vaccine steps), or, for
        :data:`RANDOM`, ``steps`` vector steps of uniform random actions and none; every host-decided value
        read from :attr:`schedule` (the function a graph captures; no host sync).

        :param algorithm: the algorithm.
        :param key: :data:`RANDOM`, or per gradient step whether it is a vaccine step.
        :return: the last vector step's actions and step (a callback's locals).
        """
        env, k = self.env, self.steps
        schedule, buffer, guard = self.schedule, algorithm.replay_buffer, algorithm.guard
        first_step = schedule[3 * k + 1].to(th.int64)
        random = key is RANDOM
        if random and self.random_generator is None:
            raise ValueError("a random block needs the random_generator this block was made without")
        rates = schedule[: 2 * k].float()  # ε and the IQR bonus of every step, cast once
        # [k, NB]: every step's, made once
        branch_rates = None if random else algorithm.branch_rates(rates[:k, None])
        # the NaN guard's step number after each vector step, made once
        numbers = first_step + th.arange(1, k + 1, device=first_step.device) * env.num_envs
        obs = self.obs
        actions: th.Tensor | None = None
        step: DeviceStep | None = None
        taken: list[tuple[th.Tensor, ...]] = []  # per step: done, return, length, actions (recorded below)
        algorithm.policy.set_training_mode(False)
        for i in range(k):
            # 1. act; 2. env step; 3. NaN guard, replay push (the device loop's order; the statistics after)
            if random:  # the device loop's warm-up draws, in its order
                assert self.random_generator is not None and self.n_actions is not None
                actions = random_actions(self.n_actions, self.random_generator, env.num_envs)
            else:
                assert branch_rates is not None
                actions = algorithm.explore(obs, iqr_bonus=rates[k + i], branch_rates=branch_rates[i])
            step = env.step_tensors_static(actions)
            taken.append((step.done, step.episode_return, step.episode_length, actions))
            final_obs, reward = step.final_obs, step.reward
            if guard is not None:
                (obs, final_obs), reward = guard.check_env_tensors(numbers[i], (obs, final_obs), reward)
            buffer.add(obs, final_obs, actions, reward, step.done, step.infos)
            obs = step.obs
        # the block's episode statistics and action counts in one go: the same as step by step
        columns = (th.stack(column) for column in zip(*taken, strict=True))
        record_steps(self.stats, self.action_counts, *columns, self.branch_values)
        self.obs.copy_(obs)
        self._target_updates(algorithm, schedule[2 * k : 3 * k].sum())
        if key:
            algorithm.policy.set_training_mode(True)
            beta = schedule[3 * k]
            for vaccine in key:
                algorithm.learner.train_step_in_graph(buffer, self.batch_size, vaccine, beta)
        assert actions is not None and step is not None
        return actions, step

    def _target_updates(self, algorithm: CollectingAlgorithm, count: th.Tensor) -> None:
        """``count`` (a device number) Polyak updates of the target network, as ``polyak_update`` makes them
        (``target·(1 − τ) + τ·online``); each of the :attr:`max_target_updates` slots masked by ``count``."""
        params = [p.data for p in algorithm.q_net.parameters()]
        targets = [p.data for p in algorithm.q_net_target.parameters()]
        tau = algorithm.tau
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

    def prepare(self, algorithm: CollectingAlgorithm, random: bool = False) -> BlockKey:
        """Advance the host bookkeeping over the block as the device loop would step by step, and copy the
        values the block reads into :attr:`schedule`.

        :param random: a random block (before ``learning_starts``: no gradient step is planned).
        :return: the block's key (:data:`RANDOM`, or per gradient step: a vaccine step).
        """
        k, n = self.steps, self.env.num_envs
        values = [0.0] * (3 * k + 2)
        values[3 * k + 1] = float(algorithm.num_timesteps)
        for i in range(k):
            values[i], values[k + i] = float(algorithm.exploration_rate), float(algorithm.iqr_bonus)
            algorithm.num_timesteps += n
            algorithm.update_progress()
            values[2 * k + i] = 1.0 if algorithm.advance_schedules() else 0.0
        values[3 * k] = float(algorithm.replay_buffer.beta)
        if self.schedule.is_cuda:  # pinned: an asynchronous copy (the host allocator keeps it until done)
            self.schedule.copy_(th.tensor(values, dtype=th.float64).pin_memory(), non_blocking=True)
        else:
            self.schedule.copy_(th.tensor(values, dtype=th.float64))
        return RANDOM if random else algorithm.plan_gradient_steps(self.gradient_steps)

    def run(self, algorithm: CollectingAlgorithm, key: BlockKey) -> tuple[th.Tensor, DeviceStep]:
        """One block: a replay of ``key``'s graph, or an eager block (warm-up, or no capture), or the
        capture (then its first replay).

        :raises CaptureError: the capture failed (nothing of the block ran; the env's state is rolled back).
        """
        env, buffer = self.env, algorithm.replay_buffer
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
        elif not self.capture:
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
            outputs = self._capture(algorithm, key)
        env.set_current_obs(self.obs, outputs[1].infos)  # the block copied the last step's there
        return outputs

    def _capture(self, algorithm: CollectingAlgorithm, key: BlockKey) -> tuple[th.Tensor, DeviceStep]:
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
