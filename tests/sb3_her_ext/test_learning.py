"""BranchingIQN learns: a one-branch contextual bandit, and the LOB env (loss falls, hindsight fires)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from foxhunt import presets
from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.diagnostics import read_diagnostics


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny networks run faster on one thread, above all on a shared 2-core CI machine."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


class ContextBandit(gym.Env):
    """One-step episodes: the observation shows which of 3 actions pays 1 (the others pay 0).

    A uniformly random policy earns 1/3 per episode; the optimum is 1.
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.target = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, dtype=np.float32)
        obs[self.target] = 1.0
        return obs

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(3))
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.target)
        return self._obs(), reward, True, False, {}


@pytest.mark.slow
def test_one_branch_learns_a_contextual_bandit() -> None:
    env = DummyVecEnv([ContextBandit] * 4)
    model = BranchingIQN(
        "MlpPolicy", env, learning_rate=2e-3, learning_starts=100, batch_size=32,
        train_freq=1, gradient_steps=2, target_update_interval=100, exploration_fraction=0.5, seed=0,
        policy_kwargs=dict(net_arch=[32], n_ensemble=2, n_cos=16, n_quantiles=8, n_quantiles_target=8,
                           n_quantiles_act=8, n_atoms=21),
    )
    random_mean, _ = evaluate_policy(_RandomAgent(), Monitor(ContextBandit()), n_eval_episodes=300)
    model.learn(1200)
    learned_mean, _ = evaluate_policy(model, Monitor(ContextBandit()), n_eval_episodes=300)
    assert random_mean < 0.45  # about 1/3
    assert learned_mean > 0.9


class _RandomAgent:
    """Uniform random actions, with SB3's ``predict`` signature (for ``evaluate_policy``)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def predict(self, obs: np.ndarray, state=None, episode_start=None, deterministic: bool = False):
        return self.rng.integers(3, size=(len(obs),)), state


@pytest.mark.slow
def test_lob_loss_falls_and_hindsight_injects(tmp_path: Path) -> None:
    env = LOBVecEnv(4, seed=0, data="synthetic", num_steps=5000, episode_length=200)
    path = tmp_path / "diag.jsonl"
    model = BranchingIQN(
        "MlpPolicy", env, learning_rate=3e-4, learning_starts=200, batch_size=32, train_freq=1,
        target_update_interval=400, seed=0, diagnostics_path=str(path), diagnostics_interval=400,
        policy_kwargs=dict(net_arch=[32, 32], n_ensemble=2, n_cos=16, n_quantiles=8, n_quantiles_target=8,
                           n_quantiles_act=8, n_atoms=21, **presets.trading_policy_kwargs()),
        **presets.trading_algorithm_kwargs(),
    )
    model.learn(2400)
    lines = read_diagnostics(path)
    assert len(lines) == 6
    first, last = lines[0], lines[-1]
    assert last["l_q"] < 0.5 * first["l_q"]
    assert last["l_c51"] < first["l_c51"]
    kinds = ("backward", "forward", "relabel")
    injected = {kind: sum(line["hindsight"][kind] for line in lines) for kind in kinds}
    assert sum(injected.values()) > 0, injected
    assert injected["relabel"] == 0  # the magnitude relabel is off by default (its rewards are not exact)
    # hindsight rows sit in the buffer beside the real ones: more rows than env transitions
    assert model.replay_buffer.size() > 2400
