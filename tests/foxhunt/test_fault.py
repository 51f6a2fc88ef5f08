"""Fault tests of ``foxhunt train`` as a process: SIGKILL mid-run, then ``--resume``; one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foxhunt.checkpoint import list_checkpoints
from foxhunt.runs import train
from tests.foxhunt._small_runs import assert_same_model, small_config

REPO_ROOT = Path(__file__).resolve().parents[2]


def _foxhunt(*args: str, cwd: Path) -> subprocess.Popen:
    """``foxhunt ARGS`` as a child process running this checkout's packages."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-m", "foxhunt.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_run_killed_mid_run_resumes_to_the_uninterrupted_model(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    config_file = small_config(out, steps=800).save(tmp_path / "config.json")
    process = _foxhunt("train", "--config", str(config_file), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not list_checkpoints(out):  # kill as soon as the first checkpoint is in place
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        assert process.poll() is None, "the run ended before it could be killed: give it more steps"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (out / "model.zip").exists()  # the run was lost but for its checkpoints
    assert list_checkpoints(out)[-1][0] < 800

    resumed = _foxhunt("train", "--resume", str(out), "--no-progress", cwd=tmp_path)
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr
    assert f"run folder: {out}" in stdout
    reference = train(small_config(tmp_path / "whole", steps=800))
    assert_same_model(reference / "model.zip", out / "model.zip")
    assert (out / "diagnostics.jsonl").read_text().count("\n") == (
        reference / "diagnostics.jsonl"
    ).read_text().count("\n")


@pytest.mark.parametrize("debug", [False, True])
def test_a_user_error_is_one_line_and_exit_2_in_a_real_process(tmp_path: Path, debug: bool) -> None:
    process = _foxhunt(*(["--debug"] if debug else []), "train", "--steps", "0", cwd=tmp_path)
    _, stderr = process.communicate(timeout=120)
    if debug:
        assert process.returncode == 1 and "Traceback (most recent call last)" in stderr
        assert "ValueError: --steps=0 must be >= 1" in stderr
    else:
        assert process.returncode == 2
        assert stderr == "foxhunt: error: --steps=0 must be >= 1\n"
    assert not (tmp_path / "runs").exists()
