"""``foxhunt evaluate`` of an execute-task model (issue 36): the run's own execution report, reproduced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foxhunt.cli import main


@pytest.fixture(scope="module")
def execute_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny execute run folder (600 steps on 2 books of the synthetic market; its execution report)."""
    from foxhunt.runs import train
    from tests.foxhunt._small_runs import small_config

    env = {"episode_length": 20, "task": "execute", "exec_quantity": 50.0}
    return train(small_config(tmp_path_factory.mktemp("execute") / "run", env_kwargs=env))


def _same_report(run_dir: Path, out: Path) -> None:
    """``out`` holds the run's execution report: the same windows, shortfalls, verdicts and table."""
    ours, theirs = (json.loads((folder / "execution.json").read_text()) for folder in (out, run_dir))
    assert ours["offsets"] == theirs["offsets"] and len(ours["offsets"]) > 10
    assert ours["shortfall_bps"] == theirs["shortfall_bps"]
    assert ours["report"] == theirs["report"] and ours["model"] == theirs["model"]
    assert (out / "execution.md").read_text() == (run_dir / "execution.md").read_text()
    assert (out / "execution.png").stat().st_size > 0


def test_evaluate_an_execute_run_folder_reproduces_its_execution_report(
        execute_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(execute_run)]) == 0
    text = capsys.readouterr().out
    (out,) = (execute_run / "evaluations").iterdir()
    assert f"report: {out / 'execution.md'}" in text and "| policy vs twap |" in text
    _same_report(execute_run, out)
    assert not (out / "evaluation.json").exists()  # not the trading report


def test_evaluate_an_execute_model_file_gets_its_runs_report(execute_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert main(["evaluate", str(execute_run / "model.zip"), "--out", str(out)]) == 0
    _same_report(execute_run, out)


def test_evaluate_an_execute_model_on_another_market_and_its_refusals(
        execute_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seed9"
    assert main(["evaluate", str(execute_run), "--market-seed", "9", "--out", str(out),
                 "--models", str(execute_run / "model.zip")]) == 0
    capsys.readouterr()
    document = json.loads((out / "execution.json").read_text())
    theirs = json.loads((execute_run / "execution.json").read_text())
    assert document["shortfall_bps"]["buy"]["policy"] != theirs["shortfall_bps"]["buy"]["policy"]
    assert document["shortfall_bps"]["buy"]["model"] == document["shortfall_bps"]["buy"]["policy"]
    cases = [(["--steps", "3"], "--steps does not apply to an execute-task model"),
             (["--n-envs", "3"], "--n-envs does not apply"), (["--seed", "3"], "--seed does not apply"),
             (["--baselines", "flat"], "--baselines does not apply"),
             (["--no-plots"], "--no-plots does not apply"),
             (["--market-seed", "0"], "not held out")]
    for extra, message in cases:
        assert main(["evaluate", str(execute_run), "--out", str(tmp_path / "x"), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("foxhunt: error: ") and message in err, (extra, err)


def test_a_trading_evaluation_refuses_an_execute_model_saying_why(execute_run: Path) -> None:
    from foxhunt.evaluation.model_file import load_model

    with pytest.raises(ValueError, match=r"trained on the execute task \(env.task='execute'\)"):
        load_model(execute_run / "model.zip")


def test_watch_an_execute_model_on_a_held_out_window(execute_run: Path, tmp_path: Path) -> None:
    """``foxhunt watch`` of an execute model draws window ``--book`` of the execution report's held-out
    windows; the parent fills as the report's scoring (score_windows) fills it on that window."""
    import torch
    from PIL import Image

    from foxenv.config import EnvConfig, split_env_kwargs
    from foxhunt.evaluation.api import build_market
    from foxhunt.evaluation.baselines import ModelPolicy
    from foxhunt.evaluation.execution_baselines import score_windows
    from foxhunt.evaluation.execution_report import load_execution_model
    from foxhunt.runs import RunConfig

    out = tmp_path / "execute.gif"
    assert main(["watch", str(execute_run), "--book", "2", "--out", str(out), "--no-progress"]) == 0
    with Image.open(out) as image:
        assert image.n_frames == 20  # the whole window: the parent is done at its end
    record = json.loads(out.with_suffix(".json").read_text())
    setup = record["setup"]
    offsets = json.loads((execute_run / "execution.json").read_text())["offsets"]
    assert setup["task"] == "execute" and setup["offsets"] == [offsets[2]] and setup["books"] == len(offsets)
    assert setup["market_seed"] == 1 and setup["train_market_seed"] == 0
    assert main(["watch", str(execute_run), "--steps", "21", "--out", str(tmp_path / "x.gif")]) == 2
    config = RunConfig.load(execute_run / "config.json")
    env = EnvConfig(**split_env_kwargs(config.resolved_env_kwargs())[0])
    market = build_market("synthetic", market_seed=1, levels=env.levels,
                          num_steps=config.synthetic_market_steps)
    policy = ModelPolicy(load_execution_model(execute_run / "model.zip", env.grid), grid=env.grid)
    scored = score_windows(policy, market, env, torch.tensor(offsets))
    filled = scored["done"][:, 2] * scored["side"][2] * scored["quantity"][2]
    position = torch.tensor(record["series"]["position"], dtype=torch.float64)
    assert torch.allclose(position, filled.double()) and position[-1].abs() == 50.0
    # the window's shortfall (minus its rewards) is the report's, for the window's side
    side = "buy" if position[-1] > 0 else "sell"
    report = json.loads((execute_run / "execution.json").read_text())["shortfall_bps"][side]["policy"]
    assert -sum(record["series"]["reward"]) == pytest.approx(report[2], abs=1e-3)
