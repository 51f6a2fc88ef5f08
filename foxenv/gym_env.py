"""The single-book Gymnasium environment: one book of the batched core, numpy in and out.

``gymnasium.make("foxenv/LOB-v0", data="synthetic")`` builds a :class:`LOBEnv`. It owns a
:class:`~foxenv.core.BatchedLOB` with one book on the CPU and converts at the boundary only:
the action is checked on numpy and goes in with ``torch.from_numpy``, the observation comes out as a
float32 array and the info as Python scalars. By default a step is the core's step on Python floats
(:class:`~foxenv.single_book.SingleBook`, equal to the core bit for bit); ``compile=True`` steps the core
through ``torch.compile``, with every output packed into one vector inside the compiled step
(:class:`~foxenv.packed_step.PackedStep`). The core comes from :func:`foxenv.factory.make_core`.
"""

from __future__ import annotations

import warnings
from collections import deque
from typing import Any

import gymnasium
import numpy as np
import torch

from foxenv.checks import check_seed
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.market import MarketData
from foxenv.factory import (
    MARKET_KWARGS,
    DataSource,
    action_space_of,
    make_core,
    observation_space_of,
    split_env_kwargs,
)
from foxenv.packed_step import COMPILE_OPTIONS, PackedStep, StepResult, compiled_step_key
from foxenv.single_book import SingleBook, lean_path_problem
from foxenv.spec import ACTION_NVEC, check_actions

#: Names defined elsewhere and importable from here, as before the factory and the packed step had
#: modules of their own.
__all__ = [
    "COMPILE_OPTIONS",
    "MARKET_KWARGS",
    "RENDER_HISTORY",
    "DataSource",
    "LOBEnv",
    "PackedStep",
    "StepResult",
    "action_space_of",
    "compiled_step_key",
    "make_core",
    "observation_space_of",
    "split_env_kwargs",
]

#: The shape of one action.
_ACTION_SHAPE = (len(ACTION_NVEC),)

#: Steps of mid history kept for rendering.
RENDER_HISTORY = 200


class LOBEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """One limit-order book as a Gymnasium environment (the batched core with ``B = 1`` on the CPU).

    Action: ``MultiDiscrete(config.grid.nvec)`` (``spec.ACTION_NVEC`` on the default grid) =
    ``spec.BRANCH_NAMES`` (direction, magnitude, order,
    urgency), see :mod:`foxenv.spec`. Observation: ``Box(-inf, inf, (D,), float32)``, the first
    ``n_market_features`` entries are market features, the rest portfolio features. Info after a step:
    ``spec.INFO_KEYS`` as Python scalars. ``reset`` returns an empty info.

    A step of the core at one book is bound by per-op overhead (~200 tiny tensor ops), so by default
    (``lean=True``) the env steps a :class:`~foxenv.single_book.SingleBook`: the core's step on Python
    floats over the core's tables, with the same results bit for bit, faster than the eager core and
    than ``compile=True`` at one book, with no compile (rates in ``benchmarks/RESULTS.md``). The state
    then lives in the lean step; ``env.core`` hands out the core with that state written into it, and a
    core moved directly (stepped, reset, ``load_state_dict``) hands its state back. The env checks the
    action on numpy and the episode end on a Python counter, so the core skips its own checks (which would
    copy the action and the step counter out of tensors every step). ``env.compiled`` says whether the
    step is compiled, ``env.lean`` whether it is the lean one.

    :param data: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` pair, or a :class:`MarketData`.
    :param render_mode: ``None`` or ``"rgb_array"`` (a picture of the book, see :mod:`foxenv.render`).
    :param seed: seed of the core (episode start offsets); ``reset(seed=...)`` reseeds. The market does
        not depend on it (``market_seed=`` picks the synthetic market).
    :param config: base :class:`EnvConfig`; keyword arguments naming its fields override it.
    :param compile: step through ``torch.compile`` (opt-in): the core's step, the function
        :meth:`BatchedLOB.enable_compile` compiles, fused with the packing of all its outputs into one
        vector (:class:`PackedStep`); ``env.core.step`` itself stays eager. Needs a C++ compiler. The
        env compiles while it is built (seconds; less with a warm inductor cache); a further env in the
        process with the same config and market shape reuses the compiled step, one that differs traces
        its own (see :meth:`PackedStep.compile`). Steps are several times faster than the eager core's,
        though not than the default lean step's (``benchmarks/RESULTS.md``). Floats may differ from the
        eager step in the last bits (a fused multiply-add). Off by default: a single-book env is often
        built for a short run, an env check or a test, where the compile would cost more than it saves.
    :param lean: step the lean one-book step (default) instead of the eager core when ``compile`` is
        False. Where the lean step cannot reproduce the core (a config field or state it does not know,
        see :func:`~foxenv.single_book.lean_path_problem`, or a difference in a few steps both take when
        the env is built, :meth:`~foxenv.single_book.SingleBook.self_check`) the env warns and steps the
        eager core.
    :param kwargs: :class:`EnvConfig` fields and ``load_market`` options, see :func:`make_core`.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        data: DataSource = "synthetic",
        render_mode: str | None = None,
        seed: int | None = None,
        config: EnvConfig | None = None,
        compile: bool = False,
        lean: bool = True,
        **kwargs: Any,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            modes = self.metadata["render_modes"]
            raise ValueError(f"render_mode={render_mode!r} must be None or one of {modes}")
        if not isinstance(compile, bool):
            raise ValueError(f"compile={compile!r} must be True or False")
        if not isinstance(lean, bool):
            raise ValueError(f"lean={lean!r} must be True or False")
        self.render_mode = render_mode
        # The env checks actions and the episode end itself (on numpy and a Python int, see step).
        self._core = make_core(
            data, 1, device="cpu", seed=seed, config=config, validate_actions=False, **kwargs
        )
        #: The compiled packed step (``compile=True``), else None (the lean or the eager core's step).
        self._packed_step: PackedStep | None = None
        if compile:
            self._packed_step = PackedStep.of(self._core).compile(self._core)
        #: The lean step holding the book's state (``lean`` and not ``compile``), else None.
        self._book: SingleBook | None = None
        if lean and not compile:
            problem = lean_path_problem(self._core)
            if problem is None:
                self._book = SingleBook(self._core)
                difference = self._book.self_check()
                if difference is not None:
                    self._book = None
                    problem = f"the lean step differs from the core in {difference}"
            if problem is not None:
                warnings.warn(f"LOBEnv steps the eager core: {problem}", stacklevel=2)
        self.compiled = compile
        self.lean = self._book is not None
        self.config: EnvConfig = self._core.config
        self.market: MarketData = self._core.market
        self.n_market_features: int = int(self._core.n_market_features)
        self.observation_space = observation_space_of(self._core)
        self.action_space = action_space_of(self._core)
        #: Steps taken in this episode (the core's step counter, kept on the host to check the end).
        self._episode_step = 0
        self._mids: deque[float] = deque(maxlen=RENDER_HISTORY)
        self._last_info: dict[str, Any] = {}

    @property
    def core(self) -> BatchedLOB:
        """The env's one-book core, holding the book's current state (with the lean step, its state is
        written into the core on each access, and a core stepped, reset or loaded directly hands its state
        back to the lean step at the env's next step)."""
        if self._book is not None:
            self._book.store()
        return self._core

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new episode.

        :param seed: reseeds the core (and ``np_random``) when given.
        :param options: unused.
        :return: the first observation and an empty info.
        """
        seed = check_seed(seed)
        super().reset(seed=seed)
        obs = self._core.reset(seed=seed)
        if self._book is not None:
            self._book.load()
        self._episode_step = 0
        self._mids.clear()
        self._last_info = {}
        return obs.numpy()[0].copy(), {}

    def check_action(self, action: Any) -> np.ndarray:
        """Check one action's shape, dtype and range (:func:`foxenv.spec.check_actions`).

        :param action: anything array-like of 4 integers, each in ``[0, nvec)``.
        :return: the action as a contiguous int64 array of shape ``(4,)``.
        :raises ValueError: naming the action, when its shape, dtype or a value is wrong.
        """
        if isinstance(action, torch.Tensor):
            action = action.numpy(force=True)
        return check_actions(action, _ACTION_SHAPE, nvec=self._core.ACTION_NVEC)

    def step(self, action: Any) -> StepResult:
        """Advance the book by one step.

        :param action: ``[direction, magnitude, order, urgency]`` integers.
        :return: observation, reward, terminated, truncated, info (Python scalars).
        :raises ValueError: on a bad action, or a step after the episode was truncated (reset first).
        """
        checked = self.check_action(action)
        if self._episode_step >= self.config.episode_length:
            raise ValueError(
                f"step={self._episode_step} >= episode_length={self.config.episode_length}: "
                "the episode is over, call reset() before stepping again"
            )
        if self._book is not None:
            return self._finish(self._book.step(checked.tolist()))
        action_row = torch.from_numpy(checked.reshape(1, -1))  # numpy's reshape is cheaper
        if self._packed_step is not None:
            result = self._packed_step.unpack(self._packed_step.step(action_row))
        else:  # eager: one item() per value (cheaper than packing mixed dtypes with eager ops)
            obs, reward, terminated, truncated, core_info = self._core.step(action_row)
            info = {key: value.item() for key, value in core_info.items()}
            result = obs.numpy()[0].copy(), reward.item(), terminated.item(), truncated.item(), info
        return self._finish(result)

    def _finish(self, result: StepResult) -> StepResult:
        """Note the step count (and, when rendering, the mid and info) of a step's ``result``."""
        info = result[4]
        self._episode_step = info["step"]
        if self.render_mode is not None:
            self._mids.append(info["mid"])
            self._last_info = info
        return result

    def render(self) -> np.ndarray | None:
        """Draw the book, the agent's resting order, its position and the recent mid path.

        :return: an ``H x W x 3`` uint8 image in ``"rgb_array"`` mode, else ``None``.
        """
        if self.render_mode is None:
            return None
        from foxenv.render import render_core_book

        return render_core_book(self.core, 0, list(self._mids), self._last_info)
