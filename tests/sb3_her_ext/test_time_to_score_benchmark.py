"""``benchmarks/time_to_score.py`` and its scoring (:mod:`experiments.scoring`): the scorer, the stopping
callback, the summary and a smoke run."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch as th

from experiments import scoring


def _module() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_score.py"
    spec = importlib.util.spec_from_file_location("time_to_score_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _small(signal_strength: float = 2.0) -> Any:
    from experiments.runner import Setup

    return Setup(signal_strength=signal_strength, signal_horizon=5, market_steps=2_000, steps=400, n_envs=4,
                 model_kwargs={"learning_starts": 100, "batch_size": 16}, net_arch=[16], eval_envs=2,
                 eval_steps=40, eval_seed=1000)


def test_the_oracle_pnl_is_the_one_evaluate_policies_scores() -> None:
    setup = _small()
    scorer = scoring.HeldOutScorer(setup)
    from experiments import results

    evaluation = results.evaluate({}, setup)
    assert scorer.oracle_pnl == pytest.approx(evaluation.results["oracle"].metrics["pnl"], rel=1e-12)
    assert scorer.oracle_pnl > 0


def test_the_scorer_refuses_a_market_without_a_planted_signal() -> None:
    with pytest.raises(ValueError, match="signal_strength=0"):
        scoring.HeldOutScorer(_small(0.0))


def test_greedy_device_policy_decodes_joint_codes() -> None:

    class Joint:
        device = th.device("cpu")

        def _predict(self, obs: th.Tensor, deterministic: bool = True) -> th.Tensor:
            return th.tensor([0, 80, 27 * 2 + 9 * 1 + 3 * 0 + 2])

    policy = scoring.GreedyDevicePolicy(SimpleNamespace(policy=Joint()))
    policy.reset(3, th.device("cpu"))
    actions = policy.act(th.zeros(3, 5), th.ones(3, dtype=th.bool))
    assert actions.tolist() == [[0, 0, 0, 0], [2, 2, 2, 2], [2, 1, 0, 2]]


class _FakeScorer:
    def __init__(self, shares: list[float]) -> None:
        self.shares = list(shares)

    def share(self, model: object) -> float:
        return self.shares.pop(0)


@pytest.mark.parametrize("shares,cap,stop,stops_at,reached", [
    ([0.1, 0.3, 0.6, 0.9], 1e9, True, 2, True),  # stops at the first score >= 0.5
    ([0.1, 0.2, 0.3], 0.0, True, 0, False),  # past the cap after the first score
    ([0.1, 0.6, 0.2, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0], 1e9, False, 8, True),  # on to the budget: all scored
])
def test_callback_stops_at_the_target_or_the_cap(shares: list, cap: float, stop: bool, stops_at: int,
                                                 reached: bool) -> None:
    callback = scoring.ScoreCallback(_FakeScorer(shares), every=10, target=0.5, cap_seconds=cap,
                                   learning_starts=10, device="cpu", stop_at_target=stop)
    callback.model = SimpleNamespace(_n_updates=0)
    callback._on_training_start()
    results = []
    for step in range(5, 100, 5):
        callback.num_timesteps = step
        go_on = callback._on_step()
        results.append(go_on)
        if not go_on:
            break
    assert len(callback.points) == stops_at + 1
    assert [p["steps"] for p in callback.points] == [10 * (k + 1) for k in range(stops_at + 1)]
    assert (callback.reached is not None) == reached
    if reached:
        assert callback.reached["share"] >= 0.5 and callback.reached is next(
            p for p in callback.points if p["share"] >= 0.5)  # the first crossing
    assert callback.warmup_s is not None


def test_summary_counts_unreached_seeds_as_over_the_cap() -> None:
    bench = _module()
    runs = [{"reached": True, "seconds": s, "steps": 100 * s, "best_share": 0.6, "final_share": 0.5,
             "trained_s": s, "score_s": 1.0} for s in (3.0, 5.0)]
    runs.append({"reached": False, "seconds": None, "steps": None, "best_share": 0.2, "final_share": 0.1,
                 "trained_s": 60.0, "score_s": 1.0})
    row = bench.summarise(runs, cap=60.0)
    assert row["reached"] == 2 and row["median_s"] == 5.0 and row["min_s"] == 3.0 and math.isinf(row["max_s"])
    assert row["median_steps"] == 500 and row["final_shares"] == [0.5, 0.5, 0.1]
    assert bench.summarise(runs[1:] + runs[2:], cap=60.0)["median_s"] == math.inf


def test_timing_breakdown_separates_warm_up_first_chunk_and_steady_rate() -> None:
    points = [{"steps": 100, "train_s": 1.0}, {"steps": 200, "train_s": 4.0}, {"steps": 300, "train_s": 5.0},
              {"steps": 500, "train_s": 7.0}]
    out = scoring.timing_breakdown(points, warmup_s=0.5, learning_starts=100)
    assert out["warmup_s"] == 0.5 and out["first_chunk_s"] == pytest.approx(3.5)
    assert out["steady_s_per_kstep"] == pytest.approx(1000 * 3.0 / 300)


def test_quick_run_writes_its_table_json(tmp_path: Path) -> None:
    bench = _module()
    out = tmp_path / "tts.json"
    result = bench.main(["--quick", "--agents", "iqn_joint,dqn", "--run-to-budget", "--out", str(out)])
    data = json.loads(out.read_text())
    market = data["markets"]["2"]
    assert set(market["summary"]) == {"iqn_joint", "dqn"}
    for runs in market["runs"].values():
        (run,) = runs
        assert run["points"] and run["trained_steps"] == 600 and run["score_s"] > 0
        assert run["points"][-1]["steps"] == 600 and run["final_share"] == run["points"][-1]["share"]
        assert all(math.isfinite(p["share"]) for p in run["points"])
    assert result["target"] == 0.5 and market["oracle_pnl"] > 0
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the figure beside the JSON
    # --plot redraws saved results without training: two files' runs merged by market and agent
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"markets": {"2": {"runs": {"dqn": market["runs"]["dqn"]}}}}))
    merged = bench.merged_runs([data, json.loads(other.read_text())])
    assert list(merged) == ["2"] and len(merged["2"]["dqn"]) == 2 and len(merged["2"]["iqn_joint"]) == 1
    assert bench.main(["--plot", str(out), str(other), "--out", str(tmp_path / "both.json")]) == {
        "plotted": [str(out), str(other)]}
    assert (tmp_path / "both.png").stat().st_size > 0 and not (tmp_path / "both.json").exists()
    with pytest.raises(SystemExit, match="no such file"):
        bench.main(["--plot", str(tmp_path / "nope.json")])


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_quick_run_with_seeds_at_once_reports_the_ratio_and_the_same_seed_0(tmp_path: Path,
                                                                            mode: str) -> None:
    """--concurrent 2 (in threads, or --processes): seed 0 alone, then seeds 0 and 1 at once; seed 0 scores
    the same points in the batch as alone; the record has the walls and their ratio."""
    bench = _module()
    out = tmp_path / "tts.json"
    bench.main(["--quick", "--agents", "iqn_joint", "--seeds", "2", "--concurrent", "2", "--run-to-budget",
                "--out", str(out), *(["--processes"] if mode == "processes" else [])])
    market = json.loads(out.read_text())["markets"]["2"]
    record = market["concurrency"]["iqn_joint"]
    assert record["concurrent"] == 2 and record["seed0_same_points"] is True and record["mode"] == mode
    assert record["batches"][0]["seeds"] == 2 and record["alone_wall_s"] > 0
    assert record["ratio"] == pytest.approx(record["batches"][0]["wall_s"] / record["alone_wall_s"])
    runs = market["runs"]["iqn_joint"]
    assert [run["seed"] for run in runs] == [0, 1] and all(run["trained_steps"] == 600 for run in runs)
    assert [p["share"] for p in runs[0]["points"]] == [p["share"] for p in record["alone_points"]]
    assert [p["share"] for p in runs[0]["points"]] != [p["share"] for p in runs[1]["points"]]
