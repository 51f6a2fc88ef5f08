"""``benchmarks/generic_cpu.py``: its toy env, the flattened face QR-DQN sees, and a tiny timed run's JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest


def _module() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "generic_cpu.py"
    spec = importlib.util.spec_from_file_location("generic_cpu_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_toy_env_rewards_the_targets_and_the_flat_face_unravels_the_same_actions() -> None:
    bench = _module()
    env = bench.ToyBranchEnv(seed=3)
    obs, _ = env.reset()
    targets = np.minimum((obs[:3] * np.array([3, 4, 2])).astype(int), [2, 3, 1])
    _, reward, terminated, truncated, _ = env.step(targets)
    assert reward == 1.0 and not terminated and not truncated
    flat = bench.FlatActions(bench.ToyBranchEnv(seed=3))
    assert flat.action_space.n == 24
    flat.reset(seed=3)  # the same first observation as ``env``'s
    joint = int(np.ravel_multi_index(tuple(targets), (3, 4, 2)))
    assert flat.step(joint)[1] == 1.0
    flat.reset(seed=3)
    assert flat.step((joint + 1) % 24)[1] < 1.0  # another joint action misses a branch
    for _ in range(bench.EPISODE - 1):
        *_, truncated, _ = flat.step(0)
    assert truncated


def test_a_tiny_alternating_run_times_both_algorithms(tmp_path: Path) -> None:
    pytest.importorskip("sb3_contrib")  # the ``bench`` extra; without it QR-DQN's row is a note (next test)
    bench = _module()
    out = tmp_path / "generic.json"
    result = bench.main(["--n-envs", "2", "--steps", "40", "--rounds", "2", "--out", str(out)])
    rows = {row["algorithm"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"BranchingIQN", "QR-DQN"} and result["rounds"] == 2
    for row in rows.values():
        assert len(row["rounds_ms_per_env_step"]) == 2 and row["ms_per_env_step"] > 0.0
    assert rows["QR-DQN"]["over_qrdqn"] == 1.0


def test_without_sb3_contrib_qrdqn_is_a_note(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    bench = _module()
    monkeypatch.setitem(sys.modules, "sb3_contrib", None)  # an import of it raises ImportError
    out = tmp_path / "generic.json"
    bench.main(["--n-envs", "2", "--steps", "40", "--rounds", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [row["algorithm"] for row in result["rows"]] == ["BranchingIQN"]
    assert result["rows"][0]["ms_per_env_step"] > 0.0 and "over_qrdqn" not in result["rows"][0]
    assert "sb3-contrib" in result["notes"]["QR-DQN"]
