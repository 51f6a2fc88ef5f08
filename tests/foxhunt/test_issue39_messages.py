"""Issue 39.13-14 leftovers: a rollout too large for memory is refused before allocating; ``env=None``, a
missing model file and a NaN window PnL are one clear line each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from foxhunt.cli import main


def _refuse_allocating(*args: object, **kwargs: object) -> None:
    raise AssertionError("the rollout started allocating")


@pytest.mark.parametrize(("argv", "option"), [
    (["--n-envs", "1000000000"], "--n-envs"),
    (["--steps", "1000000000000"], "--steps"),
])
def test_a_rollout_too_large_is_refused_before_allocating(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                          option: str) -> None:
    import foxhunt.evaluation.rollout

    monkeypatch.setattr(foxhunt.evaluation.rollout, "random_rollout", _refuse_allocating)
    assert main(["rollout", *argv, "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"foxhunt: error: {option}: the run needs about "), lines
    assert f"lower {option}" in lines[0]


def test_branching_iqn_without_an_env_names_env() -> None:
    from sb3_her_ext import BranchingIQN

    with pytest.raises(ValueError, match=r"^env=None: BranchingIQN builds its networks"):
        BranchingIQN("MlpPolicy", None)


@pytest.mark.parametrize("name", ["missing", "missing.zip"])
def test_loading_a_missing_model_names_the_path_given(tmp_path: Path, name: str) -> None:
    from sb3_her_ext import BranchingIQN

    path = str(tmp_path / name)
    with pytest.raises(FileNotFoundError) as error:
        BranchingIQN.load(path)
    assert f"no model file {path!r}" in str(error.value)
    assert ".zip.zip" not in str(error.value)


def test_a_nan_window_pnl_names_the_window_and_the_metric() -> None:
    from foxhunt.evaluation import stats

    pnl = torch.tensor([[1.0, float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
    starts = torch.arange(8).reshape(1, 8) * 100
    with pytest.raises(ValueError, match=r"^agent's PnL per window is nan in the window of book 1, episode 0 "
                                         r"\(from market row 100\) \(1 of 8 windows not finite\)"):
        row = stats.paired_windows(pnl, torch.zeros(1, 8), starts, 50, baseline="flat", policy="agent")
        stats.correct({"agent": [row]})
    with pytest.raises(ValueError, match=r"^flat's PnL per window is inf"):
        row = stats.paired_windows(torch.zeros(1, 8), pnl.nan_to_num(posinf=0, nan=float("inf")), starts, 50,
                                   baseline="flat")
        stats.correct({"policy": [row]})


def test_load_replay_buffer_refuses_a_buffer_of_another_run(tmp_path: Path) -> None:
    from foxhunt.checkpoint import REPLAY_FILE, latest_checkpoint
    from foxhunt.runs import train
    from sb3_her_ext import BranchingIQN
    from tests.foxhunt._small_runs import small_config

    first = train(small_config(tmp_path / "first", steps=300, checkpoint_every=300))
    second = train(small_config(tmp_path / "second", steps=300, checkpoint_every=300, seed=6))
    model = BranchingIQN.load(first / "model.zip")
    own = latest_checkpoint(first) / REPLAY_FILE
    model.load_replay_buffer(own)  # the run's own buffer: same fingerprint
    kept = model.replay_buffer
    other = latest_checkpoint(second) / REPLAY_FILE
    message = (rf"^replay buffer file {re.escape(str(other))} was made with another config.seed than this "
               r"model \(6, the model: 5\)")
    with pytest.raises(ValueError, match=message):
        model.load_replay_buffer(other)
    assert model.replay_buffer is kept
    model.load_replay_buffer(other, allow_other_run=True)
    assert model.replay_buffer is not kept


def test_the_provenance_attribute_is_foxhunts_fingerprint() -> None:
    from foxhunt.fingerprint import ATTRIBUTE, NOT_COMPARED
    from sb3_her_ext.validation import PROVENANCE_ATTRIBUTE, PROVENANCE_NOT_COMPARED

    assert (PROVENANCE_ATTRIBUTE, PROVENANCE_NOT_COMPARED) == (ATTRIBUTE, NOT_COMPARED)
