"""The one checksum scheme of replay buffer files: a SHA-256 trailer inside the file (sb3_her_ext.checksum).

``BranchingIQN``'s save and load round trip, a flipped byte and a malformed trailer: test_replay.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sb3_her_ext.checksum import TRAILER_MAGIC, ChecksumError, append_trailer, sha256_prefix, verify_trailer


def test_a_sealed_file_verifies_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "buffer.pkl"
    path.write_bytes(b"pickle bytes" * 1000)
    digest = append_trailer(path)
    assert digest == hashlib.sha256(b"pickle bytes" * 1000).hexdigest() == sha256_prefix(path, 12_000)
    assert path.read_bytes().endswith(TRAILER_MAGIC + digest.encode() + b"\n")
    assert verify_trailer(path) == digest
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01
    path.write_bytes(bytes(data))
    message = rf"buffer.pkl is corrupted: SHA-256 [0-9a-f]{{64}} where the file records {digest}"
    with pytest.raises(ChecksumError, match=message):
        verify_trailer(path)


def test_a_file_without_a_trailer_or_no_file(tmp_path: Path) -> None:
    old = tmp_path / "old.pkl"
    old.write_bytes(b"written before trailers existed" * 10)
    assert verify_trailer(old) is None  # nothing to check: the caller decides
    (tmp_path / "short.pkl").write_bytes(b"x")
    assert verify_trailer(tmp_path / "short.pkl") is None
    with pytest.raises(FileNotFoundError, match="nowhere.pkl: no such file"):
        verify_trailer(tmp_path / "nowhere.pkl")
    assert sha256_prefix(old) == hashlib.sha256(old.read_bytes()).hexdigest()
