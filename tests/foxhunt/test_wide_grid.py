"""The wide action grid through the application: joint codes, both faces of the SB3 env, BranchingIQN,
the evaluation (baselines, oracle, recorder, metrics), fingerprints and ``--env.action-grid``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from foxenv import spec
from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv, decode_joint, encode_joint

WIDE = spec.WIDE_GRID
PARAMS = {"action_grid": "wide", "episode_length": 30, "num_steps": 600}


def test_codes_round_trip_over_all_1080_on_numpy_and_tensors() -> None:
    codes = np.arange(WIDE.joint_actions)
    actions = decode_joint(codes, len(codes), grid=WIDE)
    assert actions.shape == (1080, 4)
    assert (actions.max(dim=0).values + 1).tolist() == list(WIDE.nvec)
    assert len({tuple(a) for a in actions.tolist()}) == 1080  # one action per code
    assert np.array_equal(encode_joint(actions.numpy(), WIDE), codes)
    assert torch.equal(encode_joint(actions, WIDE), torch.from_numpy(codes))
    assert torch.equal(decode_joint(torch.from_numpy(codes), 1080, grid=WIDE), actions)
    # hand-worked: ((d * 10 + m) * 3 + o) * 12 + u
    assert int(encode_joint(np.array([2, 9, 2, 11]), WIDE)) == 1079
    assert int(encode_joint(np.array([1, 3, 1, 10]), WIDE)) == 360 + 108 + 12 + 10
    # the default grid's codes are unchanged
    assert int(encode_joint(np.array([2, 1, 0, 2]))) == 65
    with pytest.raises(ValueError, match=r"codes\[1\]=1080 out of range: a joint code must lie in \[0, 1080"):
        decode_joint(np.array([0, 1080]), 2, name="codes", grid=WIDE)
    with pytest.raises(ValueError, match=r"\[0, 81\)"):
        decode_joint(np.array([81]), 1)


@pytest.mark.parametrize("face", ["branched", "joint"])
def test_sb3_env_rolls_out_random_wide_actions(face: str) -> None:
    env = LOBVecEnv(3, seed=0, action_face=face, **PARAMS)
    expected = spaces.Discrete(1080) if face == "joint" else spaces.MultiDiscrete([3, 10, 3, 12])
    assert env.action_space == expected
    assert env.magnitudes == WIDE.magnitudes  # what hindsight's magnitude relabel reads
    assert env.joint_nvec == (WIDE.nvec if face == "joint" else None)  # what its joint relabels decode by
    env.reset()
    env.action_space.seed(0)
    seen = set()
    for _ in range(70):  # past two episode ends
        actions = np.stack([env.action_space.sample() for _ in range(3)])
        obs, reward, done, infos = env.step(actions)
        assert np.isfinite(obs).all() and np.isfinite(reward).all()
        seen.update(np.asarray(actions).reshape(3, -1)[:, -1].tolist())
    assert max(seen) > 2  # urgencies beyond the default grid's were played
    bad = np.array([1080, 0, 0]) if face == "joint" else np.array([[0, 10, 0, 0]] * 3)
    with pytest.raises(ValueError, match="out of range"):
        env.step(bad)


@pytest.mark.parametrize("step", ["step_tensors", "step_tensors_static"])
def test_device_env_joint_wide_codes_equal_the_branched_face(step: str) -> None:
    joint = DeviceLOBVecEnv(4, seed=1, action_face="joint", **PARAMS)
    branched = DeviceLOBVecEnv(4, seed=1, **PARAMS)
    joint.reset(), branched.reset()
    generator = torch.Generator().manual_seed(0)
    for _ in range(35):
        codes = torch.randint(0, 1080, (4,), generator=generator)
        one, two = getattr(joint, step)(codes), getattr(branched, step)(decode_joint(codes, 4, grid=WIDE))
        assert torch.equal(one.obs, two.obs) and torch.equal(one.reward, two.reward)
    with pytest.raises(ValueError, match=r"\[0, 1080\)"):
        getattr(joint, step)(torch.tensor([0, 1, 2, 1080]))


@pytest.mark.parametrize("face", ["branched", pytest.param("joint", marks=pytest.mark.slow)])
def test_branching_iqn_learns_on_the_wide_grid(face: str) -> None:
    from sb3_her_ext import BranchingIQN

    env = DeviceLOBVecEnv(4, seed=2, action_face=face, **PARAMS)
    model = BranchingIQN("MlpPolicy", env, learning_starts=40, batch_size=16, buffer_size=600, seed=0,
                         train_freq=4, policy_kwargs={"net_arch": [32], "n_ensemble": 2, "n_quantiles": 8,
                                                      "n_quantiles_target": 8, "n_quantiles_act": 8})
    dims = [1080] if face == "joint" else [3, 10, 3, 12]
    assert list(model.action_dims) == dims
    if face == "branched":  # hindsight's magnitude relabel takes the grid's ten sizes
        assert model.hindsight_config.magnitudes == WIDE.magnitudes
    model.learn(240)
    assert model.num_timesteps >= 240
    actions, _ = model.predict(env.reset(), deterministic=True)
    actions = np.asarray(actions).reshape(4, -1)
    assert ((actions >= 0) & (actions < np.array(dims))).all()


def test_evaluation_scores_a_wide_model_beside_the_oracle_and_refuses_another_grid() -> None:
    from foxhunt.evaluation import evaluate_policies
    from foxhunt.evaluation.baselines import OraclePolicy, RandomPolicy
    from foxhunt.evaluation.recorder import record

    class Codes:  # a joint-face model: fixed codes, long, 0.3 of max_position, IoC 5 ticks beyond
        action_space = spaces.Discrete(1080)

        def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
            return np.full(obs.shape[0], int(encode_joint(np.array([2, 2, 2, 5]), WIDE))), None

    env_kwargs = {"action_grid": "wide", "episode_length": 40}
    evaluation = evaluate_policies({"codes": Codes()}, n_envs=4, steps=40, env_kwargs=env_kwargs,
                                   market_kwargs={"num_steps": 800, "signal_strength": 2.0,
                                                  "signal_horizon": 5},
                                   baselines=("flat", "random", "buy_and_hold", "market_maker"))
    metrics = evaluation.results["codes"].metrics
    assert [len(v) for v in metrics["action_mix"].values()] == [3, 10, 3, 12]
    assert metrics["action_mix"]["magnitude"][2] == 1.0 and metrics["action_mix"]["urgency"][5] == 1.0
    assert [len(v) for v in metrics["action_labels"].values()] == [3, 10, 3, 12]
    assert metrics["action_labels"]["magnitude"][:2] == ["0.1", "0.2"]
    assert metrics["action_labels"]["urgency"][11] == "u11"
    oracle = evaluation.results["oracle"].metrics["action_mix"]
    assert oracle["magnitude"][WIDE.full_size] == 1.0 and oracle["urgency"][WIDE.whole_gap] == 1.0
    assert evaluation.results["oracle"].metrics["pnl"] > 0  # valid on the wide grid: it finds the signal
    assert evaluation.results["market_maker"].metrics["action_mix"]["urgency"][WIDE.at_touch] == 1.0
    assert max(evaluation.results["random"].metrics["action_mix"]["urgency"][3:]) > 0
    assert evaluation.setup["env_config"]["action_grid"]["name"] == "wide"
    from foxhunt.evaluation.api import build_market

    market = build_market("synthetic", num_steps=400)
    with pytest.raises(ValueError, match="acts on the 'default' action grid, the env on 'wide'"):
        record(RandomPolicy(0), market, num_books=2, env_kwargs=env_kwargs)
    with pytest.raises(ValueError, match=r"acts in Discrete\(1080\), which is not one of foxenv's"):
        record(Codes(), market, num_books=2, env_kwargs={"episode_length": 40})
    assert OraclePolicy(1.0, 5, grid=WIDE).grid is WIDE
    from foxhunt.evaluation.baselines import WaveOraclePolicy

    wave = WaveOraclePolicy(torch.ones(50, dtype=torch.int64), grid=WIDE)
    wave.reset(2, torch.device("cpu"))
    wave.start_episodes(torch.tensor([3, 7]))
    assert wave.act(torch.zeros(2, 5), torch.ones(2, dtype=torch.bool)).tolist() == [[2, 9, 0, 11]] * 2


def test_fingerprints_name_the_grid_and_keep_the_default_ones() -> None:
    from foxhunt import fingerprint
    from foxhunt.runs import RunConfig

    default = fingerprint.run_fingerprint(RunConfig())
    assert "action_grid" not in default["env"] and default["action_space"] == "Discrete(81)"
    wide = fingerprint.run_fingerprint(RunConfig().with_values({"env.action_grid": "wide"}))
    assert wide["action_space"] == "Discrete(1080)" and wide["env"]["action_grid"]["name"] == "wide"
    branched = RunConfig().with_values({"env.action_grid": "wide", "action_face": "branched"})
    assert fingerprint.run_fingerprint(branched)["action_space"] == "MultiDiscrete([3, 10, 3, 12])"
    with pytest.raises(fingerprint.FingerprintMismatch, match="env.action_grid"):
        fingerprint.compare(default, wide, what="a checkpoint", fix="resume on its grid")
    with pytest.raises(ValueError, match="action_grid='huge' must be one of"):
        fingerprint.run_fingerprint(RunConfig().with_values({"env.action_grid": "huge"}))


@pytest.mark.slow
def test_train_and_evaluate_on_the_wide_grid_from_the_cli(tmp_path: Path) -> None:
    from foxhunt.cli import main

    out = tmp_path / "run"
    assert main(["train", "--steps", "120", "--n-envs", "2", "--out", str(out), "--no-progress",
                 "--eval-steps", "10", "--env.action-grid", "wide", "--env.episode-length", "40"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["env"]["action_grid"] == "wide"
    policy = json.loads((out / "evaluation.json").read_text())["policies"]["policy"]
    assert len(policy["action_mix"]["urgency"]) == 12
    # the model file carries its grid: evaluating it alone rebuilds the wide env
    assert main(["evaluate", str(out / "model.zip"), "--steps", "10", "--n-envs", "2", "--out",
                 str(tmp_path / "again"), "--no-plots"]) == 0
    again = json.loads((tmp_path / "again" / "evaluation.json").read_text())
    assert len(again["policies"]["policy"]["action_mix"]["magnitude"]) == 10


# ------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_wide_static_steps_on_cuda_decode_without_a_host_sync() -> None:
    """The static tensor step (the one the fused CUDA graph captures) takes 1,080 wide codes on CUDA with no
    host sync, and equals the branched face's static step on the decoded actions."""
    kwargs = dict(device="cuda", seed=0, action_grid="wide", num_steps=600, episode_length=8)
    joint, branched = DeviceLOBVecEnv(64, action_face="joint", **kwargs), DeviceLOBVecEnv(64, **kwargs)
    joint.reset(), branched.reset()
    generator = torch.Generator(device="cuda").manual_seed(0)
    codes = [torch.randint(0, 1080, (64,), device="cuda", generator=generator) for _ in range(20)]
    decoded = [decode_joint(c, 64, check_range=False, grid=WIDE) for c in codes]
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
        for name in ("obs", "reward", "done", "final_obs"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert max(int(a.max()) for a in decoded) == 11  # urgencies the default grid has not were played


@pytest.mark.gpu
@pytest.mark.parametrize("face", ["branched", "joint"])
def test_a_wide_cuda_run_trains_through_the_graphed_device_loop(tmp_path: Path, face: str) -> None:
    from foxhunt.runs import train
    from sb3_her_ext import BranchingIQN
    from tests.foxhunt._small_runs import small_config

    config = small_config(tmp_path / "run", device="cuda", action_face=face,
                          env_kwargs={"episode_length": 60, "action_grid": "wide"})
    out = train(config)
    model = BranchingIQN.load(out / "model.zip", device="cuda")
    expected = spaces.Discrete(1080) if face == "joint" else spaces.MultiDiscrete([3, 10, 3, 12])
    assert model.action_space == expected and model.num_timesteps == 600
    policy = json.loads((out / "evaluation.json").read_text())["policies"]["policy"]
    assert len(policy["action_mix"]["urgency"]) == 12
