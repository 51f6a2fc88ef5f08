"""The batched Gymnasium vector environment: all books in one core, no subprocesses.

:class:`LOBVectorEnv` steps ``num_envs`` books of one :class:`~foxenv.core.BatchedLOB` at once and
resets finished books in the same step (Gymnasium's ``AutoresetMode.SAME_STEP``): where a book's
episode ended, the returned observation is already its reset observation, and the info carries
``final_obs`` / ``final_info`` (what the finished step produced) with the masks ``_final_obs`` /
``_final_info``. With ``return_tensors=True`` everything stays a torch tensor on the core's device
(no host copy, no host sync on CUDA), which is the GPU training loop's path: there the reset is fused
into the core's step (:meth:`~foxenv.core.BatchedLOB.step_autoreset`), so ``compile=True`` compiles it
with the step and ``cuda_graph=True`` captures it in the same graph.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from foxenv.checks import check_device, check_seed
from foxenv.config import EnvConfig, is_whole
from foxenv.factory import DataSource, action_space_of, make_core, observation_space_of
from foxenv.gym_env import RENDER_HISTORY
from foxenv.spec import ACTION_NVEC, check_actions

ArrayOrTensor = np.ndarray | torch.Tensor


def tensors_to_numpy(tensors: dict[str, torch.Tensor], pack: bool | None = None) -> dict[str, np.ndarray]:
    """Copy a dict of tensors to numpy arrays with their own memory.

    On an accelerator the tensors are packed into one float64 buffer so there is a single
    device-to-host transfer (exact for float32, bool and integers below 2**53).

    :param tensors: tensors with a common leading (batch) dimension, one device.
    :param pack: force (True) or skip (False) the packing; ``None``: pack unless on the CPU.
    :return: the same keys, numpy arrays of the same dtypes and shapes.
    """
    if not tensors:
        return {}
    values = list(tensors.values())
    if pack is None:
        pack = values[0].device.type != "cpu"
    if not pack:
        return {key: value.numpy().copy() for key, value in tensors.items()}
    batch = values[0].shape[0]
    packed = torch.cat([value.reshape(batch, -1).to(torch.float64) for value in values], dim=1).cpu().numpy()
    arrays: dict[str, np.ndarray] = {}
    column = 0
    for key, value in tensors.items():
        width = value[0].numel() if value.dim() > 1 else 1
        part = packed[:, column : column + width]
        dtype = torch.empty(0, dtype=value.dtype).numpy().dtype
        arrays[key] = part.reshape(value.shape).astype(dtype)
        column += width
    return arrays


class LOBVectorEnv(VectorEnv):
    """``num_envs`` limit-order books stepped together on one device, with same-step autoreset.

    Spaces: ``single_action_space = MultiDiscrete(config.grid.nvec)``, ``action_space`` its batch
    (``[num_envs, 4]``); ``single_observation_space = Box(-inf, inf, (D,), float32)``,
    ``observation_space`` of shape ``[num_envs, D]``.

    ``step`` returns ``(obs [N, D] float32, reward [N] float32, terminated [N] bool, truncated [N] bool,
    info)``; ``info`` holds the core's per-book info (``mid``, ``position``, ``trade_closed``, ...,
    each ``[N]``) of the step just taken, plus ``final_obs`` (``[N, D]``: the observation the step
    produced before any reset; it equals ``obs`` for books that did not finish), ``final_info`` (the
    same per-book info dict) and the masks ``_final_obs`` = ``_final_info`` = ``terminated | truncated``.
    Unlike ``SyncVectorEnv`` these keys are present on every step and ``final_obs`` is one dense
    array rather than an object array, so the same code serves numpy and tensors.

    Episode starts: where the env may sync with the host (on the CPU, or when it returns numpy arrays),
    new start offsets are drawn only at steps where some book finished; with tensors on an accelerator
    they are drawn on every step (so no host sync is needed). Both are deterministic for a
    seed, but the same seed gives other episode starts in the two modes.

    :param num_envs: number of books ``N``.
    :param data: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` pair, or a ``MarketData``.
    :param device: device of the core.
    :param seed: seed of the core (episode start offsets; the market does not depend on it).
    :param return_tensors: accept and return torch tensors on ``device`` instead of numpy arrays.
    :param render_mode: ``None`` or ``"rgb_array"`` (``render()`` draws the first book).
    :param check_action_range: check that every action lies inside ``nvec``; this needs a host sync,
        so the default (``None``) checks everywhere except tensors on an accelerator. Shape and dtype are
        always checked.
    :param config: base :class:`EnvConfig`; keyword arguments naming its fields override it.
    :param compile: fuse the core's step with ``torch.compile`` (:meth:`BatchedLOB.enable_compile`):
        several times faster on CPU and GPU after a compile of seconds on the first step; floats may
        differ from the eager step in the last bits.
    :param cuda_graph: capture the core's step, with the autoreset fused in, in a CUDA graph at the
        first ``reset`` (:meth:`BatchedLOB.enable_cuda_graph`; CUDA only): one graph launch per step.

    :param kwargs: :class:`EnvConfig` fields and ``load_market`` options
        (see :func:`foxenv.factory.make_core`).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}

    def __init__(
        self,
        num_envs: int,
        data: DataSource = "synthetic",
        device: torch.device | str = "cpu",
        seed: int | None = None,
        return_tensors: bool = False,
        render_mode: str | None = None,
        check_action_range: bool | None = None,
        config: EnvConfig | None = None,
        compile: bool = False,
        cuda_graph: bool = False,
        **kwargs: Any,
    ) -> None:
        if not is_whole(num_envs) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be an integer >= 1")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            modes = self.metadata["render_modes"]
            raise ValueError(f"render_mode={render_mode!r} must be None or one of {modes}")
        self.device = check_device(device)
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, got device={self.device}")
        self.return_tensors = bool(return_tensors)
        # A host sync is free on the CPU and unavoidable when we hand out numpy arrays anyway.
        self._may_sync = self.device.type == "cpu" or not self.return_tensors
        self.check_action_range = self._may_sync if check_action_range is None else bool(check_action_range)
        self.core = make_core(
            data,
            int(num_envs),
            device=self.device,
            seed=seed,
            config=config,
            validate_actions=self.check_action_range,
            **kwargs,
        )
        if compile:
            self.core.enable_compile()
        self._capture_graph = bool(cuda_graph)
        self.num_envs = int(num_envs)
        self.config: EnvConfig = self.core.config
        self.market = self.core.market
        self.n_market_features: int = int(self.core.n_market_features)
        self.render_mode = render_mode
        self.single_observation_space = observation_space_of(self.core)
        self.single_action_space = action_space_of(self.core)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._mids: deque[float] = deque(maxlen=RENDER_HISTORY)
        self._last_info: dict[str, Any] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ArrayOrTensor, dict[str, Any]]:
        """Reset every book.

        :param seed: reseeds the core (and ``np_random``) when given.
        :param options: unused.
        :return: observations ``[N, D]`` and an empty info.
        """
        seed = check_seed(seed)
        super().reset(seed=seed)
        obs = self.core.reset(seed=seed)
        if self._capture_graph:  # capture once the books hold a valid state; later resets refill the graph
            self._capture_graph = False
            self.core.enable_cuda_graph()
        self._mids.clear()
        self._last_info = {}
        return (obs if self.return_tensors else obs.cpu().numpy().copy()), {}

    def check_actions(self, actions: ArrayOrTensor) -> torch.Tensor:
        """Check a batch of actions (:func:`foxenv.spec.check_actions`: dtype and shape always, range when
        ``check_action_range``) and move it to the core's device.

        :param actions: ``[N, 4]`` integers, numpy or torch.
        :return: an int64 tensor on the core's device.
        """
        expected = (self.num_envs, len(ACTION_NVEC))
        checked = check_actions(actions, expected, name="actions", check_range=self.check_action_range,
                                nvec=self.core.ACTION_NVEC)
        tensor = checked if isinstance(checked, torch.Tensor) else torch.from_numpy(checked)
        return tensor.to(self.device, torch.int64)

    def step(
        self, actions: ArrayOrTensor
    ) -> tuple[ArrayOrTensor, ArrayOrTensor, ArrayOrTensor, ArrayOrTensor, dict[str, Any]]:
        """Step every book, then reset the books whose episode ended.

        :param actions: ``[N, 4]`` integer actions (numpy, or torch on any device).
        :return: obs, reward, terminated, truncated, info (see the class docstring).
        """
        action = self.check_actions(actions)
        # Where the host may sync, the reset runs (and draws start offsets) only at steps where a book
        # finished; elsewhere it is fused into the core's (compiled / captured) step and draws every step.
        obs, reward, terminated, truncated, step_info, final_obs = self.core.step_autoreset(
            action, host_sync=self._may_sync
        )
        done = terminated | truncated
        if self.render_mode is not None:
            if bool(done[0]):  # the first book starts afresh: nothing of its last episode to draw
                self._last_info = {}
                self._mids.clear()
            else:
                self._last_info = {key: value[0].item() for key, value in step_info.items()}
                self._mids.append(self._last_info["mid"])
        info: dict[str, Any] = dict(step_info)
        info["final_obs"] = final_obs
        info["_final_obs"] = done
        info["_final_info"] = done
        if self.return_tensors:
            info["final_info"] = step_info  # the core hands out a new dict (and new tensors) every step
            return obs, reward, terminated, truncated, info
        arrays = tensors_to_numpy({"obs": obs, "reward": reward, "terminated": terminated,
                                   "truncated": truncated, **info})
        info = {key: arrays[key] for key in info}
        info["final_info"] = {key: arrays[key] for key in step_info}
        return arrays["obs"], arrays["reward"], arrays["terminated"], arrays["truncated"], info

    def render(self) -> tuple[np.ndarray, ...] | None:
        """Draw the first book (the book, its resting order, position and recent mids).

        :return: a one-element tuple with an ``H x W x 3`` uint8 image, or ``None`` without a render mode.
        """
        if self.render_mode is None:
            return None
        from foxenv.render import render_core_book

        return (render_core_book(self.core, 0, list(self._mids), self._last_info),)


def make_vec(
    num_envs: int,
    data: DataSource = "synthetic",
    device: torch.device | str = "cpu",
    seed: int | None = None,
    return_tensors: bool = False,
    **kwargs: Any,
) -> LOBVectorEnv:
    """Build a :class:`LOBVectorEnv` (also reachable as ``gymnasium.make_vec("foxenv/LOB-v0", num_envs)``).

    :param num_envs: number of books.
    :param data: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` pair, or a ``MarketData``.
    :param device: device of the core.
    :param seed: seed of the core (episode start offsets; the market does not depend on it).
    :param return_tensors: accept and return torch tensors on ``device``.
    :param kwargs: ``render_mode``, ``check_action_range``, ``config``, ``compile``, ``cuda_graph``,
        :class:`EnvConfig`
        fields and ``load_market`` options.
    :return: the vector env (call ``reset`` before ``step``).
    """
    return LOBVectorEnv(
        num_envs, data=data, device=device, seed=seed, return_tensors=return_tensors, **kwargs
    )
