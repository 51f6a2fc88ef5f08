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
:class:`FlatActionVecEnv` shows the four-branch action as one ``Discrete(81)`` for SB3 DQN and QR-DQN.
"""

from __future__ import annotations

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
    VecEnvWrapper,
)

from foxenv import spec
from foxenv.config import EnvConfig, is_whole
from foxenv.factory import DataSource, action_space_of, make_core, observation_space_of


def _numpy_dtype(dtype: torch.dtype) -> type:
    if dtype == torch.bool:
        return np.bool_
    return np.float64 if dtype.is_floating_point else np.int64


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
    :param env_kwargs: ``config`` (a base ``EnvConfig``), ``foxenv.config.EnvConfig`` fields and
        ``foxenv.data.load_market`` keyword arguments (``levels`` goes to both; ``market_seed`` is
        ``load_market``'s ``seed``); anything else raises ``ValueError``. The core is built by
        :func:`foxenv.factory.make_core`, as for the Gymnasium faces.
    """

    def __init__(self, num_envs: int, device: str = "cpu", seed: int | None = None,
                 data: DataSource = "synthetic", **env_kwargs: Any) -> None:
        if not is_whole(num_envs) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be an integer >= 1")
        num_envs = int(num_envs)
        self.device = torch.device(device)
        self.lob = make_core(data, num_envs, device=self.device, seed=seed, **env_kwargs)
        self.config: EnvConfig = self.lob.config
        self.render_mode = None
        super().__init__(num_envs, observation_space_of(self.lob), action_space_of(self.lob))
        self.n_market_features = int(self.lob.n_market_features)
        self.reward_scale = float(self.config.reward_scale)
        self.branch_names = spec.BRANCH_NAMES
        self.magnitudes = tuple(float(m) for m in spec.MAGNITUDES)
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

        :param actions: ``[num_envs, n_branches]`` integer actions (numpy or torch).
        :raises ValueError: naming ``actions`` and the value, as :func:`foxenv.spec.check_actions` (the
            rules of every foxenv face: integers, exactly ``(num_envs, 4)``, each in ``[0, nvec)``).
        """
        expected = (self.num_envs, len(spec.ACTION_NVEC))
        checked = spec.check_actions(actions, expected, name="actions")
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
        :raises ValueError: when the state does not fit the env (the book core names what differs).
        """
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


#: Weights of the flattened action code ``27 d + 9 m + 3 o + u`` (the decoding of
#: :class:`foxhunt.evaluation.baselines.ModelPolicy`): direction, magnitude, order, urgency.
FLAT_ACTION_WEIGHTS: tuple[int, ...] = (27, 9, 3, 1)


def _flat_weights() -> np.ndarray:
    nvec = np.asarray(spec.ACTION_NVEC, dtype=np.int64)
    weights = np.cumprod(np.concatenate([nvec[1:], [1]])[::-1])[::-1]
    if tuple(int(w) for w in weights) != FLAT_ACTION_WEIGHTS:  # foxenv's action changed shape
        raise ValueError(f"foxenv.spec.ACTION_NVEC={tuple(spec.ACTION_NVEC)} does not fit the 81 flat codes")
    return weights


def flatten_actions(actions: np.ndarray) -> np.ndarray:
    """Branch actions ``[..., 4]`` to flat codes ``27 d + 9 m + 3 o + u`` ``[...]`` (int64).

    :param actions: integer actions, each branch in ``[0, 3)``.
    :return: the codes, in ``[0, 81)``.
    """
    actions = np.asarray(actions, dtype=np.int64)
    if actions.shape[-1:] != (len(FLAT_ACTION_WEIGHTS),):
        raise ValueError(f"actions has shape {actions.shape}; its last axis must hold the 4 branches")
    return actions @ _flat_weights()


def unflatten_actions(codes: np.ndarray) -> np.ndarray:
    """Flat codes ``[...]`` in ``[0, 81)`` to branch actions ``[..., 4]`` (int64): the inverse of
    :func:`flatten_actions`.

    :param codes: integer codes.
    :return: ``(direction, magnitude, order, urgency)`` per code.
    :raises ValueError: naming ``codes`` when one lies outside ``[0, 81)`` or is not an integer.
    """
    raw = np.asarray(codes)
    if raw.dtype.kind not in "iu" and not (raw.dtype.kind == "f" and np.all(raw == np.round(raw))):
        raise ValueError(f"codes={codes!r} must be integers")
    codes = raw.astype(np.int64)
    n = int(np.prod(spec.ACTION_NVEC))
    if codes.size and (codes.min() < 0 or codes.max() >= n):
        raise ValueError(f"codes hold values outside [0, {n}): min {codes.min()}, max {codes.max()}")
    nvec = np.asarray(spec.ACTION_NVEC, dtype=np.int64)
    return (codes[..., None] // _flat_weights()) % nvec


#: The one branch of :class:`FlatActionVecEnv`'s ``Discrete(81)`` action.
FLAT_BRANCH_NAMES: tuple[str, ...] = ("action",)


class FlatActionVecEnv(VecEnvWrapper):
    """foxenv's ``MultiDiscrete([3, 3, 3, 3])`` action as one ``Discrete(81)``, for SB3 DQN and
    sb3-contrib QR-DQN (which take a single discrete action).

    Code ``27 d + 9 m + 3 o + u`` (direction, magnitude, order, urgency), the code
    :class:`foxhunt.evaluation.baselines.ModelPolicy` decodes, so a model trained here is evaluated as is.
    Observations, rewards, dones and infos pass through unchanged; attributes (``n_market_features``,
    ``last_info_tensors``, ...) are read from the wrapped env.

    :param venv: a :class:`LOBVecEnv` (or any VecEnv with foxenv's four-branch action).
    """

    def __init__(self, venv: VecEnv) -> None:
        nvec = tuple(int(n) for n in getattr(venv.action_space, "nvec", ()))
        if nvec != tuple(spec.ACTION_NVEC):
            raise ValueError(f"venv.action_space={venv.action_space} must be MultiDiscrete{spec.ACTION_NVEC}")
        super().__init__(venv, action_space=gym.spaces.Discrete(int(np.prod(nvec))))

    def reset(self) -> VecEnvObs:
        """Reset the wrapped env."""
        return self.venv.reset()

    def step_async(self, actions: np.ndarray) -> None:
        """Decode ``[num_envs]`` flat codes to ``[num_envs, 4]`` branch actions and pass them on.

        :param actions: the codes (numpy, a list, or a torch tensor), one per env.
        """
        if isinstance(actions, torch.Tensor):
            actions = actions.detach().cpu().numpy()
        codes = np.asarray(actions).reshape(-1)
        if codes.shape[0] != self.num_envs:
            raise ValueError(f"actions has {codes.shape[0]} codes for {self.num_envs} envs")
        self.venv.step_async(unflatten_actions(codes))

    def step_wait(self) -> VecEnvStepReturn:
        """The wrapped env's step."""
        return self.venv.step_wait()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        """The wrapped env's attribute, except ``branch_names``: this face has one branch, ``("action",)``."""
        if attr_name == "branch_names":
            return [FLAT_BRANCH_NAMES for _ in self._get_indices(indices)]
        return self.venv.get_attr(attr_name, indices)
