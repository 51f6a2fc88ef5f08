"""Checkpoints of a training run: written atomically, checked by SHA-256 on load, taken by an SB3 callback.

A run folder's checkpoints::

    checkpoints/
        step_000004000/
            model.zip          BranchingIQN.save: network, optimizer, PopArt, GradVac, SB3 counters,
                               _last_obs, episode count, schedule progress
            replay_buffer.pkl  model.save_replay_buffer: storage, priorities, hindsight state (the
                               newest checkpoint only: a resume continues from the newest, and the
                               buffer is most of a checkpoint's bytes)
            state.pt           RNG states, env state, diagnostics accumulators (foxhunt.training_state)
            manifest.json      step, diagnostics offset, SHA-256 and size of every other file, and the
                               run's fingerprint (foxhunt.fingerprint: config, market, face, env, code)

A checkpoint is built in a hidden ``.tmp-*`` folder beside the others, every file fsync'ed, the manifest
written last, then renamed into place (``os.replace``): a folder named ``step_*`` is always complete. Once a
newer one is in place, an older checkpoint gives its replay buffer up (manifest rewritten first, atomically,
with ``"replay_buffer": false``, then the file deleted): it still holds the model at its step. A
checkpoint is taken at the start of a rollout (after the previous rollout's gradient steps), the one
point where a new ``learn`` call picks up exactly where the old one was.

:func:`load_checkpoint` compares the fingerprint of the manifest and of the replay buffer with the run's
config as it is now and refuses a difference in one line naming the field (a ``config.json`` edited after the
run started: another ``market_seed`` would carry the old market's books, buffer and schedules on another
market); ``allow_market_change`` lets the market differ, and the books then start afresh on the new one.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from foxhunt import fingerprint, training_state
from sb3_her_ext.checksum import sha256_prefix as sha256_file

#: Folder of a run's checkpoints.
CHECKPOINTS_DIR = "checkpoints"
#: The manifest of one checkpoint.
MANIFEST = "manifest.json"
#: The files of one checkpoint besides the manifest.
CHECKPOINT_FILES = ("model.zip", "replay_buffer.pkl", "state.pt")
#: The replay buffer's file, kept by the newest checkpoint only.
REPLAY_FILE = "replay_buffer.pkl"
#: Layout version written into every manifest.
FORMAT = 1
_NAME = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupted (the message names the file)."""


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's contents to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint at ``step``."""
    return f"step_{int(step):09d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """A run's complete checkpoints, oldest first.

    :param run_dir: the run folder.
    :return: ``(step, folder)`` pairs.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint folder of a run, or ``None`` when it has none."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def read_manifest(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's manifest, after checking every file against its SHA-256 and size.

    :param checkpoint: the checkpoint folder.
    :return: the manifest (``format``, ``step``, ``diagnostics_offset``, ``files``, ...).
    :raises CheckpointError: naming the file that is missing, unreadable or differs from the manifest.
    """
    checkpoint = Path(checkpoint)
    manifest_path = checkpoint / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {checkpoint}: {manifest_path} is missing") from None
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint {checkpoint}: {manifest_path} is unreadable ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(
        manifest.get("files"), dict
    ):
        raise CheckpointError(f"checkpoint {checkpoint}: {manifest_path} is not a format-{FORMAT} manifest")
    dropped = {REPLAY_FILE} if manifest.get("replay_buffer") is False else set()  # an older checkpoint's
    missing = sorted(set(CHECKPOINT_FILES) - dropped - set(manifest["files"]))
    if missing:
        raise CheckpointError(f"checkpoint {checkpoint}: {manifest_path} lists no {missing}")
    if not isinstance(manifest.get("step"), int) or isinstance(manifest.get("step"), bool):
        raise CheckpointError(f"checkpoint {checkpoint}: {manifest_path} has step={manifest.get('step')!r}, "
                              "not an integer")
    for name, expected in manifest["files"].items():
        size = expected.get("bytes") if isinstance(expected, dict) else None
        if name not in CHECKPOINT_FILES or not (isinstance(expected, dict) and isinstance(
                expected.get("sha256"), str) and isinstance(size, int) and not isinstance(size, bool)):
            raise CheckpointError(f"checkpoint {checkpoint}: {manifest_path} has a malformed entry {name!r}: "
                                  f"{expected!r} (each of {list(CHECKPOINT_FILES)} needs a 'sha256' string "
                                  "and a 'bytes' integer)")
        path = checkpoint / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {checkpoint}: {path} is missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"checkpoint file {path} is corrupted: {size} bytes where the manifest says "
                f"{expected['bytes']}"
            )
        digest = sha256_file(path)
        if digest != expected["sha256"]:
            raise CheckpointError(
                f"checkpoint file {path} is corrupted: SHA-256 {digest} where the manifest says "
                f"{expected['sha256']}"
            )
    return manifest


def _file_size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def write_checkpoint(run_dir: str | Path, model: Any, diagnostics_path: str | Path | None = None) -> Path:
    """Write a checkpoint of ``model`` (with its env) into ``run_dir/checkpoints``, atomically.

    :param run_dir: the run folder.
    :param model: the algorithm (a :class:`~sb3_her_ext.BranchingIQN` with its training env).
    :param diagnostics_path: the run's diagnostics file; its size now is the offset a resume truncates to.
    :return: the checkpoint folder.
    """
    if hasattr(model, "check_finite"):
        model.check_finite()  # a run whose NaN guard tripped on the device never writes a checkpoint
    model.collector.flush_action_counts()  # the device loop's counts since its last flush, into the state
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    step = int(model.num_timesteps)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{final.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        model.save(tmp / "model.zip")
        model.save_replay_buffer(tmp / "replay_buffer.pkl")
        th.save(training_state.training_state(model), tmp / "state.pt")
        files = {}
        for name in CHECKPOINT_FILES:
            _fsync(tmp / name)
            files[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
        manifest = {
            "format": FORMAT,
            "step": step,
            "diagnostics_offset": _file_size(Path(diagnostics_path)) if diagnostics_path else 0,
            "time": time.time(),
            "files": files,
            "fingerprint": fingerprint.of(model),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _fsync(tmp / MANIFEST)
        _fsync(tmp)
        if final.exists():  # a step written before (a resumed run): the new one replaces it
            _discard(final)
        os.replace(tmp, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _discard(folder: Path) -> None:
    """Remove a checkpoint folder: first renamed out of the ``step_*`` names, then deleted."""
    trash = folder.parent / f".trash-{folder.name}-{secrets.token_hex(4)}"
    os.replace(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def drop_replay_buffer(checkpoint: Path) -> None:
    """Remove a checkpoint's replay buffer: its manifest is rewritten without it (atomically, marked
    ``"replay_buffer": false``), then the file is deleted. A no-op when it has none.

    :param checkpoint: the checkpoint folder.
    """
    manifest_path = checkpoint / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    if REPLAY_FILE in manifest["files"]:
        manifest["files"] = {k: v for k, v in manifest["files"].items() if k != REPLAY_FILE}
        manifest["replay_buffer"] = False
        tmp = checkpoint / f".{MANIFEST}.{secrets.token_hex(4)}"
        tmp.write_text(json.dumps(manifest, indent=2))
        _fsync(tmp)
        os.replace(tmp, manifest_path)
    (checkpoint / REPLAY_FILE).unlink(missing_ok=True)


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints (``keep=0``: keep all) and leftover temporary folders;
    only the newest keeps its replay buffer (:func:`drop_replay_buffer`).

    :param run_dir: the run folder.
    :param keep: how many to keep.
    """
    found = list_checkpoints(run_dir)
    if keep > 0:
        for _, folder in found[:-keep]:
            _discard(folder)
        found = found[-keep:]
    for _, folder in found[:-1]:
        drop_replay_buffer(folder)
    root = Path(run_dir) / CHECKPOINTS_DIR
    if root.is_dir():
        for leftover in root.glob(".t*-*"):  # .tmp-* of a killed write, .trash-* of a killed delete
            shutil.rmtree(leftover, ignore_errors=True)


