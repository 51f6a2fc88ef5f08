"""Trading metrics: pure functions over per-step series of one book or a batch of books.

Every function takes numpy arrays or torch tensors (any device; they are copied to the host as
float64, so never call these inside an env step). Time runs along the last axis: a ``[T]`` input
gives a Python ``float``, a ``[B, T]`` (or any ``[..., T]``) input gives an ``np.ndarray`` of
shape ``[...]``, one value per book.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from foxenv.spec import ACTION_NVEC, BRANCH_NAMES

ArrayLike = np.ndarray | torch.Tensor | Sequence[float]



def _as_float64(values: ArrayLike, name: str, min_steps: int = 1) -> np.ndarray:
    """Return ``values`` as a float64 numpy array with at least one axis of ``min_steps`` or more.

    :param values: a numpy array, a torch tensor or a sequence of numbers.
    :param name: the argument's name, for error messages.
    :param min_steps: the least length the last (time) axis may have.
    :return: the float64 array.
    """
    if isinstance(values, torch.Tensor):
        array = values.detach().to("cpu", torch.float64).numpy()
    else:
        array = np.asarray(values, dtype=np.float64)
    if array.ndim == 0:
        raise ValueError(f"{name} has shape {array.shape}; it needs a time axis (shape [..., T])")
    if array.shape[-1] < min_steps:
        raise ValueError(f"{name} has {array.shape[-1]} steps on its last axis; at least {min_steps} needed")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds non-finite values (NaN or inf)")
    return array


def _scalar_or_array(result: np.ndarray) -> float | np.ndarray:
    """Return a 0-d result as a Python float, anything else unchanged.

    :param result: the reduced array.
    :return: a float for a single series, else the per-book array.
    """
    return float(result) if result.ndim == 0 else result


def sharpe_ratio(returns: ArrayLike, periods_per_year: float | None = None) -> float | np.ndarray:
    """Sharpe ratio of per-step returns (or per-step PnL): ``mean / std``, zero risk-free rate.

    The standard deviation is the sample one (``ddof=1``). A series with zero deviation has
    Sharpe 0 when its mean is 0 and ``±inf`` otherwise.

    :param returns: ``[..., T]`` per-step returns, ``T >= 2``.
    :param periods_per_year: when given, the ratio is annualised by ``sqrt(periods_per_year)``.
    :return: the Sharpe ratio, a float for a ``[T]`` input, else an array of shape ``[...]``.
    """
    series = _as_float64(returns, "returns", min_steps=2)
    if periods_per_year is not None and not periods_per_year > 0:
        raise ValueError(f"periods_per_year={periods_per_year} must be > 0")
    mean = series.mean(axis=-1)
    std = series.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(std > 0, mean / np.where(std > 0, std, 1.0), np.sign(mean) * np.inf)
    ratio = np.where((std == 0) & (mean == 0), 0.0, ratio)
    if periods_per_year is not None:
        ratio = ratio * np.sqrt(periods_per_year)
    return _scalar_or_array(np.asarray(ratio))


def max_drawdown(equity: ArrayLike) -> float | np.ndarray:
    """Largest fall of an equity curve from its running peak, in the curve's own units (currency).

    :param equity: ``[..., T]`` equity (or cumulative PnL) after each step.
    :return: ``max_t (max_{s <= t} equity_s - equity_t) >= 0``, per book.
    """
    curve = _as_float64(equity, "equity")
    running_peak = np.maximum.accumulate(curve, axis=-1)
    return _scalar_or_array((running_peak - curve).max(axis=-1))


def turnover(
    positions: ArrayLike, initial_position: float = 0.0, episode_starts: ArrayLike | None = None
) -> float | np.ndarray:
    """Total traded quantity implied by a position path: ``sum_t |position_t - position_{t-1}|``.

    :param positions: ``[..., T]`` signed position (lots) after each step.
    :param initial_position: the position before the first step (and before each episode start).
    :param episode_starts: optional ``[..., T]`` bool, True where a step is the first of a new episode
        (the book was reset before it, so the position it changed from is ``initial_position``).
    :return: the summed absolute position change, per book, in lots.
    """
    path = _as_float64(positions, "positions")
    start = np.full((*path.shape[:-1], 1), float(initial_position))
    previous = np.concatenate([start, path[..., :-1]], axis=-1)
    if episode_starts is not None:
        starts = _as_float64(episode_starts, "episode_starts") != 0
        if starts.shape != path.shape:
            raise ValueError(f"episode_starts has shape {starts.shape}, positions has shape {path.shape}")
        previous = np.where(starts, float(initial_position), previous)
    return _scalar_or_array(np.abs(path - previous).sum(axis=-1))


def hit_rate(trade_pnls: ArrayLike, closed: ArrayLike | None = None) -> float | np.ndarray:
    """Fraction of closed trades with a strictly positive realised PnL.

    :param trade_pnls: ``[..., T]`` PnL of each closed trade; or, together with ``closed``,
        the per-step ``trade_pnl`` info of the env.
    :param closed: optional ``[..., T]`` bool mask (the env's ``trade_closed``): only the steps
        where it is True count as trades.
    :return: winners / trades per book; NaN for a book without any closed trade.
    """
    pnl = _as_float64(trade_pnls, "trade_pnls", min_steps=0)
    if closed is None:
        mask = np.ones(pnl.shape, dtype=bool)
    else:
        mask = _as_float64(closed, "closed", min_steps=0) != 0
        if mask.shape != pnl.shape:
            raise ValueError(
                f"closed has shape {mask.shape}, trade_pnls has shape {pnl.shape}; they must match"
            )
    trades = mask.sum(axis=-1)
    wins = (mask & (pnl > 0)).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(trades > 0, wins / np.maximum(trades, 1), np.nan)
    return _scalar_or_array(np.asarray(rate, dtype=np.float64))


def action_mix(actions: ArrayLike, nvec: Sequence[int] = ACTION_NVEC) -> np.ndarray:
    """Per-branch frequency table of a batch of multi-discrete actions.

    :param actions: ``[..., n_branches]`` integer actions (any leading shape, e.g. ``[T, B, 4]``).
    :param nvec: number of choices of each branch.
    :return: ``[n_branches, max(nvec)]`` float64 table; row ``b`` holds the frequency of each
        value of branch ``b`` and sums to 1 (columns past ``nvec[b]`` are 0).
    """
    sizes = [int(n) for n in nvec]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"nvec={tuple(nvec)} must be a non-empty sequence of positive sizes")
    if isinstance(actions, torch.Tensor):
        table = actions.detach().to("cpu").numpy()
    else:
        table = np.asarray(actions)
    if table.ndim == 0 or table.shape[-1] != len(sizes):
        raise ValueError(f"actions has shape {table.shape}; its last axis must have {len(sizes)} branches")
    if table.size and table.dtype.kind not in "iub":
        raise ValueError(f"actions has dtype {table.dtype}; integer actions are needed")
    flat = table.reshape(-1, len(sizes)).astype(np.int64)
    if flat.shape[0] == 0:
        raise ValueError("actions is empty; at least one action is needed")
    frequencies = np.zeros((len(sizes), max(sizes)), dtype=np.float64)
    for branch, size in enumerate(sizes):
        column = flat[:, branch]
        if column.min() < 0 or column.max() >= size:
            low, high = int(column.min()), int(column.max())
            raise ValueError(f"actions[..., {branch}] values in [{low}, {high}]; must be in [0, {size})")
        frequencies[branch, :size] = np.bincount(column, minlength=size) / column.shape[0]
    return frequencies


def summarize(
    *,
    step_pnl: ArrayLike,
    positions: ArrayLike,
    trade_pnl: ArrayLike,
    trade_closed: ArrayLike,
    episode_starts: ArrayLike | None = None,
    actions: ArrayLike | None = None,
    episode_rewards: ArrayLike | None = None,
    nvec: Sequence[int] = ACTION_NVEC,
    branch_names: Sequence[str] = BRANCH_NAMES,
    periods_per_year: float | None = None,
) -> dict[str, Any]:
    """Summarise a run of one book (``[T]`` inputs) or many (``[B, T]``) in one flat dict.

    Per-book metrics are averaged over books (``hit_rate`` pools all closed trades instead, so a
    book without trades does not make it NaN).

    :param step_pnl: ``[..., T]`` change of equity (currency) in each step.
    :param positions: ``[..., T]`` position (lots) after each step.
    :param trade_pnl: ``[..., T]`` realised PnL of the trade closed in each step.
    :param trade_closed: ``[..., T]`` bool, a trade closed in the step.
    :param episode_starts: optional ``[..., T]`` bool, the step began a new episode (for the turnover).
    :param actions: optional ``[..., T, n_branches]`` actions taken, for the action mix.
    :param episode_rewards: optional 1-D total reward of each finished episode.
    :param nvec: choices per branch (for the action mix).
    :param branch_names: names of the branches (keys of the action mix).
    :param periods_per_year: annualises the Sharpe ratio when given.
    :return: a dict with ``sharpe``, ``max_drawdown``, ``turnover`` (lots per step), ``total_pnl``,
        ``hit_rate``, ``num_trades``, ``steps``, optionally ``episodes``, ``mean_episode_reward``
        and ``action_mix`` (``{branch name: [frequency of each value]}``).
    """
    pnl = _as_float64(step_pnl, "step_pnl", min_steps=2)
    cumulative = np.cumsum(pnl, axis=-1)
    closed = _as_float64(trade_closed, "trade_closed") != 0
    pnls = _as_float64(trade_pnl, "trade_pnl")
    path = _as_float64(positions, "positions")
    for name, series in (("positions", path), ("trade_pnl", pnls), ("trade_closed", closed)):
        if series.shape != pnl.shape:
            raise ValueError(
                f"{name} has shape {series.shape}, step_pnl has shape {pnl.shape}; they must match"
            )
    num_steps = pnl.shape[-1]
    summary: dict[str, Any] = {
        "steps": int(pnl.size),
        "sharpe": float(np.mean(sharpe_ratio(pnl, periods_per_year))),
        "max_drawdown": float(np.mean(max_drawdown(cumulative))),
        "turnover": float(np.mean(turnover(path, episode_starts=episode_starts))) / num_steps,
        "total_pnl": float(cumulative[..., -1].mean()),
        "hit_rate": float(hit_rate(pnls.reshape(-1), closed.reshape(-1))),
        "num_trades": int(closed.sum()),
    }
    if episode_rewards is not None:
        rewards = _as_float64(episode_rewards, "episode_rewards", min_steps=0).reshape(-1)
        summary["episodes"] = int(rewards.size)
        summary["mean_episode_reward"] = float(rewards.mean()) if rewards.size else float("nan")
    if actions is not None:
        if len(branch_names) != len(nvec):
            raise ValueError(f"branch_names={tuple(branch_names)} must name each of the {len(nvec)} branches")
        table = action_mix(actions, nvec)
        summary["action_mix"] = {
            name: table[branch, : int(nvec[branch])].tolist() for branch, name in enumerate(branch_names)
        }
    return summary
