"""``foxhunt evaluate`` end to end on a run folder: the report, the JSON, the figures, the held-out seeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from foxhunt.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained run folder."""
    out = tmp_path_factory.mktemp("evaluate") / "run"
    assert main(["train", "--steps", "120", "--n-envs", "2", "--out", str(out), "--no-progress",
                 "--eval-steps", "10", "--no-hindsight"]) == 0
    return out


def test_train_writes_the_evaluation_report(run_dir: Path) -> None:
    document = json.loads((run_dir / "evaluation.json").read_text())
    assert document["eval_data"] == "synthetic, market seed 1, training market seed 0"
    assert document["setup"]["market_seed"] == 1 and document["setup"]["train_market_seed"] == 0
    assert set(document["policies"]) == {"policy", "flat", "random", "buy_and_hold"}
    for name in ("report.md", "eval_equity.png", "eval_position.png", "eval_action_mix.png",
                 "eval_episode_pnl.png"):
        assert (run_dir / name).is_file(), name
    # a run of at most foxhunt train's CPU budget says what it is
    assert "(a smoke test: 120 env steps check the pipeline" in (run_dir / "report.md").read_text()


def test_a_longer_run_is_no_smoke_test() -> None:
    from foxhunt import presets
    from foxhunt.runs import RunConfig, smoke_test_note

    assert "smoke test" in smoke_test_note(RunConfig())
    assert smoke_test_note(RunConfig(steps=presets.CPU.steps + 1)) is None


def test_evaluate_a_run_folder_with_the_signal_and_the_oracle(run_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["evaluate", str(run_dir), "--steps", "15", "--n-envs", "3", "--out", str(out),
                 "--signal-strength", "1", "--signal-horizon", "5", "--market-seed", "9", "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "evaluation: deterministic policy, synthetic, market seed 9, training market seed 0" in text
    # the headline number, and whether the console's intervals are Holm-adjusted (issue 39.8)
    assert "  share of the oracle's PnL: " in text and " %" in text.split("share of the oracle's PnL: ")[1]
    assert "intervals: 95 % circular block bootstrap over the windows, not Holm-adjusted; verdicts: " \
           "p-values corrected with Holm over 4 comparisons" in text
    assert "(95 % CI, not Holm-adjusted) over 3 window(s)" in text
    document = json.loads((out / "evaluation.json").read_text())
    assert document["steps"] == 15 * 3 and document["policy"] == "policy"
    assert "oracle" in document["policies"] and len(document["comparisons"]["policy"]) == 4
    report = (out / "report.md").read_text()
    assert "independent steps" in report and "market seed 9" in report
    assert "**share of the oracle's PnL: " in report
    oracle = document["policies"]["oracle"]["pnl"]
    if oracle > 0:
        assert document["shares"]["oracle"] == pytest.approx(document["pnl"] / oracle)
    assert not list(out.glob("*.png"))


def test_evaluate_refuses_bad_targets_and_values(tmp_path: Path, run_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """User errors exit with status 2 and one line naming the value on stderr (the CLI's convention)."""
    cases = [
        (["evaluate", str(tmp_path / "nothing")], "must be a run folder or a model .zip"),
        (["evaluate", str(tmp_path)], "not a run folder"),
        (["evaluate", str(run_dir), "--steps", "0"], "--steps=0 must be >= 1"),
        (["evaluate", str(run_dir), "--market-seed", "0", "--steps", "2", "--no-plots",
          "--out", str(tmp_path / "x")], "not held out"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("foxhunt: error: ") and message in err, (argv, err)


def test_evaluate_a_run_folder_keeps_the_runs_report_and_reuses_its_settings(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no options, ``foxhunt evaluate RUN_DIR`` evaluates as the run did (its books, steps, seed, market,
    env settings), so it reproduces the run's numbers, into a new ``evaluations/<stamp>/`` each time."""
    own_report = (run_dir / "report.md").read_text()
    own = json.loads((run_dir / "evaluation.json").read_text())
    assert main(["evaluate", str(run_dir), "--no-plots"]) == 0
    assert main(["evaluate", str(run_dir), "--no-plots"]) == 0
    capsys.readouterr()
    folders = sorted((run_dir / "evaluations").iterdir())
    assert len(folders) == 2 and all((folder / "report.md").is_file() for folder in folders)
    assert (run_dir / "report.md").read_text() == own_report
    for folder in folders:
        again = json.loads((folder / "evaluation.json").read_text())
        assert again["setup"] == own["setup"]
        assert again["policies"] == own["policies"]


def test_evaluate_refuses_an_out_folder_that_holds_a_report(run_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(run_dir), "--out", str(run_dir), "--no-plots"]) == 2
    assert "must be a new or empty folder" in capsys.readouterr().err


def test_a_model_file_gets_the_evaluation_of_its_run_folder(run_dir: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``foxhunt evaluate RUN_DIR/model.zip`` scored 16 books with seed 0 where ``RUN_DIR`` scored 2 books
    with seed 1005 (issue 39.1): the model file carries its run's settings."""
    own = json.loads((run_dir / "evaluation.json").read_text())
    assert main(["evaluate", str(run_dir / "model.zip"), "--no-plots", "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    again = json.loads((tmp_path / "r" / "evaluation.json").read_text())
    assert again["setup"]["books"] == own["setup"]["books"] == 2
    assert again["setup"] == own["setup"] and again["policies"] == own["policies"]


def test_a_killed_run_is_scored_with_its_newest_checkpoint(run_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A run folder without model.zip (the run was killed) was "a folder without config.json" although
    config.json is there (issue 39.7)."""
    killed = tmp_path / "killed"
    shutil.copytree(run_dir, killed, ignore=shutil.ignore_patterns("evaluations", ".lock"))
    (killed / "model.zip").unlink()
    assert main(["evaluate", str(killed), "--no-plots", "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    newest = sorted((killed / "checkpoints").iterdir())[-1].name
    said = f"the run has no model.zip (it stopped before it ended): its newest checkpoint, {newest}"
    assert said in text and said in (tmp_path / "r" / "report.md").read_text()
    shutil.rmtree(killed / "checkpoints")
    assert main(["evaluate", str(killed), "--no-plots"]) == 2
    assert "holds config.json but neither model.zip nor a checkpoint" in capsys.readouterr().err
