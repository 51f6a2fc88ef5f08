"""A prioritized replay buffer on the model's device that injects hindsight transitions.

:class:`PrioritizedHindsightReplayBuffer` is an SB3 :class:`~stable_baselines3.common.buffers.ReplayBuffer`
subclass (so ``OffPolicyAlgorithm`` can ``add`` to it, ``save_replay_buffer`` / ``load_replay_buffer`` it)
whose storage is one :class:`cuda_ext.ReplayStorage` (the layout of ``cuda_ext/README.md``) on one device,
driven by the ``cuda_ext`` ops:

* ``add``: hindsight candidates (backward, forward, relabel; :mod:`sb3_her_ext.hindsight`) and the real
  rows are concatenated and written by ONE ``per_push``, then the sum tree is brought up to date, then the
  trackers advance with the real rows' slots;
* ``sample``: ``per_sample`` (stratified proportional, importance weights divided by their max); on a GPU
  ``per_sample_philox``, whose kernel draws the uniforms itself from ``sample_rng_state = (seed, counter)``
  (seeded from the buffer's generator when the storage is allocated; saved and restored with the buffer);
* ``update_priorities``: ``per_update``, then the sum tree is brought up to date.

Randomness: every draw (the CPU sampler's uniforms, the Philox seed, the stratified sampler's) comes from the
buffer's own :attr:`~PrioritizedHindsightReplayBuffer.generator` on its device, seeded when the buffer is made
(``seed``, or one draw of torch's global generator, which SB3 has just seeded with the model's seed) and
pickled with the buffer; nothing in ``add`` / ``sample`` touches a process-wide generator, so a model's
samples do not depend on other models training in the same process (``sb3_her_ext.concurrent``).

Bringing the tree up to date: on the CPU ``per_tree_rebuild`` of the written leaves, right away. On a GPU
``per_tree_refresh`` (one launch: the writers marked their dirty subtrees), lazily: at the next ``sample``,
so one launch serves a push and the update before it (trees beyond 2^23 leaves, which are not marked:
``per_tree_rebuild`` right away, as on the CPU). :meth:`refresh_tree` does it on demand (call it
before reading ``tree`` directly); pickling does it first.

Counts (``write_head``, ``size``, hindsight counters) stay device tensors; ``add``/``sample``/
``update_priorities`` never read a device value on the host. ``size()``, ``pos``, ``full``,
``max_priority()`` and ``mean_weight()`` read the device and so synchronise: call them at log time.

Usage (the algorithm does this through SB3's ``replay_buffer_class``)::

    env = LOBVecEnv(8, seed=0)
    buffer = PrioritizedHindsightReplayBuffer(
        100_000, env.observation_space, env.action_space, device="cuda", n_envs=8,
        hindsight=HindsightConfig(reward_scale=env.reward_scale, magnitudes=env.magnitudes),
    )
    buffer.add(obs, next_obs, actions, rewards, dones, infos)   # SB3's numpy path, or torch + dict of tensors
    batch = buffer.sample(256)                                  # batch.weights, batch.indices, batch.kinds
    buffer.update_priorities(batch.indices, td_abs)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.vec_env import VecNormalize

import cuda_ext
from cuda_ext import ReplayStorage
from cuda_ext.reference.per import marks_subtrees
from cuda_ext.replay_storage import PushBlock, PushJoiner
from sb3_her_ext.branches import branch_action_dims
from sb3_her_ext.hindsight import (
    KIND_REAL,
    REQUIRED_INFO_KEYS,
    HindsightConfig,
    HindsightState,
    StepBatch,
)
from sb3_her_ext.replay_inputs import counterfactual_states, info_tensors, to_rows
from sb3_her_ext.stratified import stratified_indices
from sb3_her_ext.validation import check_allocation

__all__ = ["HindsightConfig", "PrioritizedHindsightReplayBuffer", "PrioritizedReplaySamples"]

_TIMEOUT_KEY = "TimeLimit.truncated"

#: SB3's attribute names of the storage tensors -> the :class:`cuda_ext.ReplayStorage` fields they show.
_STORAGE_FIELDS = {
    "observations": "obs", "next_observations": "next_obs", "actions": "action", "rewards": "reward",
    "dones": "done", "kinds": "kind", "tree": "tree", "head_size": "head_size",
    "max_priority_tensor": "max_priority",
}
#: Tensors the buffer holds beside its storage.
_OWN_TENSORS = ("last_weights", "sample_rng_state")


class _StorageField:
    """A buffer attribute that is a field of its :class:`cuda_ext.ReplayStorage` (SB3's names kept)."""

    def __init__(self, field: str, doc: str) -> None:
        self.field = field
        self.__doc__ = doc

    def __get__(self, buffer: Any, owner: type | None = None) -> Any:
        if buffer is None:
            return self
        return getattr(buffer.storage, self.field)

    def __set__(self, buffer: Any, value: torch.Tensor) -> None:
        setattr(buffer.storage, self.field, value)


def _new_sample_rng_state(generator: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """A fresh ``(seed, counter)`` state for ``per_sample_philox``: the seed from ``generator`` (so a seeded
    run samples the same rows), the counter 0.

    :param generator: the buffer's generator.
    :param device: where the state lives.
    :return: ``[2] int64``.
    """
    seed = torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, generator=generator,
                         device=generator.device)
    return torch.stack([seed, torch.zeros((), dtype=torch.int64, device=seed.device)]).to(device)


def _seeded_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` (the CPU's for a device type without one) seeded with ``seed``."""
    generator = torch.Generator(device=device if device.type in ("cpu", "cuda") else "cpu")
    generator.manual_seed(int(seed) % 2**64)
    return generator


def _seed_of_state(state: torch.Tensor) -> int:
    """A seed that is a function of a generator state (to go on on another kind of device)."""
    return int.from_bytes(hashlib.sha256(state.cpu().numpy().tobytes()).digest()[:8], "little")


class PrioritizedReplaySamples(NamedTuple):
    """A sampled batch: SB3's ``ReplayBufferSamples`` fields plus the prioritized-replay fields.

    :param observations: ``[B, D]`` float32.
    :param actions: ``[B, NB]`` int64, one index per branch.
    :param next_observations: ``[B, D]`` float32.
    :param dones: ``[B, 1]`` float32 (SB3's shape), 1 for terminal and synthetic rows.
    :param rewards: ``[B, 1]`` float32 (SB3's shape).
    :param weights: ``[B]`` float32 importance weights (divided by their max; 1 for stratified samples).
    :param indices: ``[B]`` int64 replay slots (pass them to ``update_priorities``).
    :param kinds: ``[B]`` int8: 0 real, 1 backward hindsight, 2 forward hindsight, 3 magnitude relabel.
    :param counterfactual_states: ``[B, S]`` float64 env states before each row's step (the buffer's
        ``counterfactual_state_dim > 0``), else None.
    """

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    weights: torch.Tensor
    indices: torch.Tensor
    kinds: torch.Tensor
    counterfactual_states: torch.Tensor | None = None


class PrioritizedHindsightReplayBuffer(ReplayBuffer):
    """Prioritized replay (sum tree, α, β) on one device, with hindsight injection on trade closes.

    The ring holds ``buffer_size`` rows in total (real and synthetic together, unlike SB3's
    per-env rows). SB3's numpy storage is never allocated.

    :param buffer_size: capacity ``C`` in rows; >= 1.
    :param observation_space: a ``Box`` observation space (flattened to ``D``).
    :param action_space: ``Discrete`` (one branch) or ``MultiDiscrete`` (``NB`` branches).
    :param device: where the storage lives (``"auto"``: CUDA when available).
    :param n_envs: rows per ``add`` (the number of envs / books); >= 1.
    :param optimize_memory_usage: must be False (next observations are stored explicitly: hindsight
        rows have their own).
    :param handle_timeout_termination: store ``done = done and not TimeLimit.truncated`` (as SB3).
    :param alpha: priority exponent; >= 0.
    :param beta: importance-sampling exponent (the algorithm anneals it); in [0, 1].
    :param priority_eps: added to ``|TD|`` in ``update_priorities``; > 0.
    :param hindsight: a :class:`HindsightConfig`, a dict of its fields, or ``None`` (hindsight off).
    :param seed: seed of the buffer's :attr:`generator`; None: one draw of torch's global generator (which
        SB3's ``set_random_seed`` has seeded with the model's seed just before it makes the buffer).
    :param counterfactual_state_dim: ``S`` > 0: each row also stores its env's state before the step, read
        from the step's ``infos[sb3_her_ext.counterfactual.STATE_KEY]`` (a counterfactual env's, recording:
        :mod:`sb3_her_ext.counterfactual`), returned as the samples' ``counterfactual_states``; 0: none
        stored. Not with hindsight (its synthetic rows have no env state).
    """

    observations = _StorageField("obs", "``[C, D]`` float32 observations (``storage.obs``).")
    next_observations = _StorageField("next_obs", "``[C, D]`` float32 next observations.")
    actions = _StorageField("action", "``[C, NB]`` int64 actions (``storage.action``).")
    rewards = _StorageField("reward", "``[C]`` float32 rewards (``storage.reward``).")
    dones = _StorageField("done", "``[C]`` float32 dones (``storage.done``).")
    kinds = _StorageField("kind", "``[C]`` int8 replay kinds (``storage.kind``).")
    tree = _StorageField("tree", "``[2P]`` float64 sum tree (``storage.tree``).")
    head_size = _StorageField("head_size", "``[2]`` int64 ``(write_head, size)`` (``storage.head_size``).")
    max_priority_tensor = _StorageField("max_priority", "``[1]`` float32 running max priority.")
    counterfactual_states = _StorageField("state", "``[C, S]`` float64 pre-step env states, or None.")

    #: :meth:`sample_stratified` looks at this many candidate rows per batch row (uniform draws) when the
    #: buffer is larger than that, so its cost does not grow with the capacity.
    STRATIFIED_OVERSAMPLE: int = 16

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: torch.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        alpha: float = 0.6,
        beta: float = 0.4,
        priority_eps: float = 1e-6,
        hindsight: HindsightConfig | dict | None = None,
        seed: int | None = None,
        counterfactual_state_dim: int = 0,
    ) -> None:
        if int(buffer_size) != buffer_size or buffer_size < 1:
            raise ValueError(f"buffer_size={buffer_size} must be an integer >= 1")
        if int(n_envs) != n_envs or n_envs < 1:
            raise ValueError(f"n_envs={n_envs} must be an integer >= 1")
        if optimize_memory_usage:
            raise ValueError(
                "optimize_memory_usage=True is not supported: hindsight rows need their own next_obs"
            )
        if not isinstance(observation_space, spaces.Box):
            raise ValueError(f"observation_space={observation_space} must be a Box")
        if not 0 <= alpha < math.inf:
            raise ValueError(f"alpha={alpha} must be a finite number >= 0")
        if not 0 <= beta <= 1:
            raise ValueError(f"beta={beta} must lie in [0, 1]")
        if not 0 < priority_eps < math.inf:
            raise ValueError(f"priority_eps={priority_eps} must be a finite number > 0")
        dim = counterfactual_state_dim
        if not isinstance(dim, int | np.integer) or isinstance(dim, bool) or dim < 0:
            raise ValueError(f"counterfactual_state_dim={counterfactual_state_dim!r} must be an integer >= 0")
        self.counterfactual_state_dim = int(counterfactual_state_dim)
        self.branch_sizes = branch_action_dims(action_space)
        self._allocated = False
        BaseBuffer.__init__(
            self, int(buffer_size), observation_space, action_space, device, n_envs=int(n_envs)
        )
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.priority_eps = float(priority_eps)
        self.obs_dim = int(np.prod(observation_space.shape))
        self.n_branches = len(self.branch_sizes)
        self.hindsight_config = HindsightConfig.from_value(hindsight)
        if self.hindsight_config is not None:
            self._check_hindsight_branches(self.hindsight_config)
            if self.counterfactual_state_dim:
                raise ValueError(f"counterfactual_state_dim={self.counterfactual_state_dim} with hindsight "
                                 "on: hindsight rows have no env state to replay; turn hindsight off")
        if seed is None:  # one draw of the global generator, at construction only (never in add / sample)
            seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))
        #: every random draw of the buffer comes from this generator on its device (pickled with the buffer)
        self.generator = _seeded_generator(self._device, seed)
        # obs and next obs (float32), actions, states (float64), the rest
        row = 8 * self.obs_dim + 8 * self.n_branches + 8 * self.counterfactual_state_dim + 9
        tree = 16 * (1 << max(self.buffer_size - 1, 0).bit_length())  # the sum and min trees
        check_allocation("buffer_size", buffer_size, float(self.buffer_size) * row + tree, self._device)
        self._allocate()

    # ----------------------------------------------------------------------------------- storage
    def _check_hindsight_branches(self, cfg: HindsightConfig) -> None:
        sizes = cfg.relabelled_sizes(self.branch_sizes)  # a joint code's branches, decoded
        nb = len(sizes)
        for name in ("direction_branch", "magnitude_branch"):
            if getattr(cfg, name) >= nb:
                raise ValueError(f"hindsight {name}={getattr(cfg, name)} must be < the {nb} action branches")
        n_dir = sizes[cfg.direction_branch]
        if cfg.flat_action >= n_dir:
            raise ValueError(f"hindsight flat_action={cfg.flat_action} must be < {n_dir} direction actions")
        n_mag = sizes[cfg.magnitude_branch]
        if cfg.relabel and len(cfg.magnitudes) != n_mag:
            raise ValueError(
                f"hindsight magnitudes={cfg.magnitudes} must have one value per magnitude action ({n_mag})"
            )

    def _allocate(self) -> None:
        dev = self.device
        self.storage = ReplayStorage.zeros(self.buffer_size, self.obs_dim, self.n_branches, dev,
                                           state_dim=self.counterfactual_state_dim)
        self.capacity = self.storage.capacity
        self.tree_leaves = self.storage.tree_leaves
        #: whether per_push / per_update left marked subtrees that per_tree_refresh has not rebuilt yet
        self._tree_stale = False
        self.last_weights = torch.full((1,), float("nan"), dtype=torch.float32, device=dev)
        self.sample_rng_state = _new_sample_rng_state(self.generator, dev)
        #: joins each add's blocks; keeps their constant columns (not pickled)
        self._joiner = PushJoiner()
        self.hindsight_state = (
            None if self.hindsight_config is None
            else HindsightState(self.hindsight_config, self.n_envs, self.obs_dim, self.n_branches, dev)
        )
        self._allocated = True

    def _tensor_names(self) -> tuple[str, ...]:
        """Every tensor attribute: the storage's (by SB3's names) and the buffer's own."""
        stored = ("counterfactual_states",) if self.counterfactual_state_dim else ()
        return (*_STORAGE_FIELDS, *stored, *_OWN_TENSORS)

    @property
    def device(self) -> torch.device:
        """Device of the storage; setting it moves every tensor (SB3's ``load_replay_buffer`` does)."""
        return self._device

    @device.setter
    def device(self, value: torch.device | str) -> None:
        self._device = torch.device(value)
        if getattr(self, "_allocated", False):
            self.storage = self.storage.to(self._device)
            for name in _OWN_TENSORS:
                setattr(self, name, getattr(self, name).to(self._device))
            self._move_generator()
            if self.hindsight_state is not None:
                self.hindsight_state = self.hindsight_state.to(self._device)

    def _move_generator(self) -> None:
        """Give :attr:`generator` the buffer's device: a new one there, seeded from a draw of the old one
        (a generator's state does not move between kinds of device)."""
        wanted = self._device if self._device.type in ("cpu", "cuda") else torch.device("cpu")
        old = self.generator
        if old.device.type == wanted.type and (wanted.index is None or old.device.index == wanted.index):
            return
        seed = torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, generator=old, device=old.device)
        self.generator = _seeded_generator(wanted, int(seed))

    @property
    def pos(self) -> int:
        """The write head (next slot written), as SB3's ``pos``; synchronises with the device."""
        if not getattr(self, "_allocated", False):
            return 0
        return int(self.head_size[0].item())

    @pos.setter
    def pos(self, value: int) -> None:
        if getattr(self, "_allocated", False):
            raise ValueError(f"pos={value}: the write head is owned by per_push; use reset() to clear")

    @property
    def full(self) -> bool:
        """Whether every slot has been written; synchronises with the device."""
        return getattr(self, "_allocated", False) and self.size() == self.buffer_size

    @full.setter
    def full(self, value: bool) -> None:
        if getattr(self, "_allocated", False):
            raise ValueError(f"full={value}: the fill state is owned by per_push; use reset() to clear")

    def size(self) -> int:
        """Number of written rows (real and synthetic), exact; reads the device (a sync): call rarely.

        :return: the number of rows that can be sampled.
        """
        return int(self.head_size[1].item())

    def reset(self) -> None:
        """Empty the buffer: storage, tree, counters, max priority and hindsight state."""
        self._allocate()

    @property
    def hindsight_counts(self) -> dict[str, torch.Tensor]:
        """Cumulative rows wanted per hindsight kind (0-dim int64 device tensors; read at log time)."""
        if self.hindsight_state is None:
            zero = torch.zeros((), dtype=torch.int64, device=self.device)
            return {"backward": zero, "forward": zero.clone(), "relabel": zero.clone()}
        return self.hindsight_state.counts

    def max_priority(self) -> float:
        """The running max raw priority (a sync; for diagnostics).

        :return: the max priority.
        """
        return float(self.max_priority_tensor[0].item())

    def mean_weight(self) -> float:
        """Mean importance weight of the last ``sample`` batch, NaN before the first (a sync).

        :return: the mean weight.
        """
        return float(self.last_weights.mean().item())

    # ----------------------------------------------------------------------------------- add
    def _step_batch(self, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any,
                    infos: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> StepBatch:
        keys = REQUIRED_INFO_KEYS if self.hindsight_config is not None else ()
        info, timeout = info_tensors(self, infos, keys)
        episode_end = to_rows(self, "done", done, torch.bool, None)
        # done and not a timeout (a > b is a & ~b for bools: one op)
        terminal = episode_end > timeout if self.handle_timeout_termination and timeout is not None \
            else episode_end
        return StepBatch(
            obs=to_rows(self, "obs", obs, torch.float32, self.obs_dim),
            next_obs=to_rows(self, "next_obs", next_obs, torch.float32, self.obs_dim),
            action=to_rows(self, "action", action, torch.int64, self.n_branches),
            reward=to_rows(self, "reward", reward, torch.float32, None),
            episode_end=episode_end,
            terminal=terminal,
            info=info,
        )

    def add(self, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any,
            infos: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> None:
        """Store one step of ``n_envs`` transitions plus its hindsight rows in ONE ``per_push``.

        Order: hindsight_inject → hindsight_forward → magnitude_relabel → joined with the real rows →
        ``per_push`` → the tree (``per_tree_rebuild`` now; on a GPU ``per_tree_refresh`` at the next
        sample) → ``hindsight_track`` (with the real rows' slots).

        :param obs: ``[n_envs, D]`` observations (numpy, SB3's path, or torch).
        :param next_obs: ``[n_envs, D]`` next observations.
        :param action: ``[n_envs, NB]`` (or ``[n_envs]`` for one branch) actions.
        :param reward: ``[n_envs]`` rewards.
        :param done: ``[n_envs]`` episode ends (terminated or truncated).
        :param infos: SB3's list of per-env info dicts, or a dict of ``[n_envs]`` tensors; with hindsight
            on they must hold the env info contract keys; ``TimeLimit.truncated`` marks timeouts; with
            ``counterfactual_state_dim`` the pre-step states
            (:func:`sb3_her_ext.replay_inputs.counterfactual_states`; missing: a ``ValueError`` naming it).
        """
        batch = self._step_batch(obs, next_obs, action, reward, done, infos)
        states = counterfactual_states(self, infos) if self.counterfactual_state_dim else None
        blocks = [PushBlock(batch.obs, batch.next_obs, batch.action, batch.reward, None, KIND_REAL,
                            done=batch.terminal, priority=0.0, max_multiplier=1.0)]
        if self.hindsight_state is not None:
            blocks += self.hindsight_state.candidates(batch, self.storage.next_obs)
        rows = self._joiner.join(blocks)
        slots = cuda_ext.per_push(self.storage, rows, alpha=self.alpha)
        self._tree_written(slots)
        if states is not None:  # no hindsight rows then: one slot per real row
            self.storage.write_state(slots, states)
        if self.hindsight_state is not None:
            self.hindsight_state.after_push(batch, slots[: self.n_envs])

    # ----------------------------------------------------------------------------------- sample
    def _gather(self, indices: torch.Tensor, weights: torch.Tensor) -> PrioritizedReplaySamples:
        return PrioritizedReplaySamples(
            observations=self.observations[indices],
            actions=self.actions[indices],
            next_observations=self.next_observations[indices],
            dones=self.dones[indices].unsqueeze(1),
            rewards=self.rewards[indices].unsqueeze(1),
            weights=weights,
            indices=indices,
            kinds=self.kinds[indices],
            counterfactual_states=None if self.storage.state is None else self.storage.state[indices],
        )

    @staticmethod
    def _check_batch_size(batch_size: int) -> None:
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be an integer >= 1")

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> PrioritizedReplaySamples:
        """Draw ``batch_size`` rows proportionally to priority (``cuda_ext.per_sample``).

        The buffer must not be empty (SB3's ``learning_starts`` guards it; no check, to avoid a sync).

        :param batch_size: rows to draw; >= 1.
        :param env: must be None: observation/reward normalisation is not supported on the device buffer.
        :return: the batch, with importance weights ``(size * P(i)) ** -beta`` divided by their max.
        """
        self._check_batch_size(batch_size)
        if env is not None:
            raise ValueError(f"env={env!r}: VecNormalize is not supported by this device buffer")
        self.refresh_tree()
        storage = self.storage
        if storage.tree.is_cuda:
            # the kernel draws its own uniforms: no separate draw kernel in a graphed cycle
            # (benchmarks/RESULTS.md, replay cycle)
            indices, weights = cuda_ext.per_sample_philox(
                storage.tree, storage.head_size, self.sample_rng_state, batch_size=int(batch_size),
                beta=float(self.beta),
            )
        else:  # on the CPU torch.rand is far cheaper than the Philox reference's many small int64 ops
            uniforms = torch.rand(int(batch_size), dtype=torch.float64, device=self.device,
                                  generator=self.generator)
            indices, weights = cuda_ext.per_sample(
                storage.tree, storage.head_size, uniforms, beta=float(self.beta)
            )
        self.last_weights = weights
        return self._gather(indices, weights)

    def sample_with_beta(self, batch_size: int, beta: torch.Tensor) -> PrioritizedReplaySamples:
        """:meth:`sample` with ``β`` read from a 0-dim float64 tensor on the buffer's device, so that a
        captured CUDA graph samples with the current ``β`` (the sampling kernels take it as a host number,
        which a graph would freeze). The same rows as :meth:`sample` (same draws); the weights are
        :meth:`importance_weights` of them, equal to :meth:`sample`'s up to the rounding of ``pow``.

        :param batch_size: rows to draw; >= 1.
        :param beta: 0-dim float64 importance exponent in ``[0, 1]`` (not checked: no host read).
        :return: the batch.
        """
        self._check_batch_size(batch_size)
        self.refresh_tree()
        storage = self.storage
        if storage.tree.is_cuda:
            indices, _ = cuda_ext.per_sample_philox(
                storage.tree, storage.head_size, self.sample_rng_state, batch_size=int(batch_size), beta=0.0
            )
        else:
            uniforms = torch.rand(int(batch_size), dtype=torch.float64, device=self.device,
                                  generator=self.generator)
            indices, _ = cuda_ext.per_sample(storage.tree, storage.head_size, uniforms, beta=0.0)
        weights = self.importance_weights(indices, beta)
        self.last_weights = weights
        return self._gather(indices, weights)

    def importance_weights(self, indices: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """``w_i = (size · P(i)) ** -β`` of sampled slots, divided by their max (``per_sample``'s formula),
        with ``β`` a tensor (no host read).

        :param indices: ``[B]`` int64 slots.
        :param beta: 0-dim importance exponent.
        :return: ``[B]`` float32 weights.
        """
        tree = self.storage.tree
        probability = tree[indices + tree.shape[0] // 2] / tree[1]
        weights = (self.head_size[1].double() * probability) ** -beta.to(torch.float64)
        return (weights / weights.max()).float()

    def update_priorities(self, indices: torch.Tensor, td_abs: torch.Tensor) -> None:
        """Set the priorities of sampled rows to ``|TD| + eps`` (``per_update``, then the tree: see the module
        docstring).

        :param indices: ``[B]`` int64 slots from :meth:`sample`.
        :param td_abs: ``[B]`` (or ``[B, 1]``) absolute TD errors.
        """
        indices = indices.reshape(-1).to(device=self.device, dtype=torch.int64)
        td = td_abs.detach().reshape(-1).to(device=self.device, dtype=torch.float32)
        if td.numel() != indices.numel():
            raise ValueError(f"td_abs has {td.numel()} values for {indices.numel()} indices")
        cuda_ext.per_update(self.storage.tree, self.storage.max_priority, indices, td, alpha=self.alpha,
                            eps=self.priority_eps)
        self._tree_written(indices)

    def _tree_written(self, leaves: torch.Tensor) -> None:
        """After ``per_push`` / ``per_update`` wrote ``leaves``: leave the marked subtrees to the next
        :meth:`refresh_tree` (GPU, a tree the writers mark), or rebuild the leaves' ancestors now (CPU; and
        trees of more than 2^23 leaves, whose refresh would rebuild every node)."""
        if self.storage.tree.is_cuda and marks_subtrees(self.storage.tree_leaves):
            self._tree_stale = True
        else:
            cuda_ext.per_tree_rebuild(self.storage.tree, leaves)

    def host_state(self) -> tuple[bool, torch.Tensor]:
        """Whether the tree is stale, the last batch's weights: what a graph replay of ``add`` or ``sample``
        (no Python) does not set; its caller puts back what the captured run left (:meth:`set_host_state`)."""
        return self._tree_stale, self.last_weights

    def set_host_state(self, state: tuple[bool, torch.Tensor]) -> None:
        """Put back a :meth:`host_state`."""
        self._tree_stale, self.last_weights = state

    def refresh_tree(self) -> None:
        """Bring every node of ``tree`` up to date (``per_tree_refresh``) if a write left it stale (GPU only;
        no host sync)."""
        if self._tree_stale:
            cuda_ext.per_tree_refresh(self.storage.tree)
            self._tree_stale = False

    def sample_stratified(self, batch_size: int, branch: int, n_values: int) -> PrioritizedReplaySamples:
        """Draw rows uniformly, an equal share for each value of one action branch (for the gradient vaccine;
        :func:`sb3_her_ext.stratified.stratified_indices` says how).

        :param batch_size: rows to draw; >= 1.
        :param branch: the action branch to stratify on.
        :param n_values: number of strata (values ``0 .. n_values - 1`` of ``branch``); >= 1.
        :return: the batch, with weights 1.
        """
        self._check_batch_size(batch_size)
        if int(branch) != branch or not 0 <= branch < self.n_branches:
            raise ValueError(f"branch={branch} must be an integer in [0, {self.n_branches})")
        if int(n_values) != n_values or n_values < 1:
            raise ValueError(f"n_values={n_values} must be an integer >= 1")
        indices = stratified_indices(self, batch_size, branch, n_values)
        return self._gather(indices, torch.ones(batch_size, dtype=torch.float32, device=self.device))

    # ----------------------------------------------------------------------------------- checks
    def invalid_fields(self) -> list[str]:
        """The storage fields holding a value no push writes: non-finite observations, rewards, priorities
        (the sum tree) or max priority, actions outside their branch, a head or size outside the ring (one
        host read; e.g. after loading a file).

        :return: the names of the bad fields (SB3's names); empty when the buffer is sound.
        """
        if not getattr(self, "_allocated", False):
            return []
        checks = {
            name: torch.isfinite(getattr(self, name)).all()
            for name in ("observations", "next_observations", "rewards", "dones", "tree",
                         "max_priority_tensor", "counterfactual_states")
            if getattr(self, name) is not None
        }
        sizes = torch.as_tensor(self.branch_sizes, dtype=torch.int64, device=self.device)
        actions = self.actions.reshape(-1, self.n_branches)
        checks["actions"] = ((actions >= 0) & (actions < sizes)).all()
        head_size = self.head_size
        checks["head_size"] = ((head_size >= 0) & (head_size <= self.buffer_size)).all()
        ok = torch.stack(list(checks.values())).tolist()
        return [name for name, good in zip(checks, ok, strict=True) if not good]

    # ----------------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        """Pickle with every tensor on the CPU (the device is restored on load when available)."""
        if getattr(self, "_allocated", False):
            self.refresh_tree()
        state = self.__dict__.copy()
        if "storage" in state:
            state["storage"] = state["storage"].to("cpu")
        for name in _OWN_TENSORS:
            if name in state:
                state[name] = state[name].cpu()
        if state["hindsight_state"] is not None:
            state["hindsight_state"] = state["hindsight_state"].to("cpu")
        state.pop("_joiner", None)  # its kept tensors are remade on the device at the next add
        generator = state.pop("generator", None)
        if generator is not None:  # its state and device: a CUDA generator's state is only read back there
            state["_generator_state"] = generator.get_state()
            state["_generator_device"] = str(generator.device)
        state["_device"] = str(self._device)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore the tensors onto the pickled device, or the CPU when it is not available here."""
        saved = torch.device(state["_device"])
        self._tree_stale = False  # pickles of earlier versions lack it; their trees were always up to date
        self.counterfactual_state_dim = 0  # as it is unless the pickle says otherwise (earlier versions)
        if state.get("_allocated", False) and "storage" not in state:  # a pickle of the flat layout
            state = dict(state)
            flat = {field: state.pop(name) for name, field in _STORAGE_FIELDS.items()}
            state["storage"] = ReplayStorage(**flat)
        generator_state = state.pop("_generator_state", None)
        generator_device = torch.device(state.pop("_generator_device", "cpu"))
        self.__dict__.update(state)
        self._joiner = PushJoiner()
        self.generator = self._restored_generator(generator_state, generator_device)
        if self.__dict__.get("_allocated", False) and "sample_rng_state" not in state:
            # a pickle of an earlier version
            self.sample_rng_state = _new_sample_rng_state(self.generator, "cpu")
        self._device = torch.device("cpu")
        if saved.type == "cpu" or (saved.type == "cuda" and torch.cuda.is_available()):
            self.device = saved

    @staticmethod
    def _restored_generator(state: torch.Tensor | None, device: torch.device) -> torch.Generator:
        """The pickled generator: its state on its device where that exists here; else a CPU generator
        seeded from its state; a pickle of an earlier version (no generator): one draw of torch's global
        generator, as at construction."""
        if state is None:
            return _seeded_generator(torch.device("cpu"), int(torch.randint(-(2**63), 2**63 - 1, ())))
        if device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available()):
            generator = torch.Generator(device=device)
            generator.set_state(state)
            return generator
        return _seeded_generator(torch.device("cpu"), _seed_of_state(state))
