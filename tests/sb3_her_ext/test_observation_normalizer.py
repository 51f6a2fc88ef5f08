"""BranchingIQN's observation standardisation: fitted once on the replay rows, saved, identity until then."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_her_ext import BranchingIQN
from sb3_her_ext.networks import BranchingQNetwork

NET = dict(obs_dim=5, n_market_features=3, action_dims=[3, 2], bottleneck_dims=[4, 4], net_arch=[8],
           n_ensemble=2, n_cos=4, n_atoms=5)
TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)


class ScaledEnv(gym.Env):
    """Features of very different scales (offset 500 and spread 100 on feature 0, 0.01 on feature 2)."""

    SCALES = np.array([100.0, 1.0, 0.01, 5.0], dtype=np.float32)
    OFFSETS = np.array([500.0, 0.0, 0.0, -20.0], dtype=np.float32)

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = spaces.MultiDiscrete([3, 2])
        self.t = 0

    def _obs(self) -> np.ndarray:
        return (self.OFFSETS + self.SCALES * self.np_random.standard_normal(4)).astype(np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), float(action[0] == 2), False, self.t >= 10, {}


def tiny_model(**kwargs) -> BranchingIQN:
    env = DummyVecEnv([ScaledEnv, ScaledEnv])
    env.seed(0)
    policy = {**TINY_POLICY, **kwargs.pop("policy_kwargs", {})}
    return BranchingIQN("MlpPolicy", env, learning_starts=60, batch_size=16, buffer_size=1000, train_freq=2,
                        target_update_interval=50, seed=0, device="cpu", policy_kwargs=policy, **kwargs)


def test_network_standardises_what_it_reads() -> None:
    th.manual_seed(0)
    normalized = BranchingQNetwork(**NET, normalize_observations=True)
    raw = BranchingQNetwork(**NET, normalize_observations=False)
    raw.load_state_dict({k: v for k, v in normalized.state_dict().items() if not k.startswith("obs_")})
    obs = th.randn(64, 5) * th.tensor([50.0, 1.0, 0.1, 3.0, 0.0]) + th.tensor([10.0, 0, 0, 7.0, 2.0])
    assert not normalized.observation_normalizer_fitted
    th.testing.assert_close(normalized.branch_features(obs), raw.branch_features(obs))  # identity before
    normalized.fit_observation_normalizer(obs)
    assert normalized.observation_normalizer_fitted and bool(normalized.obs_normalizer_fitted)
    mean, std = obs.double().mean(0), obs.double().std(0, unbiased=False)
    th.testing.assert_close(normalized.obs_shift, mean.float())
    # the constant feature 4 is only shifted (its std is 0)
    expected_scale = th.where(std > 1e-6, 1.0 / std, th.ones_like(std)).float()
    th.testing.assert_close(normalized.obs_scale, expected_scale)
    standardized = (obs - mean.float()) * expected_scale
    th.testing.assert_close(normalized.branch_features(obs), raw.branch_features(standardized))
    assert standardized[:, :4].std(0, unbiased=False).sub(1).abs().max() < 1e-4


def test_fit_rejects_bad_input() -> None:
    net = BranchingQNetwork(**NET, normalize_observations=True)
    with pytest.raises(ValueError, match="observations.shape"):
        net.fit_observation_normalizer(th.zeros(1, 5))
    with pytest.raises(ValueError, match="observations.shape"):
        net.fit_observation_normalizer(th.zeros(10, 4))
    with pytest.raises(ValueError, match="normalize_observations=False"):
        BranchingQNetwork(**NET).fit_observation_normalizer(th.zeros(10, 5))


def test_learn_fits_once_on_the_warmup_rows_and_the_target_matches() -> None:
    model = tiny_model()
    assert model.policy.observation_normalizer_pending
    model.learn(60)  # only warm-up rows: no gradient step yet, nothing fitted
    assert model.policy.observation_normalizer_pending
    model.learn(100, reset_num_timesteps=False)
    q_net, target = model.policy.q_net, model.policy.q_net_target
    assert not model.policy.observation_normalizer_pending
    # fitted on the 60 warm-up rows (+ the first rollout's) of the buffer: centred near the env's offsets
    assert abs(float(q_net.obs_shift[0]) - 500.0) < 40.0
    assert 50.0 < 1.0 / float(q_net.obs_scale[0]) < 150.0
    assert 0.005 < 1.0 / float(q_net.obs_scale[2]) < 0.02
    th.testing.assert_close(target.obs_shift, q_net.obs_shift)
    th.testing.assert_close(target.obs_scale, q_net.obs_scale)
    shift = q_net.obs_shift.clone()
    model.learn(100, reset_num_timesteps=False)
    assert th.equal(q_net.obs_shift, shift)  # fitted once, frozen after


def test_save_load_keeps_the_fit(tmp_path: Path) -> None:
    model = tiny_model()
    model.learn(120)
    obs = np.stack([ScaledEnv().reset(seed=k)[0] for k in range(8)])
    before, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "m.zip")
    loaded = BranchingIQN.load(tmp_path / "m.zip", device="cpu")
    assert not loaded.policy.observation_normalizer_pending
    th.testing.assert_close(loaded.policy.q_net.obs_shift, model.policy.q_net.obs_shift)
    after, _ = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(before, after)


def test_a_network_saved_without_the_normalizer_loads_as_trained() -> None:
    old = BranchingQNetwork(**NET, normalize_observations=False)
    new = BranchingQNetwork(**NET, normalize_observations=True)
    new.load_state_dict(old.state_dict())  # strict: the missing buffers are filled, not reported
    assert new.observation_normalizer_fitted  # never refitted: it keeps computing what it was trained on
    obs = th.randn(16, 5) * 30
    th.testing.assert_close(new.branch_features(obs), old.branch_features(obs))


def test_off_feeds_raw_observations() -> None:
    model = tiny_model(policy_kwargs={"normalize_observations": False})
    assert not model.policy.observation_normalizer_pending
    assert not hasattr(model.policy.q_net, "obs_shift")
    model.learn(120)
    assert "q_net.obs_shift" not in model.policy.state_dict()
