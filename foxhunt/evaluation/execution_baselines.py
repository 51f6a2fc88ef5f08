"""Baselines of the execute task (``EnvConfig(task="execute")``, :mod:`foxenv.execution`), scored on the same
windows as an agent: TWAP, TWAP limit-then-market, submit-and-leave, an immediate Market order,
Almgren-Chriss and VWAP.

Each baseline is a policy of the evaluation's protocol (``reset(num_books, device)``, ``act(obs,
episode_start) -> [B, 4]`` actions; :class:`foxhunt.evaluation.baselines.Policy`), acting on the device from
the observation alone: the step from the portfolio features' ``time_left`` and the quantity done from the
execution features' ``exec_remaining``. A schedule ``x(t)`` (the share of the parent done after step ``t``) is
tracked with child orders of :func:`baseline_child_sizes` (quarter slices up to the whole parent): the agent's
grid, ``(0, 1/2, 1, 2)`` slices, cannot send a whole parent at once, so the baselines run on an env that
differs from the agent's only in that branch (same market, windows, sides, quantities, fees and matching:
:func:`score_windows` builds it). VWAP needs each window's start time (:meth:`VWAPPolicy.start`), which
:func:`score_windows` gives.

Almgren-Chriss (discrete, Almgren & Chriss 2000): with per-step mid volatility ``sigma`` (currency), temporary
impact ``eta`` (currency per share per share traded in a step) and risk aversion ``lambda`` (per currency),
``cosh(kappa) = 1 + lambda sigma^2 / (2 eta)`` and the shares left after step ``t`` are ``Q sinh(kappa (T -
t - 1)) / sinh(kappa T)``; ``lambda = 0`` is TWAP. :func:`fit_execution_model` fits ``sigma``, ``eta`` and
the volume profile on the fit data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.market import MarketData
from foxenv.execution import EXECUTION_FEATURES
from foxenv.matching import NO_LIMIT, walk_book
from foxenv.spec import ORDER_TYPES

#: Names of the execution baselines (:func:`make_execution_baseline`).
EXECUTION_BASELINES = ("twap", "twap_limit", "submit_and_leave", "immediate", "almgren_chriss", "vwap")
#: Column of the portfolio features' ``time_left``, counted from the end of an execute observation.
TIME_LEFT_FROM_END = -1 - len(EXECUTION_FEATURES)
#: Column of ``exec_remaining``, counted from the end.
REMAINING_FROM_END = EXECUTION_FEATURES.index("exec_remaining") - len(EXECUTION_FEATURES)
#: Quarter slices: the resolution at which a baseline tracks its schedule.
QUARTERS = 4
MARKET, MAKER = ORDER_TYPES.index("market"), ORDER_TYPES.index("limit_maker")


def baseline_child_sizes(horizon: int) -> tuple[float, ...]:
    """The child sizes of the baselines' env: ``0, 1/4, ..., horizon`` TWAP slices (the whole parent).

    :param horizon: ``T``, the episode length.
    """
    return tuple(k / QUARTERS for k in range(QUARTERS * int(horizon) + 1))


def twap_schedule(horizon: int) -> torch.Tensor:
    """``[T]`` float64 share of the parent done after each step: ``(t + 1) / T``."""
    return torch.arange(1, horizon + 1, dtype=torch.float64) / horizon


def almgren_chriss_schedule(horizon: int, kappa: float) -> torch.Tensor:
    """``[T]`` float64 share done after each step for the urgency ``kappa`` (per step; 0 is TWAP).

    :raises ValueError: for a negative or non-finite ``kappa``.
    """
    if not math.isfinite(kappa) or kappa < 0:
        raise ValueError(f"kappa={kappa!r} must be a finite number >= 0")
    if kappa == 0:
        return twap_schedule(horizon)
    left_steps = torch.arange(horizon - 1, -1, -1, dtype=torch.float64)  # T - t - 1
    if kappa * horizon > 700:  # sinh overflows: the ratio is exp(-kappa (t + 1))
        return 1 - torch.exp(-kappa * (horizon - left_steps))
    return 1 - torch.sinh(kappa * left_steps) / math.sinh(kappa * horizon)


def almgren_chriss_kappa(risk_aversion: float, sigma: float, eta: float) -> float:
    """The discrete urgency ``kappa``: ``cosh(kappa) = 1 + lambda sigma^2 / (2 eta)`` (steps of one)."""
    if not math.isfinite(risk_aversion) or risk_aversion < 0:
        raise ValueError(f"risk_aversion={risk_aversion!r} must be a finite number >= 0")
    if not eta > 0:
        raise ValueError(f"eta={eta!r} must be > 0")
    return math.acosh(1 + risk_aversion * sigma**2 / (2 * eta))


@dataclass(frozen=True)
class ExecutionModel:
    """What the baselines fit on the fit data.

    :param sigma: standard deviation of the one-step mid change, currency.
    :param eta: temporary impact, currency per share per share traded in one step.
    :param step_seconds: mean clock time of a step, seconds.
    :param profile_start: clock time of the volume profile's first bin, seconds.
    :param bin_seconds: width of a profile bin, seconds.
    :param profile: traded shares per step in each bin (the fit data's mean where a bin saw no step).
    """

    sigma: float
    eta: float
    step_seconds: float
    profile_start: float
    bin_seconds: float
    profile: tuple[float, ...]

    def volume_at(self, seconds: torch.Tensor) -> torch.Tensor:
        """Expected traded shares per step at clock times ``seconds`` (outside the profile: its mean)."""
        profile = torch.tensor(self.profile, dtype=torch.float64, device=seconds.device)
        index = torch.floor((seconds - self.profile_start) / self.bin_seconds).long()
        inside = (index >= 0) & (index < profile.shape[0])
        return torch.where(inside, profile[index.clamp(0, profile.shape[0] - 1)], profile.mean())


def fit_execution_model(market: MarketData, slice_shares: float, bin_seconds: float = 1800.0
                        ) -> ExecutionModel:
    """Fit :class:`ExecutionModel` on ``market`` (the fit data).

    ``eta`` is the mean over snapshots and both sides of the extra cost per share of walking the book for two
    slices instead of one, per share of the slice: ``(vwap(2 q) - vwap(q)) / q``, at least half a tick per
    share of the mean best level (``tick / (2 mean best size)``: the slope of walking a book of such levels
    a tick apart), so that it is never 0.

    :param market: the fit data.
    :param slice_shares: ``q``, the TWAP slice in shares (``Q / T``); > 0.
    :param bin_seconds: width of the volume profile's clock bins; > 0.
    """
    if not slice_shares > 0:
        raise ValueError(f"slice_shares={slice_shares!r} must be > 0")
    if not bin_seconds > 0:
        raise ValueError(f"bin_seconds={bin_seconds!r} must be > 0")
    mid = market.mid_price().double()
    sigma = float(mid.diff().std()) if market.num_steps > 2 else 0.0
    tick = market.tick_size
    costs = []
    books = ((1.0, market.ask_price, market.ask_size), (-1.0, market.bid_price, market.bid_size))
    for side, prices, sizes in books:
        ticks, sizes = torch.round(prices.double() / tick), sizes.double()
        sign = torch.full((market.num_steps,), side, dtype=torch.float64, device=ticks.device)
        average = []
        for quantity in (slice_shares, 2 * slice_shares):
            wanted = torch.full_like(sign, quantity)
            filled, notional, _ = walk_book(ticks, sizes, sign, wanted, sign * NO_LIMIT)
            average.append(notional / filled.clamp_min(1e-12))
        costs.append(side * (average[1] - average[0]) * tick / slice_shares)
    eta = float(torch.cat(costs).mean())
    top = float(torch.cat([market.ask_size[:, 0], market.bid_size[:, 0]]).double().mean())
    eta = max(eta, tick / (2 * max(top, 1.0)))
    times = market.time.double()
    step_seconds = float((times[-1] - times[0]) / max(market.num_steps - 1, 1))
    volume = market.exec_bid.double().sum(dim=1) + market.exec_ask.double().sum(dim=1)
    start = float(times[0])
    bins = int((float(times[-1]) - start) // bin_seconds) + 1
    index = ((times - start) // bin_seconds).long().clamp(0, bins - 1)
    zeros = torch.zeros(bins, dtype=torch.float64, device=times.device)
    total = zeros.index_add(0, index, volume)
    count = zeros.index_add(0, index, torch.ones_like(volume))
    mean = float(volume.mean())
    profile = torch.where(count > 0, total / count.clamp_min(1.0), torch.full_like(total, mean))
    return ExecutionModel(sigma, eta, step_seconds, start, float(bin_seconds), tuple(profile.tolist()))


class SchedulePolicy:
    """Tracks a schedule ``x(t)`` (share done after step ``t``) with Market children of whole quarter slices:
    the child at step ``t`` is ``x(t)`` less what is done, rounded to the nearest quarter slice.

    :param name: the policy's name.
    :param schedule: ``[T]`` share done after each step, nondecreasing, ending at 1 (or ``None``: give
        :meth:`start` per-book schedules).
    :param horizon: ``T``.
    """

    def __init__(self, name: str, schedule: torch.Tensor | None, horizon: int) -> None:
        self.name = name
        self.horizon = int(horizon)
        self._schedule = None if schedule is None else schedule.double().reshape(1, -1)

    def reset(self, num_books: int, device: torch.device) -> None:
        """Put the schedule on ``device``."""
        if self._schedule is not None:
            self._schedule = self._schedule.to(device)
        self._rows = torch.arange(num_books, device=device)

    def start(self, schedules: torch.Tensor) -> None:
        """Per-book schedules ``[B, T]`` for the windows that follow."""
        self._schedule = schedules.double()

    def _step_and_done(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B]`` int64 step and ``[B]`` float64 share of the parent done, read off the observation."""
        time_left = obs[:, TIME_LEFT_FROM_END].double()
        step = torch.round((1 - time_left) * self.horizon).long().clamp(0, self.horizon - 1)
        return step, 1 - obs[:, REMAINING_FROM_END].double()

    def _quarters(self, share: torch.Tensor, up: bool = False) -> torch.Tensor:
        """A share of the parent as a size index of :func:`baseline_child_sizes` (nearest, or rounded up)."""
        quarters = share * self.horizon * QUARTERS
        index = torch.ceil(quarters - 1e-6) if up else torch.round(quarters)
        return index.clamp(0, QUARTERS * self.horizon).long()

    def _actions(self, size: torch.Tensor, order: torch.Tensor | int, urgency: int) -> torch.Tensor:
        order = torch.as_tensor(order, device=size.device).expand_as(size)
        return torch.stack([size, torch.zeros_like(size), order, torch.full_like(size, urgency)], dim=1)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Market children tracking the schedule."""
        step, done = self._step_and_done(obs)
        assert self._schedule is not None, "give the schedule (start) before acting"
        target = self._schedule.expand(obs.shape[0], -1)[self._rows[: obs.shape[0]], step]
        return self._actions(self._quarters(target - done), MARKET, 0)


class TWAPLimitPolicy(SchedulePolicy):
    """TWAP in ``intervals`` slices of ``T / intervals`` steps: each slice rests post-only at the touch and
    what is left of it crosses at the slice's last step (a Market child).

    :param horizon: ``T``.
    :param intervals: number of slices, ``1 <= intervals <= T``.
    :param at_touch: the urgency index of a LimitMaker at the touch (the grid's ``at_touch``).
    """

    def __init__(self, horizon: int, intervals: int = 10, at_touch: int = 1) -> None:
        if int(intervals) != intervals or not 1 <= intervals <= horizon:
            raise ValueError(f"intervals={intervals!r} must be an integer in [1, {horizon}]")
        super().__init__("twap_limit", None, horizon)
        self.at_touch = int(at_touch)
        bounds = torch.linspace(0, horizon, int(intervals) + 1).round().long()  # the slices' first steps
        slice_of_step = torch.bucketize(torch.arange(horizon), bounds[1:], right=True)
        self._end = bounds[1:][slice_of_step]  # the step after step t's slice
        self._first = torch.arange(horizon) == bounds[:-1][slice_of_step]  # step t begins a slice

    def reset(self, num_books: int, device: torch.device) -> None:
        """Put the slice tables on ``device``; no order posted yet."""
        super().reset(num_books, device)
        self._end, self._first = self._end.to(device), self._first.to(device)
        self._posted = torch.zeros(num_books, dtype=torch.int64, device=device)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Post the slice's outstanding shares (rounded up to a quarter slice) at the touch when it begins and
        ask for the same size while some is outstanding (which keeps the order and its queue); cross what
        is left at its last step."""
        step, done = self._step_and_done(obs)
        end = self._end[step]
        outstanding = end.double() / self.horizon - done
        self._posted = torch.where(self._first[step], self._quarters(outstanding, up=True), self._posted)
        resting = torch.where(outstanding > 1e-9, self._posted, torch.zeros_like(self._posted))
        last = step + 1 >= end
        size = torch.where(last, self._quarters(outstanding), resting)
        order = torch.where(last, MARKET, MAKER)
        return self._actions(size, order, self.at_touch)


class SubmitAndLeavePolicy(SchedulePolicy):
    """One post-only order at the touch for the whole parent, left working (the core re-pegs it when the
    touch moves away); the env crosses what is left at ``T``."""

    def __init__(self, horizon: int, at_touch: int = 1) -> None:
        super().__init__("submit_and_leave", None, horizon)
        self.at_touch = int(at_touch)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """All that is left (the largest child), post-only at the touch."""
        size = torch.full((obs.shape[0],), QUARTERS * self.horizon, dtype=torch.int64, device=obs.device)
        return self._actions(size, MAKER, self.at_touch)


class VWAPPolicy(SchedulePolicy):
    """Market children tracking the fit data's volume profile over each window's expected clock times
    (``start time + k * mean step time``: no look at the window's own volume).

    :param model: the fitted model (its profile and step time).
    :param horizon: ``T``.
    """

    def __init__(self, model: ExecutionModel, horizon: int) -> None:
        super().__init__("vwap", None, horizon)
        self.model = model

    def start_times(self, seconds: torch.Tensor) -> None:
        """The windows' start clock times ``[B]``: their schedules follow."""
        steps = torch.arange(1, self.horizon + 1, dtype=torch.float64, device=seconds.device)
        volume = self.model.volume_at(seconds.double()[:, None] + steps * self.model.step_seconds)
        cumulative = torch.cumsum(volume, dim=1)
        self.start(cumulative / cumulative[:, -1:].clamp_min(1e-12))


def make_execution_baseline(name: str, horizon: int, model: ExecutionModel | None = None,
                            risk_aversion: float = 1e-5, intervals: int = 10, at_touch: int = 1
                            ) -> SchedulePolicy:
    """The execution baseline ``name`` of :data:`EXECUTION_BASELINES`.

    :param name: the baseline.
    :param horizon: ``T``.
    :param model: the fitted model (Almgren-Chriss and VWAP need it).
    :param risk_aversion: Almgren-Chriss's ``lambda``, per currency (0: TWAP).
    :param intervals: TWAP limit-then-market's number of slices (at most ``horizon``).
    :param at_touch: the urgency index of a LimitMaker at the touch.
    :raises ValueError: for an unknown name or a missing model.
    """
    if name not in EXECUTION_BASELINES:
        raise ValueError(f"execution baseline {name!r} must be one of {EXECUTION_BASELINES}")
    if name in ("almgren_chriss", "vwap") and model is None:
        raise ValueError(f"execution baseline {name!r} needs a model fitted on the fit data")
    if name == "twap":
        return SchedulePolicy("twap", twap_schedule(horizon), horizon)
    if name == "immediate":
        return SchedulePolicy("immediate", torch.ones(horizon, dtype=torch.float64), horizon)
    if name == "twap_limit":
        return TWAPLimitPolicy(horizon, min(intervals, horizon), at_touch)
    if name == "submit_and_leave":
        return SubmitAndLeavePolicy(horizon, at_touch)
    assert model is not None
    if name == "vwap":
        return VWAPPolicy(model, horizon)
    kappa = almgren_chriss_kappa(risk_aversion, model.sigma, model.eta)
    return SchedulePolicy("almgren_chriss", almgren_chriss_schedule(horizon, kappa), horizon)


def disjoint_offsets(market_steps: int, horizon: int, limit: int | None = None) -> torch.Tensor:
    """Start rows of disjoint windows of ``horizon`` steps (each also needs the snapshot after its end).

    :return: ``[W]`` int64: ``0, T, 2 T, ...`` below ``market_steps - T``, at most ``limit`` of them.
    """
    offsets = torch.arange(0, market_steps - horizon, horizon, dtype=torch.int64)
    return offsets if limit is None else offsets[:limit]


def score_windows(policy: Any, market: MarketData, config: EnvConfig, offsets: torch.Tensor,
                  device: str | torch.device = "cpu", child_sizes: tuple[float, ...] | None = None
                  ) -> dict[str, torch.Tensor]:
    """Run ``policy`` once on every window starting at ``offsets`` (one book each) and score it.

    :param policy: a policy of the evaluation's protocol (a baseline, or an agent's adapter).
    :param market: the scored market.
    :param config: an execute-task config (side, quantity, fees ...).
    :param offsets: ``[W]`` window start rows.
    :param device: where the env runs.
    :param child_sizes: the env's child sizes (``None``: :func:`baseline_child_sizes` for a baseline of
        this module, else ``config``'s).
    :return: ``{"shortfall_bps", "side", "quantity", "arrival", "filled_at"}``: ``[W]`` tensors on the CPU;
        ``shortfall_bps`` is the implementation shortfall in bps of the parent's notional (lower is better),
        ``filled_at`` the step after which the parent was done; ``"done"`` and ``"mid"``: ``[T, W]`` share
        of the parent done and the mid after each step (the schedule on its price path).
    """
    if config.task != "execute":
        raise ValueError(f"task={config.task!r}: score_windows scores the execute task")
    if child_sizes is None and isinstance(policy, SchedulePolicy):
        child_sizes = baseline_child_sizes(config.episode_length)
    if child_sizes is not None:
        config = dataclasses.replace(config, exec_child_sizes=tuple(child_sizes))
    offsets = torch.as_tensor(offsets, dtype=torch.int64)
    books = int(offsets.shape[0])
    env = BatchedLOB(market, books, config, device=device, seed=0)
    env.reset()
    state = env.state_dict()
    state["offset"] = offsets.to(state["offset"].device)
    env.load_state_dict(state)
    obs = env.reset(mask=torch.zeros(books, dtype=torch.bool, device=env.device))  # observes, changes nothing
    device = env.device
    policy.reset(books, device)
    if isinstance(policy, VWAPPolicy):
        policy.start_times(env.market.time.index_select(0, offsets.to(device)))
    cash = torch.zeros(books, dtype=torch.float64, device=device)
    filled_at = torch.full((books,), config.episode_length, dtype=torch.int64, device=device)
    alive = torch.ones(books, dtype=torch.bool, device=device)
    start = torch.ones(books, dtype=torch.bool, device=device)
    positions, mids = [], []
    for step in range(config.episode_length):
        obs, _, terminated, _, info = env.step(policy.act(obs, start))
        start = torch.zeros_like(start)
        positions.append(info["position"])
        mids.append(info["mid"])
        cash = torch.where(alive, info["cash"], cash)
        filled_at = torch.where(alive & terminated, step + 1, filled_at)
        alive = alive & ~terminated
    execution = env._execution
    assert execution is not None
    side, quantity, arrival = execution.parent(env.state_dict()["offset"].to(device))
    shortfall = -1e4 * (cash + side * quantity * arrival) / (quantity * arrival)
    result = {"shortfall_bps": shortfall, "side": side, "quantity": quantity, "arrival": arrival,
              "filled_at": filled_at, "done": torch.stack(positions) * side / quantity,
              "mid": torch.stack(mids)}
    return {key: value.cpu() for key, value in result.items()}
