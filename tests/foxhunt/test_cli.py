"""The ``foxhunt`` command line: help, rollout metrics, and an end-to-end ``train`` run folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch as th

from foxhunt.cli import build_parser, main


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """``main`` sets the torch thread count (``--threads``); put it back afterwards."""
    threads = th.get_num_threads()
    yield
    th.set_num_threads(threads)


def test_help_documents_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "train" in text and "rollout" in text
    train_help = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for option in ("--data", "--steps", "--n-envs", "--device", "--seed", "--out", "--hindsight",
                   "--no-hindsight"):
        assert option in train_help, option


def test_rollout_prints_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "--steps", "30", "--n-envs", "2", "--no-progress"]) == 0
    text = capsys.readouterr().out
    for metric in ("sharpe", "max_drawdown", "hit_rate", "action_mix", "direction"):
        assert metric in text, metric


def test_train_rejects_a_missing_data_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--data='.*nowhere' must be 'synthetic' or a folder"):
        main(["train", "--data", str(tmp_path / "nowhere"), "--steps", "10", "--out", str(tmp_path / "run"),
              "--no-progress"])


def test_train_rejects_too_few_eval_steps_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--eval-steps=1 must be >= 2"):
        main(["train", "--steps", "10", "--eval-steps", "1", "--out", str(tmp_path / "run"), "--no-progress"])
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--seed", "-1", "--seed=-1 must lie in"), ("--seed", str(2**32), "--seed=4294967296 must lie in"),
    ("--device", "tpu", "--device='tpu' must be cpu or cuda"),
    ("--device", "meta", "--device='meta' must be cpu or cuda"),
])
@pytest.mark.parametrize("command", ["train", "rollout"])
def test_bad_seed_or_device_is_refused_before_anything_runs(
    tmp_path: Path, command: str, flag: str, value: str, message: str
) -> None:
    extra = ["--out", str(tmp_path / "run")] if command == "train" else []
    with pytest.raises(ValueError, match=message):
        main([command, "--steps", "10", flag, value, "--no-progress", *extra])
    assert not (tmp_path / "run").exists()


def test_cuda_graph_on_the_cpu_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--cuda-graph needs --device cuda, got --device='cpu'"):
        main(["train", "--steps", "10", "--cuda-graph", "--no-progress", "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


@pytest.mark.gpu
def test_train_on_cuda_runs_graphed_steps(tmp_path: Path) -> None:
    """``--device cuda`` trains with ``cuda_graph`` on by default (and ``--no-cuda-graph`` turns it off)."""
    from sb3_her_ext import BranchingIQN

    for flags, graphed in (([], True), (["--no-cuda-graph"], False)):
        out = tmp_path / f"run_{graphed}"
        assert main(["train", "--device", "cuda", "--steps", "600", "--n-envs", "4", "--out", str(out),
                     "--no-progress", "--eval-steps", "5", *flags]) == 0
        assert json.loads((out / "config.json").read_text())["cuda_graph"] is graphed
        model = BranchingIQN.load(out / "model.zip", device="cuda")
        assert model.cuda_graph is graphed and model.num_timesteps == 600


@pytest.mark.slow
def test_train_writes_the_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sb3_her_ext import BranchingIQN
    from sb3_her_ext.diagnostics import DIAGNOSTICS_KEYS, read_diagnostics

    out = tmp_path / "run"
    assert main(["train", "--steps", "240", "--n-envs", "2", "--out", str(out), "--no-progress",
                 "--eval-steps", "20", "--no-hindsight", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    for metric in ("sharpe", "max_drawdown", "hit_rate", "action_mix"):
        assert metric in text, metric
    assert str(out) in text
    for name in ("model.zip", "config.json", "diagnostics.jsonl", "training.png", "evaluation.json"):
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("*/events.out.tfevents.*"))
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((out / "config.json").read_text())
    assert config["steps"] == 240 and config["n_envs"] == 2 and config["hindsight"] is False
    assert config["seed"] == 3 and config["cuda_graph"] is False  # off on the CPU
    lines = read_diagnostics(out / "diagnostics.jsonl")
    assert lines and all(tuple(line) == DIAGNOSTICS_KEYS for line in lines)
    assert lines[-1]["step"] == 240
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["steps"] == 20 * 2
    model = BranchingIQN.load(out / "model.zip")
    assert model.hindsight_config is None and model.num_timesteps == 240
    obs = np.zeros((2, model.observation_space.shape[0]), np.float32)
    actions, _ = model.predict(obs, deterministic=True)
    assert actions.shape == (2, 4)


@pytest.mark.slow
def test_train_on_lobster_evaluates_on_the_test_split(lobster_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["train", "--data", str(lobster_dir), "--steps", "160", "--n-envs", "2", "--out", str(out),
                 "--no-progress", "--eval-steps", "10"]) == 0
    assert "evaluation: deterministic policy, test split" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["hindsight"] is True
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["eval_data"] == "test split" and evaluation["steps"] == 10 * 2
