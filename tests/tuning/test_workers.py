"""Many workers of one study: started at the same moment on a new PostgreSQL database, launched by
``foxhunt tune --n-workers N`` (CPU workers, separate processes, one storage), one killed mid-trial."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from foxhunt.runs import RunConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
_databases = itertools.count()

#: One worker's start: say it is ready, wait for the go, then open the storage and the study at once.
_OPEN = """
import sys, time
from pathlib import Path
from tuning.study import make_sampler, make_storage, open_study, make_pruner
url, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.001)
storage = make_storage(url)
study = open_study("race", storage, "sharpe", True, make_sampler("random", 0), make_pruner("none"), {"k": 1})
print(study._study_id)
"""


def fresh_database(url: str) -> str:
    """A new, empty database on the test server (no optuna tables): its URL."""
    import psycopg

    name = f"fresh_{os.getpid()}_{next(_databases)}"
    server = url.rsplit("/", 1)[0]
    host, port = server.split("@", 1)[1].split(":")
    with psycopg.connect(host=host, port=int(port), user="postgres", dbname="postgres",
                         autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return f"{server}/{name}"


@pytest.mark.slow
def test_workers_started_at_once_on_a_new_database_share_one_study(postgres_url: str, tmp_path: Path) -> None:
    """Issue 26: all create the tables (PostgreSQL: CREATE TYPE studydirection) and the study at once."""
    url = fresh_database(postgres_url)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    go = tmp_path / "go"
    workers = [
        subprocess.Popen([sys.executable, "-c", _OPEN, url, str(tmp_path / f"ready{k}"), str(go)],
                         cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in range(4)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{k}").exists() for k in range(4)):  # every interpreter has imported
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers)
        time.sleep(0.05)
    go.touch()
    results = [worker.communicate(timeout=120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * 4, [err for _, err in results]
    assert len({out.strip() for out, _ in results}) == 1  # one study, the same id for all
    summaries = optuna.get_all_study_summaries(url)
    assert [s.study_name for s in summaries] == ["race"] and summaries[0].user_attrs["metric"] == "sharpe"


def _launcher(tiny_files: tuple[Path, Path], out: Path, *extra: str) -> subprocess.Popen:
    config, space = tiny_files
    command = [
        sys.executable, "-m", "foxhunt.cli", "tune", "--config", str(config), "--space", str(space),
        "--out", str(out), "--sampler", "random", "--pruner", "none", "--n-evaluations", "1",
        "--heartbeat-interval", "1", "--grace-period", "3", "--no-progress", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    log = open(out.with_suffix(".log"), "w")
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_launcher_runs_cpu_workers_as_processes_on_one_storage(
    postgres_url: str, tiny_files: tuple[Path, Path], tmp_path: Path
) -> None:
    url = fresh_database(postgres_url)
    out = tmp_path / "study"
    launcher = _launcher(tiny_files, out, "--storage", url, "--n-workers", "2", "--n-trials", "4",
                         "--eval-steps", "10")
    try:
        assert launcher.wait(timeout=400) == 0, out.with_suffix(".log").read_text()
    finally:
        if launcher.poll() is None:
            launcher.terminate()  # the launcher stops its workers on SIGTERM
            launcher.wait(timeout=60)
    log = out.with_suffix(".log").read_text()
    study = optuna.load_study(study_name="foxhunt", storage=url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    workers = {t.user_attrs["worker"] for t in study.trials}
    assert len(workers) == 2 and all(w.split(":")[1] != str(launcher.pid) for w in workers)
    assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == 4
    assert "worker 1/2: pid" in log and "worker 2/2: pid" in log and log.count("\nbest sharpe=") == 1
    assert log.count("not searched on the joint action face") == 1  # said once, by the launcher
    best = RunConfig.load(out / "best_config.json")  # written once, by the launcher, with the full budget
    assert best.eval_steps == 20 and best.checkpoint_every == RunConfig().checkpoint_every


@pytest.mark.slow
def test_a_launched_worker_killed_mid_trial_loses_nothing_and_its_trial_is_rerun(
    tiny_files: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "study"
    storage = f"sqlite:///{out / 'study.db'}"
    launcher = _launcher(tiny_files, out, "--n-workers", "2", "--n-trials", "8")
    try:
        deadline = time.monotonic() + 240
        victim = None
        while victim is None:
            log = out.with_suffix(".log")
            assert time.monotonic() < deadline and launcher.poll() is None, log.read_text()
            time.sleep(0.5)
            try:
                running = optuna.load_study(study_name="foxhunt", storage=storage).get_trials(
                    states=(TrialState.RUNNING,))
            except (KeyError, Exception):  # not created yet
                continue
            running = [t for t in running if "worker" in t.user_attrs]  # its objective has started
            if running:
                time.sleep(1.0)  # into the training run
                victim = running[0]
                os.kill(int(victim.user_attrs["worker"].split(":")[1]), signal.SIGKILL)
        completed_before = {t.number for t in optuna.load_study(study_name="foxhunt", storage=storage).trials
                            if t.state == TrialState.COMPLETE}
        assert launcher.wait(timeout=400) == 1  # a worker died: said, and not 0
    finally:
        if launcher.poll() is None:
            launcher.terminate()  # the launcher stops its workers on SIGTERM
            launcher.wait(timeout=60)
    log = out.with_suffix(".log").read_text()
    study = optuna.load_study(study_name="foxhunt", storage=storage)
    trials = {t.number: t for t in study.trials}
    assert completed_before <= {n for n, t in trials.items() if t.state == TrialState.COMPLETE}
    assert trials[victim.number].state == TrialState.FAIL
    reruns = [t for t in trials.values() if t.system_attrs.get("failed_trial") == victim.number]
    assert len(reruns) == 1 and reruns[0].state == TrialState.COMPLETE, log
    assert reruns[0].params == victim.params and reruns[0].user_attrs["worker"] != victim.user_attrs["worker"]
    assert not [t for t in trials.values() if t.state == TrialState.RUNNING]
    assert "was killed by signal 9" in log and "retry of trial" in log
    assert (out / "best_config.json").exists()
