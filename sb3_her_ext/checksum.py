"""SHA-256 sidecar files: how ``BranchingIQN.save_replay_buffer`` records a file's bytes and
``load_replay_buffer`` verifies them.

A checked file ``F`` has a sidecar ``F.sha256`` in ``sha256sum``'s format (``<hex>  <name>``), so
``sha256sum -c F.sha256`` checks it too. A replay buffer pickle with a flipped byte would otherwise load
silently (with non-finite rows).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["SUFFIX", "ChecksumError", "sha256_file", "sidecar", "verify_checksum", "write_checksum"]

#: Suffix of a checksum sidecar file.
SUFFIX = ".sha256"


class ChecksumError(ValueError):
    """A file's bytes differ from its recorded SHA-256, or the record is missing (the message names it)."""


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, in hex.

    :param path: the file.
    :return: 64 hex digits.
    """
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sidecar(path: str | Path) -> Path:
    """The checksum file of ``path`` (``path`` + ``.sha256``)."""
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def write_checksum(path: str | Path) -> Path:
    """Record ``path``'s SHA-256 in its sidecar file (written to a temporary name, then renamed).

    :param path: the file.
    :return: the sidecar.
    """
    path = Path(path)
    record = sidecar(path)
    partial = record.with_name(record.name + ".tmp")
    partial.write_text(f"{sha256_file(path)}  {path.name}\n")
    partial.replace(record)
    return record


def verify_checksum(path: str | Path, missing_ok: bool = False) -> str | None:
    """Check ``path`` against its sidecar file.

    :param path: the file.
    :param missing_ok: return None when there is no sidecar (else raise).
    :return: its SHA-256 (None without a sidecar when ``missing_ok``).
    :raises ChecksumError: when the sidecar is missing (unless ``missing_ok``) or malformed, or the bytes
        differ.
    :raises FileNotFoundError: when ``path`` is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    record = sidecar(path)
    if not record.is_file():
        if missing_ok:
            return None
        raise ChecksumError(f"{path} has no checksum file {record}")
    fields = record.read_text().split()
    if len(fields) != 2 or len(fields[0]) != 64:
        raise ChecksumError(f"{record} is not a '<sha256>  <name>' line")
    digest = sha256_file(path)
    if digest != fields[0]:
        raise ChecksumError(f"{path} is corrupted: SHA-256 {digest} where {record} says {fields[0]}")
    return digest
