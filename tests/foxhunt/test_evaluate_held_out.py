"""``foxhunt evaluate`` of a LOBSTER model (issue 39.1): every market setting the model carries is used (its
``split_times``), a window inside the training clock on the same files is refused in one line naming both
clock ranges, and ``--env.market`` changes the market options deliberately."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from foxenv.data import generate_synthetic, load_market
from foxenv.data.export import export_lobster
from foxhunt import fingerprint
from foxhunt.cli import main
from foxhunt.envs import LOBVecEnv
from foxhunt.evaluation.api import default_baselines
from foxhunt.runs import RunConfig
from sb3_her_ext import BranchingIQN

TINY_POLICY = dict(net_arch=[8], n_ensemble=1, n_cos=4, n_quantiles=2, n_quantiles_target=2,
                   n_quantiles_act=2, n_atoms=5)
#: A synthetic LOBSTER day: 1,200 steps of 19.5 s from 09:30 to 16:00.
STEP_SECONDS = 19.5
SPLIT_TIMES = ["14:30", "15:30"]
QUICK = ["--no-plots", "--baselines", "flat"]


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic day as LOBSTER files, 5 levels."""
    folder = tmp_path_factory.mktemp("day") / "lobster"
    export_lobster(generate_synthetic(1200, levels=5, seed=0, step_seconds=STEP_SECONDS), folder)
    return folder


def lobster_model(path: Path, folder: Path, levels: int = 5, **market: object) -> Path:
    """An untrained joint-face model stamped as ``foxhunt train --data FOLDER`` stamps it, with the market
    options ``market`` (the step clock and ``split_times`` by default)."""
    options = {"step_seconds": STEP_SECONDS, "split_times": SPLIT_TIMES, **market}
    env = LOBVecEnv(2, seed=0, num_steps=400, action_face="joint", levels=levels, episode_length=30)
    model = BranchingIQN("MlpPolicy", env, policy_kwargs=TINY_POLICY, buffer_size=100, batch_size=8,
                         learning_starts=10, seed=0)
    config = RunConfig(data=str(folder), env_kwargs={"levels": levels, "episode_length": 30, **options},
                       action_face="joint", n_envs=2, eval_steps=30)
    fingerprint.stamp(model, fingerprint.run_fingerprint(config))
    model.save(path)
    return path


