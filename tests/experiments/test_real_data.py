"""The real-data experiment end to end on the CPU with a tiny budget, on two LOBSTER-format tickers the
project writes itself (the synthetic market through foxenv's exporter: one at two levels, one at one)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from experiments import real_data
from foxenv.data import generate_synthetic
from foxenv.data.export import export_lobster


@pytest.mark.slow
def test_real_data_experiment_runs_every_split_and_writes_tables_with_verdicts(tmp_path) -> None:  # noqa: ANN001
    export_lobster(generate_synthetic(700, levels=2, seed=0), tmp_path / "aaa", ticker="AAA")
    export_lobster(generate_synthetic(700, levels=1, seed=1), tmp_path / "bbb", ticker="BBB")
    agents = "iqn,dqn" + (",qrdqn" if importlib.util.find_spec("sb3_contrib") else "")
    out = tmp_path / "out"
    results = real_data.main([
        "--data", str(tmp_path / "aaa"), "--other", str(tmp_path / "bbb"), "--agents", agents, "--seeds", "2",
        "--steps", "60", "--n-envs", "2", "--step-seconds", "15.8", "--episode-length", "20",
        "--split-times", "10:30,11:00", "--cache-dir", str(tmp_path / "cache"), "--out", str(out),
    ])
    assert list(results) == list(real_data.SPLITS)
    names = agents.split(",")
    for split, result in results.items():
        setup, summary = result["setup"], result["summary"]
        assert setup["windows"] >= 10 and setup["books"] == setup["windows"]  # every disjoint window once
        assert set(summary["rows"]) == set(names) | set(real_data.BASELINES)
        assert summary["rows"]["flat"]["pnl"]["mean"] == 0.0
        assert summary["family"] == 2 * len(names)
        for agent in names:
            assert summary["rows"][agent]["seeds"] == 2 and len(summary["rows"][agent]["pnl"]["values"]) == 2
            rows = summary["comparisons"][agent]
            assert [row["baseline"] for row in rows] == ["flat", "imbalance"]
            for row in rows:
                assert row["windows"] == setup["windows"] and row["ci_low"] <= row["ci_high"]
                assert f"Holm over {2 * len(names)} comparisons" in row["verdict"]
        text = (out / f"{split}.md").read_text()
        assert "independent windows" in text and "edge over flat" in text and "bps of notional" in text
        assert "**Verdict:** " in text
        assert json.loads((out / f"{split}.json").read_text())["spec"]["name"] == split
    assert results["cross-ticker"]["spec"]["levels"] == 1
    assert "BBB" in results["cross-ticker"]["setup"]["market"]
    assert "AAA" in results["cross-ticker-reverse"]["setup"]["market"]
    assert (out / "real_data.png").is_file() and (out / "results.json").is_file()


def test_real_data_options_are_checked(capsys) -> None:  # noqa: ANN001
    for argv, match in ((["--splits", "weekly"], "weekly"), (["--agents", "ppo"], "ppo"),
                        (["--split-times", "12:30"], "two clock times"), (["--seeds", "0"], "--seeds=0"),
                        (["--gradient-steps", "0"], "--gradient-steps=0")):
        with pytest.raises(SystemExit):
            real_data.parse_args(argv)
        assert match in capsys.readouterr().err


@pytest.mark.slow
def test_walk_forward_over_exported_days_pools_every_test_day(tmp_path) -> None:  # noqa: ANN001
    from foxenv.data.export import export_synthetic_days

    export_synthetic_days(tmp_path / "days", num_days=3, num_steps=250, levels=2, seed=3)
    results = real_data.main([
        "--splits", "walk-forward", "--days", str(tmp_path / "days"), "--agents", "dqn", "--seeds", "2",
        "--steps", "40", "--n-envs", "2", "--step-seconds", "15.8", "--episode-length", "20",
        "--gradient-steps", "2",
        "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--no-figure",
    ])
    setup, summary = results["walk-forward"]["setup"], results["walk-forward"]["summary"]
    assert setup["folds"] == 2 and [s["windows"] for s in setup["per_fold"]] == [12, 12]
    # fold 1 scores day 1 (fit on day 0), fold 2 scores day 2 (fit on days 0 and 1)
    assert "days [1]" in setup["per_fold"][0]["market"] and "days [2]" in setup["per_fold"][1]["market"]
    fits = [s["fitted_baselines"]["imbalance"]["fit_market"] for s in setup["per_fold"]]
    assert "days [0]" in fits[0] and "days [0, 1]" in fits[1]
    rows = summary["comparisons"]["dqn"]
    assert [row["windows"] for row in rows] == [24, 24] and summary["family"] == 2
    assert summary["rows"]["flat"]["pnl"]["mean"] == 0.0
    with pytest.raises(SystemExit):
        real_data.parse_args(["--splits", "walk-forward"])  # needs --days
    args = real_data.parse_args(["--gradient-steps", "3"])
    assert real_data.run_config(args, 0, 1).resolved_model_kwargs()["gradient_steps"] == 3


def test_the_headline_names_only_agents_significantly_above_both_baselines() -> None:
    def row(baseline: str, mean: float, p: float | None) -> dict:
        return {"baseline": baseline, "mean_difference": mean, "p_holm": p}

    summary = {"family": 4, "comparisons": {
        "a": [row("flat", 3.0, 0.01), row("imbalance", 2.0, 0.02)],
        "b": [row("flat", 3.0, 0.01), row("imbalance", 2.0, 0.2)],
    }}
    assert real_data.headline(summary, 40).startswith("a: positive held-out PnL after fees above flat")
    summary["comparisons"]["a"][1] = row("imbalance", -2.0, 0.01)  # significant, but below the rule
    text = real_data.headline(summary, 40)
    assert text.startswith("no agent shows an edge") and "(only a over flat, b over flat)" in text
    summary["comparisons"] = {"a": [row("flat", 1.0, None), row("imbalance", 1.0, None)]}
    assert "detectable with 1 windows" in real_data.headline(summary, 1)