def load_checkpoint(checkpoint: str | Path, env: Any, device: str, *,
                    expected_fingerprint: dict[str, Any] | None = None, allow_market_change: bool = False,
                    **load_kwargs: Any) -> tuple[Any, dict]:
    """A :class:`~sb3_her_ext.BranchingIQN` as it was when ``checkpoint`` was written, on ``env``.

    Restores the model (``force_reset=False``: the env is not reset, ``_last_obs`` stays), its replay
    buffer, every generator and the env's state. The diagnostics accumulators are returned in the manifest
    (key ``"diagnostics_state"``) to be put back once ``learn`` has started (:class:`RunCheckpointCallback`).

    :param checkpoint: the checkpoint folder.
    :param env: a fresh training env built from the run's config.
    :param device: the run's device.
    :param expected_fingerprint: the run's fingerprint now (:func:`foxhunt.fingerprint.run_fingerprint`);
        the manifest's and the replay buffer's must equal it (None: not checked).
    :param allow_market_change: the market may differ: the model, buffer and schedules go on, the books
        start afresh on the new market (the env is reset, its saved state left out).
    :param load_kwargs: attributes to set on the loaded model (``diagnostics_path``, ``tensorboard_log``).
    :return: ``(model, manifest)``.
    :raises CheckpointError: when a file differs from the manifest.
    :raises FingerprintMismatch: when the checkpoint was made on something else (naming the field).
    """
    from sb3_her_ext.algorithm import BranchingIQN

    checkpoint = Path(checkpoint)
    manifest = read_manifest(checkpoint)
    if REPLAY_FILE not in manifest["files"]:
        raise CheckpointError(f"checkpoint {checkpoint} holds no {REPLAY_FILE} (only a run's newest "
                              "checkpoint keeps one); its model.zip loads alone, a resume starts from the "
                              "newest")
    fix = "put config.json back as it was, or start a new run (foxhunt train --config FILE)"
    changed: list[str] = []
    if expected_fingerprint is not None:
        changed = fingerprint.compare(manifest.get("fingerprint"), expected_fingerprint,
                                      what=f"checkpoint {checkpoint}", fix=fix,
                                      allow_market_change=allow_market_change)
    model = BranchingIQN.load(checkpoint / "model.zip", env=env, device=device, force_reset=bool(changed),
                              **load_kwargs)
    model.load_replay_buffer(checkpoint / REPLAY_FILE, allow_other_run=True)  # compared with the run's below
    if expected_fingerprint is not None:
        fingerprint.compare(fingerprint.of(model.replay_buffer), expected_fingerprint,
                            what=f"replay buffer {checkpoint / 'replay_buffer.pkl'}", fix=fix,
                            allow_market_change=allow_market_change)
    state = th.load(checkpoint / "state.pt", weights_only=False)  # our own file, its SHA-256 checked
    if not changed:  # on a new market the books start afresh (load reset the env)
        training_state.set_env_state(model.get_env(), state["env"])
    training_state.set_rng_state(model, state["rng"])
    if model.num_timesteps != manifest["step"]:
        raise CheckpointError(
            f"checkpoint {checkpoint}: model.zip is at step {model.num_timesteps}, the manifest says "
            f"{manifest['step']}"
        )
    return model, {**manifest, "diagnostics_state": state["diagnostics"]}