def evaluate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["evaluate", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err.strip()


def test_a_model_file_is_scored_with_its_split_times(day: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Today's code dropped the model's split_times and scored the fraction split (14:42-16:00, most of it
    inside the training clock 09:30-15:30)."""
    model = lobster_model(tmp_path / "m.zip", day)
    status, _, err = evaluate(capsys, str(model), "--data", str(day), "--out", str(tmp_path / "r"), *QUICK)
    assert status == 0, err
    setup = json.loads((tmp_path / "r" / "evaluation.json").read_text())["setup"]
    assert setup["market_options"]["split_times"] == SPLIT_TIMES
    test = load_market(str(day), split="test", step_seconds=STEP_SECONDS, split_times=SPLIT_TIMES)
    assert setup["market_steps"] == test.num_steps and float(test.time[0]) >= 15.5 * 3600
    assert setup["clock"] == [float(test.time[0]), float(test.time[-1])]
    assert ", clock 15:30:" in (tmp_path / "r" / "report.md").read_text()


def test_a_window_inside_the_training_clock_is_refused(day: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = lobster_model(tmp_path / "m.zip", day)
    status, _, err = evaluate(capsys, str(model), "--data", str(day), "--env.market", '{"split_times": null}',
                              *QUICK)
    assert status == 2 and err.count("\n") == 0, err
    assert "--split test: the model was trained on the 'train' split of these LOBSTER files" in err
    assert "the scored steps' clock 14:4" in err and "overlaps the training clock 09:30:" in err
    assert "-15:29:" in err and "split_times differ" in err
    later = '{"split_times": ["14:30", "15:00"]}'  # test from 15:00: still inside 09:30-15:30
    status, _, err = evaluate(capsys, str(model), "--data", str(day), "--env.market", later, *QUICK)
    assert status == 2 and "overlaps the training clock" in err
    assert not (tmp_path / "evaluations").exists()


def test_env_market_changes_the_options_and_the_report_says_so(day: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    model = lobster_model(tmp_path / "m.zip", day)
    held_out = '{"split_times": ["14:30", "15:45"]}'  # test from 15:45: after the training clock
    status, out, err = evaluate(capsys, str(model), "--data", str(day), "--env.market", held_out,
                                "--out", str(tmp_path / "r"), *QUICK)
    assert status == 0, err
    assert ("market options set with --env.market (not the model's): {'split_times': ['14:30', '15:45']}"
            in out)
    assert "market options set with --env.market" in (tmp_path / "r" / "report.md").read_text()
    for value, message in [("{split_times: 1}", "--env.market='{split_times: 1}' is not valid JSON"),
                           ("[1]", "must be a JSON object of market options"),
                           ('{"split_time": null}',
                            "not a LOBSTER market option; did you mean 'split_times'?"),
                           ('{"market_seed": 3}', "give the evaluation market's seed with --market-seed")]:
        status, _, err = evaluate(capsys, str(model), "--data", str(day), "--env.market", value, *QUICK)
        assert status == 2 and err.count("\n") == 0 and message in err, (value, err)


def test_lobster_evaluations_score_the_same_signal_baselines(day: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39.8: on LOBSTER data a report had only flat, random and buy-and-hold."""
    assert default_baselines("synthetic") == ("flat", "random", "buy_and_hold")
    assert default_baselines(str(day)) == ("flat", "random", "buy_and_hold", "imbalance", "market_maker")
    model = lobster_model(tmp_path / "m.zip", day)
    status, _, err = evaluate(capsys, str(model), "--data", str(day), "--out", str(tmp_path / "r"),
                              "--no-plots")
    assert status == 0, err
    document = json.loads((tmp_path / "r" / "evaluation.json").read_text())
    assert set(document["policies"]) == {"policy", "flat", "random", "buy_and_hold", "imbalance",
                                         "market_maker"}
    fit = document["setup"]["fitted_baselines"]["imbalance"]
    train = load_market(str(day), split="train", step_seconds=STEP_SECONDS, split_times=SPLIT_TIMES)
    assert fit["fit_steps"] == train.num_steps  # fitted on the training clock, never on the scored steps
    assert "- imbalance fitted on" in (tmp_path / "r" / "report.md").read_text()


class NineByNine(gym.Env):
    """foxenv's observations with a MultiDiscrete([3, 3]) action."""

    def __init__(self, size: int) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([3, 3])

    def reset(self, seed=None, options=None):
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}


def test_a_model_over_two_branches_is_refused_in_one_line(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39.13: a model over MultiDiscrete([3, 3]) met a TypeError in model_file.py."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    size = LOBVecEnv(1, num_steps=400, episode_length=30).observation_space.shape[0]
    BranchingIQN("MlpPolicy", DummyVecEnv([lambda: NineByNine(size)]), policy_kwargs=TINY_POLICY,
                 buffer_size=100, batch_size=8, learning_starts=10).save(tmp_path / "two.zip")
    status, _, err = evaluate(capsys, str(tmp_path / "two.zip"), *QUICK)
    assert status == 2 and err.count("\n") == 0, err
    assert "acts in MultiDiscrete([3, 3]), which is not one of foxenv's action faces" in err


def test_goog_held_out_by_the_models_own_clock(lobster_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case on the real GOOG day: a model trained with split_times 14:30 / 15:30 was scored on
    14:42-16:00; it is scored after 15:30, and the fraction split is refused naming both clock ranges."""
    model = lobster_model(tmp_path / "m.zip", lobster_dir, levels=10, step_seconds=None, step_events=100)
    status, _, err = evaluate(capsys, str(model), "--data", str(lobster_dir), "--out", str(tmp_path / "r"),
                              *QUICK)
    assert status == 0, err
    setup = json.loads((tmp_path / "r" / "evaluation.json").read_text())["setup"]
    test = load_market(str(lobster_dir), split="test", step_events=100, split_times=SPLIT_TIMES)
    assert setup["market_steps"] == test.num_steps and float(test.time[0]) >= 15.5 * 3600
    status, _, err = evaluate(capsys, str(model), "--data", str(lobster_dir), "--env.market",
                              '{"split_times": null}', *QUICK)
    assert status == 2 and err.count("\n") == 0, err
    assert "overlaps the training clock 09:30:" in err


def test_train_on_lobster_scores_the_same_signal_baselines_and_its_model_file_agrees(
        day: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39.8: ``foxhunt train``'s report on LOBSTER data scores the imbalance rule and the market maker;
    issue 39.1: ``RUN_DIR`` and ``RUN_DIR/model.zip`` get the same evaluation."""
    run = tmp_path / "run"
    market = json.dumps({"step_seconds": STEP_SECONDS, "split_times": ["13:00", "14:00"]})  # test: 2 h
    assert main(["train", "--data", str(day), "--env.levels", "5", "--env.market", market, "--steps", "120",
                 "--n-envs", "2", "--eval-steps", "70", "--env.episode-length", "30", "--out", str(run),
                 "--no-progress", "--no-hindsight", "--algorithm.learning-starts", "50"]) == 0
    text = capsys.readouterr().out
    assert "policy - imbalance: " in text and "policy - market_maker: " in text
    assert "60 steps x 2 books" in text  # 70 steps are 2 whole 30-step windows per book
    own = json.loads((run / "evaluation.json").read_text())
    assert {"imbalance", "market_maker"} <= set(own["policies"]) and own["setup"]["windows"] == 4
    for k, target in enumerate((run, run / "model.zip")):
        out = tmp_path / f"report{k}"
        assert main(["evaluate", str(target), "--no-plots", "--out", str(out)]) == 0
        again = json.loads((out / "evaluation.json").read_text())
        assert again["setup"] == own["setup"] and again["policies"] == own["policies"], target


def test_the_evaluate_parser_loads_no_torch() -> None:
    """``foxhunt evaluate``'s parser and its names import nothing heavy (issue 39.4: parse first, import
    later); its copy of the LOBSTER splits is foxenv's."""
    import subprocess
    import sys

    from foxenv.data import SPLITS
    from foxhunt.evaluation import cli, names
    from foxhunt.evaluation.baselines import BASELINES, SIGNAL_BASELINES

    assert cli.SPLITS == SPLITS
    assert names.BASELINES == BASELINES and names.SIGNAL_BASELINES == SIGNAL_BASELINES
    code = ("import sys, argparse; from foxhunt.evaluation import cli; "
            "cli.add_parser(argparse.ArgumentParser().add_subparsers()); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
