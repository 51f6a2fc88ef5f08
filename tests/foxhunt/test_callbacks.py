"""``foxhunt train`` off a terminal and against the clock: progress lines every 30 s, ``--time-limit``."""

from __future__ import annotations

import argparse
import io
import re
import types
from collections import deque
from pathlib import Path

import pytest

from foxhunt import callbacks
from foxhunt.callbacks import ProgressLineCallback, TimeLimitCallback, format_duration
from foxhunt.cli import main
from foxhunt.options import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("5400", 5400), ("90m", 5400), ("1.5h", 5400), ("1h30m", 5400),
                                               ("45s", 45), ("0.5", 0.5), ("2d", 172800), (" 10M ", 600)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "90x", "1h30", "m", "-5", "0", "0m", "1 h"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 42, 185, 3720, 90000)] == [
        "0s", "42s", "3m05s", "1h02m", "25h00m"]


def _fake_model(steps: int = 0) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_timesteps=steps, ep_info_buffer=deque(maxlen=100), get_env=lambda: None,
                                 logger=None)


def test_progress_lines_come_every_period(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    stream, model = io.StringIO(), _fake_model(200)
    callback = ProgressLineCallback(total=1200, every=30, stream=stream)
    callback.init_callback(model)
    callback.on_training_start({}, {})
    for now, steps in ((1010.0, 300), (1029.0, 400), (1030.0, 500), (1031.0, 510), (1060.0, 800)):
        clock[0], model.num_timesteps = now, steps
        if steps == 800:
            model.ep_info_buffer.extend([{"r": -2.0, "l": 10}, {"r": 4.0, "l": 10}])
        assert callback.on_step()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "training: step 200 of 1,200, a progress line every 30s"
    assert lines[1:] == [
        "step 500 of 1,200 (42 %), 10 steps/s, elapsed 30s, ETA 1m10s",
        "step 800 of 1,200 (67 %), 10 steps/s, elapsed 1m00s, ETA 40s, episode reward: last 4, mean of 2 1",
    ]


def test_time_limit_stops_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [50.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    model = _fake_model()
    callback = TimeLimitCallback(10, "--time-limit 10s", total=1000)
    callback.init_callback(model)
    callback.on_training_start({}, {})
    clock[0], model.num_timesteps = 59.9, 40
    assert callback.on_step() and callback.stop_reason is None
    clock[0], model.num_timesteps = 60.0, 48
    assert not callback.on_step()
    assert callback.stop_reason == "training stopped by --time-limit 10s at step 48 of 1,000"
    with pytest.raises(ValueError, match="seconds=0 must be > 0"):
        TimeLimitCallback(0)


@pytest.mark.slow
def test_train_with_a_time_limit_saves_checkpoints_evaluates_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--time-limit", "3", "--steps", "1000000", "--n-envs", "2", "--eval-steps", "10",
            "--exp-name", "cut"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (run,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"cut-\d{8}-\d{6}-[0-9a-f]{6}", run.name)
    cut = re.search(r"training stopped by --time-limit 3s at step ([\d,]+) of 1,000,000", out)
    assert cut, out
    step = int(cut[1].replace(",", ""))
    assert 0 < step < 1_000_000
    # stdout is no terminal here: progress lines instead of a bar
    assert "training: step 0 of 1,000,000, a progress line every 30s" in out
    assert re.search(rf"step {cut[1]} of 1,000,000 \(0 %\), [\d,]+ steps/s", out)
    assert (run / "model.zip").is_file()
    checkpoints = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")]
    assert checkpoints == [f"step_{step:09d}"]
    assert "training stopped by --time-limit 3s" in (run / "report.md").read_text().splitlines()[0]
    # the cut run goes on with --resume
    assert main(["train", "--resume", str(run), "--time-limit", "2"]) == 0
    later = re.search(r"training stopped by --time-limit 2s at step ([\d,]+)", capsys.readouterr().out)
    assert later and int(later[1].replace(",", "")) > step
