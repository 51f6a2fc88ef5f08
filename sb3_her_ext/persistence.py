"""BranchingIQN's files: the model (refusing NaN or inf) and the replay buffer (sealed with a SHA-256 and
verified on load), as a mixin of SB3's ``save``/``load`` and ``save_replay_buffer``/``load_replay_buffer``."""

from __future__ import annotations

import io
import pathlib
import pickle
import warnings
from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np

from sb3_her_ext import checksum
from sb3_her_ext.guard import NonFiniteError, named_state, refuse_nonfinite
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer
from sb3_her_ext.validation import provenance_difference

SelfModel = TypeVar("SelfModel", bound="ModelFiles")


class ModelFiles:
    """SB3's file methods, checked; mixed into :class:`~sb3_her_ext.algorithm.BranchingIQN` before SB3's
    ``OffPolicyAlgorithm`` (each method calls SB3's through ``super()``)."""

    policy: Any
    guard: Any
    replay_buffer: Any
    _n_gradient_steps: int

    def save(self, path: str | pathlib.Path | io.BufferedIOBase, exclude: Iterable[str] | None = None,
             include: Iterable[str] | None = None) -> None:
        """SB3's ``save``, refusing a model that holds a NaN or inf (the error names the tensor and the
        gradient step it went bad: :func:`~sb3_her_ext.guard.refuse_nonfinite`).

        :param path: the file (``.zip``) or an open file.
        :param exclude: attributes not to save.
        :param include: attributes to save that would be left out.
        """
        refuse_nonfinite(named_state(self.policy, self.policy.optimizer), self.guard, self._n_gradient_steps)
        super().save(path, exclude, include)

    # ------------------------------------------------------------------ replay buffer files

    @staticmethod
    def _replay_file(path: str | pathlib.Path, reading: bool) -> pathlib.Path:
        """The file SB3 writes or reads for ``path`` (it adds ``.pkl`` to a path without a suffix)."""
        path = pathlib.Path(path)
        if reading:
            return path if path.exists() else pathlib.Path(f"{path}.pkl")
        return path if path.suffix else pathlib.Path(f"{path}.pkl")

    @classmethod
    def load(cls: type[SelfModel], path: str | pathlib.Path | io.BufferedIOBase, *args: Any,
             **kwargs: Any) -> SelfModel:
        """SB3's ``load``; a missing file is a ``FileNotFoundError`` naming the path given (SB3 names the
        last name it tried, ``x.zip.zip``).

        :param path: the model file (``.zip`` is added to a path without a file there, as SB3 does).
        :param args: SB3's ``load`` arguments (``env``, ``device``, ...).
        :param kwargs: SB3's ``load`` keyword arguments.
        :return: the model.
        """
        if isinstance(path, str | pathlib.Path):
            given = pathlib.Path(path)
            if not given.is_file() and not pathlib.Path(f"{given}.zip").is_file():
                tried = "" if given.suffix == ".zip" else f" (nor {given}.zip)"
                raise FileNotFoundError(f"{cls.__name__}.load: no model file {str(path)!r}{tried}")
        return super().load(path, *args, **kwargs)

    def save_replay_buffer(self, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """SB3's ``save_replay_buffer``, sealed with the file's SHA-256 in a trailer after the pickle
        (:mod:`sb3_her_ext.checksum`: SB3's loaders still read the file; not for an open file object).

        :param path: the pickle to write (``.pkl`` is added to a path without a suffix), or an open file.
        """
        super().save_replay_buffer(path)
        if isinstance(path, str | pathlib.Path):
            checksum.append_trailer(self._replay_file(path, reading=False))

    def load_replay_buffer(self, path: str | pathlib.Path | io.BufferedIOBase,
                           truncate_last_traj: bool = True, allow_other_run: bool = False) -> None:
        """SB3's ``load_replay_buffer``, verified: the file against the SHA-256 it carries (a file without
        one, e.g. saved before checksums, loads with a warning), and the loaded contents (no non-finite
        observation, reward or priority, no action outside its branch). On an error the model keeps its
        current buffer.

        :param path: the pickle (or an open file: no checksum check).
        :param truncate_last_traj: SB3's argument (``HerReplayBuffer`` only).
        :param allow_other_run: load a buffer although the record of what it was made on (foxhunt's
            fingerprint, :func:`~sb3_her_ext.validation.provenance_difference`) differs from the model's.
        :raises ValueError: the buffer was made on something else than the model (another config, market,
            action face or env), naming the first differing field.
        :raises ChecksumError: the file's bytes differ from its checksum (the message names the file).
        :raises NonFiniteError: the loaded buffer holds values no push writes (the message names the file).
        """
        name, sealed = "the given file object", True
        if isinstance(path, str | pathlib.Path):
            file = self._replay_file(path, reading=True)
            name = str(file)
            sealed = checksum.verify_trailer(file) is not None
        previous = self.replay_buffer
        try:
            super().load_replay_buffer(path, truncate_last_traj)
        except (EOFError, pickle.UnpicklingError, AttributeError, ImportError, IndexError) as error:
            self.replay_buffer = previous  # a file cut short loses its trailer too: not taken for an old one
            raise checksum.ChecksumError(f"replay buffer file {name} cannot be read ({type(error).__name__}: "
                                         f"{error}): it is truncated or not a replay buffer") from None
        if not sealed:
            warnings.warn(f"{name} carries no SHA-256 (saved before checksums?): loaded unverified",
                          stacklevel=2)
        buffer = self.replay_buffer
        if isinstance(buffer, PrioritizedHindsightReplayBuffer):
            bad = buffer.invalid_fields()
        else:  # SB3's numpy buffer
            bad = [field for field in ("observations", "next_observations", "rewards")
                   if not np.isfinite(getattr(buffer, field)).all()]
        if bad:
            self.replay_buffer = previous
            raise NonFiniteError(f"replay buffer file {name} holds invalid values in {bad}: not loaded")
        other = None if allow_other_run else provenance_difference(self, buffer)
        if other is not None:
            self.replay_buffer = previous
            field, theirs, mine = other
            raise ValueError(f"replay buffer file {name} was made with another {field} than this model "
                             f"({theirs!r}, the model: {mine!r}): not loaded; pass allow_other_run=True to "
                             "load it anyway")
