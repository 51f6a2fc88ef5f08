"""On-disk cache of parsed, aggregated market data, keyed by the input files' contents and the parameters.

A cache entry is one ``torch.save`` file of plain tensors and numbers (loadable with
``weights_only=True``) and a sha256 of that content, named by a sha256 over the bytes of every input
file, the loader's parameters and a format version. Changing a file, a parameter or the format gives a
new key, so a stale entry is never read; a damaged entry fails its checksum and is rebuilt.

The cache is an optimisation only: :func:`cached_market` builds the data without it when the cache
folder cannot be found, read or written, and says so in one :class:`CacheWarning`.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from foxenv.data.market import MarketData

#: Bump when the aggregation or the entry layout changes in a way that makes old cache entries wrong.
CACHE_FORMAT_VERSION = 2

#: Environment variable that overrides the default cache folder.
CACHE_DIR_ENV = "FOXHUNT_CACHE_DIR"

#: Key of the content checksum inside an entry.
CHECKSUM_KEY = "sha256"

_HASH_CHUNK_BYTES = 1 << 22


class CacheWarning(UserWarning):
    """The market cache could not be used (unreadable, unwritable or corrupt); the data was loaded anyway."""


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    """The cache folder: ``cache_dir``, else ``$FOXHUNT_CACHE_DIR``, else ``~/.cache/foxhunt/lobster``.

    :param cache_dir: an explicit folder, or None for the default.
    :return: the folder (not created here).
    :raises RuntimeError: when the default is needed and the home folder cannot be determined.
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
    :raises RuntimeError: when the default folder is needed and the home folder cannot be determined.
    """
    return resolve_cache_dir(cache_dir) / f"{key}.pt"


def _payload_sha256(payload: dict[str, Any]) -> str:
    """sha256 over every field of an entry (names, tensor dtypes, shapes and bytes, other values' reprs).

    :param payload: the entry's fields, tensors on CPU.
    :return: 64 hex characters.
    """
    digest = hashlib.sha256()
    for name in sorted(payload):
        value = payload[name]
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
            digest.update(value.contiguous().view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def save_market(path: Path, data: MarketData) -> None:
    """Write ``data`` (moved to CPU) and its checksum to ``path`` atomically: a temporary file, then a rename.

    :param path: destination file; its folder is created if needed.
    :param data: the timeline to store.
    :raises OSError: when the folder or the file cannot be written (the temporary file is removed).
    :raises RuntimeError: when torch cannot open the file for writing.
    """
    payload: dict[str, Any] = {}
    for field in fields(data):
        value = getattr(data, field.name)
        payload[field.name] = value.cpu() if isinstance(value, torch.Tensor) else value
    payload[CHECKSUM_KEY] = _payload_sha256(payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(payload, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def load_market_file(path: Path) -> MarketData | None:
    """Read an entry written by :func:`save_market` and verify its checksum.

    :param path: the entry's file.
    :return: the timeline on CPU, or None when there is no entry.
    :raises OSError: when it cannot be told whether the entry exists (e.g. no permission on the folder).
    :raises ValueError: when the entry cannot be read, or is truncated, foreign or fails its checksum
        (naming the path).
    """
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for an unreadable or damaged file
        reason = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        raise ValueError(f"cache entry {path} could not be read ({reason})") from error
    if not isinstance(payload, dict) or CHECKSUM_KEY not in payload:
        raise ValueError(f"cache entry {path} holds no checksum: not written by this version")
    checksum = payload.pop(CHECKSUM_KEY)
    if checksum != _payload_sha256(payload):
        raise ValueError(f"cache entry {path} fails its checksum: the file is damaged")
    try:
        return MarketData(**payload)
    except TypeError as error:
        raise ValueError(f"cache entry {path} does not hold MarketData fields ({error})") from error


def cached_market(
    paths: list[str | os.PathLike],
    params: dict[str, Any],
    cache_dir: str | os.PathLike | None,
    build: Callable[[], MarketData],
) -> MarketData:
    """The cached entry for ``paths`` and ``params``, else ``build()``, stored for next time.

    The cache never makes a load fail: when the folder cannot be determined, read or written, or the
    entry is damaged, the data is built (and stored when possible) and one :class:`CacheWarning` says why.

    :param paths: the input files (readable; their bytes are part of the key).
    :param params: JSON-serialisable loader parameters that change the result.
    :param cache_dir: cache folder, or None for the default (see :func:`resolve_cache_dir`).
    :param build: makes the data when the cache does not hold it; its errors propagate.
    :return: the timeline on CPU.
    """
    key = cache_key(paths, params)
    problems: list[str] = []
    try:
        entry: Path | None = cache_path(cache_dir, key)
    except RuntimeError as error:  # no HOME and no password entry: there is no default folder
        problems.append(f"no cache folder ({error}); set {CACHE_DIR_ENV} or cache_dir")
        entry = None
    if entry is not None:
        try:
            cached = load_market_file(entry)
        except OSError as error:
            problems.append(f"could not read {entry} ({error})")
        except ValueError as error:
            problems.append(str(error))
        else:
            if cached is not None:
                return cached
    data = build()
    if entry is not None:
        try:
            save_market(entry, data)
        except (OSError, RuntimeError) as error:
            problems.append(f"could not write {entry} ({error})")
    if problems:
        warnings.warn(f"market cache: {'; '.join(problems)}; the data was loaded from its files",
                      CacheWarning, stacklevel=3)
    return data
