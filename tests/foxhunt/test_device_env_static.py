"""DeviceLOBVecEnv's static face (the step a fused CUDA graph captures): the same steps as ``step_tensors``,
its state written in place into tensors that stay put, pinned back after other paths replaced them, rolled
back after a capture that never ran."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxhunt.device_lob_env import DeviceLOBVecEnv
from sb3_her_ext.device_vec_env import TIMEOUT_KEY
from tests.foxenv.fake_market import random_market

PARAMS = {"levels": 5, "episode_length": 6, "max_position": 10.0}


@pytest.fixture(scope="module")
def market():
    return random_market(300, num_levels=5, seed=3)


def pair(market) -> tuple[DeviceLOBVecEnv, ...]:
    envs = tuple(DeviceLOBVecEnv(5, seed=7, data=market, **PARAMS) for _ in range(2))
    for env in envs:
        env.reset()
    return envs


def test_the_static_step_equals_step_tensors_and_keeps_its_tensors(market):
    plain, static = pair(market)
    rng = np.random.default_rng(0)
    state = None
    for _ in range(20):  # episodes of 6 steps: resets included
        actions = torch.from_numpy(rng.integers(0, 3, size=(5, 4)))
        a, b = plain.step_tensors(actions), static.step_tensors_static(actions)
        for name in ("obs", "reward", "done", "final_obs", "episode_return", "episode_length"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.infos.keys() == b.infos.keys() and torch.equal(a.infos[TIMEOUT_KEY], b.infos[TIMEOUT_KEY])
        current = static.lob._state_tensors()
        if state is not None:  # the same tensors step after step, holding the new state
            assert all(current[key] is state[key] for key in state)
        state = current
        assert all(torch.equal(v, plain.lob._state_tensors()[k]) for k, v in current.items())
        assert torch.equal(static.current_obs(), plain.current_obs())
    assert np.array_equal(static.running_episode_stats()[0], plain.running_episode_stats()[0])


def test_pin_copies_a_replaced_state_into_the_static_tensors(market):
    _, env = pair(market)
    env.step_tensors_static(torch.ones(5, 4, dtype=torch.int64))
    static = env.lob._state_tensors()
    env.reset()  # replaces the core's state tensors
    assert any(env.lob._state_tensors()[k] is not v for k, v in static.items())
    fresh = {k: v.clone() for k, v in env.lob._state_tensors().items()}
    env.pin_static_state()
    pinned = env.lob._state_tensors()
    assert all(pinned[k] is static[k] and torch.equal(pinned[k], fresh[k]) for k in static)


def test_rollback_undoes_static_steps_since_the_last_pin(market):
    _, env = pair(market)
    env.step_tensors_static(torch.ones(5, 4, dtype=torch.int64))
    env.pin_static_state()
    before = {k: v.clone() for k, v in env.lob._state_tensors().items()}
    obs = env.current_obs()
    # a capture records these steps without running them; here they ran, so only the pointers go back
    env.step_tensors_static(torch.zeros(5, 4, dtype=torch.int64))
    env.pin_static_state(rollback=True)
    assert env.current_obs() is obs
    assert env.lob._state_tensors().keys() == before.keys()


def test_running_stats_are_copies(market):
    _, env = pair(market)
    env.step_tensors_static(torch.ones(5, 4, dtype=torch.int64))
    returns, lengths = env.running_episode_stats()
    kept = returns.copy(), lengths.copy()
    env.step_tensors_static(torch.ones(5, 4, dtype=torch.int64))
    assert np.array_equal(returns, kept[0]) and np.array_equal(lengths, kept[1])


def test_graph_generators_name_the_cores_generator(market):
    _, env = pair(market)
    assert env.graph_generators() == [env.lob._generator]


def test_set_current_obs_names_the_tensor_a_graph_writes(market):
    _, env = pair(market)
    obs = env.current_obs().clone()
    env.set_current_obs(obs)
    assert env.current_obs() is obs
    assert np.array_equal(env.state_dict()["obs"], obs.numpy())


@pytest.mark.gpu
def test_the_static_step_on_cuda_equals_step_tensors_without_a_host_sync():
    kwargs = dict(device="cuda", seed=0, data="synthetic", num_steps=600, episode_length=8, cuda_graph=True)
    plain, static = DeviceLOBVecEnv(64, **kwargs), DeviceLOBVecEnv(64, **kwargs)
    for env in (plain, static):
        env.reset()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    actions = [torch.randint(0, 3, (64, 4), device="cuda", generator=gen) for _ in range(30)]
    static.step_tensors_static(actions[0])
    plain.step_tensors(actions[0])
    torch.cuda.synchronize()
    steps = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for action in actions[1:]:  # episodes of 8 steps: same-step resets with offsets drawn inside
            steps.append((plain.step_tensors(action), static.step_tensors_static(action)))
            static.pin_static_state()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in steps:  # compared after: a comparison read on the host is a sync
        for name in ("obs", "reward", "done", "final_obs", "episode_return", "episode_length"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert static.lob._state_tensors()["books"] is static.lob._graph_state["books"]  # the core's graph's
