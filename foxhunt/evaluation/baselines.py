"""Policies the recorder runs: an adapter for SB3-style models and the baselines every agent is compared with.

A policy here is anything with ``reset(num_books, device)`` and ``act(obs, episode_start) -> actions``, where
``obs`` is the core's ``[B, D]`` float32 observation tensor, ``episode_start`` a ``[B]`` bool tensor (True on
the first step of an episode) and the result ``[B, 4]`` int64 (direction, magnitude, order, urgency) on the
observation's device. Baselines act on the device; only :class:`ModelPolicy` copies the observation to the
host, because SB3's ``predict`` takes numpy.

foxenv's action: direction 0 / 1 / 2 = short / flat / long target, magnitude 0 / 1 / 2 = a quarter / half /
all of ``max_position``, order 0 / 1 / 2 = Market / LimitMaker / IoC, urgency 0 / 1 / 2 (Market: a third,
two thirds or all of the gap to the target) on the default grid. Every policy here takes the env's action
grid (``grid``, :class:`foxenv.spec.ActionGrid`) and picks its indices there: the full size
(``grid.full_size``), a Market order for all of the gap (``grid.whole_gap``), a LimitMaker at the touch
(``grid.at_touch``); :func:`~foxhunt.evaluation.recorder.record` refuses a policy of another grid.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from foxenv.data.synthetic import SyntheticProfile, signal_drift_ticks, signal_from_imbalance
from foxenv.spec import DEFAULT_GRID, ActionGrid
from foxhunt.evaluation.names import BASELINES, SIGNAL_BASELINES  # noqa: F401 (re-exported)

#: foxenv's action branches and their sizes on the default grid (any grid: ``grid.nvec``).
NVEC = DEFAULT_GRID.nvec
#: Thresholds of ``|top-of-book imbalance|`` the imbalance rule is fitted over.
IMBALANCE_THRESHOLDS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.95)
#: Order types the imbalance rule is fitted over: Market (pays the spread), post-only LimitMaker at the touch.
IMBALANCE_ORDERS = (0, 1)
#: Column of the position among the portfolio features, counted from the end of the observation.
POSITION_FROM_END = -8


@runtime_checkable
class Policy(Protocol):
    """What the recorder runs."""

    name: str

    def reset(self, num_books: int, device: torch.device) -> None:
        """Forget any state; ``num_books`` books on ``device`` follow."""

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """``[B, 4]`` int64 actions for ``[B, D]`` observations."""


def _constant(num_books: int, device: torch.device, action: tuple[int, int, int, int]) -> torch.Tensor:
    return torch.tensor(action, dtype=torch.int64, device=device).expand(num_books, 4).contiguous()


class FlatPolicy:
    """Never trades: target position 0 with a Market order (a no-op when flat)."""

    name = "flat"

    def reset(self, num_books: int, device: torch.device) -> None:
        """Build the constant action."""
        self._action = _constant(num_books, device, (1, 0, 0, 0))

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """The flat action for every book."""
        return self._action


class BuyAndHoldPolicy:
    """Buys ``max_position`` with a Market order at once and holds it to the end of the episode.

    :param grid: the env's action grid.
    """

    name = "buy_and_hold"

    def __init__(self, grid: ActionGrid = DEFAULT_GRID) -> None:
        self.grid = grid

    def reset(self, num_books: int, device: torch.device) -> None:
        """Build the constant action (long, full size, Market, all of the gap)."""
        self._action = _constant(num_books, device, (2, self.grid.full_size, 0, self.grid.whole_gap))

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """The long action for every book."""
        return self._action


class RandomPolicy:
    """Uniformly random over every branch, from its own seeded generator on the device.

    :param seed: seed of the generator (re-seeded by :meth:`reset`, so every run draws the same actions).
    :param grid: the env's action grid.
    """

    name = "random"

    def __init__(self, seed: int = 0, grid: ActionGrid = DEFAULT_GRID) -> None:
        self.seed = int(seed)
        self.grid = grid

    def reset(self, num_books: int, device: torch.device) -> None:
        """Re-seed the generator."""
        self._generator = torch.Generator(device=device).manual_seed(self.seed)
        self._nvec = torch.tensor(self.grid.nvec, dtype=torch.float32, device=device)
        self._num_books = num_books

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Uniform actions."""
        uniform = torch.rand((self._num_books, len(NVEC)), generator=self._generator, device=obs.device)
        return (uniform * self._nvec).long()


