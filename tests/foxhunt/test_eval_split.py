"""``RunConfig.eval_split``: a run scored on validation data trains and is scored away from the test data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foxhunt.cli import main
from foxhunt.runs import RunConfig, eval_market_seed, train_market_seed


def test_eval_split_picks_the_training_split_and_the_evaluation_market() -> None:
    test, validation = RunConfig(), RunConfig(eval_split="validation")
    assert (test.eval_split, test.train_split(), validation.train_split()) == ("test", "train", "fit")
    assert train_market_seed(test) == train_market_seed(validation) == 0
    assert (eval_market_seed(test), eval_market_seed(validation)) == (1, 2)  # three distinct markets
    shifted = RunConfig(eval_split="validation", env_kwargs={"market_seed": 7})
    assert (train_market_seed(shifted), eval_market_seed(shifted)) == (7, 9)


def test_eval_split_must_be_known() -> None:
    with pytest.raises(ValueError, match="RunConfig.eval_split='train' must be one of 'test', 'validation'"):
        RunConfig(eval_split="train")


def test_a_synthetic_run_on_validation_is_scored_on_a_third_market(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["train", "--steps", "160", "--n-envs", "2", "--out", str(out), "--no-progress",
                 "--eval-steps", "10", "--eval-split", "validation"]) == 0
    capsys.readouterr()
    assert json.loads((out / "config.json").read_text())["eval_split"] == "validation"
    setup = json.loads((out / "evaluation.json").read_text())["setup"]
    assert (setup["market_seed"], setup["train_market_seed"]) == (2, 0)


def test_a_lobster_run_on_validation_trains_on_fit_and_is_scored_on_validation(
        lobster_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import foxenv.data

    loaded: list[str] = []
    load_market = foxenv.data.load_market

    def spy(*args: object, split: str = "all", **kwargs: object) -> object:
        loaded.append(split)
        return load_market(*args, split=split, **kwargs)

    monkeypatch.setattr(foxenv.data, "load_market", spy)
    out = tmp_path / "run"
    assert main(["train", "--data", str(lobster_dir), "--steps", "160", "--n-envs", "2", "--out", str(out),
                 "--no-progress", "--eval-steps", "10", "--eval-split", "validation"]) == 0
    assert "evaluation: deterministic policy, validation split" in capsys.readouterr().out
    assert loaded[0] == "fit" and "validation" in loaded and "test" not in loaded and "train" not in loaded
    assert json.loads((out / "evaluation.json").read_text())["eval_data"] == "validation split"
