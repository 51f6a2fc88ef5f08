"""A toy trading env with exogenous prices: a device vector env that is also a counterfactual env.

No foxhunt, no foxenv. A fixed price table (seeded) is the market; each episode starts at a random row
``m0`` and lasts ``horizon`` steps (then it terminates). The agent's state is ``(m, t, position)``:

* action: ``MultiDiscrete([3, 3])``, branch 0 the direction (short, flat, long), branch 1 the size
  (1, 2, 3); the target position is ``direction · size`` (so the size does nothing when flat); with
  ``joint=True`` one branch, ``Discrete(9)``, of code ``3 · direction + size``;
* reward: ``position' · Δ[m] − cost · |position' − position|`` where ``Δ[m]`` is the price change from
  row ``m`` to ``m + 1``;
* observation: ``(Δ[m], Δ[m + 1], position / 3, t / horizon)``: the next two changes are known; the rest
  are i.i.d. draws from ``CHANGES``, so the best policy given the observation is a small dynamic
  program (:func:`optimal_q`).

The market does not depend on the agent and a step draws no random numbers, so every action's outcome from
a stored state is exact (:meth:`ToyCounterfactualEnv.counterfactual_step`).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch as th
from gymnasium import spaces

from sb3_her_ext.counterfactual import STATE_KEY, CounterfactualOutcome
from sb3_her_ext.device_vec_env import TIMEOUT_KEY, DeviceStep
from tests.sb3_her_ext._host_vec_env import ToyVecEnv

#: the values a price change takes (equally likely, independent across rows)
CHANGES = (-1.0, -0.25, 0.25, 1.0)
DIRECTIONS = (-1.0, 0.0, 1.0)
SIZES = (1.0, 2.0, 3.0)


def target_position(actions: th.Tensor, positions: th.Tensor | None = None) -> th.Tensor:
    """``[..., 2]`` int64 actions (or ``[..., 1]`` joint codes) -> ``[...]`` float64 target positions
    ``direction · size``.

    :param positions: ``[9]`` the positions of the joint codes on the actions' device (made here if None;
        an env passes its own, as a CUDA graph capture cannot copy from the host).
    """
    if positions is None:
        positions = th.tensor([d * s for d in DIRECTIONS for s in SIZES], dtype=th.float64,
                              device=actions.device)
    codes = actions[..., 0] if actions.shape[-1] == 1 else actions[..., 0] * 3 + actions[..., 1]
    return positions[codes]


class ToyCounterfactualEnv(ToyVecEnv):
    """The toy market (module docstring) with SB3's numpy face and the device and counterfactual faces.

    :param n_envs: number of envs.
    :param device: device of the tensor faces.
    :param seed: seed of the price table and of the episode starts.
    :param horizon: steps per episode (the last one terminates).
    :param cost: cost per unit of position traded.
    :param n_rows: rows of the price table.
    :param joint: one branch of 9 joint codes instead of two branches.
    """

    def __init__(self, n_envs: int, device: str = "cpu", seed: int = 0, horizon: int = 8, cost: float = 0.3,
                 n_rows: int = 4096, joint: bool = False) -> None:
        self.render_mode = None
        action_space = spaces.Discrete(9) if joint else spaces.MultiDiscrete([3, 3])
        super().__init__(n_envs, spaces.Box(-1.0, 1.0, (4,), np.float32), action_space)
        self.n_branches = 1 if joint else 2
        self.device = th.device(device)
        self.horizon, self.cost, self.n_rows = horizon, cost, n_rows
        table = np.random.default_rng(seed).choice(CHANGES, n_rows + 2)
        self.changes = th.tensor(table, dtype=th.float64, device=self.device)
        self.positions = target_position(th.arange(9, device=self.device)[:, None])
        self.generator = th.Generator(device=self.device).manual_seed(seed + 1)
        #: ``[N, 3]`` float64 state ``(m, t, position)`` of each env
        self.state = th.zeros(n_envs, 3, dtype=th.float64, device=self.device)
        self._return = th.zeros(n_envs, dtype=th.float64, device=self.device)
        self._record = False
        self._actions: th.Tensor | None = None
        self._restart(th.ones(n_envs, dtype=th.bool, device=self.device))

    counterfactual_state_dim = 3

    # ------------------------------------------------------------------ the dynamics (one place)

    def observe(self, state: th.Tensor) -> th.Tensor:
        """``[..., 3]`` states -> ``[..., 4]`` float32 observations."""
        m = state[..., 0].long()
        return th.stack([self.changes[m], self.changes[m + 1], state[..., 2] / 3.0,
                         state[..., 1] / self.horizon], dim=-1).float()

    def transition(self, state: th.Tensor, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """``[..., 3]`` states and ``[..., 2]`` actions -> next states, float32 rewards, terminated flags."""
        position = target_position(actions, self.positions)
        reward = position * self.changes[state[..., 0].long()] - self.cost * (position - state[..., 2]).abs()
        next_state = th.stack([state[..., 0] + 1, state[..., 1] + 1, position], dim=-1)
        return next_state, reward.float(), next_state[..., 1] >= self.horizon

    def _restart(self, where: th.Tensor) -> None:
        starts = th.randint(0, self.n_rows - self.horizon, (self.num_envs,), generator=self.generator,
                            device=self.device).double()
        fresh = th.stack([starts, th.zeros_like(starts), th.zeros_like(starts)], dim=-1)
        self.state = th.where(where[:, None], fresh, self.state)

    # ------------------------------------------------------------------ the counterfactual face

    def record_counterfactual_states(self, record: bool = True) -> None:
        self._record = bool(record)

    def counterfactual_step(self, states: th.Tensor, actions: th.Tensor) -> CounterfactualOutcome:
        k = actions.shape[1]
        next_state, reward, terminated = self.transition(states[:, None, :].expand(-1, k, -1), actions)
        return CounterfactualOutcome(self.observe(next_state), reward, terminated)

    # ------------------------------------------------------------------ the device face

    def current_obs(self) -> th.Tensor:
        return self.observe(self.state)

    def step_tensors(self, actions: th.Tensor) -> DeviceStep:
        before = self.state
        next_state, reward, done = self.transition(before, actions)
        final_obs = self.observe(next_state)
        episode_return = self._return + reward.double()
        length = next_state[:, 1].long()
        self.state = next_state
        self._return = episode_return.masked_fill(done, 0.0)
        self._restart(done)
        infos = {TIMEOUT_KEY: th.zeros_like(done)}
        if self._record:
            infos[STATE_KEY] = before
        return DeviceStep(self.observe(self.state), reward, done, final_obs, infos, episode_return, length)

    # ------------------------------------------------------------------ SB3's numpy face

    def reset(self) -> np.ndarray:
        self._return.zero_()
        self._restart(th.ones(self.num_envs, dtype=th.bool, device=self.device))
        return self.current_obs().cpu().numpy().copy()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = th.as_tensor(np.asarray(actions).reshape(self.num_envs, self.n_branches),
                                     device=self.device)

    def step_wait(self) -> tuple:
        assert self._actions is not None
        step = self.step_tensors(self._actions.long())
        done = step.done.cpu().numpy()
        states = step.infos[STATE_KEY].cpu().numpy() if STATE_KEY in step.infos else None
        infos: list[dict] = [{} if states is None else {STATE_KEY: states[i]} for i in range(self.num_envs)]
        for i in np.flatnonzero(done):
            infos[i].update(terminal_observation=step.final_obs[i].cpu().numpy(),
                            episode={"r": float(step.episode_return[i]), "l": int(step.episode_length[i]),
                                     "t": 0.0})
        return step.obs.cpu().numpy().copy(), step.reward.cpu().numpy().copy(), done, infos


# ---------------------------------------------------------------------- the optimum


def all_actions() -> th.Tensor:
    """``[9, 2]`` every joint action, branch 1 fastest."""
    return th.tensor(list(itertools.product(range(3), range(3))), dtype=th.int64)


def optimal_q(env: ToyCounterfactualEnv) -> np.ndarray:
    """``Q*[t, position index, Δ index, Δ' index, action]``: the undiscounted optimum given the observation
    (the changes after the next two i.i.d. uniform on :data:`CHANGES`), by backward induction."""
    positions = sorted({d * s for d in DIRECTIONS for s in SIZES})
    index = {p: i for i, p in enumerate(positions)}
    targets = target_position(all_actions()).tolist()
    n_c = len(CHANGES)
    q = np.zeros((env.horizon, len(positions), n_c, n_c, len(targets)))
    value_next = np.zeros((len(positions), n_c, n_c))  # V at t + 1 (0 after the horizon)
    for t in reversed(range(env.horizon)):
        for (ip, p), (i0, d0), (i1, _) in itertools.product(enumerate(positions), enumerate(CHANGES),
                                                            enumerate(CHANGES)):
            for a, target in enumerate(targets):
                later = value_next[index[target], i1].mean() if t + 1 < env.horizon else 0.0
                q[t, ip, i0, i1, a] = target * d0 - env.cost * abs(target - p) + later
        value_next = q[t].max(axis=-1)
    return q


def greedy_return(env: ToyCounterfactualEnv, policy, starts: np.ndarray) -> float:
    """Mean undiscounted return of ``policy`` (``[n, 4]`` float32 observations -> ``[n, 2]`` actions) over
    episodes from the rows ``starts``, stepped all at once on the env's dynamics."""
    state = th.tensor(np.stack([starts, np.zeros_like(starts), np.zeros_like(starts)], axis=1),
                      dtype=th.float64, device=env.device)
    total = th.zeros(len(starts), dtype=th.float64, device=env.device)
    for _ in range(env.horizon):
        actions = th.as_tensor(np.asarray(policy(env.observe(state).cpu().numpy())), device=env.device)
        state, reward, _ = env.transition(state, actions.reshape(len(starts), -1).long())
        total += reward.double()
    return float(total.mean())


def optimal_policy(env: ToyCounterfactualEnv):
    """The greedy policy of :func:`optimal_q` (observations -> ``[n, 2]`` actions)."""
    q = optimal_q(env)
    positions = sorted({d * s for d in DIRECTIONS for s in SIZES})
    actions = all_actions().numpy()

    def policy(obs: np.ndarray) -> np.ndarray:
        t = np.rint(obs[:, 3] * env.horizon).astype(int)
        ip = np.searchsorted(positions, np.rint(obs[:, 2] * 3.0))
        i0, i1 = (np.searchsorted(CHANGES, obs[:, j].astype(np.float64)) for j in (0, 1))
        return actions[q[t, ip, i0, i1].argmax(axis=-1)]

    return policy
