"""The metrics of a :class:`~foxhunt.evaluation.recorder.Recording`, and paired comparisons.

Each metric is defined once, in :mod:`foxenv.metrics` (the formulas, and the vocabulary :data:`UNITS` that
names every metric with its unit); this module applies them to a recorded run. Sharpe and Sortino ratios are
of the per-step PnL of a book (currency per step), pooled over every recorded book-step, with a zero
risk-free rate; they are annualised by the market's clock only where the evaluation covers a trading day of
distinct market time (:func:`foxenv.metrics.annualisation`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from foxenv import metrics as fm
from foxenv.spec import BRANCH_NAMES
from foxhunt.evaluation.recorder import Recording

#: The vocabulary of :func:`compute_metrics` (``"{currency}"`` stands for the market's currency).
UNITS = fm.UNITS
#: Trading seconds in a year (the clock that annualises per-step ratios).
TRADING_SECONDS_PER_YEAR = fm.TRADING_SECONDS_PER_YEAR


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


def compute_metrics(recording: Recording, step_seconds: float | None = None) -> dict[str, Any]:
    """Every metric of a run, named and measured as :data:`foxenv.metrics.UNITS` says.

    :param recording: the run.
    :param step_seconds: seconds of one market step for annualising (default: the recording's).
    :return: a flat dict of Python numbers, ``currency`` (the unit of every PnL), ``action_mix``
        (``{branch: [share of each value]}``) and ``action_labels`` (``{branch: [label of each value]}``).
    """
    s = recording.series
    alive = s["alive"]
    pnl = s["step_pnl"]
    count = max(int(alive.sum()), 1)
    samples = pnl[alive]
    sharpe = fm.sharpe_ratio(samples) if samples.numel() > 1 else math.nan
    sortino = fm.sortino_ratio(samples) if samples.numel() > 0 else math.nan
    seconds = recording.step_seconds if step_seconds is None else step_seconds
    independent = recording.independent_steps()
    annual = fm.annualisation(seconds, independent * seconds if seconds else 0.0)
    notional = float(s["notional"].sum())
    lots = float(s["traded_lots"].sum())
    closed = s["trade_closed"]
    cumulative = torch.cumsum(pnl, dim=0)
    drawdowns = fm.max_drawdown(cumulative.T, initial=0.0)
    per_episode = episode_pnl(recording)
    nvec = recording.nvec  # the action grid's
    actions = s["actions"].reshape(-1, len(nvec))[alive.reshape(-1)]
    table = fm.action_mix(actions, nvec) if actions.shape[0] else torch.zeros(len(nvec), max(nvec)).numpy()
    resting = s["order_active"]
    total = float(pnl.sum())
    return {
        "currency": fm.currency_of(recording.market),
        "pnl": total,
        "pnl_per_book": total / recording.num_books,
        "pnl_per_episode": float(per_episode.mean()),
        "pnl_bps_of_notional": 1e4 * total / notional if notional > 0 else math.nan,
        "sharpe": sharpe,
        "sharpe_annualised": sharpe * annual if annual is not None else math.nan,
        "sortino": sortino,
        "sortino_annualised": sortino * annual if annual is not None else math.nan,
        "max_drawdown": float(drawdowns.mean()),
        "max_drawdown_worst": float(drawdowns.max()),
        "turnover": lots / count,
        "notional_traded": notional,
        "hit_rate": fm.hit_rate(s["trade_pnl"].reshape(-1), closed.reshape(-1)),
        "trades": int(closed.sum()),
        "fills": int((s["traded_lots"] > 0).sum()),
        "fees": float(s["fees"].sum()),
        "spread_cost": float(s["spread_cost"].sum()),
        "maker_share": float(s["maker_lots"].sum()) / lots if lots > 0 else math.nan,
        "resting_share": float(resting.sum()) / count,
        "resting_distance": float(s["order_distance"][resting].mean()) if bool(resting.any()) else math.nan,
        "time_in_market": float(((s["position"] != 0) & alive).sum()) / count,
        "mean_abs_position": float((s["position"].abs() * alive).sum()) / count,
        "steps": recording.num_steps * recording.num_books,
        "independent_steps": independent,
        "episodes": int(per_episode.numel()),
        "step_seconds": float(seconds),
        "action_mix": {name: table[b, : nvec[b]].tolist() for b, name in enumerate(BRANCH_NAMES)},
        "action_labels": ({k: list(v) for k, v in recording.action_labels.items()} if recording.action_labels
                          else fm.action_labels(nvec, BRANCH_NAMES)),
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
