"""``foxhunt train --eval-freq N``: evaluations on the validation data during training, the best model kept
(SB3's ``EvalCallback``), training unchanged by them, the best surviving a resume."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from foxhunt.eval_callback import BEST_MODEL_FILE, EVALUATIONS_FILE, RunEvalCallback
from foxhunt.runs import RunConfig, eval_market_seed, held_out_metrics, resume, train, train_market_seed
from tests.foxhunt._small_runs import Crash, CrashAt, assert_same_model, small_config


def _lines(run: Path) -> list[dict]:
    return [json.loads(text) for text in (run / EVALUATIONS_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The small run without evaluations, with them every 200 steps, and the latter killed and resumed."""
    root = tmp_path_factory.mktemp("evalfreq")
    plain = train(small_config(root / "plain"))
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        evaluated = train(small_config(root / "evaluated", eval_freq=100))
    (root / "evaluated.out").write_text(output.getvalue())
    with pytest.raises(Crash):
        train(small_config(root / "resumed", eval_freq=100), CrashAt(550))
    killed = [line["timesteps"] for line in _lines(root / "resumed")]
    assert killed == [100, 200, 300, 400, 500], killed  # 500: after the last checkpoint (step 400)
    resumed = resume(root / "resumed")
    return {"plain": plain, "evaluated": evaluated, "resumed": resumed}


def test_evaluations_do_not_change_training(runs: dict[str, Path]) -> None:
    assert_same_model(runs["plain"] / "model.zip", runs["evaluated"] / "model.zip")
    assert not (runs["plain"] / EVALUATIONS_FILE).exists()
    assert not (runs["plain"] / BEST_MODEL_FILE).exists()


def test_evaluations_log_and_keep_the_best(runs: dict[str, Path]) -> None:
    from sb3_her_ext import BranchingIQN

    run = runs["evaluated"]
    lines = _lines(run)
    assert [line["timesteps"] for line in lines] == [100, 200, 300, 400, 500, 600]
    assert all("sharpe" in line and "pnl" in line for line in lines)
    best = [line for line in lines if line["best"]]
    finite = [line["sharpe"] for line in lines if line["sharpe"] is not None]
    assert len(best) >= 1 and best[-1]["sharpe"] == max(finite)
    assert BranchingIQN.load(run / BEST_MODEL_FILE).num_timesteps == best[-1]["timesteps"]
    assert json.loads((run / "config.json").read_text())["eval_freq"] == 100
    events = b"".join(path.read_bytes() for path in (run / "tb").rglob("*tfevents*"))
    assert b"eval/sharpe" in events and b"eval/pnl" in events
    printed = (run.parent / "evaluated.out").read_text()
    assert "eval at step 100 (validation data): sharpe " in printed
    assert printed.count("eval at step") == 6
    assert f"best model: {run / BEST_MODEL_FILE} (sharpe " in printed


def test_best_survives_a_resume(runs: dict[str, Path]) -> None:
    # killed at step 550, resumed from the checkpoint of step 400: the evaluation of step 500 is done again
    assert _lines(runs["resumed"]) == _lines(runs["evaluated"])
    assert_same_model(runs["resumed"] / "model.zip", runs["evaluated"] / "model.zip")
    if (runs["evaluated"] / BEST_MODEL_FILE).is_file():
        assert_same_model(runs["resumed"] / BEST_MODEL_FILE, runs["evaluated"] / BEST_MODEL_FILE)


def test_evaluations_score_the_validation_data_never_the_test_data() -> None:
    config = RunConfig(eval_freq=100)  # the run's own eval_split is "test": its final report's data
    callback = RunEvalCallback(config, "unused", held_out_metrics)
    assert callback.config.eval_split == "validation"
    assert eval_market_seed(callback.config) == train_market_seed(config) + 2 != eval_market_seed(config)


def test_eval_freq_is_checked_and_a_train_option() -> None:
    with pytest.raises(ValueError, match="RunConfig.eval_freq=-1"):
        RunConfig(eval_freq=-1)
    with pytest.raises(ValueError, match="RunConfig.eval_metric='sharp'"):
        RunConfig(eval_metric="sharp")
    from foxhunt.cli import build_parser
    from foxhunt.options import config_from_args

    args = build_parser().parse_args(["train", "--eval-freq", "5000", "--eval-metric", "pnl"])
    config = config_from_args(args)
    assert (config.eval_freq, config.eval_metric) == (5000, "pnl")


@pytest.mark.gpu
def test_eval_freq_on_the_device_loop_evaluates_at_rollout_ends(tmp_path: Path) -> None:
    """On CUDA (the device loop: callbacks once per rollout) each multiple of N gets one evaluation, at the
    first rollout end at or after it."""
    from foxhunt.cli import main
    from sb3_her_ext import BranchingIQN

    out = tmp_path / "run"
    assert main(["train", "--device", "cuda", "--steps", "600", "--n-envs", "4", "--out", str(out),
                 "--no-progress", "--eval-steps", "5", "--eval-freq", "200"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["device_loop"] is True and config["eval_freq"] == 200
    steps = [line["timesteps"] for line in _lines(out)]
    assert steps and steps == sorted(steps) and steps[0] >= 200
    assert [step // 200 for step in steps] == sorted(set(step // 200 for step in steps))
    best = [line for line in _lines(out) if line["best"]]
    assert best
    assert BranchingIQN.load(out / BEST_MODEL_FILE, device="cuda").num_timesteps == best[-1]["timesteps"]
