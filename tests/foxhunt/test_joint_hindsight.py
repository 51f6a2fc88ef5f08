"""Hindsight on the joint face: the relabels decode the joint code into its branches and encode their rows
again, so the replay holds exactly the branched face's rows, as codes; the SB3 loop, the device loop and the
fused block still agree bit for bit with it on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from foxenv import spec
from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv, decode_joint, encode_joint
from foxhunt.runs import RunConfig
from sb3_her_ext import BranchingIQN
from sb3_her_ext.algorithm import resolve_hindsight
from sb3_her_ext.hindsight import HindsightConfig, JointCodes
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

OBS_SPACE = spaces.Box(-np.inf, np.inf, (3,), np.float32)
NVEC = tuple(spec.ACTION_NVEC)
N_JOINT = int(np.prod(NVEC))
TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)
TINY = dict(learning_starts=0, batch_size=16, buffer_size=2000, train_freq=2, target_update_interval=50,
            policy_kwargs=TINY_POLICY, seed=0, device="cpu", vaccine_interval=0, hindsight={"relabel": True})


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks run faster on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_joint_codes_are_foxhunts_codes() -> None:
    codes = torch.arange(N_JOINT)[:, None]
    joint = JointCodes(NVEC, "cpu")
    branches = joint.decode(codes)
    assert torch.equal(branches, decode_joint(codes, N_JOINT))
    assert torch.equal(joint.encode(branches), codes)
    assert torch.equal(joint.encode(branches)[:, 0], encode_joint(branches))


def scripted_steps(books: int, steps: int, seed: int) -> list[tuple]:
    """Random trades on ``books`` books: positions that open, hold, close and flip; the infos hindsight
    reads."""
    rng = np.random.default_rng(seed)
    position = np.zeros(books)
    mid = np.full(books, 100.0)
    entry = np.zeros(books)
    out = []
    for _ in range(steps):
        mid = mid + rng.normal(0.0, 0.5, books)
        new = np.where(rng.random(books) < 0.3, rng.choice([-10.0, 0.0, 10.0], books), position)
        closed = (position != 0) & (np.sign(new) != np.sign(position))
        pnl = np.where(closed, np.sign(position) * (mid - entry) * 10.0, 0.0)
        lots = np.where(closed, np.abs(position), 0.0)
        closed_entry = np.where(closed, entry, 0.0)
        opened = (new != 0) & (np.sign(new) != np.sign(position))
        entry = np.where(opened, mid, np.where(new == 0, 0.0, entry))
        info = {"mid": mid, "best_bid": mid - 0.5, "best_ask": mid + 0.5, "position": new,
                "trade_closed": closed, "trade_pnl": pnl, "trade_lots": lots, "entry_mid": closed_entry}
        info = {k: torch.tensor(v) for k, v in info.items()}
        info["TimeLimit.truncated"] = torch.zeros(books, dtype=torch.bool)
        actions = torch.as_tensor(np.stack([rng.integers(0, n, books) for n in NVEC], 1), dtype=torch.int64)
        obs = torch.as_tensor(rng.normal(size=(books, 3)), dtype=torch.float32)
        next_obs = torch.as_tensor(rng.normal(size=(books, 3)), dtype=torch.float32)
        reward = torch.as_tensor(rng.normal(size=books), dtype=torch.float32)
        done = torch.as_tensor(rng.random(books) < 0.02)
        out.append((obs, next_obs, actions, reward, done, info))
        position = new
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("anchor", ["close", "peak"])
def test_the_joint_face_gets_the_branched_faces_hindsight_rows_encoded(anchor: str, device: str) -> None:
    books, settings = 5, {"lookahead": 3, "threshold": 0.5, "anchor": anchor, "relabel": True}
    branched = PrioritizedHindsightReplayBuffer(4096, OBS_SPACE, spaces.MultiDiscrete(list(NVEC)),
                                                device=device, n_envs=books, alpha=0.6, hindsight=settings)
    joint = PrioritizedHindsightReplayBuffer(4096, OBS_SPACE, spaces.Discrete(N_JOINT), device=device,
                                             n_envs=books, alpha=0.6,
                                             hindsight={**settings, "joint_nvec": NVEC})
    for obs, next_obs, actions, reward, done, info in scripted_steps(books, 120, seed=1):
        obs, next_obs, actions, reward, done = (x.to(device) for x in (obs, next_obs, actions, reward, done))
        info = {k: v.to(device) for k, v in info.items()}
        branched.add(obs, next_obs, actions, reward, done, info)
        joint.add(obs, next_obs, encode_joint(actions)[:, None], reward, done, info)
    counts = {k: int(v) for k, v in joint.hindsight_counts.items()}
    assert counts == {k: int(v) for k, v in branched.hindsight_counts.items()}
    assert min(counts.values()) > 0  # every kind made rows
    for name in branched._tensor_names():
        if name == "sample_rng_state":  # each buffer draws its own sampling seed; no row depends on it
            continue
        if name == "actions":
            assert torch.equal(joint.actions, encode_joint(branched.actions.reshape(-1, len(NVEC)))[:, None])
        else:
            torch.testing.assert_close(getattr(joint, name), getattr(branched, name), rtol=0, atol=0,
                                       equal_nan=True, msg=name)


def test_joint_hindsight_settings_are_checked_and_read_from_the_env() -> None:
    with pytest.raises(ValueError, match=r"joint_nvec=\(3, 0\) must be a non-empty tuple of integers >= 1"):
        HindsightConfig(joint_nvec=(3, 0))
    with pytest.raises(ValueError, match=r"joint_nvec=\(3, 3, 3\) needs one action branch of 27 codes"):
        PrioritizedHindsightReplayBuffer(64, OBS_SPACE, spaces.Discrete(N_JOINT), device="cpu",
                                         hindsight={"joint_nvec": (3, 3, 3)})
    env = LOBVecEnv(2, data="synthetic", num_steps=300, episode_length=20, action_face="joint")
    assert env.joint_nvec == NVEC
    assert resolve_hindsight(True, env).joint_nvec == NVEC
    assert resolve_hindsight("auto", env) is None  # off unless asked for: the measurement decides
    assert LOBVecEnv(2, data="synthetic", num_steps=300, episode_length=20).joint_nvec is None
    assert RunConfig(action_face="joint", hindsight=True).resolved_model_kwargs()["hindsight"] is True


def run(env_cls: type, tmp_path: Path, total: int = 400) -> BranchingIQN:
    env = env_cls(4, device="cpu", seed=0, data="synthetic", num_steps=1500, episode_length=20,
                  action_face="joint")
    path = tmp_path / f"{env_cls.__name__}.jsonl"
    model = BranchingIQN("MlpPolicy", env, diagnostics_path=str(path), diagnostics_interval=40, **TINY)
    return model.learn(total, log_interval=1)


def assert_same(a: BranchingIQN, b: BranchingIQN) -> None:
    for name in a.replay_buffer._tensor_names():
        torch.testing.assert_close(getattr(a.replay_buffer, name), getattr(b.replay_buffer, name), rtol=0,
                                   atol=0, equal_nan=True, msg=name)
    counts = {k: int(v) for k, v in a.replay_buffer.hindsight_counts.items()}
    assert counts == {k: int(v) for k, v in b.replay_buffer.hindsight_counts.items()}
    assert counts["relabel"] > 0 and counts["backward"] + counts["forward"] > 0
    for x, y in zip(a.policy.state_dict().values(), b.policy.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    assert a._n_updates == b._n_updates > 0 and a.num_timesteps == b.num_timesteps


def test_joint_hindsight_training_blocks_equal_the_sb3_loop(tmp_path: Path) -> None:
    sb3, device = run(LOBVecEnv, tmp_path), run(DeviceLOBVecEnv, tmp_path)
    assert sb3.replay_buffer.hindsight_config.joint_nvec == NVEC
    assert device.collector.block is not None and device.collector.block.eager_blocks > 0
    assert_same(sb3, device)
    kinds = sb3.replay_buffer.kinds
    assert bool((kinds == 3).any())  # relabel rows stored, as joint codes in range
    assert int(sb3.replay_buffer.actions.max()) < N_JOINT


@pytest.mark.gpu
def test_a_joint_hindsight_cuda_run_injects_through_the_graphed_device_loop(tmp_path: Path) -> None:
    """On CUDA the joint face's relabels run inside the fused graph (decode and encode on the device) and
    fill the replay with rows of every kind, as joint codes in range."""
    env = DeviceLOBVecEnv(64, device="cuda", seed=0, data="synthetic", num_steps=3000, episode_length=50,
                          action_face="joint")
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "device": "cuda", "buffer_size": 20_000,
                                              "learning_starts": 512, "batch_size": 64, "train_freq": 4,
                                              "cuda_graph": True})
    model.learn(6_400)
    assert model.collector.block is not None and model.collector.block.captures >= 1
    counts = {k: int(v) for k, v in model.replay_buffer.hindsight_counts.items()}
    assert counts["relabel"] > 0 and counts["backward"] + counts["forward"] > 0
    kinds, actions = model.replay_buffer.kinds, model.replay_buffer.actions
    assert bool((kinds == 3).any()) and int(actions.min()) >= 0 and int(actions.max()) < N_JOINT


def test_a_resumed_joint_hindsight_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    """The trackers, the forward ring and the joint tables survive a checkpoint: the resumed run ends bit for
    bit where the uninterrupted one does."""
    from foxhunt.runs import resume, train
    from tests.foxhunt._small_runs import Crash, CrashAt, assert_same_model, small_config

    settings = {"steps": 400, "action_face": "joint", "hindsight": True, "device_loop": True}
    whole = train(small_config(tmp_path / "whole", **settings))
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(small_config(out, **settings), callback=CrashAt(300))
    assert resume(out) == out
    assert_same_model(whole / "model.zip", out / "model.zip")
    model = BranchingIQN.load(whole / "model.zip")
    assert model.hindsight_config is not None and model.hindsight_config.joint_nvec == NVEC
