"""The device face of :class:`~foxhunt.envs.LOBVecEnv`: tensors in and out, for the device training loop.

:class:`DeviceLOBVecEnv` is a :class:`~foxhunt.envs.LOBVecEnv` (SB3's numpy face: ``reset``, ``step``,
``evaluate_policy``, ``save``/``load`` all work as before) that also implements
:class:`sb3_her_ext.device_vec_env.DeviceVecEnv`: :meth:`DeviceLOBVecEnv.step_tensors` steps the books on
``[N, 4]`` int64 action tensors with :meth:`foxenv.core.BatchedLOB.step_autoreset` and returns the
observations, rewards, dones, final observations, info tensors and the finished episodes' return and
length, all on the books' device. ``BranchingIQN.learn`` collects through it with
:mod:`sb3_her_ext.collect` (no host sync, no Python loop over books).

Episode statistics live on the device while the tensor face steps and in numpy while the numpy face steps;
either face hands them over to the other at its first step, so the two faces can be mixed.

On a CPU the autoreset draws new start offsets only at steps where a book finished, exactly as the numpy
face does (same seed, same episodes in both faces); on an accelerator it draws every step, with no host
sync (:meth:`~foxenv.core.BatchedLOB.step_autoreset`'s ``host_sync=False``), so the same seed gives other
episode starts there.

:meth:`DeviceLOBVecEnv.step_tensors_static` is the step a CUDA graph of the whole training block captures
(:mod:`sb3_her_ext.collect.block`): the same step, but every piece of state it changes (the books, the
running episode statistics) is written in place into tensors that stay put, so that replays of the graph
read and write the same memory; :meth:`DeviceLOBVecEnv.pin_static_state` puts the state back into those
tensors after any other step or reset replaced them.

With ``action_face="joint"`` the env takes one ``Discrete(81)`` action, the code ``27 d + 9 m + 3 o + u``
(``branch_names`` ``("action",)``): every face decodes the codes to the four branches with
:func:`foxhunt.envs.decode_joint` before the books step, the tensor faces on the device (static shapes; the
range checked where the core checks ranges, ``validate_actions``: on a CPU, never in a CUDA graph).

The env is a :class:`sb3_her_ext.counterfactual.CounterfactualEnv`: after
:meth:`DeviceLOBVecEnv.record_counterfactual_states` every step (either face, and the static step inside a
CUDA graph) puts each book's state before the step in its infos under
:data:`~sb3_her_ext.counterfactual.STATE_KEY` (``[N, 17]`` float64, :func:`foxenv.counterfactual.pack_state`),
and :meth:`DeviceLOBVecEnv.counterfactual_step` gives every action's outcome from stored states
(:class:`foxenv.counterfactual.CounterfactualStep`, bit for bit the env's own step).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn

from foxenv import spec
from foxenv.checks import check_device
from foxenv.counterfactual import STATE_DIM, CounterfactualStep, packed_state_of, unpack_state
from foxenv.data.market import MarketData
from foxhunt.envs import LOBVecEnv, decode_joint
from sb3_her_ext.counterfactual import STATE_KEY, CounterfactualOutcome
from sb3_her_ext.device_vec_env import TIMEOUT_KEY, DeviceStep

__all__ = ["DeviceLOBVecEnv"]


class DeviceLOBVecEnv(LOBVecEnv):
    """``num_envs`` books with SB3's numpy face and a tensor face on their device (see the module docstring).

    :param num_envs: number of books; >= 1.
    :param device: device of the books (and of every tensor of the tensor face).
    :param seed: as :class:`~foxhunt.envs.LOBVecEnv`.
    :param data: as :class:`~foxhunt.envs.LOBVecEnv`.
    :param compile: fuse the book step (and its autoreset) with ``torch.compile``
        (:meth:`~foxenv.core.BatchedLOB.enable_compile`): several times faster after a compile of seconds.
    :param cuda_graph: capture the book step with its autoreset in a CUDA graph
        (:meth:`~foxenv.core.BatchedLOB.enable_cuda_graph`; CUDA only).
    :param action_face: as :class:`~foxhunt.envs.LOBVecEnv`.
    :param env_kwargs: as :class:`~foxhunt.envs.LOBVecEnv`.
    :ivar counterfactual_state_dim: width of a stored state (:data:`foxenv.counterfactual.STATE_DIM`, 17).
    """

    counterfactual_state_dim: int = STATE_DIM

    def __init__(self, num_envs: int, device: str = "cpu", seed: int | None = None,
                 data: str | os.PathLike | MarketData = "synthetic", compile: bool = False,
                 cuda_graph: bool = False, action_face: str = "branched", **env_kwargs: Any) -> None:
        for field, value in (("compile", compile), ("cuda_graph", cuda_graph)):
            if not isinstance(value, bool):
                raise ValueError(f"{field}={value!r} must be a bool")
        if cuda_graph and check_device(device).type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, got device={device}")
        super().__init__(num_envs, device=device, seed=seed, data=data, action_face=action_face, **env_kwargs)
        # where a host sync is free (CPU), reset only at steps where a book finished, as the numpy face does
        self._host_sync = self.device.type == "cpu"
        #: the tensor faces' action range check where a host read would sync (foxenv.spec.ActionRangeFlag)
        self._action_flag = spec.ActionRangeFlag(self.device, joint=action_face == "joint",
                                                 nvec=self.grid.nvec)
        self._ep_return_t = torch.zeros(self.num_envs, dtype=torch.float64, device=self.device)
        self._ep_length_t = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._stats_on = "both"  # which face holds the running episode stats: "both", "numpy", "device"
        self._obs_t = torch.zeros(self.num_envs, self.observation_space.shape[0], dtype=torch.float32,
                                  device=self.device)
        #: the books' state tensors the last static step read and wrote (step_tensors_static)
        self._static_state: dict[str, torch.Tensor] | None = None
        #: (state tensors, obs, info tensors) before the first static step since the last pin: what a
        #: rollback restores
        self._static_rollback: tuple[dict[str, Any], torch.Tensor, dict[str, Any]] | None = None
        #: whether steps put the books' pre-step state in their infos (record_counterfactual_states)
        self._record_states = False
        #: the batched clone step of counterfactual_step (its tables made here: none in a graph capture)
        self._counterfactual = CounterfactualStep(self.lob)
        if compile:
            self.lob.enable_compile()
        if cuda_graph:
            self.lob.enable_cuda_graph()  # the core's state is a valid one (BatchedLOB resets on creation)

    # ----------------------------------------------------------------------------------- numpy face
    def reset(self) -> VecEnvObs:
        """Reset every book and both faces' episode stats (see :meth:`LOBVecEnv.reset`).

        :return: ``[num_envs, D]`` float32 observations.
        """
        self.check_action_flag()
        obs = super().reset()
        self._ep_return_t.zero_()
        self._ep_length_t.zero_()
        self._stats_on = "both"
        self._obs_t = torch.from_numpy(obs).to(self.device)
        return obs

    def step_wait(self) -> VecEnvStepReturn:
        """SB3's step (see :meth:`LOBVecEnv.step_wait`), after taking over the tensor face's episode stats.

        :return: ``(obs, reward, done, infos)`` as numpy.
        """
        self.check_action_flag()
        if self._stats_on == "device":
            self._episode_return[:] = self._ep_return_t.cpu().numpy()
            self._episode_length[:] = self._ep_length_t.cpu().numpy()
        self._stats_on = "numpy"
        before = self._state_before_step()
        obs, reward, done, infos = super().step_wait()
        self._obs_t = torch.from_numpy(obs).to(self.device)
        if before is not None:  # SB3's infos are one dict per env: one [17] row each
            self.last_info_tensors[STATE_KEY] = before
            for info, row in zip(infos, before.cpu().numpy(), strict=True):
                info[STATE_KEY] = row
        return obs, reward, done, infos

    # ----------------------------------------------------------------------------------- tensor face
    def current_obs(self) -> torch.Tensor:
        """``[N, D]`` float32 observations after the last reset or step of either face.

        :return: a tensor on :attr:`device`.
        """
        return self._obs_t

    def branch_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """The four-branch actions of a tensor face's ``actions``, checked as every foxenv face checks them:
        an integer dtype and the face's shape on the host; the range on the host where the core validates
        actions (the CPU), else in a device flag raised at the next sync point (:meth:`check_action_flag`: no
        host sync on an accelerator). On the joint face the ``[N]`` or ``[N, 1]`` codes are decoded on the
        device by :func:`~foxhunt.envs.decode_joint` (static shapes).

        :param actions: the actions the tensor face was given.
        :return: ``[N, 4]`` int64 actions on :attr:`device`.
        :raises ValueError: naming ``actions``, for a float, bool or badly shaped tensor, or (CPU) a value
            out of range.
        """
        joint = self.action_face == "joint"
        host_check = self.lob.validate_actions
        if joint and host_check:
            return decode_joint(actions.to(self.device) if isinstance(actions, torch.Tensor) else actions,
                                self.num_envs, check_range=True, grid=self.grid)
        values = spec.check_action_tensor(actions, self.num_envs, joint=joint).to(self.device, torch.int64)
        if host_check:
            spec.check_action_values(values, joint=joint, nvec=self.grid.nvec)
        else:
            values = self._action_flag.record(values)
        return decode_joint(values, self.num_envs, check_range=False, grid=self.grid) if joint else values

    def check_action_flag(self) -> None:
        """Raise the ``ValueError`` of the first out-of-range action a tensor step took on an accelerator (a
        sync; called at the env's sync points and the device loop's flushes)."""
        self._action_flag.raise_if_set()

    def step_tensors(self, actions: torch.Tensor) -> DeviceStep:
        """Step every book on ``actions`` with same-step autoreset (no host sync on an accelerator).

        :param actions: ``[N, 4]`` integer actions (any device; moved to the books' device); on the joint
            face ``[N]`` or ``[N, 1]`` codes (:meth:`branch_actions`).
        :return: the step (:class:`~sb3_her_ext.device_vec_env.DeviceStep`); ``infos`` holds the core's
            per-book info of the step before any reset plus ``TimeLimit.truncated``, and is also kept in
            :attr:`last_info_tensors`.
        """
        self._take_stats()
        branch = self.branch_actions(actions)
        before = self._state_before_step()
        result = self.lob.step_autoreset(branch, host_sync=self._host_sync)
        return self._device_step(*result, state=before)

    def _take_stats(self) -> None:
        """The tensor face takes the running episode statistics over (copied in place: the tensors stay)."""
        if self._stats_on == "numpy":
            self._ep_return_t.copy_(torch.from_numpy(self._episode_return))
            self._ep_length_t.copy_(torch.from_numpy(self._episode_length))
        self._stats_on = "device"

    def _device_step(self, obs: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor,
                     truncated: torch.Tensor, info: dict[str, torch.Tensor], final_obs: torch.Tensor,
                     state: torch.Tensor | None = None) -> DeviceStep:
        """The step's :class:`DeviceStep` (with ``state``, the books' pre-step state, under ``STATE_KEY``);
        the running episode statistics advance in place."""
        done = terminated | truncated
        infos = {**info, TIMEOUT_KEY: truncated & ~terminated}
        if state is not None:
            infos[STATE_KEY] = state
        self.last_info_tensors = infos
        # float64 sums of the float32 rewards, as the numpy face's Monitor-style stats
        episode_return = self._ep_return_t + reward.to(torch.float64)
        episode_length = self._ep_length_t + 1
        self._ep_return_t.copy_(episode_return.masked_fill(done, 0.0))
        self._ep_length_t.copy_(episode_length.masked_fill(done, 0))
        self._obs_t = obs
        return DeviceStep(obs, reward, done, final_obs, infos, episode_return, episode_length)

    # ----------------------------------------------------------------------------------- CUDA-graph face
    def step_tensors_static(self, actions: torch.Tensor) -> DeviceStep:
        """:meth:`step_tensors` as a CUDA graph captures it: the books' new state is copied back into the
        tensors the step read (so replays read and write the same memory), no graph of the core's own is
        replayed (graphs do not nest), and the start offsets are drawn inside, from the generators
        :meth:`graph_generators` lists. On a CPU (never captured) the same draws as :meth:`step_tensors`.

        :param actions: ``[N, 4]`` int64 actions on :attr:`device`, checked as :meth:`step_tensors` checks
            them; on the joint face ``[N]`` or ``[N, 1]`` codes (:meth:`branch_actions`).
        :return: the step, as :meth:`step_tensors`.
        """
        lob = self.lob
        actions = self.branch_actions(actions)
        self._take_stats()
        state = lob._state_tensors()
        before = self._state_before_step()  # a copy: the step below overwrites `state` in place
        if self._static_rollback is None:
            self._static_rollback = (dict(state), self._obs_t, self.last_info_tensors)
        if self._host_sync:
            result = lob.step_autoreset(actions, host_sync=True)
        else:
            result = lob._advance_autoreset_fn(actions, lob._draw_offsets())
        for key, value in lob._state_tensors().items():
            if value is not state[key]:
                state[key].copy_(value)
        lob._set_state_tensors(state)
        self._static_state = state
        return self._device_step(*result, state=before)

    # ----------------------------------------------------------------------------------- counterfactual face
    def record_counterfactual_states(self, record: bool = True) -> None:
        """From the next step on, put (or stop putting) each book's state before the step in the step's
        infos under :data:`~sb3_her_ext.counterfactual.STATE_KEY`: ``[N, 17]`` float64 in the tensor faces'
        infos and :attr:`last_info_tensors`, a ``[17]`` float64 array in each of the numpy face's info dicts.
        Off by default (then a step does no extra work).

        :param record: on or off.
        :raises ValueError: for a non-bool, or (turning it on) an env whose steps cannot be replayed exactly
            (:meth:`counterfactual_step`).
        """
        if not isinstance(record, bool):
            raise ValueError(f"record={record!r} must be a bool")
        if record:
            self._check_replayable()
        self._record_states = record

    def _state_before_step(self) -> torch.Tensor | None:
        """The books' packed state now (``[N, 17]`` float64, a new tensor) when recording, else None."""
        return packed_state_of(self.lob) if self._record_states else None

    def _check_replayable(self) -> None:
        """Refuse an env whose step the counterfactual step (the core's eager step) would not reproduce bit
        for bit: one with a compiled step (:meth:`~foxenv.core.BatchedLOB.enable_compile` rounds floats
        its own way)."""
        if self.lob._compiled_advance is not None or self.lob._compiled_advance_autoreset is not None:
            raise ValueError("compile=True: the compiled book step may differ from the eager counterfactual "
                             "step in the last bits of floats, so its transitions cannot be replayed "
                             "exactly; make the env with compile=False for counterfactual replay")

    def counterfactual_step(self, states: torch.Tensor, actions: torch.Tensor) -> CounterfactualOutcome:
        """Every given action's outcome from every stored state: ``B * K`` clones of the books stepped once
        (:class:`foxenv.counterfactual.CounterfactualStep`), bit for bit what the env's own step gave or
        would have given (no autoreset, no host sync on an accelerator: capturable in a CUDA graph; on a
        CPU the actions' range and the states' market rows are checked).

        :param states: ``[B, 17]`` float64 states as the env put them under ``STATE_KEY``.
        :param actions: ``[B, K, NB]`` int64 actions of the env's action face: four branches, or (joint
            face, ``NB = 1``) joint codes.
        :return: ``next_obs [B, K, D]`` float32 (the step's own observation, ``final_obs``), ``reward [B,
            K]`` float32, ``terminated [B, K]`` bool (a time-limit truncation is not a termination).
        :raises ValueError: naming the argument, for a wrong type, dtype or shape (or, on a CPU, a value out
            of range); for an env that cannot be replayed exactly (``compile=True``).
        """
        self._check_replayable()
        state = unpack_state(states, "states")
        if state.books.ndim != 2:
            raise ValueError(f"states shape {tuple(states.shape)} must be [B, {STATE_DIM}]")
        n_branches = 1 if self.action_face == "joint" else len(self.grid.nvec)
        if not isinstance(actions, torch.Tensor):
            raise ValueError(f"actions of type {type(actions).__name__} must be a torch.Tensor")
        if actions.ndim != 3 or actions.shape[0] != states.shape[0] or actions.shape[2] != n_branches:
            raise ValueError(f"actions shape {tuple(actions.shape)} must be [{states.shape[0]}, K, "
                             f"{n_branches}] ({self.action_face} face)")
        step = self._counterfactual
        if self.action_face == "joint":
            codes = actions.reshape(-1)
            branch = decode_joint(codes, codes.shape[0], check_range=step.validate, grid=self.grid)
            actions = branch.reshape(actions.shape[0], actions.shape[1], -1)
        out = step(state, actions)
        return CounterfactualOutcome(next_obs=out.obs, reward=out.reward, terminated=out.terminated)

    def pin_static_state(self, rollback: bool = False) -> None:
        """Before a replay of a graph holding :meth:`step_tensors_static`: make the tensors it reads hold the
        books' current state (a reset or another step may have replaced them).

        :param rollback: first undo the static steps since the last pin that never ran (a failed capture:
            their device work was recorded, not done).
        """
        lob = self.lob
        self._take_stats()  # the numpy face may have stepped since
        if rollback and self._static_rollback is not None:
            state, obs, infos = self._static_rollback
            lob._set_state_tensors(state)
            self._obs_t, self.last_info_tensors = obs, infos
        self._static_rollback = None
        static = self._static_state
        if static is None:
            return
        current = lob._state_tensors()
        if any(current[key] is not static[key] for key in static):
            for key, value in current.items():
                static[key].copy_(value)
            lob._set_state_tensors(static)

    def set_current_obs(self, obs: torch.Tensor, infos: dict[str, torch.Tensor] | None = None) -> None:
        """After a graph replay: the env's current observations are ``obs``, a tensor the graph writes (a
        replay runs no Python, so the step's own assignments happened only at capture).

        :param obs: ``[N, D]`` float32 on :attr:`device`; the caller changes it in place only by stepping.
        :param infos: the last step's info tensors (:attr:`last_info_tensors`); None: unchanged.
        """
        self._obs_t = obs
        if infos is not None:
            self.last_info_tensors = infos

    def graph_generators(self) -> list[torch.Generator]:
        """The generators :meth:`step_tensors_static` draws from (a CUDA graph registers them).

        :return: the core's generator.
        """
        return [self.lob._generator]

    def state_dict(self) -> dict[str, Any]:
        """:meth:`LOBVecEnv.state_dict` plus the tensor face's current observations.

        :return: a state for :meth:`load_state_dict`.
        """
        self.check_action_flag()
        return {**super().state_dict(), "obs": self._obs_t.cpu().numpy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back a :meth:`state_dict`; both faces then hold the episode statistics.

        :param state: the state.
        """
        super().load_state_dict(state)
        self._ep_return_t.copy_(torch.from_numpy(self._episode_return))
        self._ep_length_t.copy_(torch.from_numpy(self._episode_length))
        self._stats_on = "both"
        self._obs_t = torch.as_tensor(state["obs"], dtype=torch.float32, device=self.device)

    def running_episode_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """The running (unfinished) episodes' return and length, read from whichever face holds them (a sync
        when the tensor face does).

        :return: ``([N] float64 returns, [N] int64 lengths)``.
        """
        self.check_action_flag()
        if self._stats_on == "device":
            # copies: on a CPU .numpy() would share the tensors, which the next step changes in place
            return self._ep_return_t.cpu().numpy().copy(), self._ep_length_t.cpu().numpy().copy()
        return self._episode_return.copy(), self._episode_length.copy()
