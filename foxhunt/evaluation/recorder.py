"""The recorder: runs a policy on ``B`` books of a market for ``N`` steps, keeping every series on the device.

Every policy recorded with the same market, books, steps, episode length and seed sees the same episode
windows: the start offsets are planned up front (:func:`plan_offsets`), not drawn as episodes end, so a
paired comparison of two policies compares the same market paths. All books start their episodes together
(every ``episode_length`` steps); a book the env terminates early (``max_drawdown``) is frozen for the rest
of its episode (no PnL, no trades counted).

The loop steps :class:`foxenv.core.BatchedLOB` directly (tensors in and out) and writes each step's values
into preallocated ``[N, B]`` device tensors; nothing is copied to the host except what a model's
``predict`` needs (SB3 takes numpy) and one offset check per episode.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from tqdm import TqdmExperimentalWarning
from tqdm.rich import tqdm as rich_tqdm

from foxenv.config import EnvConfig
from foxenv.data.market import MarketData
from foxenv.features import market_features, portfolio_features

#: Per-step series of a :class:`Recording`, each ``[N, B]`` (``actions``: ``[N, B, 4]`` int8).
SERIES = (
    "equity",  # equity of the book after the step (currency; 0 at an episode's start)
    "step_pnl",  # change of equity in the step (currency, after fees)
    "reward",  # the env's reward of the step
    "position",  # position after the step (lots)
    "mid",  # mid after the step (currency)
    "prev_mid",  # mid the step started from (currency)
    "traded_lots",  # |change of position| in the step (lots)
    "notional",  # traded_lots * prev_mid (currency)
    "maker_lots",  # traded_lots of steps whose action was LimitMaker
    "fees",  # fees paid in the step (currency; negative = rebate)
    "spread_cost",  # fill price minus the pre-trade mid, times the lots (currency; >= 0 for takers)
    "trade_closed",  # a trade closed in the step (bool)
    "trade_pnl",  # PnL of the trade closed in the step (currency)
    "episode_start",  # the step is an episode's first (bool)
    "alive",  # the book was still in its episode (bool; False after an early termination)
    "order_active",  # an unfilled LimitMaker order rests after the step (bool)
    "order_distance",  # ticks that order sits behind its own-side touch after the step (0 without one)
    "actions",  # the action taken (int8, [N, B, 4])
)


@dataclass
class Recording:
    """What :func:`record` returns: the series on the device plus the layout of the run."""

    policy: str
    """Name of the policy."""
    series: dict[str, torch.Tensor]
    """:data:`SERIES` by name."""
    offsets: torch.Tensor
    """``[E, B]`` int64 start rows of each book's episodes (host)."""
    episode_length: int
    """Steps of a full episode."""
    market: str
    """The market's name."""
    step_seconds: float
    """Median clock seconds of one market step."""
    elapsed_s: float = 0.0
    """Wall time of the loop."""
    extra: dict[str, Any] = field(default_factory=dict)
    nvec: tuple[int, ...] = (3, 3, 3, 3)
    """Choices per action branch: the env's action grid's ``nvec``."""
    action_labels: dict[str, tuple[str, ...]] | None = None
    """The name of each value of each branch (the grid's :meth:`~foxenv.spec.ActionGrid.labels`)."""

    @property
    def num_steps(self) -> int:
        """Vector steps ``N``."""
        return int(self.series["equity"].shape[0])

    @property
    def num_books(self) -> int:
        """Books ``B``."""
        return int(self.series["equity"].shape[1])

    def episode_index(self) -> torch.Tensor:
        """``[N]`` int64: the episode each step belongs to."""
        return torch.arange(self.num_steps, device=self.series["equity"].device) // self.episode_length

    def independent_steps(self) -> int:
        """Distinct market rows stepped from (the union of the episode windows actually run)."""
        return distinct_rows(self.offsets, self.episode_length, self.num_steps)

    def to(self, device: str | torch.device) -> Recording:
        """A copy with the series on ``device``."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["series"] = {k: v.to(device) for k, v in self.series.items()}
        return Recording(**values)


def progress_bar(iterable: Iterable[Any], desc: str, disable: bool = False) -> Iterable[Any]:
    """A progress bar of the kind SB3's ``learn(progress_bar=True)`` draws (tqdm's rich bar), so a run shows
    one kind of bar from training to evaluation.

    :param iterable: what to iterate over.
    :param desc: the bar's label.
    :param disable: no bar (the iterable itself).
    """
    if disable:
        return iterable
    with warnings.catch_warnings():  # tqdm.rich is marked experimental; SB3 silences the same warning
        warnings.simplefilter("ignore", TqdmExperimentalWarning)
        return rich_tqdm(iterable, desc=desc)


def distinct_rows(offsets: torch.Tensor, episode_length: int, num_steps: int) -> int:
    """Number of distinct market rows covered by episode windows of the planned offsets.

    :param offsets: ``[E, B]`` start rows.
    :param episode_length: steps of a full episode.
    :param num_steps: vector steps run (the last episode may be partial).
    :return: the size of the union of ``[offset, offset + steps of that episode)``.
    """
    starts = offsets.detach().cpu().numpy().astype(np.int64)
    lengths = np.minimum(episode_length, num_steps - episode_length * np.arange(starts.shape[0]))[:, None]
    lengths = np.broadcast_to(lengths, starts.shape).reshape(-1)
    starts = starts.reshape(-1)
    order = np.argsort(starts)
    covered, reach = 0, -1
    for start, length in zip(starts[order], lengths[order], strict=True):  # E * B windows, host-side, once
        end = start + length
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return int(covered)


def plan_offsets(market_steps: int, episode_length: int, num_books: int, num_episodes: int,
                 seed: int = 0) -> torch.Tensor:
    """Episode start rows for every book and episode: evenly spread over the market, in a seeded order.

    The ``E * B`` windows get distinct starts spaced as far apart as the market allows (disjoint when it
    holds ``E * B`` episodes), so no two books replay the same path unless the market is too short.

    :param market_steps: rows ``T`` of the market.
    :param episode_length: steps ``L`` of an episode; starts lie in ``[0, T - L)``.
    :param num_books: books ``B``.
    :param num_episodes: episodes ``E`` per book.
    :param seed: seeds the assignment of windows to books and episodes.
    :return: ``[E, B]`` int64 (CPU).
    """
    high = market_steps - episode_length
    if high < 1:
        raise ValueError(f"market_steps={market_steps} must exceed episode_length={episode_length}")
    windows = num_books * num_episodes
    grid = torch.linspace(0, high - 1, windows, dtype=torch.float64).floor().to(torch.int64)
    order = torch.randperm(windows, generator=torch.Generator().manual_seed(int(seed)))
    return grid[order].reshape(num_episodes, num_books)


def _start_observation(market_rows: torch.Tensor, features: torch.Tensor, config: EnvConfig,
                       tick_size: float) -> torch.Tensor:
    """Observation of fresh books (flat, no order, step 0) at market rows ``market_rows``."""
    zero = torch.zeros(market_rows.shape[0], dtype=torch.float64, device=features.device)
    portfolio = portfolio_features(
        position=zero, unrealized=zero, mid=torch.ones_like(zero), order_side=zero, order_price=zero,
        order_ahead=zero, order_remaining=zero, time_in_trade=zero, step=zero, config=config,
        tick_size=tick_size,
    )
    return torch.cat([features.index_select(0, market_rows), portfolio], dim=1)


def step_seconds(market: MarketData) -> float:
    """Median clock seconds between consecutive rows of ``market`` (its step duration).

    :param market: the timeline.
    :return: seconds (NaN when the market has fewer than two rows).
    """
    if market.num_steps < 2:
        return float("nan")
    return round(float(torch.diff(market.time.double()).median()), 6)


def record(policy: Any, market: MarketData, *, num_books: int = 16, num_steps: int | None = None,
           seed: int = 0, env_kwargs: dict[str, Any] | None = None, device: str | torch.device = "cpu",
           offsets: torch.Tensor | None = None, progress: bool = False) -> Recording:
    """Run ``policy`` on ``num_books`` books of ``market`` for ``num_steps`` steps and record every series.

    :param policy: a :class:`~foxhunt.evaluation.baselines.Policy` (see
        :func:`~foxhunt.evaluation.baselines.as_policy` for models and baseline names).
    :param market: the timeline.
    :param num_books: books ``B`` stepped together.
    :param num_steps: vector steps ``N``; ``None``: one episode.
    :param seed: seeds the episode windows (:func:`plan_offsets`) and the env.
    :param env_kwargs: :class:`~foxenv.config.EnvConfig` fields.
    :param device: device of the env and of the series.
    :param offsets: ``[E, B]`` start rows to use instead of :func:`plan_offsets`'s (``E >= ceil(N / L)``).
    :param progress: show a progress bar.
    :return: the :class:`Recording`.
    :raises ValueError: for a policy built for another action grid than ``env_kwargs``'s.
    """
    from foxenv.core import BatchedLOB
    from foxhunt.evaluation.baselines import as_policy

    config = EnvConfig(**(env_kwargs or {}))
    policy = as_policy(policy, grid=config.grid)
    grid = getattr(policy, "grid", config.grid)
    if grid != config.grid:
        raise ValueError(f"{policy.name}: the policy acts on the {grid.name!r} action grid, the env on "
                         f"{config.grid.name!r}; build it with grid=EnvConfig(...).grid")
    length = int(config.episode_length)
    steps = length if num_steps is None else int(num_steps)
    if steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1")
    if int(num_books) != num_books or num_books < 1:
        raise ValueError(f"num_books={num_books} must be an integer >= 1")
    episodes = -(-steps // length)
    offsets = _check_offsets(offsets, market, length, int(num_books), episodes, seed)
    lob = BatchedLOB(market, int(num_books), config, device, seed)
    _check_observation_space(policy, lob)
    series, started = _run(policy, lob, offsets, steps, progress)
    return Recording(
        policy=policy.name, series=series, offsets=offsets[:episodes].cpu(), episode_length=length,
        market=market.name, step_seconds=step_seconds(market), elapsed_s=time.perf_counter() - started,
        nvec=config.grid.nvec, action_labels=config.grid.labels(),
    )


def _check_offsets(offsets: torch.Tensor | None, market: MarketData, length: int, num_books: int,
                   episodes: int, seed: int) -> torch.Tensor:
    """``offsets`` as ``[E, B]`` int64, checked (:func:`plan_offsets`'s when None)."""
    if offsets is None:
        offsets = plan_offsets(market.num_steps, length, num_books, episodes, seed)
    offsets = torch.as_tensor(offsets, dtype=torch.int64)
    if offsets.ndim != 2 or offsets.shape[0] < episodes or offsets.shape[1] != num_books:
        raise ValueError(f"offsets has shape {tuple(offsets.shape)}; ({episodes}, {num_books}) or more rows "
                         "are needed")
    return offsets


def _check_observation_space(policy: Any, lob: Any) -> None:
    """Raise a ValueError when a model policy was trained on observations of another size than the env's."""
    space = getattr(getattr(policy, "model", None), "observation_space", None)
    if space is not None and tuple(space.shape) != (int(lob.observation_dim),):
        raise ValueError(
            f"{policy.name}: the model's observation_space has shape {tuple(space.shape)}, the env's "
            f"observation ({int(lob.observation_dim)},); give the env_kwargs (levels, return_horizons) the "
            "model was trained with"
        )


def _run(policy: Any, lob: Any, offsets: torch.Tensor, steps: int,
         progress: bool) -> tuple[dict[str, torch.Tensor], float]:
    """Step ``policy`` on ``lob`` for ``steps`` vector steps, each episode from its planned window.

    :return: the series (``[N, B]`` each, ``actions`` ``[N, B, 4]``) and the ``perf_counter`` at the start.
    """
    config = lob.config
    dev = lob.device
    length = int(config.episode_length)
    num_books = lob.num_books
    features = market_features(lob.market, config)
    market_mid = (lob.market.bid_price[:, 0] + lob.market.ask_price[:, 0]) / 2
    shape = (steps, num_books)
    series = {name: torch.zeros(shape, dtype=torch.float64, device=dev) for name in SERIES}
    for name in ("trade_closed", "episode_start", "alive", "order_active"):
        series[name] = torch.zeros(shape, dtype=torch.bool, device=dev)
    series["actions"] = torch.zeros((*shape, 4), dtype=torch.int8, device=dev)
    dev_offsets = offsets.to(dev)
    magnitudes = torch.tensor(config.grid.magnitudes, dtype=torch.float64, device=dev) * config.max_position
    policy.reset(num_books, dev)
    started = time.perf_counter()
    for t in progress_bar(range(steps), desc=f"evaluate {policy.name}", disable=not progress):
        if t % length == 0:  # every book starts its next episode at its planned window
            lob.reset()
            state = lob.state_dict()
            state["offset"] = dev_offsets[t // length].clone()
            lob.load_state_dict(state)
            obs = _start_observation(dev_offsets[t // length], features, config, lob.market.tick_size)
            if callable(getattr(policy, "start_episodes", None)):  # a policy that knows the market's rows
                policy.start_episodes(dev_offsets[t // length])
            prev_mid = market_mid.index_select(0, dev_offsets[t // length])
            prev_position = torch.zeros(num_books, dtype=torch.float64, device=dev)
            prev_equity = torch.zeros_like(prev_position)
            prev_cash = torch.zeros_like(prev_position)
            alive = torch.ones(num_books, dtype=torch.bool, device=dev)
            episode_start = torch.ones(num_books, dtype=torch.bool, device=dev)
        action = policy.act(obs, episode_start)
        obs, reward, terminated, _, info = lob.step(action)
        row = _series_row(action, reward, info, magnitudes, lob.market.tick_size, alive, episode_start,
                          prev_mid, prev_position, prev_equity, prev_cash)
        for name, value in row.items():
            series[name][t] = value
        series["actions"][t] = action.to(torch.int8)
        prev_equity, prev_position = row["equity"], row["position"]
        prev_cash, prev_mid = info["cash"], info["mid"]
        alive = alive & ~terminated
        episode_start = torch.zeros_like(episode_start)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return series, started


def _series_row(action: torch.Tensor, reward: torch.Tensor, info: dict[str, torch.Tensor],
                magnitudes: torch.Tensor, tick_size: float, alive: torch.Tensor, episode_start: torch.Tensor,
                prev_mid: torch.Tensor, prev_position: torch.Tensor, prev_equity: torch.Tensor,
                prev_cash: torch.Tensor) -> dict[str, torch.Tensor]:
    """One step's row of every series but ``actions`` (``[B]`` each); a finished episode's book holds its
    equity and position and counts nothing more."""
    is_maker = action[:, 2] == 1
    # the resting order (only a LimitMaker action leaves one) works toward the action's target
    target = (action[:, 0] - 1).double() * magnitudes[action[:, 1].long()]
    resting = info["order_active"] & alive
    order_side = torch.sign(target - info["position"]) * resting
    touch = torch.where(order_side > 0, info["best_bid"], info["best_ask"])
    distance = torch.round(order_side * (touch - info["order_price"]) / tick_size)
    lots = (info["position"] - prev_position).abs() * alive
    fees = info["fees"] * alive
    # cash falls by the fill notional plus fees; the fill notional against the pre-trade mid is the cost
    shortfall = (prev_cash - info["cash"] - info["fees"]) - (info["position"] - prev_position) * prev_mid
    return {
        "equity": torch.where(alive, info["equity"], prev_equity),
        "step_pnl": (info["equity"] - prev_equity) * alive,
        "reward": reward.double() * alive,
        "position": torch.where(alive, info["position"], prev_position),
        "mid": info["mid"],
        "prev_mid": prev_mid,
        "traded_lots": lots,
        "notional": lots * prev_mid,
        "maker_lots": lots * is_maker,
        "fees": fees,
        "spread_cost": shortfall * alive,
        "trade_closed": info["trade_closed"] & alive,
        "trade_pnl": info["trade_pnl"] * alive,
        "episode_start": episode_start,
        "alive": alive,
        "order_active": resting,
        "order_distance": distance * resting,
    }
