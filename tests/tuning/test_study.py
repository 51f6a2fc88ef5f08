"""Studies end to end on real training runs: SQLite, resume, pruning, raising trials, bad inputs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import tuning.objective
from foxhunt.checkpoint import list_checkpoints
from foxhunt.cli import build_parser
from foxhunt.cli import main as foxhunt_main
from foxhunt.runs import RunConfig, train
from tuning.cli import run
from tuning.evaluation import held_out_metrics
from tuning.space import DEFAULT_SPACE, Param
from tuning.study import StudySettings, make_storage, open_study, tune


def main(argv: list[str]) -> int:
    """``foxhunt ARGV`` with ``tune``'s errors raised (``foxhunt.cli.main`` may print them instead)."""
    return run(build_parser().parse_args(argv))


def _tune(tiny_files: tuple[Path, Path], out: Path, *extra: str) -> int:
    config, space = tiny_files
    return main(
        [
            "tune",
            "--config",
            str(config),
            "--space",
            str(space),
            "--out",
            str(out),
            "--no-progress",
            "--n-startup-trials",
            "1",
            "--n-evaluations",
            "1",
            *extra,
        ]
    )


def test_tiny_study_completes_and_resume_adds_trials(
    tiny_files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "study"
    assert _tune(tiny_files, out, "--n-trials", "2", "--pruner", "none") == 0
    printed = capsys.readouterr().out
    assert printed.count("trial 0 COMPLETE sharpe=") == 1 and printed.count("trial 1 COMPLETE") == 1
    storage = f"sqlite:///{out / 'study.db'}"
    study = optuna.load_study(study_name="foxhunt", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    best = RunConfig.load(out / "best_config.json")
    # the space fixes hindsight off (on the joint action face it is not searched, and off)
    assert best.out is None and best.steps == 200 and best.resolved_hindsight() is False
    assert best.policy.net_arch == [study.best_params["policy.net_width"]] * 2
    assert best.algorithm.learning_rate == study.best_params["algorithm.learning_rate"]
    for name in ("optimization_history", "parallel_coordinate"):
        assert (out / f"{name}.png").stat().st_size > 1000
    assert not (out / "param_importances.png").exists()  # 2 trials: an importance ranking would be noise
    for trial in study.trials:  # each trial's run folder, its value from its evaluation.json
        run = out / "trials" / f"{trial.number:05d}"
        evaluation = json.loads((run / "evaluation.json").read_text())
        assert evaluation["sharpe"] == trial.value
        # scored on the validation market (seed 2), never on the test market (seed 1) that reports use
        assert (evaluation["setup"]["market_seed"], evaluation["setup"]["train_market_seed"]) == (2, 0)
    assert best.eval_split == "validation" and study.user_attrs["eval_split"] == "validation"
    assert f"foxhunt train --config {out / 'best_config.json'} --eval-split test" in printed
    assert study.metric_names == ["sharpe"]  # the objective's name in optuna-dashboard
    # the joint face (the default) has no vaccine; the budget of 200 steps fixes the target update interval
    assert "algorithm.vaccine_interval" not in study.best_params
    assert best.algorithm.target_update_interval == 50
    assert "not searched on the joint action face" in printed
    assert "algorithm.target_update_interval fixed at 50" in printed

    with pytest.raises(ValueError, match="'foxhunt' already exists.*--resume"):
        _tune(tiny_files, out, "--n-trials", "1")
    with pytest.raises(ValueError, match="metric='sharpe', not metric='pnl'"):
        _tune(tiny_files, out, "--n-trials", "1", "--resume", "--metric", "pnl")
    assert _tune(tiny_files, out, "--n-trials", "1", "--resume", "--pruner", "none") == 0
    study = optuna.load_study(study_name="foxhunt", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert study.trials[2].params not in (study.trials[0].params, study.trials[1].params)  # new parameters
    other_space = tiny_files[1].with_name("other.yaml")
    other_space.write_text(tiny_files[1].read_text().replace("choices: [8, 16]", "choices: [8, 32]"))
    with pytest.raises(ValueError, match="searches space parameter 'policy.net_width'"):
        _tune((tiny_files[0], other_space), out, "--n-trials", "1", "--resume")


def test_pruner_stops_a_clearly_worse_trial(tiny_files: tuple[Path, Path], tmp_path: Path) -> None:
    """Trial 1 is made clearly worse (its held-out Sharpe minus 100): the median pruner stops it early.

    Every knob but the learning rate is fixed, so trials 0 and 2 are the same run.
    """
    base = RunConfig.load(tiny_files[0])
    space = {name: None for name in DEFAULT_SPACE}
    space.update(
        net_width=8, batch_size=16, hindsight=False, learning_rate=Param("float", 1e-4, 1e-2, log=True)
    )
    settings = StudySettings(
        out=tmp_path,
        n_trials=3,
        n_startup_trials=1,
        n_evaluations=2,
        progress=False,
        pruner="median",
        sampler="random",
        resume=True,
    )
    study = open_study(
        "foxhunt",
        make_storage(settings.storage_url()),
        "sharpe",
        True,
        optuna.samplers.RandomSampler(),
        optuna.pruners.NopPruner(),
    )
    for learning_rate in (3e-4, 1e-3, 3e-4):  # the second is the worse one
        study.enqueue_trial({"learning_rate": learning_rate})

    def evaluate(model, config):
        metrics = dict(held_out_metrics(model, config))
        if model.learning_rate == 1e-3:
            metrics["sharpe"] -= 100.0
        return metrics

    study = tune(base, space, settings, evaluate=evaluate)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.COMPLETE]
    pruned = study.trials[1]
    assert list(pruned.intermediate_values) == [1]  # stopped at its first evaluation point
    assert not (tmp_path / "trials" / "00001" / "model.zip").exists()
    assert all(list(t.intermediate_values) == [1, 2] for t in (study.trials[0], study.trials[2]))


def test_a_raising_trial_fails_is_not_retried_and_a_study_of_failures_exits_1(
    tiny_files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_train(config: RunConfig, callback: object = None) -> Path:
        raise RuntimeError(f"no market for {config.out}")

    monkeypatch.setattr(tuning.objective, "train", broken_train)
    config, space = tiny_files
    out = tmp_path / "s"
    argv = ["tune", "--config", str(config), "--space", str(space), "--out", str(out), "--n-trials", "2",
            "--no-progress"]
    assert foxhunt_main(argv) == 1
    captured = capsys.readouterr()
    assert "trial 0 FAIL (RuntimeError: no market for" in captured.out and "trial 1 FAIL" in captured.out
    assert captured.err == (f"foxhunt: error: every trial of study 'foxhunt' failed (2); the first, trial 0: "
                            f"RuntimeError: no market for {out / 'trials' / '00000'}\n")
    study = optuna.load_study(study_name="foxhunt", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2  # no WAITING re-run was queued
    assert not (out / "best_config.json").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--metric", "profit"], "metric='profit'"),
        (["--storage", "nosuchdb://x/y"], "storage='nosuchdb://x/y'"),
        (["--storage", "study.db"], "storage='study.db'"),
        (
            ["--storage", "postgresql://nobody@127.0.0.1:1/none"],
            "storage='postgresql://nobody@127.0.0.1:1/none'",
        ),
        (["--pruner", "mean"], "pruner='mean'"),
        (["--sampler", "cmaes"], "sampler='cmaes'"),
        (["--data", "/no/such/folder"], "--data='/no/such/folder'"),
        (["--device", "tpu"], "--device='tpu'"),
        (["--n-trials", "0"], "n_trials=0"),
        (["--sampler-seed", "-1"], "--sampler-seed -1"),
        (["--max-retry", "-1"], "--max-retry -1"),
    ],
)
def test_bad_input_names_the_value(tmp_path: Path, args: list[str], named: str) -> None:
    with pytest.raises(ValueError) as error:
        main(["tune", "--out", str(tmp_path / "s"), "--no-progress", *args])
    assert named in str(error.value)
    assert not (tmp_path / "s" / "trials").exists()


def test_unknown_space_parameter_is_named(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: float, low: 1.0e-4, high: 1.0e-3}\nwarp_factor: 9\n")
    with pytest.raises(ValueError, match="warp_factor"):
        main(["tune", "--space", str(space), "--out", str(tmp_path / "s")])


def test_storage_errors_hide_the_password() -> None:
    with pytest.raises(ValueError) as error:
        make_storage("postgresql://bob:secret@127.0.0.1:1/none")
    assert "storage='postgresql://bob:***@127.0.0.1:1/none'" in str(error.value)
    assert "secret" not in str(error.value)


def test_a_study_can_be_scored_on_the_test_data_when_asked(tiny_files: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert _tune(tiny_files, out, "--n-trials", "1", "--pruner", "none", "--eval-split", "test") == 0
    evaluation = json.loads((tmp_path / "s" / "trials" / "00000" / "evaluation.json").read_text())
    assert evaluation["setup"]["market_seed"] == 1
    assert RunConfig.load(tmp_path / "s" / "best_config.json").eval_split == "test"
    with pytest.raises(ValueError, match="eval_split='train' must be one of 'test', 'validation'"):
        StudySettings(eval_split="train")


def test_a_trial_is_the_run_that_best_config_reproduces(
    tiny_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """Evaluations during training leave its random streams alone: ``train(best_config)`` scores the same
    on the trial's evaluation steps; best_config.json itself has the full run's evaluation and checkpoints
    (the --config file's eval_steps=20, the default checkpoint_every), not the trial's budget."""
    assert _tune(tiny_files, tmp_path / "s", "--n-trials", "1", "--pruner", "none", "--eval-steps", "10") == 0
    study = optuna.load_study(study_name="foxhunt", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    assert len(study.trials[0].intermediate_values) == 1
    trial = study.trials[0].user_attrs["run_config"]
    assert (trial["eval_steps"], trial["checkpoint_every"]) == (10, 0)
    config = RunConfig.load(tmp_path / "s" / "best_config.json")
    assert (config.eval_steps, config.checkpoint_every) == (20, RunConfig().checkpoint_every)
    run = train(dataclasses.replace(config, out=str(tmp_path / "again"), progress=False, eval_steps=10))
    assert list_checkpoints(run)  # the full run can be resumed
    assert json.loads((run / "evaluation.json").read_text())["sharpe"] == study.best_value
