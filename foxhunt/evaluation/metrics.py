"""Metrics of a :class:`~foxhunt.evaluation.recorder.Recording`, with their units, and paired comparisons.

Reductions run on the recording's device; only the scalars come back. :data:`UNITS` names the unit of
every metric. Sharpe and Sortino ratios are of the per-step PnL of a book (currency per step), pooled
over every recorded book-step, with a zero risk-free rate; they are annualised by the market's clock,
``sqrt(TRADING_SECONDS_PER_YEAR / step_seconds)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from foxhunt.evaluation.baselines import NVEC
from foxhunt.evaluation.recorder import Recording

#: Trading seconds in a year: 252 sessions of 6.5 hours (the clock that annualises per-step ratios).
TRADING_SECONDS_PER_YEAR = 252 * 6.5 * 3600
#: Branch names of foxenv's action.
BRANCH_NAMES = ("direction", "magnitude", "order", "urgency")

#: Unit of each metric of :func:`compute_metrics`.
UNITS: dict[str, str] = {
    "pnl": "currency, after fees, summed over books",
    "pnl_per_book": "currency, after fees, mean over books",
    "pnl_per_episode": "currency, after fees, mean over episode windows",
    "pnl_bps_of_notional": "bps of the notional traded",
    "sharpe": "per step (mean / std of a book's step PnL)",
    "sharpe_annualised": "per year of the data's clock",
    "sortino": "per step (mean / downside deviation of a book's step PnL)",
    "sortino_annualised": "per year of the data's clock",
    "max_drawdown": "currency, mean over books of each book's largest fall of cumulative PnL",
    "max_drawdown_worst": "currency, the worst book",
    "turnover": "lots traded per book per step",
    "notional_traded": "currency, summed over books",
    "hit_rate": "share of closed trades with PnL > 0",
    "trades": "closed trades (count)",
    "fills": "book-steps in which the position changed (count)",
    "fees": "currency paid (negative = net rebate)",
    "spread_cost": "currency: fill prices against the pre-trade mid (negative = price improvement)",
    "maker_share": "share of traded lots filled by LimitMaker orders (the rest: Market / IoC takers)",
    "time_in_market": "share of book-steps with a position",
    "mean_abs_position": "lots",
    "steps": "book-steps recorded (vector steps x books)",
    "independent_steps": "distinct market rows stepped from",
    "episodes": "episode windows (books x episodes, the last may be partial)",
    "action_mix": "share of each value per branch",
}


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> float:
    den = float(denominator)
    num = float(numerator)
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.copysign(math.inf, num)


def episode_pnl(recording: Recording) -> torch.Tensor:
    """PnL of every episode window: ``[E, B]`` float64 on the recording's device (currency, after fees).

    :param recording: the run.
    :return: the summed step PnL of each book's episodes.
    """
    pnl = recording.series["step_pnl"]
    episodes = recording.episode_index()
    out = torch.zeros((int(recording.offsets.shape[0]), recording.num_books), dtype=pnl.dtype,
                      device=pnl.device)
    return out.index_add_(0, episodes, pnl)


def max_drawdowns(recording: Recording) -> torch.Tensor:
    """Largest fall of each book's cumulative PnL over the whole recording: ``[B]`` (currency).

    :param recording: the run.
    :return: ``max_t (peak_t - cumulative_t)`` per book, >= 0.
    """
    cumulative = torch.cumsum(recording.series["step_pnl"], dim=0)
    peak = torch.cummax(torch.cat([torch.zeros_like(cumulative[:1]), cumulative]), dim=0).values[1:]
    return (peak - cumulative).amax(dim=0)


def compute_metrics(recording: Recording, step_seconds: float | None = None) -> dict[str, Any]:
    """Every metric of a run (see :data:`UNITS`).

    :param recording: the run.
    :param step_seconds: seconds of one market step for annualising (default: the recording's).
    :return: a flat dict of Python numbers (and ``action_mix``: ``{branch: [share of each value]}``).
    """
    s = recording.series
    alive = s["alive"]
    pnl = s["step_pnl"]
    count = alive.sum()
    samples = pnl[alive]
    mean = samples.mean() if samples.numel() else torch.zeros((), dtype=pnl.dtype)
    std = samples.std() if samples.numel() > 1 else torch.zeros((), dtype=pnl.dtype)
    downside = torch.sqrt((samples.clamp(max=0.0) ** 2).mean()) if samples.numel() else std
    sharpe = _ratio(mean, std)
    sortino = _ratio(mean, downside)
    seconds = recording.step_seconds if step_seconds is None else step_seconds
    annual = math.sqrt(TRADING_SECONDS_PER_YEAR / seconds) if seconds and seconds > 0 else float("nan")
    notional = s["notional"].sum()
    lots = s["traded_lots"].sum()
    closed = s["trade_closed"]
    drawdowns = max_drawdowns(recording)
    per_episode = episode_pnl(recording)
    actions = s["actions"].reshape(-1, len(NVEC)).long()[alive.reshape(-1)]
    mix = {
        name: (torch.bincount(actions[:, b], minlength=NVEC[b]).double() / max(actions.shape[0], 1)).tolist()
        for b, name in enumerate(BRANCH_NAMES)
    }
    total = pnl.sum()
    return {
        "pnl": float(total),
        "pnl_per_book": float(total) / recording.num_books,
        "pnl_per_episode": float(per_episode.mean()),
        "pnl_bps_of_notional": 1e4 * float(total) / float(notional) if float(notional) > 0 else float("nan"),
        "sharpe": sharpe,
        "sharpe_annualised": sharpe * annual,
        "sortino": sortino,
        "sortino_annualised": sortino * annual,
        "max_drawdown": float(drawdowns.mean()),
        "max_drawdown_worst": float(drawdowns.max()),
        "turnover": float(lots) / max(int(count), 1),
        "notional_traded": float(notional),
        "hit_rate": _ratio((closed & (s["trade_pnl"] > 0)).sum(), closed.sum()) if bool(closed.any())
        else float("nan"),
        "trades": int(closed.sum()),
        "fills": int((s["traded_lots"] > 0).sum()),
        "fees": float(s["fees"].sum()),
        "spread_cost": float(s["spread_cost"].sum()),
        "maker_share": float(s["maker_lots"].sum()) / float(lots) if float(lots) > 0 else float("nan"),
        "time_in_market": float(((s["position"] != 0) & alive).sum()) / max(int(count), 1),
        "mean_abs_position": float((s["position"].abs() * alive).sum()) / max(int(count), 1),
        "steps": recording.num_steps * recording.num_books,
        "independent_steps": recording.independent_steps(),
        "episodes": int(per_episode.numel()),
        "step_seconds": float(seconds),
        "action_mix": mix,
    }


def paired_comparison(policy: Recording, baseline: Recording, resamples: int = 2000, level: float = 0.95,
                      seed: int = 0) -> dict[str, Any]:
    """Mean difference of per-episode PnL (policy minus baseline) on the same windows, with a bootstrap CI.

    :param policy: the policy's run.
    :param baseline: the baseline's run on the same market, books, steps and seed.
    :param resamples: bootstrap resamples of the episode windows.
    :param level: confidence level of the interval.
    :param seed: seed of the resampling.
    :return: ``{"baseline", "mean_difference", "ci_low", "ci_high", "level", "episodes", "win_share"}``
        (currency per episode window; ``win_share``: windows where the policy made more).
    """
    if not torch.equal(policy.offsets, baseline.offsets) or policy.num_steps != baseline.num_steps:
        raise ValueError(f"{policy.policy!r} and {baseline.policy!r} were not recorded on the same windows")
    other = episode_pnl(baseline).to(policy.series["step_pnl"].device)
    difference = (episode_pnl(policy) - other).reshape(-1)
    n = difference.numel()
    generator = torch.Generator(device=difference.device).manual_seed(int(seed))
    index = torch.randint(0, n, (int(resamples), n), generator=generator, device=difference.device)
    means = difference[index].mean(dim=1)
    tail = (1.0 - level) / 2.0
    low, high = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=means.dtype,
                                                   device=means.device)).tolist()
    return {
        "baseline": baseline.policy,
        "mean_difference": float(difference.mean()),
        "ci_low": low,
        "ci_high": high,
        "level": level,
        "episodes": n,
        "win_share": float((difference > 0).double().mean()),
    }
