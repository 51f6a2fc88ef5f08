"""A SHA-256 inside a file: how ``BranchingIQN.save_replay_buffer`` seals a replay buffer pickle and
``load_replay_buffer`` verifies it.

The checksum is a trailer appended after the pickle: ``b"\\nSB3_HER_EXT_SHA256 <64 hex digits>\\n"``, the
SHA-256 of every byte before it. ``pickle.load`` stops at the pickle's end, so SB3's own loaders (and any
pickle reader) still read a sealed file; no second file has to travel with it. A replay buffer pickle with a
flipped byte would otherwise load silently (with non-finite rows); :func:`verify_trailer` refuses it,
naming the file.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

__all__ = ["TRAILER_MAGIC", "ChecksumError", "append_trailer", "sha256_prefix", "verify_trailer"]

#: The trailer's first bytes; the trailer is this, 64 hex digits and a newline.
TRAILER_MAGIC = b"\nSB3_HER_EXT_SHA256 "
_TRAILER_LENGTH = len(TRAILER_MAGIC) + 64 + 1
_HEX = re.compile(rb"[0-9a-f]{64}\n")


class ChecksumError(ValueError):
    """A file's bytes differ from the SHA-256 it carries (the message names the file)."""


def sha256_prefix(path: str | Path, length: int | None = None) -> str:
    """The SHA-256 of a file's first ``length`` bytes (all: None), in hex.

    :param path: the file.
    :param length: how many bytes to hash.
    :return: 64 hex digits.
    """
    digest = hashlib.sha256()
    left = length
    with Path(path).open("rb") as handle:
        while left is None or left > 0:
            block = handle.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()


def append_trailer(path: str | Path) -> str:
    """Append the SHA-256 trailer of ``path``'s bytes to it.

    :param path: the file (e.g. a pickle just written).
    :return: the SHA-256 recorded.
    """
    digest = sha256_prefix(path)
    with Path(path).open("ab") as handle:
        handle.write(TRAILER_MAGIC + digest.encode() + b"\n")
    return digest


def verify_trailer(path: str | Path) -> str | None:
    """Check ``path``'s bytes against the trailer it ends with.

    :param path: the file.
    :return: the SHA-256, or None when the file carries no trailer (e.g. written before they existed).
    :raises ChecksumError: when the bytes differ from the trailer's SHA-256, or the trailer is malformed.
    :raises FileNotFoundError: when ``path`` is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    size = path.stat().st_size
    if size < _TRAILER_LENGTH:
        return None
    with path.open("rb") as handle:
        handle.seek(size - _TRAILER_LENGTH)
        trailer = handle.read(_TRAILER_LENGTH)
    if not trailer.startswith(TRAILER_MAGIC):
        return None
    recorded = trailer[len(TRAILER_MAGIC):]
    if not _HEX.fullmatch(recorded):
        raise ChecksumError(f"{path} is corrupted: its SHA-256 trailer {recorded!r} is malformed")
    expected = recorded[:64].decode()
    digest = sha256_prefix(path, size - _TRAILER_LENGTH)
    if digest != expected:
        raise ChecksumError(f"{path} is corrupted: SHA-256 {digest} where the file records {expected}")
    return digest
