"""On-disk cache of parsed, aggregated market data, keyed by the input files' contents and the parameters.

A cache entry is one ``torch.save`` file of plain tensors and numbers (loadable with
``weights_only=True``), named by a sha256 over the bytes of every input file, the loader's
parameters and a format version. Changing a file, a parameter or the format gives a new key, so a
stale entry is never read.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from foxenv.data.market import MarketData

#: Bump when the aggregation changes in a way that makes old cache entries wrong.
CACHE_FORMAT_VERSION = 1

#: Environment variable that overrides the default cache folder.
CACHE_DIR_ENV = "FOXHUNT_CACHE_DIR"

_HASH_CHUNK_BYTES = 1 << 22


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    """The cache folder: ``cache_dir``, else ``$FOXHUNT_CACHE_DIR``, else ``~/.cache/foxhunt/lobster``.

    :param cache_dir: an explicit folder, or None for the default.
    :return: the folder (not created here).
    """
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "foxhunt" / "lobster"


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file's bytes, read in chunks.

    :param path: the file.
    :return: 64 hex characters.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def cache_key(paths: list[str | os.PathLike], params: dict[str, Any]) -> str:
    """Key of a cache entry: sha256 over each file's sha256, the parameters (as sorted JSON) and the format.

    :param paths: the input files, in a fixed order.
    :param params: JSON-serialisable loader parameters that change the result.
    :return: 64 hex characters.
    """
    digest = hashlib.sha256()
    digest.update(f"format={CACHE_FORMAT_VERSION}".encode())
    for path in paths:
        digest.update(file_sha256(path).encode())
    digest.update(json.dumps(params, sort_keys=True).encode())
    return digest.hexdigest()


def cache_path(cache_dir: str | os.PathLike | None, key: str) -> Path:
    """File that holds (or will hold) the entry ``key``.

    :param cache_dir: an explicit folder, or None for the default (see :func:`resolve_cache_dir`).
    :param key: a key from :func:`cache_key`.
    :return: the entry's path.
    """
    return resolve_cache_dir(cache_dir) / f"{key}.pt"


def save_market(path: Path, data: MarketData) -> None:
    """Write ``data`` (moved to CPU) to ``path`` atomically: a temporary file, then a rename.

    :param path: destination file; its folder is created if needed.
    :param data: the timeline to store.
    """
    payload: dict[str, Any] = {}
    for field in fields(data):
        value = getattr(data, field.name)
        payload[field.name] = value.cpu() if isinstance(value, torch.Tensor) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(payload, temporary)
    os.replace(temporary, path)


def load_market_file(path: Path) -> MarketData | None:
    """Read an entry written by :func:`save_market`.

    :param path: the entry's file.
    :return: the timeline on CPU, or None when the file is missing or unreadable (then it is rebuilt).
    """
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        return MarketData(**payload)
    except Exception:  # a truncated or foreign file: rebuild rather than fail
        return None
