"""Storage failures a user meets as one line (issue 39.13): a disk that fills while a trial ends, and a
study created by another worker between the check and the creation."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc
from optuna.trial import TrialState

from foxhunt.cli import main as foxhunt_main
from tests.tuning.conftest import TINY_CONFIG
from tuning.study import open_study


def test_a_disk_that_fills_while_a_trial_ends_is_one_line_and_keeps_the_completed_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna asserts "Should not reach." when recording a trial's end fails; the user sees the disk."""
    db = tmp_path / "study.db"
    study = optuna.create_study(study_name="foxhunt", storage=f"sqlite:///{db}", direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=1.0, params={}, distributions={}))
    config, space = tmp_path / "base.json", tmp_path / "space.yaml"
    config.write_text(json.dumps(TINY_CONFIG))
    space.write_text("net_width: 8\nbatch_size: 16\n")
    record = optuna.storages.RDBStorage.set_trial_state_values

    def full_at_the_end(self: object, trial_id: int, state: TrialState, values: object = None) -> bool:
        if state.is_finished():
            raise sqlalchemy.exc.OperationalError(
                "UPDATE trials", {}, sqlite3.OperationalError("database or disk is full"))
        return record(self, trial_id, state, values)

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values", full_at_the_end)
    argv = ["tune", "--config", str(config), "--space", str(space), "--storage", f"sqlite:///{db}",
            "--resume", "--out", str(tmp_path / "out"), "--no-progress", "--n-trials", "2"]
    assert foxhunt_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "database or disk is full" in err and "failed" in err, err
    assert "Should not reach" not in err
    monkeypatch.undo()
    kept = optuna.load_study(study_name="foxhunt", storage=f"sqlite:///{db}")
    assert kept.trials[0].state == TrialState.COMPLETE and kept.trials[0].value == 1.0


def test_a_study_created_by_another_worker_meanwhile_is_the_same_line_as_an_existing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers started at once without --resume: the loser's DuplicatedStudyError as the usual line."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    optuna.create_study(study_name="race", storage=storage)
    monkeypatch.setattr(optuna, "get_all_study_summaries", lambda *a, **k: [])  # checked before it existed
    with pytest.raises(ValueError, match="'race' already exists in the storage; pass --resume"):
        open_study("race", storage, "sharpe", False, optuna.samplers.RandomSampler(),
                   optuna.pruners.NopPruner())