class RunCheckpointCallback(BaseCallback):
    """Checkpoint the run every ``every`` environment steps and when training ends: the model, its replay
    buffer, RNG and env state, resumable bit for bit (not SB3's ``CheckpointCallback``, which saves the model
    only).

    Checkpoints are taken at the start of a rollout, after the previous rollout's gradient steps, where a
    resumed ``learn`` continues exactly. A resumed run's callback also puts back the diagnostics
    accumulators of the checkpoint once ``learn`` has restarted the diagnostics.

    :param run_dir: the run folder.
    :param every: environment steps between checkpoints (0: none, not even the last).
    :param keep: checkpoints kept (the newest; 0: all).
    :param diagnostics_path: the run's diagnostics file (its size is recorded in each manifest).
    :param resumed_from: the manifest of the checkpoint this run resumed from, with its
        ``diagnostics_state`` (``None`` for a new run).
    """

    def __init__(self, run_dir: str | Path, every: int, keep: int = 0,
                 diagnostics_path: str | Path | None = None,
                 resumed_from: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.every = int(every)
        self.keep = int(keep)
        self.diagnostics_path = diagnostics_path
        self.resumed_from = resumed_from
        self.last_step = 0

    def _on_training_start(self) -> None:
        self.last_step = self.model.num_timesteps
        if self.resumed_from is not None:
            training_state.set_diagnostics_state(self.model, self.resumed_from["diagnostics_state"])

    def _on_rollout_start(self) -> None:
        if self.every > 0 and self.model.num_timesteps - self.last_step >= self.every:
            self.checkpoint()

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        if self.every > 0 and self.model.num_timesteps > self.last_step:
            self.checkpoint()

    def checkpoint(self) -> Path:
        """Write a checkpoint now and prune the old ones.

        :return: the checkpoint folder.
        """
        folder = write_checkpoint(self.run_dir, self.model, self.diagnostics_path)
        self.last_step = self.model.num_timesteps
        prune_checkpoints(self.run_dir, self.keep)
        return folder
