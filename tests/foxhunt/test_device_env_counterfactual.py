"""DeviceLOBVecEnv as a :class:`sb3_her_ext.counterfactual.CounterfactualEnv`: the pre-step states it
records in every face's infos, replayed through ``counterfactual_step`` with the logged action, give the
logged transition bit for bit (next observation, reward, terminated), over resets, truncations and
terminations, on both action faces, the trading and the execution task; all actions at once give
``[B, K, ...]`` whose logged slice is the log; on CUDA the same, and inside a CUDA graph as eagerly."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from foxenv.counterfactual import STATE_DIM, pack_state, packed_state_of, unpack_state
from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import encode_joint
from sb3_her_ext.counterfactual import STATE_KEY, is_counterfactual_env
from sb3_her_ext.device_vec_env import TIMEOUT_KEY
from tests.foxenv.counterfactual_checks import StickyPolicy, assert_same
from tests.foxenv.fake_market import random_market

SYNTHETIC = {"data": "synthetic", "num_steps": 800, "episode_length": 12}
#: planted signal, drawdown terminations, latency: the configs the replay must cover
CONFIGS = [
    pytest.param({**SYNTHETIC, "signal_strength": 2.0, "signal_horizon": 5, "max_drawdown": 3.0},
                 id="planted-drawdown"),
    pytest.param({**SYNTHETIC, "order_latency": 1, "fill_model": "optimistic", "inventory_penalty": 0.01},
                 id="latency-optimistic"),
    pytest.param({**SYNTHETIC, "action_grid": "wide", "max_drawdown": 5.0}, id="wide-grid"),
    pytest.param({**SYNTHETIC, "task": "execute"}, id="execute"),
]
PATHS = ["numpy", "tensors", "static"]


def make_env(num_envs: int, face: str, config: dict[str, Any], device: str = "cpu") -> DeviceLOBVecEnv:
    env = DeviceLOBVecEnv(num_envs, device=device, seed=3, action_face=face, **config)
    env.reset()
    env.record_counterfactual_states(True)
    return env


def face_actions(env: DeviceLOBVecEnv, branch: torch.Tensor) -> torch.Tensor:
    """``[N, NB]`` actions of the env's face for four-branch ``branch``."""
    if env.action_face == "joint":
        return encode_joint(branch, env.grid)[:, None]
    return branch


