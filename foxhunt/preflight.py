"""Checks before a run starts: every option valid, and the run's memory within what the device has free.

:func:`check_run` runs before :func:`foxhunt.runs.train` creates anything, so a run that cannot start fails
in one line and leaves no folder behind: the device is parsed and present, and the memory of the books, the
replay buffer, the
synthetic market and the final evaluation's series is estimated against the free memory of the device
(``--n-envs 1000000000``: "needs 6,720 GB, 23 GB free", at once, not after an allocation fails or after a
whole training). :func:`check_evaluation_size` does the same for ``foxhunt evaluate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch as th

from foxenv.checks import check_device
from sb3_her_ext.validation import free_memory

#: How messages name the replay buffer's size (the flag of ``RunConfig.algorithm.buffer_size``).
BUFFER_OPTION = "--algorithm.buffer-size"
#: Bytes per book of the env and its loop, per observation feature and fixed (copies of the observation in
#: the core, the numpy face, the replay push and the policy's input; the book state and info tensors).
BOOK_BYTES_PER_FEATURE = 48
BOOK_BYTES = 4096
#: Bytes of one step of the final evaluation per book: the recorder's float64 series, with slack.
EVAL_BYTES_PER_BOOK_STEP = 8 * 20
#: Bytes of one step of a synthetic market per book level (prices and sizes of both sides, features) and
#: fixed (the order-flow grids).
MARKET_BYTES_PER_LEVEL = 64
MARKET_BYTES = 4 * 64 * 4 + 256


def _gb(size: float) -> str:
    return f"{size / 1e9:,.3g} GB" if size < 1e12 else f"{size / 1e9:,.0f} GB"


def check_fits(parts: Mapping[str, tuple[tuple[str, ...], float]], device: str | th.device,
               growth: Mapping[str, float] | None = None) -> None:
    """Refuse when the parts' sum exceeds the device's free memory.

    :param parts: ``{what: (the options that scale it, bytes)}``.
    :param device: where they live.
    :param growth: each option's value over its default: of the options behind the large parts, the message
        names the one furthest above its default (None: the largest part's first option).
    :raises ValueError: one line naming that option, the estimate and the free memory.
    """
    free = free_memory(device)
    total = sum(size for _, size in parts.values())
    if free is None or total <= free:
        return
    large = [options for options, size in parts.values() if size >= 0.1 * total]
    candidates = [option for options in large for option in options]
    growth = dict(growth or {})
    option = max(candidates, key=lambda name: growth.get(name, 0.0)) if growth else candidates[0]
    shown = ", ".join(f"{name} {_gb(part)}" for name, (_, part) in parts.items() if part >= 0.01 * total)
    raise ValueError(f"{option}: the run needs about {_gb(total)} of memory ({shown}), and "
                     f"{th.device(device)} has {_gb(free)} free; lower {option}")


def observation_size(env_kwargs: Mapping[str, Any]) -> int:
    """Features of one observation for these env settings."""
    from foxenv.config import EnvConfig, split_env_kwargs
    from foxenv.features import PORTFOLIO_FEATURES, market_feature_dim

    config, _ = split_env_kwargs(env_kwargs)
    return market_feature_dim(EnvConfig(**config)) + len(PORTFOLIO_FEATURES)


def book_bytes(env_kwargs: Mapping[str, Any]) -> float:
    """The estimated bytes of one book of the env and its loop for these env settings (the minimum where
    the settings cannot be read yet: the env's own checks name a bad one)."""
    try:
        size = observation_size(env_kwargs)
    except (TypeError, ValueError):
        size = 1
    return float(BOOK_BYTES_PER_FEATURE * size + BOOK_BYTES)


def run_memory(config: Any) -> dict[str, tuple[tuple[str, ...], float]]:
    """The estimated memory of a run's large parts, by part: ``{what: (the options that scale it, bytes)}``.

    :param config: the :class:`~foxhunt.runs.RunConfig`.
    :return: the parts.
    """
    env_kwargs = config.resolved_env_kwargs()
    size = observation_size(env_kwargs)
    branches = 1 if config.resolved_action_face() == "joint" else 4
    buffer_size = int(config.resolved_model_kwargs().get("buffer_size", 0))
    tree = 16 * (1 << max(buffer_size - 1, 0).bit_length())
    row = 8 * size + 8 * branches + 9
    levels = int(env_kwargs.get("levels", 10))
    parts = {
        "books": (("--n-envs",), float(config.n_envs) * book_bytes(env_kwargs)),
        "replay buffer": ((BUFFER_OPTION,), float(buffer_size) * row + tree),
        "final evaluation": (("--eval-steps", "--n-envs"),
                             float(config.eval_steps) * config.n_envs * EVAL_BYTES_PER_BOOK_STEP),
    }
    if config.data == "synthetic":
        parts["synthetic market"] = (("--synthetic-market-steps",), float(config.synthetic_market_steps) * (
            MARKET_BYTES_PER_LEVEL * levels + MARKET_BYTES + 4 * size))
    return parts


def check_run(config: Any) -> None:
    """Every check a run can make before it starts (see the module docstring).

    :param config: the :class:`~foxhunt.runs.RunConfig`.
    :raises ValueError: one line naming the field.
    """
    device = check_device(config.device, "RunConfig.device")
    defaults = type(config)()  # the run's own class: preflight imports no foxhunt.runs
    growth = {
        "--n-envs": config.n_envs / defaults.n_envs,
        "--eval-steps": config.eval_steps / defaults.eval_steps,
        BUFFER_OPTION: config.resolved_model_kwargs().get("buffer_size", 0)
        / defaults.resolved_model_kwargs().get("buffer_size", 1),
        "--synthetic-market-steps": config.synthetic_market_steps / defaults.synthetic_market_steps,
    }
    check_fits(run_memory(dataclasses.replace(config, device=str(device))), device, growth)


def check_evaluation_size(steps: int | None, books: int | None, device: str | th.device,
                          names: tuple[str, str] = ("--steps", "--n-envs")) -> None:
    """Refuse an evaluation whose series cannot fit in the device's free memory.

    :param steps: vector steps (None: one episode, not checked).
    :param books: books (None: the default, not checked).
    :param device: the evaluation's device.
    :param names: how the messages name the two options.
    """
    if steps is None or books is None:
        return
    growth = {names[0]: float(steps), names[1]: float(books)}
    series = float(steps) * books * EVAL_BYTES_PER_BOOK_STEP
    check_fits({"evaluation series": (names, series)}, device, growth)
