"""Fingerprints (issue 26): every artefact of a run knows what it was made on, and resume, buffer load and
env-state load refuse a mismatch in one line naming the field, old -> new."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from foxhunt import fingerprint
from foxhunt.checkpoint import MANIFEST, CheckpointError, latest_checkpoint, read_manifest
from foxhunt.envs import LOBVecEnv
from foxhunt.fingerprint import FingerprintMismatch
from foxhunt.runs import RunConfig, resume, train
from sb3_her_ext.checksum import append_trailer
from tests.foxhunt._small_runs import Crash, CrashAt, small_config


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    with pytest.raises(Crash):
        train(small_config(out, steps=400, checkpoint_every=100), CrashAt(250))
    return out


@pytest.fixture
def run(crashed: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(crashed, copy)
    return copy


def edit_config(run: Path, **env: object) -> None:
    values = json.loads((run / "config.json").read_text())
    values["env"].update(env)
    (run / "config.json").write_text(json.dumps(values))


def test_every_artefact_carries_the_fingerprint(run: Path) -> None:
    checkpoint = latest_checkpoint(run)
    manifest = read_manifest(checkpoint)
    stamped = manifest["fingerprint"]
    assert stamped["market"] == {"source": "synthetic", "seed": 0, "num_steps": 1500, "params": {}}
    assert stamped["action_face"] == "joint" and stamped["action_space"] == "Discrete(81)"
    assert stamped["env"]["episode_length"] == 60 and stamped["env"]["levels"] == 10
    assert stamped["config"]["seed"] == 5 and "steps" not in stamped["config"]
    assert set(stamped["code"]) == {"version", "commit"}
    assert fingerprint.read_model_file(checkpoint / "model.zip") == stamped
    with (checkpoint / "replay_buffer.pkl").open("rb") as handle:
        assert fingerprint.of(pickle.load(handle)) == stamped
    assert stamped == fingerprint.run_fingerprint(RunConfig.load(run / "config.json"))


def test_resume_refuses_a_config_edited_to_another_market(run: Path) -> None:
    """The issue's example: kill a run, edit env_kwargs.market_seed in config.json, --resume."""
    edit_config(run, market_seed=5)
    with pytest.raises(FingerprintMismatch, match=r"checkpoint .*step_000000200 was made with another "
                       r"config\.env\.market_seed: 0 -> 5 \(and 1 more: market\.seed\); put "
                       r"config\.json back as it was.*or pass --allow-market-change"):
        resume(run, progress=False)
    assert not (run / "model.zip").exists()


def test_an_explicit_market_change_resumes_on_the_new_market(run: Path) -> None:
    edit_config(run, market_seed=5)
    resume(run, progress=False, allow_market_change=True)
    stamped = fingerprint.read_model_file(run / "model.zip")
    assert stamped["market"]["seed"] == 5  # the model now says what it went on with


@pytest.mark.parametrize(("field", "value", "shown"), [("max_position", 7, r"max_position: 100\.0 -> 7"),
                                                       ("levels", 5, r"levels: 10 -> 5")])
def test_a_change_of_settings_is_refused_even_with_a_market_change(run: Path, field: str, value: int,
                                                                    shown: str) -> None:
    edit_config(run, **{field: value})
    with pytest.raises(FingerprintMismatch, match=rf"config\.env\.{shown}"):
        resume(run, progress=False, allow_market_change=True)


def test_a_replay_buffer_of_another_run_is_refused(run: Path) -> None:
    checkpoint = latest_checkpoint(run)
    path = checkpoint / "replay_buffer.pkl"
    with path.open("rb") as handle:
        buffer = pickle.load(handle)
    buffer.foxhunt_fingerprint = {**buffer.foxhunt_fingerprint, "action_face": "branched"}
    with path.open("wb") as handle:
        pickle.dump(buffer, handle)
    append_trailer(path)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"]["replay_buffer.pkl"] = {"sha256": fingerprint_sha(path), "bytes": path.stat().st_size}
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(FingerprintMismatch, match=r"replay buffer .*replay_buffer\.pkl was made with another "
                       r"action_face: 'branched' -> 'joint'"):
        resume(run, progress=False)


def fingerprint_sha(path: Path) -> str:
    from sb3_her_ext.checksum import sha256_prefix

    return sha256_prefix(path)


@pytest.mark.parametrize("entry", [None, "abc", {"sha256": "x"}, {"sha256": 3, "bytes": 1},
                                   {"sha256": "x", "bytes": True}])
def test_a_malformed_manifest_entry_is_one_error_naming_it(run: Path, entry: object) -> None:
    checkpoint = latest_checkpoint(run)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"]["state.pt"] = entry
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"has a malformed entry 'state.pt'"):
        read_manifest(checkpoint)


ENV = dict(seed=0, num_steps=600, episode_length=20)


@pytest.mark.parametrize(("other", "shown"), [
    (dict(market_seed=5), r"market\.name 'synthetic seed=0 .*' -> 'synthetic seed=5 .*'"),
    (dict(max_position=20), r"config\.max_position 100.0 -> 20"),
    (dict(fill_model="optimistic"), r"config\.fill_model 'conservative' -> 'optimistic'"),
])
def test_an_env_state_of_another_market_or_setting_is_refused_naming_it(other: dict, shown: str) -> None:
    state = LOBVecEnv(2, **ENV).state_dict()
    with pytest.raises(FingerprintMismatch, match=r"the env state was taken from another env: " + shown):
        LOBVecEnv(2, **{**ENV, **other}).load_state_dict(state)
    LOBVecEnv(2, **ENV).load_state_dict(state)  # the same env takes it


def test_the_cli_refuses_the_edited_run_in_one_line(run: Path, capsys: pytest.CaptureFixture) -> None:
    from foxhunt.cli import main

    edit_config(run, market_seed=5)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.env.market_seed: 0 -> 5" in err
    assert main(["train", "--allow-market-change", "--no-progress"]) == 2
    assert "--allow-market-change goes with --resume RUN_DIR" in capsys.readouterr().err
