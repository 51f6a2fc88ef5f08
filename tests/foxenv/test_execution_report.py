"""The execute task's report (foxhunt.evaluation.execution_report) and experiment (experiments.execution)."""

from __future__ import annotations

import json

import pytest
import torch

from foxhunt.evaluation.execution_report import execution_report, format_report, summarize


def fake_scores(shift: float) -> dict:
    """Three policies on 12 windows per side: twap, a baseline ``shift`` bps better, a model 1 bps better."""
    generator = torch.Generator().manual_seed(0)
    scores = {}
    for side in ("buy", "sell"):
        twap = torch.randn(12, generator=generator, dtype=torch.float64) * 3 + 2
        noise = torch.randn(12, generator=generator, dtype=torch.float64) * 0.1
        scores[side] = {"twap": {"shortfall_bps": twap},
                        "submit_and_leave": {"shortfall_bps": twap - shift},
                        "agent": {"shortfall_bps": twap - 1.0 + noise}}
    return scores


def test_summary_and_paired_comparisons_against_twap_and_the_best_baseline() -> None:
    offsets = torch.arange(12) * 10
    report = execution_report(fake_scores(0.5), offsets, horizon=10, resamples=500)
    row = report["summary"]["buy"]["twap"]
    assert row["windows"] == 12 and row["q50_bps"] == pytest.approx(float(torch.quantile(
        fake_scores(0.5)["buy"]["twap"]["shortfall_bps"], 0.5)))
    assert report["best_baseline"] == {"buy": "submit_and_leave", "sell": "submit_and_leave"}
    agent = report["comparisons"]["buy"]["agent"]
    assert [r["baseline"] for r in agent] == ["twap", "submit_and_leave"]
    assert agent[0]["mean_difference"] == pytest.approx(1.0, abs=0.1)  # bps saved against twap
    assert agent[0]["ci_low"] > 0 and agent[1]["mean_difference"] == pytest.approx(0.5, abs=0.1)
    assert "twap" not in report["comparisons"]["buy"]  # twap is not compared with itself
    assert report["family"] == 2 * (2 + 1)  # per side: agent vs twap and best, submit_and_leave vs twap
    table = format_report(report)
    assert "| agent vs twap | +1.0" in table and "Holm over 6 comparisons" in table


def test_summary_of_a_constant_and_overlapping_windows_are_refused() -> None:
    row = summarize(torch.full((5,), 2.5))
    assert row["mean_bps"] == 2.5 and row["std_bps"] == 0.0 and row["q95_bps"] == 2.5
    with pytest.raises(ValueError, match="overlap"):
        execution_report(fake_scores(0.5), torch.arange(12) * 5, horizon=10, resamples=100)


def test_the_experiment_runs_end_to_end(tmp_path) -> None:
    from experiments.execution import parse_args, run

    args = parse_args(["--horizon", "10", "--num-steps", "800", "--windows", "12", "--levels", "5",
                       "--out", str(tmp_path)])
    payload = run(args)
    saved = json.loads((tmp_path / "execution.json").read_text())
    assert set(saved["shortfall_bps"]["buy"]) == {"twap", "twap_limit", "submit_and_leave", "immediate",
                                                  "almgren_chriss", "vwap"}
    assert len(saved["offsets"]) == 12 and (tmp_path / "execution.png").stat().st_size > 0
    assert "twap_limit vs twap" in (tmp_path / "execution.md").read_text()
    assert payload["report"]["family"] == 10


def test_hindsight_is_off_on_the_execute_task_and_refused_when_asked_for() -> None:
    from foxhunt.runs import RunConfig

    branched = {"action_face": "branched"}
    assert RunConfig(env_kwargs={"task": "execute"}, **branched).resolved_hindsight() is False
    assert RunConfig(**branched).resolved_hindsight() is True  # the trading task's branched face keeps it
    with pytest.raises(ValueError, match="hindsight=True with env.task='execute'"):
        RunConfig(env_kwargs={"task": "execute"}, hindsight=True).resolved_hindsight()


def test_an_execute_run_trains_resumes_to_the_uninterrupted_model_and_reports_shortfall(tmp_path) -> None:
    from foxhunt.runs import resume, train
    from tests.foxhunt._small_runs import Crash, CrashAt, assert_same_model, small_config

    env = {"episode_length": 20, "task": "execute", "exec_quantity": 50.0}
    whole = train(small_config(tmp_path / "whole", env_kwargs=env))
    table = (whole / "execution.md").read_text()
    assert "policy vs twap" in table and "| immediate |" in table
    with pytest.raises(Crash):
        train(small_config(tmp_path / "crashed", env_kwargs=env), callback=CrashAt(450))
    resumed = resume(tmp_path / "crashed", progress=False)
    assert_same_model(whole / "model.zip", resumed / "model.zip")
