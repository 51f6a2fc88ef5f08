"""An SB3 ``VecEnv`` over the batched book core: B books stepped as one tensor batch, no subprocesses.

:class:`LOBVecEnv` wraps :class:`foxenv.core.BatchedLOB` with SB3's numpy-in / numpy-out contract:
autoreset of finished books (``BatchedLOB.step_autoreset``) with ``terminal_observation`` and
``TimeLimit.truncated`` in their infos, and Monitor-style ``episode`` stats, so neither ``VecMonitor``
nor ``Monitor`` is needed (``env_is_wrapped(Monitor)`` answers True, which makes ``evaluate_policy``
read the ``episode`` info). Infos are one dict per env of Python scalars with the env info contract keys.
The batched info tensors of the last step are also kept in :attr:`LOBVecEnv.last_info_tensors` (device
tensors plus ``TimeLimit.truncated``), the form the replay buffer's tensor path takes. Actions follow
:func:`foxenv.spec.check_actions`, the rules of every foxenv face. SB3's ``VecNormalize`` wraps it like any
``VecEnv`` (``last_info_tensors`` stays unnormalised).

``action_face`` picks the action the env takes: ``"branched"``, foxenv's ``MultiDiscrete([3, 3, 3, 3])``, or
``"joint"``, one ``Discrete(81)`` of codes ``27 d + 9 m + 3 o + u`` (for BranchingIQN's joint face, SB3 DQN
and sb3-contrib QR-DQN), decoded by :func:`decode_joint`, the one decoder of the codes (numpy and tensor
faces, and :class:`foxhunt.evaluation.baselines.ModelPolicy`). Both follow the env's action grid
(``EnvConfig.action_grid``, :class:`foxenv.spec.ActionGrid`): on the ``"wide"`` grid ``MultiDiscrete([3,
10, 3, 12])`` and ``Discrete(1080)``. The tensor face is
:class:`foxhunt.device_lob_env.DeviceLOBVecEnv`, a subclass.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from foxenv import spec
from foxenv.checks import check_device, check_seed
from foxenv.config import EnvConfig, is_whole
from foxenv.factory import DataSource, action_space_of, make_core, observation_space_of
from foxhunt import fingerprint
from foxhunt.config import ACTION_FACES
from foxhunt.preflight import book_bytes
from sb3_her_ext.validation import check_allocation


def _numpy_dtype(dtype: torch.dtype) -> type:
    if dtype == torch.bool:
        return np.bool_
    return np.float64 if dtype.is_floating_point else np.int64


#: Weights of the joint action code ``27 d + 9 m + 3 o + u`` (direction, magnitude, order, urgency) on the
#: default grid (any grid: :attr:`foxenv.spec.ActionGrid.code_weights`).
JOINT_WEIGHTS: tuple[int, ...] = spec.DEFAULT_GRID.code_weights
#: Number of joint actions on the default grid (``Discrete(81)``).
N_JOINT: int = spec.DEFAULT_GRID.joint_actions
#: The one branch of the joint face.
JOINT_BRANCH_NAMES: tuple[str, ...] = ("action",)


@functools.cache
def _tables_on(device: torch.device, grid: spec.ActionGrid) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(grid.code_weights, dtype=torch.int64, device=device),
            torch.tensor(grid.nvec, dtype=torch.int64, device=device))


def _joint_tables(device: torch.device | str, grid: spec.ActionGrid = spec.DEFAULT_GRID) -> (
    tuple[torch.Tensor, torch.Tensor]
):
    """``(weights, nvec)`` int64 of ``grid`` on ``device``, made once per device and grid (an env makes them
    when it is built, so no step, not even a CUDA-graph capture, copies them to the device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" share one pair
        device = torch.device("cuda", torch.cuda.current_device())
    return _tables_on(device, grid)


def decode_joint(codes: Any, num_envs: int, *, check_range: bool = True, name: str = "actions",
                 grid: spec.ActionGrid = spec.DEFAULT_GRID) -> torch.Tensor:
    """Joint codes to foxenv's four-branch actions: the one decoder of the joint face (numpy and tensor
    paths, training and evaluation).

    :param codes: ``[num_envs]`` or ``[num_envs, 1]`` integer codes ``sum(action * grid.code_weights)``
        (``27 d + 9 m + 3 o + u`` on the default grid): numpy (or anything ``np.asarray`` takes) or a torch
        tensor on any device.
    :param num_envs: the number of codes.
    :param check_range: check every code lies in ``[0, grid.joint_actions)`` (for a tensor on an accelerator
        a host sync).
    :param name: the argument's name in error messages.
    :param grid: the env's action grid (:class:`foxenv.spec.ActionGrid`).
    :return: ``[num_envs, 4]`` int64 ``(direction, magnitude, order, urgency)``, on ``codes``' device (numpy
        input: a CPU tensor).
    :raises ValueError: naming ``name`` and the value, for a non-integer dtype, a wrong shape or (with
        ``check_range``) a code outside ``[0, grid.joint_actions)``.
    """
    if isinstance(codes, torch.Tensor):
        dtype, integer = codes.dtype, not (codes.dtype.is_floating_point or codes.dtype.is_complex
                                           or codes.dtype == torch.bool)
    else:
        array = np.asarray(codes)
        dtype, integer = array.dtype, array.dtype.kind in "iu"
    if not integer:
        raise ValueError(f"{name} dtype {dtype} must be an integer dtype of joint codes ({name}={codes!r})")
    if not isinstance(codes, torch.Tensor):
        codes = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))
    if tuple(codes.shape) not in ((num_envs,), (num_envs, 1)):
        raise ValueError(f"{name} has shape {tuple(codes.shape)}; the joint face takes ({num_envs},) or "
                         f"({num_envs}, 1) codes")
    codes = codes.reshape(-1).to(torch.int64)
    if check_range:
        values = codes.detach().cpu().numpy()
        bad = np.flatnonzero((values < 0) | (values >= grid.joint_actions))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}]={values[bad[0]]} out of range: a joint code must lie in "
                             f"[0, {grid.joint_actions})")
    weights, nvec = _joint_tables(codes.device, grid)
    return (codes[:, None] // weights) % nvec


def encode_joint(actions: Any, grid: spec.ActionGrid = spec.DEFAULT_GRID) -> Any:
    """Four-branch actions ``[..., 4]`` to joint codes ``sum(action * grid.code_weights)`` ``[...]``
    (``27 d + 9 m + 3 o + u`` on the default grid): the inverse of :func:`decode_joint`.

    :param actions: integer actions, each branch in ``[0, grid.nvec)`` (numpy or a torch tensor).
    :param grid: the env's action grid.
    :return: int64 codes in ``[0, grid.joint_actions)``, numpy for numpy input, else a tensor on ``actions``'
        device.
    """
    if isinstance(actions, torch.Tensor):
        return (actions.to(torch.int64) * _joint_tables(actions.device, grid)[0]).sum(-1)
    actions = np.asarray(actions, dtype=np.int64)
    if actions.shape[-1:] != (len(grid.code_weights),):
        raise ValueError(f"actions has shape {actions.shape}; its last axis must hold the 4 branches")
    return actions @ np.asarray(grid.code_weights, dtype=np.int64)


class UnknownEnvMethodError(AttributeError, ValueError):
    """``env_method`` named a method the batched book core does not have."""


class LOBVecEnv(VecEnv):
    """SB3 vectorised env of ``num_envs`` limit-order books stepped together by ``BatchedLOB``.

    :param num_envs: number of books; >= 1.
    :param device: device the book core runs on (observations come back as numpy).
    :param seed: seed of the book core (episode start offsets) and of the first reset; ``None`` = random.
        It does not change the market: train and evaluation envs with different seeds see the same data.
    :param data: a :class:`~foxenv.data.market.MarketData`, or a ``source`` for ``foxenv.data.load_market``
        (``"synthetic"``, a LOBSTER folder, or a ``(message, orderbook)`` pair).
    :param action_face: ``"branched"`` (``MultiDiscrete([3, 3, 3, 3])``, ``branch_names`` foxenv's four) or
        ``"joint"`` (``Discrete(81)``, one branch ``"action"`` of codes ``27 d + 9 m + 3 o + u``).
    :param env_kwargs: ``config`` (a base ``EnvConfig``), ``foxenv.config.EnvConfig`` fields and
        ``foxenv.data.load_market`` keyword arguments (``levels`` goes to both; ``market_seed`` is
        ``load_market``'s ``seed``); anything else raises ``ValueError``. The core is built by
        :func:`foxenv.factory.make_core`, as for the Gymnasium faces.
    """

    def __init__(self, num_envs: int, device: str = "cpu", seed: int | None = None,
                 data: DataSource = "synthetic", action_face: str = "branched", **env_kwargs: Any) -> None:
        if not is_whole(num_envs) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be an integer >= 1")
        if not isinstance(action_face, str) or action_face not in ACTION_FACES:
            raise ValueError(f"action_face={action_face!r} must be one of {list(ACTION_FACES)}")
        num_envs = int(num_envs)
        self.device = check_device(device)
        seed = check_seed(seed)
        check_allocation("num_envs", num_envs, num_envs * book_bytes(env_kwargs), self.device)
        self.lob = make_core(data, num_envs, device=self.device, seed=seed, **env_kwargs)
        self.config: EnvConfig = self.lob.config
        self.render_mode = None
        joint = action_face == "joint"
        #: the action grid (EnvConfig.action_grid): the spaces, the joint codes and the magnitudes follow it
        self.grid: spec.ActionGrid = self.config.grid
        action_space = gym.spaces.Discrete(self.grid.joint_actions) if joint else action_space_of(self.lob)
        super().__init__(num_envs, observation_space_of(self.lob), action_space)
        self.action_face = action_face
        self.branch_names = JOINT_BRANCH_NAMES if joint else spec.BRANCH_NAMES
        #: the branches a joint code holds (hindsight's relabels decode it), None on the branched face
        self.joint_nvec = tuple(int(n) for n in self.grid.nvec) if joint else None
        if joint:
            _joint_tables(self.device, self.grid)  # the decoder's tables, before any step (or graph capture)
        self.n_market_features = int(self.lob.n_market_features)
        self.reward_scale = float(self.config.reward_scale)
        self.magnitudes = tuple(float(m) for m in self.grid.magnitudes)
        self.last_info_tensors: dict[str, torch.Tensor] = {}
        self._actions: torch.Tensor | None = None
        self._episode_return = np.zeros(num_envs, dtype=np.float64)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)
        self._t_start = time.time()
        if seed is not None:
            self.seed(seed)

    # ----------------------------------------------------------------------------------- stepping
    def reset(self) -> VecEnvObs:
        """Reset every book (with the seed given to :meth:`seed`, if any) and the episode stats.

        :return: ``[num_envs, D]`` float32 observations.
        """
        seed = self._seeds[0]
        obs = self.lob.reset(seed=seed)
        self._reset_seeds()
        self._reset_options()
        self._episode_return[:] = 0.0
        self._episode_length[:] = 0
        self.reset_infos = [{} for _ in range(self.num_envs)]
        return obs.detach().cpu().numpy().astype(np.float32, copy=False)

    def step_async(self, actions: np.ndarray) -> None:
        """Store the actions of the next :meth:`step_wait`.

        :param actions: ``[num_envs, 4]`` integer actions (numpy or torch); on the joint face ``[num_envs]``
            (or ``[num_envs, 1]``) codes in ``[0, grid.joint_actions)`` (:func:`decode_joint`).
        :raises ValueError: naming ``actions`` and the value, as :func:`foxenv.spec.check_actions` (the
            rules of every foxenv face: integers, exactly ``(num_envs, 4)``, each in ``[0, nvec)``) or
            :func:`decode_joint`.
        """
        if self.action_face == "joint":
            actions = decode_joint(actions, self.num_envs, grid=self.grid)
        expected = (self.num_envs, len(spec.ACTION_NVEC))
        checked = spec.check_actions(actions, expected, name="actions", nvec=self.grid.nvec)
        tensor = checked if isinstance(checked, torch.Tensor) else torch.from_numpy(checked)
        self._actions = tensor.to(device=self.device, dtype=torch.int64)

    def step_wait(self) -> VecEnvStepReturn:
        """Step every book, autoreset the finished ones and build SB3's infos.

        :return: ``(obs [N, D] float32, reward [N] float32, done [N] bool, infos)``; a finished book's
            info holds ``terminal_observation``, ``TimeLimit.truncated`` and ``episode`` {"r", "l", "t"},
            and its obs row is already the first observation of its next episode.
        """
        if self._actions is None:
            raise ValueError("step_wait() called without step_async(actions)")
        # the core's same-step autoreset; host_sync: reset only when a book finished (SB3 needs numpy anyway)
        obs, reward, terminated, truncated, info, final_obs = self.lob.step_autoreset(
            self._actions, host_sync=True
        )
        self._actions = None
        done = terminated | truncated
        timeout = truncated & ~terminated
        self.last_info_tensors = {**info, "TimeLimit.truncated": timeout}
        keys = list(info)
        # one device-to-host transfer for every info value (float64 holds the int64 step counts exactly),
        # then each column back to its dtype so bools stay bools and counts stay ints
        table = torch.stack([info[k].detach().to(torch.float64) for k in keys]).cpu().numpy()
        columns = [table[j].astype(_numpy_dtype(info[k].dtype)).tolist() for j, k in enumerate(keys)]
        infos: list[dict[str, Any]] = [
            dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)
        ]
        final_obs_np = final_obs.detach().cpu().numpy().astype(np.float32, copy=False)
        reward_np = reward.detach().cpu().numpy().astype(np.float32, copy=False)
        done_np = done.detach().cpu().numpy().astype(bool, copy=False)
        timeout_np = timeout.detach().cpu().numpy().astype(bool, copy=False)
        self._episode_return += reward_np
        self._episode_length += 1
        finished = np.flatnonzero(done_np)
        if finished.size:
            elapsed = round(time.time() - self._t_start, 6)
            for i in finished:  # only the books that finished this step
                infos[i]["terminal_observation"] = final_obs_np[i].copy()
                infos[i]["TimeLimit.truncated"] = bool(timeout_np[i])
                infos[i]["episode"] = {
                    "r": float(self._episode_return[i]), "l": int(self._episode_length[i]), "t": elapsed,
                }
            self._episode_return[finished] = 0.0
            self._episode_length[finished] = 0
        obs_np = obs.detach().cpu().numpy().astype(np.float32, copy=True)
        return obs_np, reward_np, done_np, infos

    def state_dict(self) -> dict[str, Any]:
        """The env's state: the book core's and the running episodes' statistics (for checkpoints).

        :return: a state for :meth:`load_state_dict`.
        """
        episode_return, episode_length = self.running_episode_stats()
        return {
            "identity": fingerprint.env_identity(self),
            "lob": self.lob.state_dict(),
            "episode_return": episode_return,
            "episode_length": episode_length,
            "elapsed": time.time() - self._t_start,
            "seeds": list(self._seeds),
            "options": list(self._options),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back a :meth:`state_dict` taken from an env of the same market, config and size.

        :param state: the state.
        :raises ValueError: when the state does not fit the env: taken on another market or with other
            settings (:func:`foxhunt.fingerprint.check_env_identity` names the field, old -> new), or the book
            core's layout differs (the core names it).
        """
        fingerprint.check_env_identity(state.get("identity"), self)
        if state["episode_return"].shape != (self.num_envs,):
            raise ValueError(
                f"the state's env has {state['episode_return'].shape[0]} books, this one {self.num_envs}"
            )
        self.lob.load_state_dict(state["lob"])
        self._episode_return[:] = state["episode_return"]
        self._episode_length[:] = state["episode_length"]
        self._t_start = time.time() - state["elapsed"]
        self._seeds = list(state["seeds"])
        self._options = list(state["options"])

    def running_episode_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """The running (unfinished) episodes' return and length.

        :return: ``([N] float64 returns, [N] int64 lengths)``.
        """
        return self._episode_return.copy(), self._episode_length.copy()

    def close(self) -> None:
        """Nothing to release (no subprocesses)."""

    # ----------------------------------------------------------------------------------- SB3 plumbing
    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seed the next :meth:`reset` (the batched core takes one seed for all books).

        :param seed: the seed; ``None`` draws one.
        :return: the per-env seeds ``seed + i`` (SB3's convention; the core uses ``seed``).
        """
        return super().seed(seed)

    def _indices(self, indices: VecEnvIndices) -> list[int]:
        chosen = list(self._get_indices(indices))
        bad = [i for i in chosen if not 0 <= int(i) < self.num_envs]
        if bad:
            raise ValueError(f"indices={indices!r} hold {bad}, outside [0, {self.num_envs})")
        return chosen

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Read an attribute of this env (or, failing that, of the book core), once per index.

        :param attr_name: the attribute, e.g. ``"n_market_features"``.
        :param indices: which envs (all by default).
        :return: the value, repeated for each index.
        """
        chosen = self._indices(indices)
        if hasattr(self, attr_name):
            value = getattr(self, attr_name)
        elif "lob" in vars(self) and hasattr(self.lob, attr_name):
            value = getattr(self.lob, attr_name)
        else:
            raise AttributeError(f"LOBVecEnv has no attribute {attr_name!r}")
        return [value for _ in chosen]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set an attribute on the book core when it has it, else on this env; all books share it.

        :param attr_name: the attribute.
        :param value: its new value.
        :param indices: must cover every env (None): the books are one batched object.
        """
        if sorted(self._indices(indices)) != list(range(self.num_envs)):
            raise ValueError(f"indices={indices!r}: set_attr applies to all {self.num_envs} books at once")
        target = self.lob if hasattr(self.lob, attr_name) and not hasattr(self, attr_name) else self
        setattr(target, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        """Call a method of the book core once and return its result for each index.

        :param method_name: a method of ``BatchedLOB``.
        :param method_args: positional arguments.
        :param indices: which envs get the result (all by default).
        :param method_kwargs: keyword arguments.
        :return: the result, repeated for each index.
        """
        chosen = self._indices(indices)
        method = getattr(self.lob, method_name, None)
        if method_name.startswith("_") or not callable(method):
            raise UnknownEnvMethodError(f"env_method: BatchedLOB has no public method {method_name!r}")
        result = method(*method_args, **method_kwargs)
        return [result for _ in chosen]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether the envs are wrapped by ``wrapper_class``: True only for ``Monitor``, whose episode
        statistics this env reports itself.

        :param wrapper_class: the wrapper class.
        :param indices: which envs.
        :return: one bool per index.
        """
        return [wrapper_class is Monitor for _ in self._indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Rendering is not supported.

        :return: one ``None`` per env.
        """
        return [None for _ in range(self.num_envs)]
