"""A saved model for evaluation (issues 25 and 26): it carries its env settings, its action space is checked
against foxenv's faces, and a market it cannot be scored on is one line saying what differs."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import DQN
from stable_baselines3.common.vec_env import DummyVecEnv

from foxhunt import fingerprint
from foxhunt.cli import main
from foxhunt.envs import LOBVecEnv
from foxhunt.evaluation import model_file
from foxhunt.runs import RunConfig
from sb3_her_ext import BranchingIQN
from tests.foxenv.test_lobster import scenario, write_pair

TINY_POLICY = dict(net_arch=[8], n_ensemble=1, n_cos=4, n_quantiles=2, n_quantiles_target=2,
                   n_quantiles_act=2, n_atoms=5)
EVALUATE = ["--steps", "4", "--n-envs", "2", "--no-plots", "--baselines", "flat"]


def saved_model(path: Path, stamp: bool = True, **env_kwargs: object) -> Path:
    """An untrained joint-face BranchingIQN on a synthetic env with ``env_kwargs``, saved (and stamped as
    foxhunt train stamps its models)."""
    env = LOBVecEnv(2, seed=0, num_steps=400, action_face="joint", **{"episode_length": 30, **env_kwargs})
    model = BranchingIQN("MlpPolicy", env, policy_kwargs=TINY_POLICY, buffer_size=100, batch_size=8,
                         learning_starts=10, seed=0)
    if stamp:
        config = RunConfig(env_kwargs={"episode_length": 30, **env_kwargs}, synthetic_market_steps=400,
                           action_face="joint")
        fingerprint.stamp(model, fingerprint.run_fingerprint(config))
    model.save(path)
    return path


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    status = main(list(args))
    err = capsys.readouterr().err.strip()
    return status, err


class NineActions(gym.Env):
    """foxenv's observations with a Discrete(9) action: what a DQN trained on something else acts in."""

    def __init__(self, size: int) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.action_space = gym.spaces.Discrete(9)

    def reset(self, seed=None, options=None):
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}


def test_a_model_of_another_action_space_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """The issue's d9.zip: an SB3 DQN over Discrete(9) on foxenv's observations got a full report, exit 0."""
    size = LOBVecEnv(1, num_steps=400, episode_length=30).observation_space.shape[0]
    DQN("MlpPolicy", DummyVecEnv([lambda: NineActions(size)]), learning_starts=10).save(tmp_path / "d9.zip")
    status, err = run_cli(capsys, "evaluate", str(tmp_path / "d9.zip"), *EVALUATE)
    assert status == 2 and err.count("\n") == 0
    assert "acts in Discrete(9), which is not one of foxenv's action faces" in err
    assert not (tmp_path / "d9").exists()


def test_a_model_file_carries_its_env_settings(tmp_path: Path, capsys) -> None:
    """A model trained at 5 levels and 30-step episodes is scored with them from the .zip alone."""
    path = saved_model(tmp_path / "m.zip", levels=5, episode_length=30, max_position=20)
    status, err = run_cli(capsys, "evaluate", str(path), "--out", str(tmp_path / "report"), *EVALUATE)
    assert status == 0, err
    setup = json.loads((tmp_path / "report" / "evaluation.json").read_text())["setup"]
    assert setup["env_config"]["levels"] == 5 and setup["env_config"]["max_position"] == 20
    assert setup["episode_length"] == 30


def test_a_model_without_settings_meets_a_one_line_error_not_a_traceback(tmp_path: Path, capsys) -> None:
    path = saved_model(tmp_path / "m.zip", stamp=False, levels=5)
    status, err = run_cli(capsys, "evaluate", str(path), *EVALUATE)
    assert status == 2 and err.count("\n") == 0
    assert "the model's observation_space has shape (36,), the env's observation (56,)" in err


def two_level_folder(folder: Path) -> Path:
    write_pair(folder, *scenario())
    return folder


def test_a_market_with_fewer_levels_says_so(tmp_path: Path, capsys) -> None:
    path = saved_model(tmp_path / "m.zip", levels=5)
    folder = two_level_folder(tmp_path / "lobster")
    status, err = run_cli(capsys, "evaluate", str(path), "--data", str(folder), *EVALUATE)
    assert status == 2 and err.count("\n") == 0
    assert ("the model was trained at levels=5 (the settings saved in the model file): its observation "
            "holds 5 book levels per side, but the LOBSTER files in") in err
    assert "hold 2; fewer levels change the observation's layout" in err


