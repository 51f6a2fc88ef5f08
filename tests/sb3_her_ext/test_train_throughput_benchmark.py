"""``benchmarks/train_throughput.py``: the replay-ratio schedule, the flat-action wrapper and a smoke run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch as th


def _module() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "train_throughput.py"
    spec = importlib.util.spec_from_file_location("train_throughput_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("books,batch,ratio,expected", [
    (16, 256, 0.25, (64, 1, 0.25)), (256, 256, 0.25, (4, 1, 0.25)), (4096, 256, 0.25, (1, 4, 0.25)),
    (65536, 256, 0.25, (1, 64, 0.25)), (16, 32, 1.0, (2, 1, 1.0)),
])
def test_schedule_gives_the_replay_ratio(books: int, batch: int, ratio: float, expected: tuple) -> None:
    assert _module().schedule(books, batch, ratio) == expected


def test_schedule_rejects_a_ratio_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="replay_ratio"):
        _module().schedule(16, 256, 0.0)


def test_quick_run_writes_every_row_with_its_ratio_to_sb3_dqn(tmp_path: Path) -> None:
    threads = th.get_num_threads()
    out = tmp_path / "result.json"
    try:
        _module().main(["--quick", "--device", "cpu", "--books", "4", "--seconds", "0.2", "--threads", "1",
                        "--num-steps", "2000", "--out", str(out)])
    finally:
        th.set_num_threads(threads)
    rows = json.loads(out.read_text())["rows"]
    assert [row["row"] for row in rows] == ["BranchingIQN device loop", "BranchingIQN one graph",
                                           "BranchingIQN SB3 loop", "SB3 DQN", "sb3-contrib QR-DQN"]
    assert rows[1]["skipped"] == "CUDA only (a CUDA graph)"  # the one-graph row needs CUDA
    dqn = next(row for row in rows if row["row"] == "SB3 DQN")
    assert dqn["over_sb3_dqn"] == 1.0
    for row in rows:
        if "skipped" in row:  # QR-DQN without sb3-contrib
            continue
        assert row["env_steps_per_s"] > 0 and row["replay_ratio"] == 0.25 and row["timed_gradient_steps"] > 0
        assert row["collect_only_env_steps_per_s"] > 0
        assert row["over_sb3_dqn"] == pytest.approx(row["env_steps_per_s"] / dqn["env_steps_per_s"])
