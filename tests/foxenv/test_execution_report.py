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


def test_the_planted_signal_options_reach_both_synthetic_markets_and_are_refused_on_lobster() -> None:
    from experiments.execution import markets, parse_args, signal_options

    args = parse_args(["--num-steps", "400", "--levels", "3", "--signal-strength", "2",
                       "--signal-horizon", "5"])
    assert signal_options(args) == {"signal_strength": 2.0, "signal_horizon": 5}  # also the agents' env
    fit, held_out = markets(args)
    assert fit.name.endswith("signal=2x5") and held_out.name.endswith("signal=2x5")
    assert "signal=2x1" in markets(parse_args(["--num-steps", "400", "--levels", "3", "--signal-strength",
                                               "2"]))[0].name  # the generator's default horizon
    with pytest.raises(SystemExit):
        parse_args(["--data", "/some/lobster", "--signal-horizon", "5"])
    with pytest.raises(SystemExit):
        parse_args(["--signal-horizon", "0"])


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


def two_tickers(tmp_path) -> tuple[str, str, list[str]]:
    """Two synthetic days exported as LOBSTER tickers AAA and BBB (2 levels), and the session options."""
    from foxenv.data import generate_synthetic
    from foxenv.data.export import export_lobster

    export_lobster(generate_synthetic(1_000, levels=2, seed=1), tmp_path / "aaa", ticker="AAA")
    export_lobster(generate_synthetic(1_000, levels=2, seed=2), tmp_path / "bbb", ticker="BBB")
    return str(tmp_path / "aaa"), str(tmp_path / "bbb"), ["--split-times", "10:30,11:00", "--step-seconds",
                                                          "15.8", "--levels", "2", "--volume-share", "0.1"]


def test_the_experiment_fits_on_one_tickers_session_and_scores_anothers(tmp_path, monkeypatch) -> None:
    from experiments.execution import parse_args, run
    from foxenv.config import EnvConfig
    from foxenv.data import load_market
    from foxenv.execution import window_quantities
    from foxhunt.evaluation.execution_baselines import fit_execution_model

    monkeypatch.setenv("FOXHUNT_CACHE_DIR", str(tmp_path / "cache"))
    fit_folder, test_folder, session = two_tickers(tmp_path)
    run(parse_args(["--data", test_folder, "--fit-data", fit_folder, *session, "--horizon", "10",
                    "--windows", "8", "--out", str(tmp_path / "out")]))
    saved = json.loads((tmp_path / "out" / "execution.json").read_text())
    options = {"split_times": ("10:30", "11:00"), "step_seconds": 15.8, "levels": 2}
    fit = load_market(fit_folder, split="fit", **options)
    test = load_market(test_folder, split="test", **options)
    config = EnvConfig(levels=2, episode_length=10, task="execute", exec_quantity=0.1,
                       exec_quantity_unit="volume")
    expected = fit_execution_model(fit, float(window_quantities(fit, config).mean()) / 10)
    assert saved["model"]["sigma"] == pytest.approx(expected.sigma)  # fitted on AAA's fit session
    assert float(fit.time[-1]) <= 10.5 * 3600 < 11 * 3600 <= float(test.time[0])
    assert saved["offsets"] == list(range(0, 80, 10)) and len(saved["shortfall_bps"]["sell"]["twap"]) == 8
    header = (tmp_path / "out" / "execution.md").read_text().splitlines()[0]
    assert "held out: LOBSTER BBB" in header and "fitted on LOBSTER AAA" in header
    assert saved["commit"] and saved["command"].startswith("python -m experiments.execution")
    with pytest.raises(SystemExit):
        parse_args(["--split-times", "12:30,13:30"])  # a session split of the synthetic market
    with pytest.raises(SystemExit):
        parse_args(["--data", test_folder, "--split-times", "12:30"])


def test_agents_train_on_the_fit_session_and_each_face_is_compared_as_its_seed_mean(tmp_path,
                                                                                    monkeypatch) -> None:
    from experiments.execution import parse_args, run

    monkeypatch.setenv("FOXHUNT_CACHE_DIR", str(tmp_path / "cache"))
    _, folder, session = two_tickers(tmp_path)
    out = tmp_path / "out"
    payload = run(parse_args(["--data", folder, *session, "--horizon", "10", "--windows", "6", "--seeds", "2",
                              "--faces", "joint", "--train-steps", "60", "--n-envs", "2", "--gamma", "1",
                              "--out", str(out)]))
    saved = json.loads((out / "runs" / "iqn_joint_s1" / "config.json").read_text())
    assert saved["eval_split"] == "validation" and saved["checkpoint_every"] == 0  # trained on "fit" only
    assert saved["algorithm"]["gamma"] == 1.0 and saved["env"]["task"] == "execute"
    assert saved["env"]["market"]["split_times"] == ["10:30", "11:00"]
    report = payload["report"]
    assert set(report["comparisons"]["buy"]) == {"twap_limit", "submit_and_leave", "immediate",
                                                 "almgren_chriss", "vwap", "iqn_joint"}
    assert {"iqn_joint_s0", "iqn_joint_s1", "iqn_joint"} <= set(report["summary"]["buy"])
    seeds = payload["shortfall_bps"]["buy"]
    mean = (torch.tensor(seeds["iqn_joint_s0"]) + torch.tensor(seeds["iqn_joint_s1"])) / 2
    assert torch.allclose(torch.tensor(seeds["iqn_joint"]), mean)
    # per side: 5 baselines vs twap, the face vs twap (and vs the best baseline where that is not twap)
    assert report["family"] == sum(5 + 1 + (best != "twap") for best in report["best_baseline"].values())
