"""Replay buffer files carry a SHA-256 checked on load: a flipped byte is refused, naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch as th

from foxhunt.checksums import (
    ChecksumError,
    load_replay_buffer,
    save_replay_buffer,
    sha256_file,
    sidecar,
    verify_checksum,
)
from foxhunt.envs import LOBVecEnv


@pytest.fixture(scope="module")
def model():
    from sb3_her_ext import BranchingIQN

    env = LOBVecEnv(2, seed=0, num_steps=400, episode_length=50)
    agent = BranchingIQN("MlpPolicy", env, seed=0, buffer_size=200, batch_size=8, learning_starts=20,
                         policy_kwargs={"net_arch": [16], "n_ensemble": 1})
    return agent.learn(60)


def test_a_saved_buffer_loads_back_when_its_checksum_matches(model, tmp_path: Path) -> None:
    path = save_replay_buffer(model, tmp_path / "buffer")
    assert path == tmp_path / "buffer.pkl"
    assert sidecar(path).read_text() == f"{sha256_file(path)}  buffer.pkl\n"
    before = model.replay_buffer
    load_replay_buffer(model, path)
    assert model.replay_buffer is not before
    assert th.equal(model.replay_buffer.observations, before.observations)


def test_a_flipped_byte_or_a_missing_checksum_is_refused(model, tmp_path: Path) -> None:
    path = save_replay_buffer(model, tmp_path / "buffer.pkl")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    before = model.replay_buffer
    with pytest.raises(ChecksumError, match=r"buffer.pkl is corrupted: SHA-256 [0-9a-f]{64} where .*sha256"):
        load_replay_buffer(model, path)
    assert model.replay_buffer is before  # nothing loaded
    sidecar(path).unlink()
    with pytest.raises(ChecksumError, match=r"buffer.pkl has no checksum file"):
        verify_checksum(path)
    sidecar(path).write_text("nonsense\n")
    with pytest.raises(ChecksumError, match=r"is not a '<sha256>  <name>' line"):
        verify_checksum(path)
    with pytest.raises(FileNotFoundError, match="nowhere.pkl: no such file"):
        verify_checksum(tmp_path / "nowhere.pkl")