def every_action(env: DeviceLOBVecEnv, num_states: int) -> torch.Tensor:
    """``[B, K, NB]``: every joint code of the grid, in the face's form (the code is the column)."""
    codes = torch.arange(env.grid.joint_actions, device=env.device)
    weights = torch.tensor(env.grid.code_weights, device=env.device)
    nvec = torch.tensor(env.grid.nvec, device=env.device)
    actions = codes[:, None] if env.action_face == "joint" else (codes[:, None] // weights) % nvec
    return actions.expand(num_states, -1, -1)


def logged_step(env: DeviceLOBVecEnv, path: str, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One step on ``path``: ``(pre-step states, next obs, reward, terminated, truncated)`` as it logged
    them (the numpy face through SB3's per-env info dicts)."""
    if path == "numpy":
        obs, reward, done, infos = env.step(action.cpu().numpy())
        states = torch.from_numpy(np.stack([info[STATE_KEY] for info in infos]))
        final = np.stack([info.get("terminal_observation", row)
                          for info, row in zip(infos, obs, strict=True)])
        timeout = np.array([info.get(TIMEOUT_KEY, False) for info in infos])
        done = torch.from_numpy(done)
        timeout = torch.from_numpy(timeout)
        return states, torch.from_numpy(final), torch.from_numpy(reward), done & ~timeout, timeout
    step = env.step_tensors_static(action) if path == "static" else env.step_tensors(action)
    timeout = step.infos[TIMEOUT_KEY]
    return step.infos[STATE_KEY], step.final_obs, step.reward, step.done & ~timeout, timeout


def check_replay(env: DeviceLOBVecEnv, path: str, steps: int, seed: int = 0, all_every: int = 1) -> Counter:
    """Step the sticky policy; replay every logged step (and, every ``all_every`` steps, every action)."""
    policy = StickyPolicy(tuple(env.grid.nvec), env.num_envs, seed)
    books = torch.arange(env.num_envs, device=env.device)
    seen: Counter = Counter()
    for t in range(steps):
        branch = policy()
        action = face_actions(env, branch).to(env.device)
        states, next_obs, reward, terminated, truncated = logged_step(env, path, action)
        assert states.shape == (env.num_envs, STATE_DIM) and states.dtype == torch.float64
        out = env.counterfactual_step(states.to(env.device), action[:, None, :])
        assert_same("next_obs", out.next_obs[:, 0], next_obs.to(env.device))
        assert_same("reward", out.reward[:, 0], reward.to(env.device))
        assert_same("terminated", out.terminated[:, 0], terminated.to(env.device))
        if t % all_every == 0:
            every = every_action(env, env.num_envs)
            out = env.counterfactual_step(states.to(env.device), every)
            k = env.grid.joint_actions
            assert out.next_obs.shape == (env.num_envs, k, env.observation_space.shape[0])
            assert out.reward.shape == out.terminated.shape == (env.num_envs, k)
            column = encode_joint(branch, env.grid).to(env.device)
            assert_same("every next_obs", out.next_obs[books, column], next_obs.to(env.device))
            assert_same("every reward", out.reward[books, column], reward.to(env.device))
            assert_same("every terminated", out.terminated[books, column], terminated.to(env.device))
            seen["distinct rewards"] += int((out.reward != out.reward[:, :1]).any(1).sum())
        seen["terminated"] += int(terminated.sum())
        seen["truncated"] += int(truncated.sum())
    return seen


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("face", ["branched", "joint"])
@pytest.mark.parametrize("config", CONFIGS)
def test_a_replayed_state_gives_the_logged_transition(config: dict, face: str, path: str) -> None:
    env = make_env(6, face, config)
    seen = check_replay(env, path, 40, seed=len(path), all_every=3)
    assert seen["distinct rewards"] > 0, dict(seen)
    if config.get("task") == "execute":  # the parent is done at the window's end: terminated, never truncated
        assert seen["terminated"] > 0, dict(seen)
    else:
        assert seen["truncated"] > 0, dict(seen)
    if "max_drawdown" in config:
        assert seen["terminated"] > 0, dict(seen)


def test_the_replay_holds_on_a_hand_made_market_with_the_faces_mixed() -> None:
    """LOBSTER-free fake market; the numpy and tensor faces alternate on one env."""
    market = random_market(300, num_levels=5, seed=3)
    env = make_env(5, "branched", {"data": market, "levels": 5, "episode_length": 6, "max_position": 10.0})
    seen: Counter = Counter()
    for path in PATHS * 3:
        seen += check_replay(env, path, 7, seed=len(seen))
    assert seen["truncated"] > 0


def test_it_is_a_counterfactual_env_that_records_only_when_asked() -> None:
    env = DeviceLOBVecEnv(4, seed=0, **SYNTHETIC)
    assert is_counterfactual_env(env) and env.counterfactual_state_dim == STATE_DIM == 17
    env.reset()
    action = torch.zeros(4, 4, dtype=torch.int64)
    assert STATE_KEY not in env.step_tensors(action).infos
    assert STATE_KEY not in env.step_tensors_static(action).infos
    assert all(STATE_KEY not in info for info in env.step(action.numpy())[3])
    env.record_counterfactual_states(True)
    before = packed_state_of(env.lob)
    step = env.step_tensors(action)
    assert torch.equal(step.infos[STATE_KEY], before) and env.last_info_tensors[STATE_KEY] is step.infos[
        STATE_KEY]
    assert not torch.equal(step.infos[STATE_KEY], packed_state_of(env.lob))  # the pre-step one
    env.record_counterfactual_states(False)
    assert STATE_KEY not in env.step_tensors(action).infos


def test_pack_and_unpack_are_exact() -> None:
    env = DeviceLOBVecEnv(4, seed=0, **SYNTHETIC)
    env.reset()
    for _ in range(5):
        env.step_tensors(torch.ones(4, 4, dtype=torch.int64))
    packed = packed_state_of(env.lob)
    state = unpack_state(packed)
    core = env.lob._state_tensors()
    assert torch.equal(state.books, core["books"].T) and torch.equal(state.counters, core["counters"].T)
    assert torch.equal(pack_state(state), packed)
    big = unpack_state(torch.tensor([[0.0] * 14 + [2.0**53 - 1, 7.0, -1.0]], dtype=torch.float64))
    assert big.counters.tolist() == [[2**53 - 1, 7, -1]]


@pytest.mark.parametrize(("states", "actions", "message"), [
    (torch.zeros(2, 16, dtype=torch.float64), torch.zeros(2, 1, 4, dtype=torch.int64), "states shape"),
    (torch.zeros(2, 17, dtype=torch.float32), torch.zeros(2, 1, 4, dtype=torch.int64), "float64"),
    (torch.zeros(2, 17, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.int64), "actions shape"),
    (torch.zeros(2, 17, dtype=torch.float64), torch.zeros(3, 1, 4, dtype=torch.int64), r"\[2, K, 4\]"),
    (torch.zeros(2, 17, dtype=torch.float64), torch.zeros(2, 1, 4), "dtype"),
    (torch.zeros(2, 17, dtype=torch.float64), torch.full((2, 1, 4), 3), "actions holds 3"),
    (torch.full((2, 17), -1.0, dtype=torch.float64), torch.zeros(2, 1, 4, dtype=torch.int64), "offset"),
])
def test_bad_arguments_are_named(states: torch.Tensor, actions: torch.Tensor, message: str) -> None:
    env = DeviceLOBVecEnv(2, seed=0, **SYNTHETIC)
    with pytest.raises(ValueError, match=message):
        env.counterfactual_step(states, actions)


def test_bad_joint_codes_and_flags_are_named() -> None:
    env = DeviceLOBVecEnv(2, seed=0, action_face="joint", **SYNTHETIC)
    states = packed_state_of(env.lob)
    with pytest.raises(ValueError, match=r"\[2, K, 1\]"):
        env.counterfactual_step(states, torch.zeros(2, 1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="81"):
        env.counterfactual_step(states, torch.full((2, 1, 1), 81))
    with pytest.raises(ValueError, match="record=1"):
        env.record_counterfactual_states(1)


def test_a_compiled_env_is_refused_naming_compile() -> None:
    env = DeviceLOBVecEnv(2, seed=0, compile=True, **SYNTHETIC)
    with pytest.raises(ValueError, match="compile=True"):
        env.record_counterfactual_states(True)
    with pytest.raises(ValueError, match="compile=True"):
        env.counterfactual_step(packed_state_of(env.lob), torch.zeros(2, 1, 4, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("face", ["branched", "joint"])
@pytest.mark.parametrize("config", CONFIGS)
def test_the_replay_on_cuda_gives_the_logged_transition(config: dict, face: str) -> None:
    for path in PATHS:
        env = make_env(16, face, config, device="cuda")
        seen = check_replay(env, path, 30, seed=1, all_every=5)
        assert seen["truncated"] + seen["terminated"] > 0 and seen["distinct rewards"] > 0, dict(seen)


@pytest.mark.gpu
@pytest.mark.parametrize("face", ["branched", "joint"])
def test_the_counterfactual_step_in_a_cuda_graph_equals_eager(face: str) -> None:
    env = make_env(16, face, {**SYNTHETIC, "max_drawdown": 5.0}, device="cuda")
    policy = StickyPolicy(tuple(env.grid.nvec), env.num_envs, 0)
    logged = []
    for _ in range(30):
        action = face_actions(env, policy()).cuda()
        step = env.step_tensors_static(action)
        logged.append((step.infos[STATE_KEY].clone(), action))
    states = torch.cat([s for s, _ in logged])
    actions = every_action(env, states.shape[0]).contiguous()
    eager = env.counterfactual_step(states, actions)
    static_states, static_actions = states.clone(), actions.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        env.counterfactual_step(static_states, static_actions)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = env.counterfactual_step(static_states, static_actions)
    static_states.zero_()
    graph.replay()  # on zeroed states: the graph reads its inputs' memory
    static_states.copy_(states)
    graph.replay()
    torch.cuda.synchronize()
    for name in ("next_obs", "reward", "terminated"):
        assert_same(name, getattr(captured, name), getattr(eager, name))
    assert bool((eager.reward != eager.reward[:, :1]).any())
