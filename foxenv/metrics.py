"""Trading metrics: the one definition of each, and the vocabulary that names them with their units.

Pure functions over per-step series of one book or a batch of books. Every function takes numpy arrays or
torch tensors (any device; they are copied to the host as float64, so never call these inside an env step).
Time runs along the last axis: a ``[T]`` input gives a Python ``float``, a ``[B, T]`` (or any ``[..., T]``)
input gives an ``np.ndarray`` of shape ``[...]``, one value per book. :mod:`foxhunt.evaluation.metrics`
applies them to a recorded run (``foxhunt evaluate``, ``foxhunt rollout``); :data:`UNITS` is the vocabulary.

Risk ratios are of per-step PnL in currency (the books start with no capital, so there is no return
series): Sharpe = mean / sample std, Sortino = mean / downside deviation, zero risk-free rate. These are
the formulas of empyrical's ``sharpe_ratio`` / ``sortino_ratio``; the library is not used because its
drawdown and return statistics need a capital base these books do not have, and for the two ratios it
would add scipy, bottleneck, peewee and pytz to a package that needs only numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from foxenv.spec import ACTION_NVEC, BRANCH_NAMES

ArrayLike = np.ndarray | torch.Tensor | Sequence[float]

#: Trading seconds in a day (one 6.5 h session) and in a year (252 sessions): the clock that annualises.
TRADING_SECONDS_PER_DAY = 6.5 * 3600
TRADING_SECONDS_PER_YEAR = 252 * TRADING_SECONDS_PER_DAY
#: The label of each value of each branch of foxenv's action, for action mixes.
ACTION_LABELS: dict[str, tuple[str, ...]] = {
    "direction": ("short", "flat", "long"),
    "magnitude": ("quarter", "half", "full"),
    "order": ("market", "limit_maker", "ioc"),
    "urgency": ("passive", "normal", "aggressive"),
}
assert tuple(ACTION_LABELS) == BRANCH_NAMES and all(
    len(labels) == n for labels, n in zip(ACTION_LABELS.values(), ACTION_NVEC, strict=True)
)

#: The vocabulary: every metric a run is scored with and its unit ("{currency}": :func:`currency_of`).
UNITS: dict[str, str] = {
    "pnl": "{currency}, after fees, summed over books",
    "pnl_per_book": "{currency}, after fees, mean over books",
    "pnl_per_episode": "{currency}, after fees, mean over episode windows",
    "pnl_bps_of_notional": "bps of the notional traded",
    "sharpe": "per step (mean / sample std of the step PnL, pooled over book-steps)",
    "sharpe_annualised": "per year (x sqrt(steps per 252 x 6.5 h)); only when the distinct market time "
    "evaluated covers a trading day (6.5 h), else n/a",
    "sortino": "per step (mean / downside deviation of the step PnL, pooled over book-steps)",
    "sortino_annualised": "per year, as sharpe_annualised",
    "max_drawdown": "{currency}, mean over books of each book's largest fall of cumulative PnL",
    "max_drawdown_worst": "{currency}, the worst book",
    "turnover": "lots traded per book per step",
    "notional_traded": "{currency}, summed over books",
    "hit_rate": "share of closed trades with PnL > 0",
    "trades": "closed trades (count)",
    "fills": "book-steps in which the position changed (count)",
    "fees": "{currency} paid (negative = net rebate)",
    "spread_cost": "{currency}: fill prices against the pre-trade mid (negative = price improvement)",
    "maker_share": "share of traded lots filled by LimitMaker orders (the rest: Market / IoC takers)",
    "resting_share": "share of book-steps that end with an unfilled LimitMaker order resting",
    "resting_distance": "ticks the resting order sits behind its own-side touch after the step (negative: "
    "inside the spread), mean over the book-steps with one",
    "time_in_market": "share of book-steps with a position",
    "mean_abs_position": "lots",
    "mean_episode_reward": "the env's reward units, mean over finished episodes",
    "episodes_finished": "episodes that ended, full or terminated (count)",
    "steps": "book-steps recorded (vector steps x books)",
    "independent_steps": "distinct market rows stepped from",
    "episodes": "episode windows (books x episodes, the last may be partial)",
    "step_seconds": "seconds of the data's clock per market step",
    "action_mix": "share of book-steps choosing each value, per branch, in the order of action_labels",
}


def currency_of(market_name: str) -> str:
    """The currency a market's prices (and so every PnL) are in: ``"USD"`` for LOBSTER data (US equities),
    ``"synthetic currency units"`` for the built-in generator or anything else.

    :param market_name: ``MarketData.name``.
    """
    return "USD" if str(market_name).startswith("LOBSTER") else "synthetic currency units"


def units(currency: str) -> dict[str, str]:
    """:data:`UNITS` with the currency named.

    :param currency: e.g. ``currency_of(market.name)``.
    """
    return {name: unit.format(currency=currency) for name, unit in UNITS.items()}


def annualisation(step_seconds: float, sample_seconds: float) -> float | None:
    """The factor that annualises a per-step ratio, ``sqrt(TRADING_SECONDS_PER_YEAR / step_seconds)``, or
    ``None`` where the sample does not support it: less than one trading day of distinct market time
    (scaling minutes of data to a year says nothing), or no clock.

    :param step_seconds: seconds of one market step.
    :param sample_seconds: distinct market time the ratio was measured on, in seconds.
    """
    if not (step_seconds and step_seconds > 0 and np.isfinite(step_seconds)):
        return None
    if not sample_seconds >= TRADING_SECONDS_PER_DAY:
        return None
    return float(np.sqrt(TRADING_SECONDS_PER_YEAR / step_seconds))


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


def _ratio(mean: np.ndarray, scale: np.ndarray, periods_per_year: float | None) -> float | np.ndarray:
    """``mean / scale`` (0 where both are 0, signed infinity where only the scale is), annualised by
    ``sqrt(periods_per_year)`` when given: the one tail of the Sharpe and Sortino ratios."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, mean / np.where(scale > 0, scale, 1.0), np.sign(mean) * np.inf)
    ratio = np.where((scale == 0) & (mean == 0), 0.0, ratio)
    if periods_per_year is not None:
        ratio = ratio * np.sqrt(periods_per_year)
    return _scalar_or_array(np.asarray(ratio))


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
    return _ratio(mean, std, periods_per_year)


