"""``benchmarks/cartpole_zoo.py``: a seed trains in ONE ``learn`` call, so ε falls over the whole run's
``exploration_fraction`` as rl-zoo3's does (chunked ``learn`` calls restarted the schedules: issue 39.12)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _module() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cartpole_zoo.py"
    spec = importlib.util.spec_from_file_location("cartpole_zoo_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_scores_inside_one_learn_so_epsilon_falls_over_the_whole_run(tmp_path: Path) -> None:
    bench = _module()
    out = tmp_path / "zoo.json"
    # no gradient step (learning_starts past the run): only acting, the schedule and the scores
    result = bench.main(["--algo", "biqn", "--seeds", "0", "--steps", "512", "--eval-every", "256",
                         "--set", "exploration_fraction=1.0", "--set", "learning_starts=100000",
                         "--out", str(out)])
    row = result["seeds"][0]
    assert [step for step, _ in row["curve"]] == [256, 512, 512]
    assert json.loads(out.read_text())["finals"] == [row["final"]]
    # halfway through the one learn call, ε is halfway from 1 to 0.04 (chunked calls: already 0.04)
    (half, eps_half), (end, eps_end) = row["eps"][0], row["eps"][-1]
    assert half == 256 and eps_half == pytest.approx(1.0 - 0.96 * 255 / 512, abs=1e-6)
    assert end == 512 and eps_end == pytest.approx(0.04, abs=0.01)
    assert [step for step, _, _ in row["popart"]] == [256, 512, 512]
