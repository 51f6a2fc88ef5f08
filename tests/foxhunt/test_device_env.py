"""DeviceLOBVecEnv: the tensor face equals the numpy face, the faces mix, and it stays an SB3 VecEnv."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv

from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv
from sb3_her_ext.device_vec_env import TIMEOUT_KEY, DeviceStep, DeviceVecEnv
from tests.foxenv.fake_market import random_market

PARAMS = {"levels": 5, "episode_length": 6, "max_position": 10.0}


@pytest.fixture(scope="module")
def market():
    return random_market(300, num_levels=5, seed=3)


def random_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 3, size=(n, 4))


def test_it_is_a_device_vec_env_and_an_sb3_vec_env(market):
    env = DeviceLOBVecEnv(3, seed=1, data=market, **PARAMS)
    assert isinstance(env, DeviceVecEnv) and isinstance(env, VecEnv) and isinstance(env, LOBVecEnv)
    assert not isinstance(LOBVecEnv(3, seed=1, data=market, **PARAMS), DeviceVecEnv)
    obs = env.reset()
    assert torch.equal(env.current_obs(), torch.from_numpy(obs))
    step = env.step_tensors(torch.ones(3, 4, dtype=torch.int64))
    assert isinstance(step, DeviceStep)
    assert step.obs.shape == (3, obs.shape[1]) and step.obs.dtype == torch.float32
    assert step.reward.shape == (3,) and step.reward.dtype == torch.float32
    assert step.done.dtype == torch.bool and step.infos[TIMEOUT_KEY].dtype == torch.bool
    assert step.episode_return.dtype == torch.float64 and step.episode_length.dtype == torch.int64
    assert env.last_info_tensors is step.infos and torch.equal(env.current_obs(), step.obs)


@pytest.mark.parametrize("field,value", [("compile", 1), ("cuda_graph", "yes")])
def test_bad_flags_name_field_and_value(market, field, value):
    with pytest.raises(ValueError, match=field):
        DeviceLOBVecEnv(2, data=market, **{field: value}, **PARAMS)


def test_cuda_graph_needs_cuda(market):
    with pytest.raises(ValueError, match="cuda_graph"):
        DeviceLOBVecEnv(2, device="cpu", data=market, cuda_graph=True, **PARAMS)


def test_tensor_face_equals_numpy_face(market):
    device_env = DeviceLOBVecEnv(5, seed=7, data=market, **PARAMS)
    numpy_env = LOBVecEnv(5, seed=7, data=market, **PARAMS)
    assert np.array_equal(device_env.reset(), numpy_env.reset())
    rng = np.random.default_rng(0)
    finished = 0
    for _ in range(20):
        actions = random_actions(rng, 5)
        step = device_env.step_tensors(torch.as_tensor(actions))
        obs, reward, done, infos = numpy_env.step(actions)
        assert np.array_equal(step.obs.numpy(), obs)
        assert np.array_equal(step.reward.numpy(), reward)
        assert np.array_equal(step.done.numpy(), done)
        np.testing.assert_array_equal(step.infos[TIMEOUT_KEY].numpy(),
                                      [info.get(TIMEOUT_KEY, False) for info in infos])
        for key in ("mid", "position", "trade_closed", "trade_pnl"):
            np.testing.assert_array_equal(step.infos[key].numpy(), [info[key] for info in infos])
        for i in np.flatnonzero(done):
            finished += 1
            assert np.array_equal(step.final_obs[i].numpy(), infos[i]["terminal_observation"])
            assert step.episode_return[i].item() == infos[i]["episode"]["r"]
            assert step.episode_length[i].item() == infos[i]["episode"]["l"]
        not_done = ~step.done
        assert torch.equal(step.final_obs[not_done], step.obs[not_done])
    assert finished >= 10


def test_faces_mix_and_hand_over_the_episode_stats(market):
    mixed = DeviceLOBVecEnv(4, seed=3, data=market, **PARAMS)
    numpy_env = LOBVecEnv(4, seed=3, data=market, **PARAMS)
    mixed.reset()
    numpy_env.reset()
    rng = np.random.default_rng(1)
    for t in range(15):
        actions = random_actions(rng, 4)
        _, reward, done, infos = numpy_env.step(actions)
        if t % 3 == 1:  # mid-episode switches between the faces
            step = mixed.step_tensors(torch.as_tensor(actions))
            assert np.array_equal(step.reward.numpy(), reward)
            for i in np.flatnonzero(done):
                assert step.episode_return[i].item() == infos[i]["episode"]["r"]
                assert step.episode_length[i].item() == infos[i]["episode"]["l"]
        else:
            _, mixed_reward, mixed_done, mixed_infos = mixed.step(actions)
            assert np.array_equal(mixed_reward, reward) and np.array_equal(mixed_done, done)
            for i in np.flatnonzero(done):
                assert mixed_infos[i]["episode"]["r"] == infos[i]["episode"]["r"]
                assert mixed_infos[i]["episode"]["l"] == infos[i]["episode"]["l"]
        returns, lengths = mixed.running_episode_stats()
        np.testing.assert_array_equal(returns, numpy_env._episode_return)
        np.testing.assert_array_equal(lengths, numpy_env._episode_length)


def test_evaluate_policy_runs_on_the_numpy_face(market):
    env = DeviceLOBVecEnv(2, seed=0, data=market, **PARAMS)

    class Flat:
        def predict(self, obs, state=None, episode_start=None, deterministic=True):
            return np.tile([1, 2, 0, 1], (len(obs), 1)), state

    mean, std = evaluate_policy(Flat(), env, n_eval_episodes=4)
    assert np.isfinite(mean) and np.isfinite(std)


@pytest.mark.gpu
def test_tensor_face_on_cuda_has_no_host_sync():
    env = DeviceLOBVecEnv(64, device="cuda", seed=0, data="synthetic", num_steps=600, episode_length=8,
                          cuda_graph=True)
    env.reset()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    actions = [torch.randint(0, 3, (64, 4), device="cuda", generator=gen) for _ in range(20)]
    env.step_tensors(actions[0])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for action in actions[1:]:
            step = env.step_tensors(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert step.obs.is_cuda and step.obs.shape == (64, env.observation_space.shape[0])
