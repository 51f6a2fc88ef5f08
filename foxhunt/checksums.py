"""SHA-256 checksums of files, and replay buffer files that carry one (verified on load).

A checked file ``F`` has a sidecar ``F.sha256`` in ``sha256sum``'s format (``<hex>  <name>``), so
``sha256sum -c F.sha256`` checks it too. A replay buffer pickle with a flipped byte would otherwise load
silently (with non-finite rows); :func:`load_replay_buffer` refuses it, naming the file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

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
    """Record ``path``'s SHA-256 in its sidecar file.

    :param path: the file.
    :return: the sidecar.
    """
    path = Path(path)
    record = sidecar(path)
    record.write_text(f"{sha256_file(path)}  {path.name}\n")
    return record


def verify_checksum(path: str | Path) -> str:
    """Check ``path`` against its sidecar file.

    :param path: the file.
    :return: its SHA-256.
    :raises ChecksumError: when the sidecar is missing or malformed, or the bytes differ.
    :raises FileNotFoundError: when ``path`` is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    record = sidecar(path)
    if not record.is_file():
        raise ChecksumError(f"{path} has no checksum file {record}")
    fields = record.read_text().split()
    if len(fields) != 2 or len(fields[0]) != 64:
        raise ChecksumError(f"{record} is not a '<sha256>  <name>' line")
    digest = sha256_file(path)
    if digest != fields[0]:
        raise ChecksumError(f"{path} is corrupted: SHA-256 {digest} where {record} says {fields[0]}")
    return digest


def save_replay_buffer(model: Any, path: str | Path) -> Path:
    """``model.save_replay_buffer(path)`` and the file's checksum beside it.

    :param model: an off-policy SB3 algorithm.
    :param path: the pickle to write (SB3 adds ``.pkl`` when it has no suffix).
    :return: the pickle written.
    """
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".pkl")
    model.save_replay_buffer(path)
    write_checksum(path)
    return path


def load_replay_buffer(model: Any, path: str | Path) -> None:
    """``model.load_replay_buffer(path)`` after checking the file against its checksum.

    :param model: an off-policy SB3 algorithm.
    :param path: a pickle written by :func:`save_replay_buffer`.
    :raises ChecksumError: when the file differs from its checksum (or has none).
    """
    verify_checksum(path)
    model.load_replay_buffer(path)
