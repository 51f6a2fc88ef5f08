"""``foxhunt tune --trials-per-process K``: K trials at once in one worker (threads; on a GPU a CUDA stream
each); each trial's value is the one its config gives trained alone; each trial's log holds its own output."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from foxhunt.cli import build_parser
from foxhunt.runs import RunConfig, train
from tuning.cli import run
from tuning.objective import thread_stdout
from tuning.study import StudySettings, make_sampler


def test_trials_run_at_once_score_as_each_trained_alone(tiny_files: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    config, space = tiny_files
    out = tmp_path / "study"
    argv = ["tune", "--config", str(config), "--space", str(space), "--out", str(out), "--no-progress",
            "--n-startup-trials", "1", "--n-evaluations", "1", "--pruner", "none", "--n-trials", "2",
            "--trials-per-process", "2"]
    assert run(build_parser().parse_args(argv)) == 0
    assert capsys.readouterr().out.count(" COMPLETE sharpe=") == 2
    study = optuna.load_study(study_name="foxhunt", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert study.trials[0].params != study.trials[1].params
    for trial in study.trials:
        folder = out / "trials" / f"{trial.number:05d}"
        log = (out / "trials" / f"{trial.number:05d}.log").read_text()
        assert f"run folder: {folder}" in log and log.count("run folder:") == 1  # its own output only
        alone = RunConfig.from_dict(trial.user_attrs["run_config"])
        again = train(dataclasses.replace(alone, out=str(tmp_path / f"alone{trial.number}")))
        assert json.loads((again / "evaluation.json").read_text())["sharpe"] == trial.value


def test_thread_stdout_sends_each_thread_to_its_own_stream(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.log" for i in range(3)]
    barrier = threading.Barrier(3)

    def write(i: int) -> None:
        with open(paths[i], "w") as log, thread_stdout(log):
            barrier.wait()
            for _ in range(50):
                print(f"thread {i}")
            barrier.wait()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, path in enumerate(paths):
        assert path.read_text() == f"thread {i}\n" * 50


def test_a_trials_parameters_do_not_depend_on_the_trials_beside_it() -> None:
    """Optuna reseeds the sampler whenever a thread of ``n_jobs`` takes a trial; the per-trial samplers
    ignore it, so trials run at once draw what they draw one at a time (the trials sleep before they sample,
    so another thread's reseed falls inside each)."""

    def objective(trial: optuna.Trial) -> float:
        time.sleep(0.05)
        return trial.suggest_float("x", 0.0, 1.0) + trial.suggest_int("n", 0, 1000)

    drawn = []
    for n_jobs in (1, 3):
        study = optuna.create_study(sampler=make_sampler("random", 7))
        study.optimize(objective, n_trials=6, n_jobs=n_jobs)
        drawn.append({t.number: t.params for t in study.trials})
    assert drawn[0] == drawn[1] and len(drawn[0]) == 6


def test_trials_per_process_is_checked() -> None:
    with pytest.raises(ValueError, match="trials_per_process=0 must be an integer >= 1"):
        StudySettings(trials_per_process=0)
