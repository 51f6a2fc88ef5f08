"""Checkpoint files: the manifest's SHA-256 catches any changed byte, writes are atomic, leftovers ignored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from foxhunt.checkpoint import (
    CHECKPOINT_FILES,
    MANIFEST,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_manifest,
    sha256_file,
)
from foxhunt.runs import resume, train
from tests.foxhunt._small_runs import small_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(small_config(tmp_path_factory.mktemp("runs") / "run", steps=200, checkpoint_every=100))


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def test_the_manifest_lists_every_file_with_its_sha256(finished: Path) -> None:
    checkpoint = latest_checkpoint(finished)
    assert checkpoint is not None and checkpoint.name == "step_000000200"
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted([*CHECKPOINT_FILES, MANIFEST])
    manifest = read_manifest(checkpoint)
    assert manifest["step"] == 200 and manifest["format"] == 1
    assert 0 < manifest["diagnostics_offset"] <= (finished / "diagnostics.jsonl").stat().st_size
    for name in CHECKPOINT_FILES:
        assert manifest["files"][name] == {
            "sha256": sha256_file(checkpoint / name), "bytes": (checkpoint / name).stat().st_size,
        }


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_flipped_byte_is_caught_naming_the_file(run: Path, name: str) -> None:
    path = run / "checkpoints" / "step_000000200" / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    message = rf"checkpoint file .*step_000000200/{name} is corrupted: SHA-256"
    with pytest.raises(CheckpointError, match=message):
        resume(run)


def test_a_truncated_or_missing_file_is_caught_naming_it(run: Path) -> None:
    folder = run / "checkpoints" / "step_000000200"
    path = folder / "replay_buffer.pkl"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"replay_buffer.pkl is corrupted: \d+ bytes where the"):
        read_manifest(folder)
    path.unlink()
    with pytest.raises(CheckpointError, match=r"replay_buffer.pkl is missing"):
        read_manifest(folder)
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"manifest.json is unreadable"):
        read_manifest(folder)
    (folder / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"manifest.json is missing"):
        resume(run)


def test_a_manifest_of_another_format_is_refused(run: Path) -> None:
    folder = run / "checkpoints" / "step_000000200"
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(CheckpointError, match="is not a format-1 manifest"):
        read_manifest(folder)


def test_a_killed_write_leaves_only_a_hidden_folder_that_resume_ignores_and_removes(run: Path) -> None:
    leftover = run / "checkpoints" / ".tmp-step_000000300-0123abcd"
    leftover.mkdir()
    (leftover / "model.zip").write_bytes(b"half")
    assert [step for step, _ in list_checkpoints(run)] == [100, 200]
    resume(run)
    assert not leftover.exists()
    assert [step for step, _ in list_checkpoints(run)] == [100, 200]


def test_only_the_newest_checkpoint_keeps_its_replay_buffer(finished: Path, run: Path) -> None:
    """The older checkpoint gave its replay buffer up (its manifest says so and still checks out); its model
    loads alone; loading it as a resume point is refused naming the file; a resume uses the newest."""
    from sb3_her_ext import BranchingIQN

    (older_step, older), (_, newest) = list_checkpoints(finished)
    assert older_step == 100 and not (older / "replay_buffer.pkl").exists()
    assert (newest / "replay_buffer.pkl").is_file()
    manifest = read_manifest(older)
    assert manifest["replay_buffer"] is False and "replay_buffer.pkl" not in manifest["files"]
    assert BranchingIQN.load(older / "model.zip").num_timesteps == 100
    with pytest.raises(CheckpointError, match=r"step_000000100 holds no replay_buffer.pkl"):
        load_checkpoint(older, env=None, device="cpu")
    resume(run)  # from step_000000200, which kept its buffer
