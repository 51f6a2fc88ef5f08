"""Two ``foxhunt tune`` workers on one PostgreSQL study; one is SIGKILLed mid-trial and its trial re-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

REPO_ROOT = Path(__file__).resolve().parents[2]


def _worker(url: str, tiny_files: tuple[Path, Path], out: Path, n_trials: int, seed: int) -> subprocess.Popen:
    config, space = tiny_files
    command = [
        sys.executable, "-m", "foxhunt.cli", "tune", "--storage", url, "--study-name", "shared", "--resume",
        "--config", str(config), "--space", str(space), "--out", str(out), "--n-trials", str(n_trials),
        "--sampler", "random", "--sampler-seed", str(seed), "--pruner", "none", "--n-evaluations", "1",
        "--heartbeat-interval", "1", "--grace-period", "3", "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    log = open(out.with_suffix(".log"), "w")
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_killed_worker_loses_no_completed_trial_and_its_trial_is_rerun(
    postgres_url: str, tiny_files: tuple[Path, Path], tmp_path: Path
) -> None:
    victim = _worker(postgres_url, tiny_files, tmp_path / "victim", n_trials=3, seed=1)
    survivor = _worker(postgres_url, tiny_files, tmp_path / "survivor", n_trials=5, seed=2)
    try:
        deadline = time.monotonic() + 180
        killed = None
        while killed is None:
            assert time.monotonic() < deadline, (tmp_path / "victim.log").read_text()
            assert victim.poll() is None, (tmp_path / "victim.log").read_text()
            time.sleep(0.5)
            try:
                study = optuna.load_study(study_name="shared", storage=postgres_url)
            except KeyError:  # not created yet
                continue
            running = [
                t
                for t in study.get_trials(states=(TrialState.RUNNING,))
                if t.user_attrs.get("worker", "").endswith(f":{victim.pid}")
            ]
            if running:
                time.sleep(1.0)  # into the training run
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                killed = running[0]
        study = optuna.load_study(study_name="shared", storage=postgres_url)
        completed_before = {t.number for t in study.get_trials(states=(TrialState.COMPLETE,))}
        assert survivor.wait(timeout=300) == 0, (tmp_path / "survivor.log").read_text()
    finally:
        for process in (victim, survivor):
            if process.poll() is None:
                process.kill()

    study = optuna.load_study(study_name="shared", storage=postgres_url)
    trials = {t.number: t for t in study.trials}
    complete = {n for n, t in trials.items() if t.state == TrialState.COMPLETE}
    assert completed_before <= complete  # every completed trial is kept
    assert trials[killed.number].state == TrialState.FAIL  # marked stale by the survivor
    reruns = [t for t in trials.values() if t.system_attrs.get("failed_trial") == killed.number]
    assert len(reruns) == 1, [(t.number, t.state, t.system_attrs) for t in trials.values()]
    rerun = reruns[0]
    assert rerun.state == TrialState.COMPLETE and rerun.params == trials[killed.number].params
    assert rerun.user_attrs["worker"].endswith(f":{survivor.pid}")
    assert len([t for t in trials.values() if t.state == TrialState.RUNNING]) == 0
    survivor_trials = [
        t for t in trials.values() if t.user_attrs.get("worker", "").endswith(f":{survivor.pid}")
    ]
    assert len(survivor_trials) == 5 and all(t.state == TrialState.COMPLETE for t in survivor_trials)
    assert "retry of trial" in (tmp_path / "survivor.log").read_text()