def sortino_ratio(returns: ArrayLike, periods_per_year: float | None = None) -> float | np.ndarray:
    """Sortino ratio of per-step returns (or PnL): ``mean / sqrt(mean(min(r, 0) ** 2))``, zero target.

    A series without a loss has Sortino 0 when its mean is 0 and ``+inf`` otherwise.

    :param returns: ``[..., T]`` per-step returns, ``T >= 1``.
    :param periods_per_year: when given, the ratio is annualised by ``sqrt(periods_per_year)``.
    :return: the Sortino ratio, a float for a ``[T]`` input, else an array of shape ``[...]``.
    """
    series = _as_float64(returns, "returns")
    if periods_per_year is not None and not periods_per_year > 0:
        raise ValueError(f"periods_per_year={periods_per_year} must be > 0")
    mean = series.mean(axis=-1)
    downside = np.sqrt((np.minimum(series, 0.0) ** 2).mean(axis=-1))
    return _ratio(mean, downside, periods_per_year)


def max_drawdown(equity: ArrayLike, initial: float | None = None) -> float | np.ndarray:
    """Largest fall of an equity curve from its running peak, in the curve's own units (currency).

    :param equity: ``[..., T]`` equity (or cumulative PnL) after each step.
    :param initial: the equity before the first step (a fall from it counts), e.g. 0 for cumulative PnL;
        ``None``: the curve starts at its first value.
    :return: ``max_t (max_{s <= t} equity_s - equity_t) >= 0``, per book.
    """
    curve = _as_float64(equity, "equity")
    if initial is not None:
        curve = np.concatenate([np.full((*curve.shape[:-1], 1), float(initial)), curve], axis=-1)
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


def action_labels(
    nvec: Sequence[int] = ACTION_NVEC, branch_names: Sequence[str] = BRANCH_NAMES
) -> dict[str, list[str]]:
    """The label of each column of an :func:`action_mix` row, by branch: :data:`ACTION_LABELS` for
    foxenv's branches, the value's index for any other.

    :param nvec: choices per branch.
    :param branch_names: names of the branches.
    :return: ``{branch name: [label of each value]}``.
    """
    if len(branch_names) != len(nvec):
        raise ValueError(f"branch_names={tuple(branch_names)} must name each of the {len(nvec)} branches")
    labels = {}
    for name, size in zip(branch_names, nvec, strict=True):
        known = ACTION_LABELS.get(name, ())
        labels[name] = list(known) if len(known) == size else [str(value) for value in range(int(size))]
    return labels