@pytest.mark.parametrize(("trained", "scored", "refused"), [
    ("train", "train", True), ("train", "all", True), ("train", "validation", True), ("train", "test", False),
    ("fit", "fit", True), ("fit", "validation", False), ("fit", "train", True), ("all", "test", True),
])
def test_lobster_data_the_model_was_trained_on_is_not_held_out(tmp_path: Path, trained: str, scored: str,
                                                               refused: bool) -> None:
    folder = two_level_folder(tmp_path / "lobster")
    market = {"source": "lobster", "files": fingerprint.lobster_files(folder), "split": trained}
    if refused:
        with pytest.raises(ValueError, match=rf"--split {scored}: the model was trained on the '{trained}' "
                           r"split of these LOBSTER files \(same SHA-256\), so .* is not held out"):
            model_file.check_held_out(market, folder, scored)
    else:
        model_file.check_held_out(market, folder, scored)
    other = two_level_folder(tmp_path / "other")
    (next(other.glob("*_message_*.csv"))).write_text("1.0,1,11,50,100500,-1\n" * 6)
    model_file.check_held_out(market, other, scored)  # other files: held out whatever the split


def test_evaluate_refuses_the_training_split_of_a_lobster_model(tmp_path: Path, capsys) -> None:
    """``foxhunt evaluate <LOBSTER run> --split train`` was in-sample with exit 0."""
    folder = two_level_folder(tmp_path / "lobster")
    path = saved_model(tmp_path / "m.zip", levels=2)
    model = BranchingIQN.load(path)
    stamped = fingerprint.read_model_file(path)
    stamped["market"] = {"source": "lobster", "files": fingerprint.lobster_files(folder), "split": "train",
                         "options": {}}
    fingerprint.stamp(model, stamped)
    model.save(path)
    status, err = run_cli(capsys, "evaluate", str(path), "--data", str(folder), "--split", "train", *EVALUATE)
    assert status == 2 and "so 'train' is not held out; use --split test" in err
    status, err = run_cli(capsys, "evaluate", str(path), *EVALUATE)  # not on the synthetic market
    assert status == 2 and "the model was trained on LOBSTER files (TEST_2012-01-01_0_1_message_2.csv" in err
    assert "give --data with a LOBSTER folder" in err


def test_a_run_whose_config_changed_after_training_is_refused(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    saved_model(run / "model.zip", levels=5)
    config = RunConfig(env_kwargs={"levels": 10, "episode_length": 30}, synthetic_market_steps=400,
                       action_face="joint")
    config.save(run / "config.json")
    status, err = run_cli(capsys, "evaluate", str(run), *EVALUATE)
    assert status == 2 and err.count("\n") == 0
    assert "model.zip was made with another env.levels: 5 -> 10" in err


def test_a_model_file_scores_as_its_run_and_says_what_it_cannot_restore(tmp_path: Path, capsys) -> None:
    """A model file carries its run's config (books, evaluation seed, eval_steps): ``foxhunt evaluate
    MODEL.zip`` scored 16 books with seed 0 where its run folder scored n_envs books with seed + 1000
    (issue 39.1); a file saved before eval_steps were stamped says which it assumed."""
    path = saved_model(tmp_path / "m.zip", levels=5)
    status, err = run_cli(capsys, "evaluate", str(path), "--no-plots", "--baselines", "flat", "--out",
                          str(tmp_path / "r"))
    assert status == 0, err
    setup = json.loads((tmp_path / "r" / "evaluation.json").read_text())["setup"]
    config = RunConfig()
    assert setup["books"] == config.n_envs and setup["seed"] == config.seed + 1000
    assert not any("eval_steps" in note for note in setup["notes"])
    model = BranchingIQN.load(path)
    stamped = fingerprint.read_model_file(path)
    del stamped["evaluation"]
    fingerprint.stamp(model, stamped)
    model.save(path)
    status, err = run_cli(capsys, "evaluate", str(path), "--no-plots", "--baselines", "flat", "--out",
                          str(tmp_path / "r2"))
    assert status == 0, err
    assert ("the model file does not record its run's eval_steps (saved before they were): 500 steps per "
            "book assumed") in (tmp_path / "r2" / "report.md").read_text()
