"""Checks before any work (issue 26): sizes against free memory, every option, no half-made run folder,
and one line for each argument that used to reach a library's traceback."""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import foxenv
from foxenv.data import generate_synthetic, load_market
from foxhunt import preflight
from foxhunt.cli import main
from foxhunt.envs import LOBVecEnv
from foxhunt.evaluation import evaluate
from foxhunt.run_folder import new_run_folder
from foxhunt.runs import train
from sb3_her_ext import BranchingIQN
from sb3_her_ext.checksum import ChecksumError
from tests.foxenv.test_lobster import scenario, write_pair
from tests.foxhunt._small_runs import small_config


@pytest.fixture
def free_23_gb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "free_memory", lambda device: 23 * 10**9)


@pytest.mark.parametrize(("overrides", "option"), [
    (dict(n_envs=10**9), "--n-envs"),
    (dict(model_kwargs={"buffer_size": 10**10}), "--algorithm.buffer-size"),
    (dict(eval_steps=10**11), "--eval-steps"),
    (dict(synthetic_market_steps=10**10), "--synthetic-market-steps"),
])
def test_a_run_too_large_for_memory_is_refused_before_any_work(tmp_path: Path, free_23_gb: None,
                                                                 overrides: dict, option: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=rf"^{option}: the run needs about [\d,.]+ GB of memory \(.*\), and "
                       rf"cpu has 23 GB free; lower {option}$"):
        train(small_config(out, **overrides))
    assert not out.exists()


