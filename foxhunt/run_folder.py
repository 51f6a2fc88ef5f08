"""Run folders that never collide: a fresh unique name, or a given folder only when it is empty.

Two runs started in the same second, even in parallel processes, get different folders: the name is a
timestamp plus a random suffix, and the folder is created with ``mkdir(exist_ok=False)`` (atomic on every
POSIX file system), retried with a new suffix should it exist.
"""

from __future__ import annotations

import secrets
import shutil
import time
from pathlib import Path

from filelock import FileLock, Timeout

#: Where runs go when no folder is given.
DEFAULT_RUNS_ROOT = Path("runs")
#: The file a run creates exclusively (``O_EXCL``) to claim its folder; the run then writes its config there.
CLAIM_FILE = "config.json"
#: The file a training process holds an exclusive lock on while it writes the folder.
LOCK_FILE = ".lock"


def unique_run_folder(root: str | Path = DEFAULT_RUNS_ROOT, attempts: int = 100) -> Path:
    """Create and return a new folder ``root/<YYYYmmdd-HHMMSS>-<6 hex>`` that no other run holds.

    :param root: the parent folder (created when missing).
    :param attempts: names tried before giving up.
    :return: the created, empty folder.
    :raises FileExistsError: when every attempt met an existing folder.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(attempts):
        path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        try:
            path.mkdir(exist_ok=False)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free run folder name under {root} after {attempts} attempts")


def claim_run_folder(out: str | Path) -> Path:
    """Create ``out`` for a new run, or take it when it is an empty folder.

    :param out: the run folder asked for (``--out``).
    :return: the folder, holding an empty :data:`CLAIM_FILE`.
    :raises ValueError: when ``out`` is a file or a non-empty folder (``--resume`` continues a run).
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(path)!r} is a file, not a run folder")
    path.mkdir(parents=True, exist_ok=True)
    refusal = f"out={str(path)!r} is not empty: give a new folder, or continue that run with --resume {path}"
    if any(path.iterdir()):
        raise ValueError(refusal)
    try:  # the claim: of two runs racing for one empty folder, only one creates the file
        (path / CLAIM_FILE).open("x").close()
    except FileExistsError:
        raise ValueError(refusal) from None
    return path


def new_run_folder(out: str | Path | None) -> Path:
    """The folder of a new run: ``out`` when given (it must be new or empty), else a unique one.

    :param out: ``RunConfig.out``.
    :return: the folder, created.
    """
    return unique_run_folder() if out is None else claim_run_folder(out)


class RunFolderLock(FileLock):
    """The lock of a run folder (``filelock``'s ``FileLock``: an ``flock`` on POSIX, which the kernel drops
    when the process dies); :meth:`close` releases it."""

    def close(self) -> None:
        """Release the lock."""
        self.release(force=True)


def lock_run_folder(path: str | Path) -> RunFolderLock:
    """Lock a run folder for this process.

    :param path: the run folder.
    :return: the held lock; ``close()`` releases it.
    :raises ValueError: when another process holds the lock (the run is still going).
    """
    lock = RunFolderLock(str(Path(path) / LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ValueError(f"run folder {str(path)!r} is in use by another training process") from None
    return lock


def discard_run_folder(path: str | Path) -> None:
    """Remove the folder of a run that failed before it began to learn (nothing in it is worth keeping: its
    config, its lock and the logs' first lines), so that neither ``--out`` nor ``--resume`` meets it later.

    :param path: the run folder :func:`new_run_folder` made.
    """
    shutil.rmtree(path, ignore_errors=True)