class OraclePolicy:
    """Trades the planted signal of a synthetic market (``signal_strength`` > 0) with Market orders.

    It reads what the agent sees: the signal of each step from the observation's top-of-book imbalance
    (``s = 2 atanh(imbalance)``), remembers the last ``signal_horizon`` of them, and knows the planted model,
    so it computes the mid move still to come, ``m = drift * sum_j s[t - j] * (k - j)`` ticks
    (:func:`~foxenv.data.synthetic.signal_drift_ticks`). It goes all in on the side of ``m`` when ``|m|``
    exceeds the round trip's cost (the spread in the observation plus two taker fees), keeps a position
    while ``m`` still points its way, and is flat otherwise. On a market without the signal the imbalance
    is noise, so its PnL is minus its costs (spread and fees) up to the market's noise.

    :param signal_strength: the planted strength the oracle assumes (> 0).
    :param signal_horizon: the planted horizon ``k``.
    :param levels: book levels of the observation (``EnvConfig.levels``), which locate the features.
    :param taker_fee_bps: the env's taker fee.
    :param tick_size: the market's tick (for the fee in ticks).
    :param price: a typical price (for the fee in ticks).
    :param grid: the env's action grid (the oracle takes its full size, Market for all of the gap: every
        grid holds them).
    :param profile: other synthetic knobs (``vol_ticks``) as the market was generated.
    """

    name = "oracle"

    def __init__(self, signal_strength: float, signal_horizon: int, levels: int = 10,
                 taker_fee_bps: float = 0.5, tick_size: float = 0.01, price: float = 580.0,
                 grid: ActionGrid = DEFAULT_GRID, **profile: float) -> None:
        self.grid = grid
        if not signal_strength > 0:
            raise ValueError(f"signal_strength={signal_strength} must be > 0 for the oracle")
        knobs = SyntheticProfile(signal_strength=signal_strength, signal_horizon=int(signal_horizon),
                                 **profile).validate()
        self.drift = signal_drift_ticks(knobs)
        self.horizon = int(signal_horizon)
        self.imbalance_column = 4 * int(levels)
        self.spread_column = 4 * int(levels) + 1
        self.fee_ticks = 2.0 * taker_fee_bps * 1e-4 * price / tick_size

    def reset(self, num_books: int, device: torch.device) -> None:
        """Clear the signal memory."""
        self._memory = torch.zeros((num_books, self.horizon), dtype=torch.float64, device=device)
        # weight of s[t - j], j = 0..k-1: the k - j steps of its move still to come
        self._weights = torch.arange(self.horizon, 0, -1, dtype=torch.float64, device=device)

    def expected_move(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Update the memory with this step's signal and return the mid move still to come, in ticks."""
        signal = signal_from_imbalance(obs[:, self.imbalance_column].double())
        memory = self._memory.masked_fill(episode_start[:, None], 0.0)  # a new window starts with no memory
        self._memory = torch.cat([signal[:, None], memory[:, :-1]], dim=1)
        return self.drift * (self._memory @ self._weights)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """All in along the expected move when it beats the round trip's cost, else hold or go flat."""
        move = self.expected_move(obs, episode_start)
        cost = obs[:, self.spread_column].double() + self.fee_ticks
        # the position is the first portfolio feature, right after the market features
        position = torch.sign(obs[:, POSITION_FROM_END].double())
        side = torch.sign(move)
        target = torch.where(move.abs() > cost, side, torch.where(side == position, position, 0.0))
        actions = torch.zeros((obs.shape[0], 4), dtype=torch.int64, device=obs.device)
        actions[:, 0] = target.long() + 1
        actions[:, 1] = self.grid.full_size
        actions[:, 3] = self.grid.whole_gap  # Market, all of the gap at once
        return actions


class WaveOraclePolicy:
    """Trades the planted waves of a synthetic market (``wave_rate`` > 0) with perfect foresight of their
    timing: all in on a wave's side from its onset row to the row before its end (the peak), flat elsewhere,
    with Market orders (all of the gap at once). It knows the market's wave schedule
    (:func:`~foxenv.data.synthetic.wave_schedule`), and which row each book is at: the recorder tells it the
    start rows of every episode (:meth:`start_episodes`) and it counts the steps since. The end, which the
    market shows only weakly, is what it knows and an agent must learn; it neither trades the reversal after
    a wave nor anything between waves, so an agent can exceed it.

    :param hold: ``[T]`` the side to hold after seeing each market row (``wave_schedule(...).hold``).
    :param name: its name in reports.
    :param grid: the env's action grid.
    """

    name = "oracle"

    def __init__(self, hold: torch.Tensor, name: str = "oracle", grid: ActionGrid = DEFAULT_GRID) -> None:
        self.grid = grid
        hold = torch.as_tensor(hold)
        if hold.ndim != 1 or hold.numel() < 1:
            raise ValueError(f"hold has shape {tuple(hold.shape)}; it must be [T] sides, one per market row")
        self.hold = hold.to(torch.int64)
        self.name = name
        self._rows: torch.Tensor | None = None

    def reset(self, num_books: int, device: torch.device) -> None:
        """Move the schedule to ``device``; the rows come with :meth:`start_episodes`."""
        self._hold = self.hold.to(device)
        self._rows = None

    def start_episodes(self, rows: torch.Tensor) -> None:
        """The market row of every book's first observation of the episodes starting now (the recorder
        calls it before the episodes' first :meth:`act`)."""
        self._rows = rows.to(self._hold.device, torch.int64) - 1  # act() advances to the row observed

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """The wave's side while it drifts, flat elsewhere; full size, Market, all of the gap."""
        if self._rows is None:
            raise ValueError("the wave oracle needs the episodes' start rows (start_episodes): record it "
                             "with foxhunt.evaluation.recorder.record")
        self._rows = self._rows + 1
        side = self._hold[self._rows.clamp(0, self._hold.numel() - 1)]
        actions = torch.zeros((obs.shape[0], 4), dtype=torch.int64, device=obs.device)
        actions[:, 0] = side + 1
        actions[:, 1] = self.grid.full_size
        actions[:, 3] = self.grid.whole_gap  # Market, all of the gap at once
        return actions


class ImbalancePolicy:
    """Trades the top-of-book imbalance: all in on its side when ``|imbalance| > threshold``, keeps a position
    while the imbalance still points its way, flat otherwise; with Market orders (``order=0``, all of the gap
    at once) or post-only LimitMaker orders at the own touch (``order=1``, which earn the spread instead of
    paying it but may not fill).

    The imbalance ``(bid size - ask size) / (bid size + ask size)`` of the best levels is the observation's
    market feature ``4 * levels``; the agent sees it too, so an agent that cannot beat this one-line rule has
    learned nothing useful from it. :func:`foxhunt.evaluation.api.fit_imbalance_rule` picks ``threshold`` on
    the fit data.

    :param threshold: in ``[0, 1)``.
    :param levels: book levels of the observation (``EnvConfig.levels``).
    :param order: 0 Market, 1 LimitMaker.
    :param grid: the env's action grid.
    """

    name = "imbalance"

    def __init__(self, threshold: float = 0.5, levels: int = 10, order: int = 0,
                 grid: ActionGrid = DEFAULT_GRID) -> None:
        self.grid = grid
        if not 0.0 <= float(threshold) < 1.0:
            raise ValueError(f"threshold={threshold} must lie in [0, 1)")
        if order not in IMBALANCE_ORDERS:
            raise ValueError(f"order={order!r} must be 0 (Market) or 1 (LimitMaker)")
        self.threshold = float(threshold)
        self.order = int(order)
        self.imbalance_column = 4 * int(levels)

    def reset(self, num_books: int, device: torch.device) -> None:
        """Nothing to reset (the rule reads the position from the observation)."""

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Market orders to the imbalance's side, full size."""
        imbalance = obs[:, self.imbalance_column].double()
        position = torch.sign(obs[:, POSITION_FROM_END].double())
        side = torch.sign(imbalance)
        target = torch.where(imbalance.abs() > self.threshold, side,
                             torch.where(side == position, position, 0.0))
        actions = torch.zeros((obs.shape[0], 4), dtype=torch.int64, device=obs.device)
        actions[:, 0] = target.long() + 1
        actions[:, 1] = self.grid.full_size
        actions[:, 2] = self.order
        # Market: all of the gap at once; LimitMaker: the touch
        actions[:, 3] = self.grid.whole_gap if self.order == 0 else self.grid.at_touch
        return actions


class MarketMakerPolicy:
    """A fixed-spread market maker within foxenv's action space: post-only at the touch, inventory-capped.

    foxenv's action holds one target and one resting LimitMaker order, so it cannot quote both sides at
    once; this maker quotes one side at a time, the side that earns the spread back: long, it rests an ask
    at the touch to go flat; short, a bid to go flat; flat, it posts on the side opposite to its last
    position (a bid first), targeting ``magnitude`` of ``max_position`` (the inventory cap). An unchanged
    target keeps the resting order and its queue place. It reads no market feature.

    :param magnitude: the inventory cap as the grid's magnitude index (default grid: 0, 1, 2 = a quarter,
        half, all of ``max_position``; ``None``: the grid's full size).
    :param grid: the env's action grid.
    """

    name = "market_maker"

    def __init__(self, magnitude: int | None = None, grid: ActionGrid = DEFAULT_GRID) -> None:
        self.grid = grid
        sizes = grid.nvec[1]
        if magnitude is None:
            magnitude = grid.full_size
        if isinstance(magnitude, bool) or not isinstance(magnitude, int) or not 0 <= magnitude < sizes:
            raise ValueError(f"magnitude={magnitude!r} must be an integer in [0, {sizes})")
        self.magnitude = int(magnitude)

    def reset(self, num_books: int, device: torch.device) -> None:
        """Every book starts by bidding."""
        self._last_side = torch.full((num_books,), -1.0, dtype=torch.float64, device=device)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """LimitMaker at the touch (urgency 1) towards flat, or from flat to the other side."""
        position = torch.sign(obs[:, POSITION_FROM_END].double())
        last = torch.where(episode_start, -1.0, self._last_side)
        self._last_side = torch.where(position != 0, position, last)
        direction = torch.where(position != 0, torch.zeros_like(position), -self._last_side)
        actions = torch.zeros((obs.shape[0], 4), dtype=torch.int64, device=obs.device)
        actions[:, 0] = direction.long() + 1
        actions[:, 1] = self.magnitude
        actions[:, 2] = 1  # LimitMaker (post-only)
        actions[:, 3] = self.grid.at_touch
        return actions


class ModelPolicy:
    """An SB3-style model (anything with ``predict(obs, deterministic=...)``) as a recorder policy.

    A model over the flattened action (``Discrete(81)``, code ``27 d + 9 m + 3 o + u``: SB3 DQN, or
    BranchingIQN on the joint action face; ``Discrete(grid.joint_actions)`` on another grid), whose
    ``predict`` gives ``[N]`` (or ``[N, 1]``) codes, is decoded to the four branches.

    :param model: the model.
    :param name: its name in reports.
    :param deterministic: greedy actions (the default) or the model's exploration.
    :param grid: the env's action grid (the model's action space must be one of its faces).
    """

    def __init__(self, model: Any, name: str = "model", deterministic: bool = True,
                 grid: ActionGrid = DEFAULT_GRID) -> None:
        if not callable(getattr(model, "predict", None)):
            raise ValueError(f"model of type {type(model).__name__} has no predict method")
        from foxhunt.evaluation.model_file import check_action_space

        check_action_space(model, name, grid)  # a Discrete(9) model's codes are not joint actions
        self.grid = grid
        self.model = model
        self.name = name
        self.deterministic = deterministic

    def reset(self, num_books: int, device: torch.device) -> None:
        """Nothing to reset (the models here are not recurrent)."""

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """The model's actions (one host round trip: SB3's ``predict`` takes numpy); joint codes decoded by
        :func:`foxhunt.envs.decode_joint`, the decoder the env trained on."""
        from foxhunt.envs import decode_joint

        action, _ = self.model.predict(obs.cpu().numpy(), deterministic=self.deterministic)
        action = np.asarray(action)
        if action.size == obs.shape[0]:  # the joint face: [N] (or [N, 1]) codes
            return decode_joint(action, obs.shape[0], name="codes", grid=self.grid).to(obs.device)
        return torch.as_tensor(action, dtype=torch.int64, device=obs.device).reshape(obs.shape[0], 4)


def make_baseline(name: str, seed: int = 0, grid: ActionGrid = DEFAULT_GRID, **oracle_kwargs: Any) -> Policy:
    """A built-in baseline by name.

    :param name: one of :data:`BASELINES`.
    :param seed: the random baseline's seed.
    :param grid: the env's action grid.
    :param oracle_kwargs: :class:`OraclePolicy`'s arguments (the oracle only).
    :return: the policy.
    """
    if name == "flat":
        return FlatPolicy()
    if name == "random":
        return RandomPolicy(seed, grid)
    if name == "buy_and_hold":
        return BuyAndHoldPolicy(grid)
    if name == "oracle":
        return OraclePolicy(grid=grid, **oracle_kwargs)
    if name == "market_maker":
        return MarketMakerPolicy(grid=grid)
    if name == "imbalance":
        raise ValueError("baseline='imbalance' is fitted on fit data: use fit_imbalance_rule(market, ...), "
                         "or evaluate_policies(..., baselines=('imbalance', ...)), which fits it")
    raise ValueError(f"baseline={name!r} must be one of {BASELINES}")


def as_policy(obj: Any, name: str | None = None, grid: ActionGrid = DEFAULT_GRID) -> Policy:
    """A recorder policy from a policy, a baseline name or an SB3-style model.

    :param obj: a :class:`Policy`, a name of :data:`BASELINES` (not ``"oracle"``, which needs the market's
        signal), or a model with ``predict``.
    :param name: the name of a model in reports (default ``"model"``).
    :param grid: the env's action grid (for a baseline name or a model).
    :return: the policy.
    """
    if isinstance(obj, str):
        return make_baseline(obj, grid=grid)
    if callable(getattr(obj, "act", None)) and callable(getattr(obj, "reset", None)):
        return obj
    return ModelPolicy(obj, name=name or "model", grid=grid)
