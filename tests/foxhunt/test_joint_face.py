"""The joint action face (issue 16): BranchingIQN on one branch of 81 joint actions, through the whole app.

Presets and RunConfig on both faces (the default one and the other), the device env's joint
face against the branched one, training on either loop, resume, ``foxhunt train --action-face`` and
``foxhunt evaluate`` on a joint run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from foxhunt import presets
from foxhunt.cli import build_parser, config_from_args, main
from foxhunt.config import auto_values
from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import JOINT_BRANCH_NAMES, LOBVecEnv, decode_joint
from foxhunt.evaluation.baselines import ModelPolicy
from foxhunt.runs import RunConfig, make_env, resolve_action_face, resume, train
from sb3_her_ext.device_vec_env import TIMEOUT_KEY
from tests.foxenv.fake_market import random_market
from tests.foxhunt._small_runs import Crash as _Crash
from tests.foxhunt._small_runs import CrashAt as _CrashAt
from tests.foxhunt._small_runs import assert_same_model, small_config

PARAMS = {"levels": 5, "episode_length": 6, "max_position": 10.0}


@pytest.fixture(scope="module")
def market():
    return random_market(300, num_levels=5, seed=3)


# ------------------------------------------------------------------------------------------ presets


def test_face_presets_drop_the_per_branch_arguments_on_the_joint_face() -> None:
    sizes = {f"algorithm.{name}": value for name, value in presets.DEVICE_SIZES["cpu"].items()}
    branched = auto_values(RunConfig(action_face="branched"))
    assert branched == {**sizes, "cuda_graph": False, "device_loop": False, "env.market_seed": 0,
                        **presets.face_settings("branched")}
    model = RunConfig(action_face="branched").resolved_model_kwargs()
    branch_args = {name: model[name] for name in presets.BRANCHED_ALGORITHM_ARGS}
    assert branch_args == presets.trading_algorithm_kwargs()
    assert model["vaccine_interval"] == 5
    policy = RunConfig(action_face="branched").resolved_policy_kwargs()
    assert policy["bottleneck_dims"] == presets.BOTTLENECK_DIMS
    # no per-branch argument; the vaccine (which stratifies by one branch's three values) off
    assert presets.face_settings("joint") == {"hindsight": False, "algorithm.vaccine_interval": 0}
    assert "bottleneck_dims" not in RunConfig(action_face="joint").resolved_policy_kwargs()
    assert RunConfig(action_face="branched", hindsight=False).resolved_model_kwargs()["hindsight"] is False
    # hindsight on the joint face relabels the decoded branches (tests/foxhunt/test_joint_hindsight.py)
    assert RunConfig(action_face="joint", hindsight=True).resolved_hindsight() is True
    with pytest.raises(ValueError, match=r"action_face='flat'"):
        resolve_action_face("flat")


@pytest.mark.parametrize("face", presets.ACTION_FACES)
def test_either_face_resolves_its_settings(face: str) -> None:
    """A config that names no face has ``presets.ACTION_FACE``; either face resolves its own settings."""
    assert RunConfig().action_face == presets.ACTION_FACE
    config = RunConfig(action_face=face)
    default = face
    assert config.resolved_action_face() == default
    assert config.resolved_hindsight() is (default == "branched")
    model = config.resolved_model_kwargs()
    assert model["hindsight"] is (default == "branched")
    assert ("exploration_mults" in model) is (default == "branched")
    assert ("bottleneck_dims" in config.resolved_policy_kwargs()) is (default == "branched")
    # the other face is still reachable by name
    other = "joint" if default == "branched" else "branched"
    assert RunConfig(action_face=other).resolved_action_face() == other
    assert RunConfig(action_face="branched", hindsight=True).resolved_hindsight() is True


# ------------------------------------------------------------------------------------------ RunConfig


@pytest.mark.parametrize(("values", "message"), [
    ({"action_face": "flat"}, r"RunConfig.action_face='flat' must be one of \['branched', 'joint'\]"),
    ({"action_face": 3}, r"RunConfig.action_face=3 must be one of"),
    ({"hindsight": "yes"}, r"RunConfig.hindsight='yes' must be a bool or None"),
])
def test_run_config_validates_the_face(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig(**values)


def test_joint_run_config_resolves_and_round_trips(tmp_path: Path) -> None:
    config = RunConfig(action_face="joint", steps=50)
    assert config.resolved_hindsight() is False
    model = config.resolved_model_kwargs()
    assert model["hindsight"] is False
    assert not set(presets.BRANCHED_ALGORITHM_ARGS) & set(model)
    assert not set(presets.BRANCHED_POLICY_ARGS) & set(config.resolved_policy_kwargs())
    assert RunConfig(action_face="joint", hindsight=False).resolved_hindsight() is False
    assert RunConfig(action_face="joint", hindsight=True).resolved_model_kwargs()["hindsight"] is True
    assert RunConfig.load(config.save(tmp_path / "config.json")) == config
    assert json.loads((tmp_path / "config.json").read_text())["action_face"] == "joint"


def test_make_env_gives_each_loop_its_joint_face() -> None:
    small = {"n_envs": 2, "synthetic_market_steps": 200, "env_kwargs": {"episode_length": 50}}
    sb3 = make_env(RunConfig(action_face="joint", **small), 0, "train")
    assert type(sb3) is LOBVecEnv and sb3.action_space == spaces.Discrete(81)
    device = make_env(RunConfig(action_face="joint", device_loop=True, **small), 0, "train")
    assert isinstance(device, DeviceLOBVecEnv) and device.action_space == spaces.Discrete(81)
    assert type(make_env(RunConfig(action_face="branched", **small), 0, "train")) is LOBVecEnv
    branched_device = make_env(RunConfig(action_face="branched", device_loop=True, **small), 0, "train")
    assert branched_device.action_space == spaces.MultiDiscrete([3] * 4)


# ------------------------------------------------------------------------------------------ device env


def test_device_env_joint_face_spaces_and_bad_face(market) -> None:
    env = DeviceLOBVecEnv(3, seed=1, data=market, action_face="joint", **PARAMS)
    assert env.action_space == spaces.Discrete(81)
    assert env.branch_names == JOINT_BRANCH_NAMES and env.get_attr("branch_names")[0] == ("action",)
    assert DeviceLOBVecEnv(3, seed=1, data=market, **PARAMS).action_space == spaces.MultiDiscrete([3] * 4)
    with pytest.raises(ValueError, match=r"action_face='flat'"):
        DeviceLOBVecEnv(3, seed=1, data=market, action_face="flat", **PARAMS)


@pytest.mark.parametrize("step", ["step_tensors", "step_tensors_static", "numpy"])
@pytest.mark.parametrize("column", [False, True])
def test_device_env_joint_face_equals_the_branched_face_on_decoded_actions(market, step: str,
                                                                           column: bool) -> None:
    joint = DeviceLOBVecEnv(5, seed=7, data=market, action_face="joint", **PARAMS)
    branched = DeviceLOBVecEnv(5, seed=7, data=market, **PARAMS)
    assert np.array_equal(joint.reset(), branched.reset())
    rng = np.random.default_rng(0)
    finished = 0
    for _ in range(15):
        codes = torch.as_tensor(rng.integers(0, 81, size=5))
        given = codes[:, None] if column else codes
        actions = decode_joint(codes.numpy(), 5)
        if step == "numpy":
            obs, reward, done, _ = joint.step(given.numpy())
            ref_obs, ref_reward, ref_done, _ = branched.step(actions.numpy())
            assert np.array_equal(obs, ref_obs) and np.array_equal(reward, ref_reward)
            assert np.array_equal(done, ref_done)
            finished += int(done.sum())
            continue
        a, b = getattr(joint, step)(given), getattr(branched, step)(actions)
        for field in ("obs", "reward", "done", "final_obs", "episode_return", "episode_length"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        for key in ("position", "trade_pnl", TIMEOUT_KEY):
            assert torch.equal(a.infos[key], b.infos[key]), key
        finished += int(a.done.sum())
    assert finished >= 5


def test_device_env_joint_numpy_face_rejects_bad_codes(market) -> None:
    env = DeviceLOBVecEnv(3, seed=1, data=market, action_face="joint", **PARAMS)
    env.reset()
    with pytest.raises(ValueError, match=r"actions\[1\]=81 out of range: a joint code"):
        env.step_async(np.array([0, 81, 1]))
    with pytest.raises(ValueError, match=r"actions has shape \(3, 4\)"):
        env.step_async(np.ones((3, 4), dtype=np.int64))


@pytest.mark.parametrize("step", ["step_tensors", "step_tensors_static"])
def test_device_env_joint_tensor_face_rejects_bad_codes(market, step: str) -> None:
    """The tensor faces decode with the same decoder and, where the core checks ranges (a CPU), check the
    codes: an out-of-range code is an error, not a silently wrapped action; a float code always is."""
    env = DeviceLOBVecEnv(3, seed=1, data=market, action_face="joint", **PARAMS)
    env.reset()
    with pytest.raises(ValueError, match=r"actions\[2\]=81 out of range: a joint code"):
        getattr(env, step)(torch.tensor([0, 1, 81]))
    with pytest.raises(ValueError, match=r"actions dtype torch.float32 must be an integer dtype"):
        getattr(env, step)(torch.tensor([0.0, 1.0, 2.0]))


def test_model_learns_through_the_device_loop_on_the_joint_face(market, monkeypatch) -> None:
    from sb3_her_ext import BranchingIQN
    from sb3_her_ext.collect import DeviceCollector

    env = DeviceLOBVecEnv(4, seed=2, data=market, action_face="joint", **PARAMS)
    model = BranchingIQN("MlpPolicy", env, hindsight=False, learning_starts=16, batch_size=16,
                         buffer_size=400, seed=0, policy_kwargs={"net_arch": [16], "n_ensemble": 2})
    assert model.branch_names == ["action"] and list(model.action_dims) == [81]
    assert model.collector.supports(env, model.train_freq)
    calls = []
    original = DeviceCollector.run_rollout
    monkeypatch.setattr(DeviceCollector, "run_rollout",
                        lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    model.learn(120)
    assert calls and model.num_timesteps >= 120
    codes, _ = model.predict(env.reset(), deterministic=True)
    assert codes.shape == (4,) and ((codes >= 0) & (codes < 81)).all()


# ------------------------------------------------------------------------------------------ ModelPolicy


class _Predicts:
    """A model whose ``predict`` gives fixed codes in a given shape."""

    def __init__(self, codes: np.ndarray) -> None:
        self.codes = codes

    def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
        return self.codes, None


@pytest.mark.parametrize("shape", [(3,), (3, 1)])
def test_model_policy_decodes_column_and_flat_codes(shape: tuple[int, ...]) -> None:
    codes = np.array([65, 22, 80])
    policy = ModelPolicy(_Predicts(codes.reshape(shape)))
    policy.reset(3, torch.device("cpu"))
    actions = policy.act(torch.zeros(3, 7), torch.zeros(3, dtype=torch.bool))
    assert torch.equal(actions, decode_joint(codes, 3))


# ------------------------------------------------------------------------------------------ runs


@pytest.mark.parametrize("device_loop", [False, True])
def test_train_a_joint_run_end_to_end(tmp_path: Path, device_loop: bool) -> None:
    out = train(small_config(tmp_path / "run", steps=240, checkpoint_every=0, action_face="joint",
                             device_loop=device_loop))
    config = json.loads((out / "config.json").read_text())
    assert config["action_face"] == "joint" and config["hindsight"] is False
    assert config["device_loop"] is device_loop
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert "policy" in evaluation["policies"] and (out / "report.md").is_file()
    from sb3_her_ext import BranchingIQN

    model = BranchingIQN.load(out / "model.zip")
    assert model.action_space == spaces.Discrete(81) and model.hindsight_config is None
    assert model.branch_names == ["action"]


@pytest.mark.parametrize("device_loop", [False, True])
def test_a_resumed_joint_run_equals_the_uninterrupted_one(tmp_path: Path, device_loop: bool) -> None:
    whole = train(small_config(tmp_path / "whole", steps=400, action_face="joint", device_loop=device_loop))
    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out, steps=400, action_face="joint", device_loop=device_loop),
              callback=_CrashAt(300))
    assert resume(out) == out
    assert_same_model(whole / "model.zip", out / "model.zip")


# ------------------------------------------------------------------------------------------ CLI


def _train_config(argv: list[str]) -> RunConfig:
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_cli_action_face_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert _train_config(["--action-face", "joint"]).action_face == "joint"
    assert _train_config(["--action-face", "branched", "--hindsight"]).hindsight is True
    assert _train_config([]).action_face == presets.ACTION_FACE
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--action-face", "flat"])
    assert _train_config(["--action-face", "joint", "--hindsight"]).hindsight is True
    assert main(["train", "--action-face", "joint", "--steps", "0"]) == 2
    err = capsys.readouterr().err
    # the error names the option typed
    assert "foxhunt: error: --steps=0 must be >= 1" in err


def test_cli_trains_and_evaluates_a_joint_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["train", "--action-face", "joint", "--steps", "120", "--n-envs", "2", "--out", str(out),
                 "--no-progress", "--eval-steps", "10", "--checkpoint-every", "0"]) == 0
    assert json.loads((out / "config.json").read_text())["action_face"] == "joint"
    report = tmp_path / "report"
    assert main(["evaluate", str(out), "--steps", "12", "--n-envs", "2", "--out", str(report),
                 "--no-plots"]) == 0
    document = json.loads((report / "evaluation.json").read_text())
    assert document["steps"] == 12 * 2 and "policy" in document["policies"]


# ------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_joint_static_step_on_cuda_decodes_without_a_host_sync() -> None:
    """The joint face's static step (the one the fused CUDA graph captures) equals the branched face's
    static step on the decoded actions, with no host sync."""
    kwargs = dict(device="cuda", seed=0, data="synthetic", num_steps=600, episode_length=8)
    joint, branched = DeviceLOBVecEnv(64, action_face="joint", **kwargs), DeviceLOBVecEnv(64, **kwargs)
    for env in (joint, branched):
        env.reset()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    codes = [torch.randint(0, 81, (64, 1), device="cuda", generator=gen) for _ in range(20)]
    decoded = [decode_joint(c.cpu().numpy().reshape(-1), 64).cuda() for c in codes]
    joint.step_tensors_static(codes[0])
    branched.step_tensors_static(decoded[0])
    torch.cuda.synchronize()
    steps = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for code, action in zip(codes[1:], decoded[1:], strict=True):
            steps.append((joint.step_tensors_static(code), branched.step_tensors_static(action)))
            joint.pin_static_state()
            branched.pin_static_state()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in steps:
        for name in ("obs", "reward", "done", "final_obs", "episode_return", "episode_length"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.gpu
def test_a_joint_cuda_run_trains_through_the_graphed_device_loop(tmp_path: Path) -> None:
    from sb3_her_ext import BranchingIQN

    out = train(small_config(tmp_path / "run", device="cuda", action_face="joint"))
    config = json.loads((out / "config.json").read_text())
    assert config["device_loop"] is True and config["cuda_graph"] is True and config["hindsight"] is False
    model = BranchingIQN.load(out / "model.zip", device="cuda")
    assert model.action_space == spaces.Discrete(81) and model.num_timesteps == 600
    assert "policy" in json.loads((out / "evaluation.json").read_text())["policies"]