def test_the_cli_says_it_in_one_line(tmp_path: Path, free_23_gb: None, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--n-envs", "1000000000", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "foxhunt: error: --n-envs: the run needs about" in err
    assert "cpu has 23 GB free" in err and not (tmp_path / "run").exists()
    assert main(["evaluate", str(tmp_path / "m.zip"), "--steps", "100000000000", "--n-envs", "16"]) == 2
    assert "--steps: the run needs about 256,000 GB" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_evaluate_on_a_missing_gpu_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["evaluate", str(tmp_path / "m.zip"), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == "foxhunt: error: --device='cuda': no CUDA device is available (use 'cpu')\n"


@pytest.mark.parametrize(("overrides", "match"), [
    (dict(policy_kwargs={"n_heads": 3}), r"unknown RunConfig\.policy_kwargs keys \['n_heads'\]"),
    (dict(model_kwargs={"lr": 1e-3}), r"unknown RunConfig\.model_kwargs keys \['lr'\]"),
    (dict(device="gpu"), r"RunConfig\.device='gpu' must be cpu or cuda"),
])
def test_every_option_is_checked_before_the_folder_is_made(tmp_path: Path, overrides: dict,
                                                           match: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=match):
        train(small_config(out, **overrides))
    assert not out.exists()


def test_a_failed_start_leaves_no_half_made_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="bogus"):
        train(small_config(out, env_kwargs={"bogus": 1}))  # refused by the env, after the folder was made
    assert not out.exists()
    assert new_run_folder(str(out)) == out  # --out takes it again


ENV = dict(num_steps=300, episode_length=20)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: LOBVecEnv(2, seed="3", **ENV), r"seed='3' must be an integer in \[0, 2\*\*32\), not a str"),
    (lambda: LOBVecEnv(2, seed=True, **ENV), r"seed=True must be an integer .* not a bool"),
    (lambda: LOBVecEnv(2, seed=2**64, **ENV), r"seed=18446744073709551616 must lie in \[0, 2\*\*32\)"),
    (lambda: LOBVecEnv(2, market_seed=-1, **ENV), r"market_seed=-1 must lie in \[0, 2\*\*32\)"),
    (lambda: LOBVecEnv(2, device="gpu", **ENV), r"device='gpu' must be cpu or cuda \(cuda:K for the K-th"),
    (lambda: foxenv.make_vec(2, device="gpu", **ENV), r"device='gpu' must be"),
    (lambda: foxenv.make_vec(2, seed=1.5, **ENV), r"seed=1.5 must be an integer"),
    (lambda: gym.make("foxenv/LOB-v0", **ENV).reset(seed=2**64), r"seed=18446744073709551616 must lie"),
    (lambda: gym.make("foxenv/LOB-v0", **ENV).reset(seed="1"), r"seed='1' must be an integer"),
    (lambda: generate_synthetic(300, seed="1"), r"seed='1' must be an integer"),
    (lambda: load_market("synthetic", seed=True, num_steps=300), r"seed=True must be an integer"),
    (lambda: evaluate("flat", seed="3", n_envs=2, steps=3, market_kwargs=dict(num_steps=300),
                      env_kwargs=dict(episode_length=20)), r"seed='3' must be an integer"),
    (lambda: evaluate("flat", market_seed=2**64, n_envs=2, steps=3), r"market_seed=1844674407370955161"),
    (lambda: evaluate("flat", device="gpu", n_envs=2, steps=3), r"device='gpu' must be"),
])
def test_seeds_and_devices_are_one_line_errors_naming_the_field(build, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_branching_iqn_names_its_device_and_unknown_policy_kwargs() -> None:
    env = LOBVecEnv(2, seed=0, **ENV)
    with pytest.raises(ValueError, match=r"device='gpu' must be auto, cpu or cuda \(cuda:K"):
        BranchingIQN("MlpPolicy", env, device="gpu", buffer_size=100, batch_size=8)
    with pytest.raises(ValueError, match=r"policy_kwargs holds unknown keys \['foo'\]; BranchingIQNPolicy "):
        BranchingIQN("MlpPolicy", env, policy_kwargs={"foo": 1}, buffer_size=100, batch_size=8)


def test_a_truncated_replay_buffer_is_not_taken_for_an_old_file(tmp_path: Path) -> None:
    env = LOBVecEnv(2, seed=0, **ENV)
    model = BranchingIQN("MlpPolicy", env, buffer_size=100, batch_size=8, learning_starts=10,
                         policy_kwargs=dict(net_arch=[8]))
    model.learn(20)
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    data = (tmp_path / "buffer.pkl").read_bytes()
    (tmp_path / "buffer.pkl").write_bytes(data[: len(data) // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "saved before checksums?" warning for a cut file
        with pytest.raises(ChecksumError, match=r"replay buffer file .*buffer\.pkl cannot be read \(.*\): it "
                           r"is truncated or not a replay buffer"):
            model.load_replay_buffer(tmp_path / "buffer.pkl")


def test_a_non_utf8_lobster_file_names_the_file_and_line(tmp_path: Path) -> None:
    message_path, _ = write_pair(tmp_path, *scenario())
    lines = message_path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"14", b"1\xff", 1)
    message_path.write_bytes(b"".join(lines))
    with pytest.raises(ValueError, match=r"message file TEST_2012-01-01_0_1_message_2.csv line 4, character "
                       r"\d+: byte 0xff is not UTF-8 text"):
        load_market(str(tmp_path), cache_dir=tmp_path / "cache")


def test_a_size_from_the_config_file_is_named_in_the_file(tmp_path: Path, free_23_gb: None,
                                                           capsys: pytest.CaptureFixture) -> None:
    """Issue 39.14: the preflight named --algorithm.buffer-size when the value came from --config FILE."""
    from foxhunt.runs import RunConfig

    config = tmp_path / "big.json"
    RunConfig(model_kwargs={"buffer_size": 10**10}).save(config)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{config}: algorithm.buffer_size: the run needs about" in err, err
    assert "--algorithm.buffer-size" not in err
    assert main(["train", "--algorithm.buffer-size", "10000000000", "--out", str(tmp_path / "r2"),
                 "--no-progress"]) == 2
    assert "foxhunt: error: --algorithm.buffer-size: the run needs about" in capsys.readouterr().err
