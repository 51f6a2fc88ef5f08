"""Replay keeps what it needs (issue 35 part 2): BranchingIQN on the device LOB env with
``counterfactual_state_dim=17`` stores each row's pre-step state; every stored row, restored through
``counterfactual_step`` with its stored action, gives its stored (next_obs, reward, done) bit for bit; the
buffer's save/load and a foxhunt resume keep the field bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch as th

import foxhunt.runs
from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.runs import RunConfig, resume, train
from sb3_her_ext import BranchingIQN
from sb3_her_ext.counterfactual import STATE_KEY
from tests.foxenv.counterfactual_checks import assert_same
from tests.foxhunt._small_runs import Crash, CrashAt, assert_same_model, small_config

ENV = {"data": "synthetic", "num_steps": 800, "episode_length": 20, "max_drawdown": 4.0}
MODEL = {"buffer_size": 400, "batch_size": 16, "learning_starts": 50, "target_update_interval": 50,
         "hindsight": False, "replay_buffer_kwargs": {"counterfactual_state_dim": 17},
         "policy_kwargs": {"net_arch": [32]}}


def make_model(face: str, seed: int = 0, **overrides: Any) -> BranchingIQN:
    env = DeviceLOBVecEnv(4, seed=seed, action_face=face, **ENV)
    env.record_counterfactual_states(True)
    return BranchingIQN("MlpPolicy", env, seed=seed, device="cpu", **{**MODEL, **overrides})


def check_rows(model: BranchingIQN) -> int:
    """Replay every stored row from its state with its action; return how many rows were checked."""
    buffer, env = model.replay_buffer, model.get_env()
    size = buffer.size()
    states = buffer.counterfactual_states[:size]
    assert states.shape == (size, 17) and states.dtype == th.float64
    out = env.counterfactual_step(states, buffer.actions[:size, None, :])
    assert_same("next_obs", out.next_obs[:, 0], buffer.next_observations[:size])
    assert_same("reward", out.reward[:, 0], buffer.rewards[:size])
    assert_same("done", out.terminated[:, 0].to(th.float32), buffer.dones[:size])
    return size


@pytest.mark.parametrize("face", ["branched", "joint"])
def test_every_stored_row_replays_to_its_transition_on_the_device_loop(face: str) -> None:
    model = make_model(face)
    model.learn(300)
    assert model.collector.block is not None  # the device loop (training blocks) stored the rows
    assert model._n_updates > 0
    assert check_rows(model) == model.num_timesteps >= 300
    assert bool(model.replay_buffer.dones.any())  # terminations (drawdown) among the rows
    batch = model.replay_buffer.sample(32)
    assert th.equal(batch.counterfactual_states, model.replay_buffer.counterfactual_states[batch.indices])


def test_every_stored_row_replays_to_its_transition_on_sb3s_loop() -> None:
    """SB3's own loop on the same env: the numpy face's per-env info dicts carry the states."""
    model = make_model("branched")
    model.collector.supports = lambda *args, **kwargs: False  # the device loop declines: SB3's loop runs
    model.learn(200)
    assert model.collector.block is None and model._n_updates > 0
    assert check_rows(model) == model.num_timesteps >= 200


def test_a_ring_that_wrapped_still_replays_and_save_load_keeps_the_states(tmp_path: Path) -> None:
    model = make_model("branched", buffer_size=150)
    model.learn(260)  # 260 rows into 150 slots
    assert model.replay_buffer.full and check_rows(model) == 150
    model.save_replay_buffer(tmp_path / "replay.pkl")
    other = make_model("branched", seed=1)
    other.load_replay_buffer(tmp_path / "replay.pkl")
    names = model.replay_buffer._tensor_names()
    assert "counterfactual_states" in names and other.replay_buffer._tensor_names() == names
    for name in names:
        assert th.equal(getattr(model.replay_buffer, name), getattr(other.replay_buffer, name)), name


def test_missing_states_are_named() -> None:
    env = DeviceLOBVecEnv(4, seed=0, **ENV)  # not recording
    model = BranchingIQN("MlpPolicy", env, seed=0, device="cpu", **MODEL)
    with pytest.raises(ValueError, match=rf"infos lack '{STATE_KEY}' \(counterfactual_state_dim=17\)"):
        model.learn(10)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> None:
    """foxhunt runs whose env records states and whose buffer stores them (the run config has no switch
    for it yet)."""
    make_env = foxhunt.runs.make_env
    kwargs = RunConfig.resolved_model_kwargs

    def recording_env(*args: Any, **kw: Any) -> Any:
        env = make_env(*args, **kw)
        env.record_counterfactual_states(True)
        return env

    def with_states(self: RunConfig) -> dict[str, Any]:
        return {**kwargs(self), "replay_buffer_kwargs": {"counterfactual_state_dim": 17}}

    monkeypatch.setattr(foxhunt.runs, "make_env", recording_env)
    monkeypatch.setattr(RunConfig, "resolved_model_kwargs", with_states)


def test_a_resumed_run_with_states_equals_the_uninterrupted_one(tmp_path: Path, recording: None) -> None:
    config = {"device_loop": True, "hindsight": False}
    whole = train(small_config(tmp_path / "whole", **config), callback=CrashAt(10**9))
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(small_config(out, **config), callback=CrashAt(470))
    resume(out, callback=CrashAt(10**9))
    assert_same_model(whole / "model.zip", out / "model.zip")
    buffers = []
    for run in (whole, out):
        model = BranchingIQN.load(run / "model.zip", device="cpu")
        model.load_replay_buffer(sorted((run / "checkpoints").glob("step_*"))[-1] / "replay_buffer.pkl")
        buffers.append(model.replay_buffer)
    assert buffers[0].counterfactual_state_dim == 17 and bool(buffers[0].counterfactual_states.any())
    for name in buffers[0]._tensor_names():
        assert th.equal(getattr(buffers[0], name), getattr(buffers[1], name)), name


@pytest.mark.gpu
@pytest.mark.parametrize("face", ["branched", "joint"])
def test_every_stored_row_replays_on_cuda_with_the_fused_graph(face: str) -> None:
    """The whole rollout as one CUDA graph (the static step records the states, the buffer stores them
    inside the graph); a seeded run has deterministic algorithms on."""
    env = DeviceLOBVecEnv(16, device="cuda", seed=0, cuda_graph=True, action_face=face, **ENV)
    env.record_counterfactual_states(True)
    model = BranchingIQN("MlpPolicy", env, seed=0, device="cuda", cuda_graph=True,
                         **{**MODEL, "buffer_size": 2_000, "learning_starts": 200})
    model.learn(1_600)
    block = model.collector.block
    assert block is not None and block.captures > 0 and block.failed is None, model.collector.capture_reason()
    assert check_rows(model) == model.num_timesteps >= 1_600
