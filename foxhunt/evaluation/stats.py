"""Paired statistics over independent episode windows: block-bootstrap intervals, Holm-corrected verdicts
and the power statement.

The unit of evidence is one *window*: a stretch of market rows that one episode of every policy replayed
(the recorder gives every policy the same windows). Two policies are compared by the per-window difference
of their PnL. Windows are what the bootstrap resamples, never books or copies: windows that overlap (or
repeat) are not independent, so :func:`window_differences` refuses them.

Adjacent windows of one day share its regime, so their differences may be serially dependent: the interval
comes from a circular block bootstrap of the time-ordered windows (Politis & Romano 1992) with blocks of
``floor(n ** (1/3))`` windows (the usual rate for a variance; 1 below 8 windows, which is the plain
bootstrap). It is written here (a dozen lines of tensor indexing) rather than taken from ``arch``, whose
``CircularBlockBootstrap`` does the same resampling but would bring SciPy and statsmodels into every install
of foxhunt for it.

Several comparisons (models x baselines) are corrected with Holm's step-down method on bootstrap p-values;
the verdict line says so. The power statement answers "how many independent windows would the observed mean
difference need to be significant at the level, with 80 % power": ``n = ((z_{1-a/2} + z_{0.8}) s / |d|)^2``
with ``s`` the per-window standard deviation implied by the bootstrap's standard error (so serial dependence
inflates it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import torch

#: Fewest independent windows an interval is computed from.
MIN_WINDOWS = 2
#: Bootstrap resamples of the windows.
RESAMPLES = 4000
#: Power the power statement asks for.
POWER = 0.8


def block_length(num_windows: int) -> int:
    """Block length of the circular block bootstrap for ``num_windows`` time-ordered windows.

    :param num_windows: windows ``n`` (>= 1).
    :return: ``floor(n ** (1/3))``, at least 1 (1 below 8 windows: the plain bootstrap).
    """
    return max(1, int(num_windows ** (1.0 / 3.0) + 1e-9))


def block_bootstrap_means(values: torch.Tensor, resamples: int = RESAMPLES, block: int | None = None,
                          seed: int = 0) -> torch.Tensor:
    """Means of circular block-bootstrap resamples of a time-ordered series.

    Each resample joins ``ceil(n / block)`` blocks of ``block`` consecutive values (wrapping around the
    end) starting at uniform positions, cut to ``n`` values.

    :param values: ``[n]`` values in time order.
    :param resamples: resamples drawn.
    :param block: block length (default :func:`block_length`); 1 is the plain bootstrap.
    :param seed: seed of the draws.
    :return: ``[resamples]`` float64 means.
    """
    values = values.double().reshape(-1)
    n = values.numel()
    if n < 1:
        raise ValueError("values is empty: nothing to resample")
    block = block_length(n) if block is None else int(block)
    if not 1 <= block <= n:
        raise ValueError(f"block={block} must lie in [1, {n}]")
    blocks = -(-n // block)
    generator = torch.Generator(device=values.device).manual_seed(int(seed))
    starts = torch.randint(0, n, (int(resamples), blocks, 1), generator=generator, device=values.device)
    index = (starts + torch.arange(block, device=values.device)).reshape(int(resamples), -1)[:, :n] % n
    return values[index].mean(dim=1)


def window_differences(policy_pnl: torch.Tensor, baseline_pnl: torch.Tensor, starts: torch.Tensor,
                       episode_length: int) -> torch.Tensor:
    """Per-window PnL differences (policy minus baseline) in time order, checking the windows' independence.

    :param policy_pnl: ``[E, B]`` per-window PnL of the policy.
    :param baseline_pnl: ``[E, B]`` the baseline's on the same windows.
    :param starts: ``[E, B]`` start rows of the windows.
    :param episode_length: steps of a window.
    :return: ``[E * B]`` float64 differences ordered by start row.
    :raises ValueError: when two windows overlap (they would not be independent evidence).
    """
    starts = torch.as_tensor(starts).reshape(-1).cpu()
    order = torch.argsort(starts)
    ordered = starts[order]
    if ordered.numel() > 1:
        gaps = torch.diff(ordered)
        if bool((gaps < episode_length).any()):
            k = int(torch.nonzero(gaps < episode_length)[0, 0])
            raise ValueError(
                f"windows starting at rows {int(ordered[k])} and {int(ordered[k + 1])} overlap "
                f"(episode_length={episode_length}): overlapping windows are not independent; evaluate fewer "
                "books or steps"
            )
    difference = (policy_pnl.double() - baseline_pnl.double().to(policy_pnl.device)).reshape(-1)
    return difference[order.to(difference.device)]


def windows_needed(mean: float, standard_error: float, num_windows: int, level: float = 0.95,
                   power: float = POWER) -> float:
    """Independent windows a mean difference ``mean`` needs to be significant at ``level`` with ``power``.

    :param mean: the observed mean per-window difference.
    :param standard_error: its (bootstrap) standard error from ``num_windows`` windows.
    :param num_windows: the windows behind ``standard_error``.
    :param level: confidence level (two-sided).
    :param power: the probability of detecting an effect of that size.
    :return: the windows needed (``inf`` for a zero mean; ``0`` for a zero spread and a non-zero mean).
    """
    if mean == 0.0:
        return math.inf
    spread = standard_error * math.sqrt(num_windows)
    z = NormalDist().inv_cdf(0.5 + level / 2.0) + NormalDist().inv_cdf(power)
    return float(math.ceil((z * spread / abs(mean)) ** 2))


def check_finite_windows(values: torch.Tensor, starts: torch.Tensor, name: str, metric: str) -> None:
    """Refuse a non-finite window value (a NaN PnL has no paired comparison), naming the window.

    :param values: ``[E, B]`` per-window values.
    :param starts: ``[E, B]`` start rows of the windows.
    :param name: whose values (a policy or baseline name).
    :param metric: what they are.
    :raises ValueError: one line: whose, the metric, the first bad window (book, episode, start row), count.
    """
    bad = ~torch.isfinite(values)
    if not bool(bad.any()):
        return
    index = tuple(int(i) for i in torch.nonzero(bad)[0])
    where = f"the window of book {index[-1]}" + (f", episode {index[0]}" if len(index) > 1 else "")
    if starts.shape == values.shape:
        where += f" (from market row {int(starts[index])})"
    raise ValueError(f"{name}'s {metric} is {float(values[index])} in {where} ({int(bad.sum())} of "
                     f"{values.numel()} windows not finite): windows with a non-finite {metric} cannot be "
                     "compared; check the data and the policy's actions in that window")


def paired_windows(policy_pnl: torch.Tensor, baseline_pnl: torch.Tensor, starts: torch.Tensor,
                   episode_length: int, *, baseline: str, level: float = 0.95, resamples: int = RESAMPLES,
                   seed: int = 0, policy: str = "policy", metric: str = "PnL per window") -> dict[str, Any]:
    """The paired comparison of a policy and a baseline over the same independent windows.

    :param policy_pnl: ``[E, B]`` per-window PnL of the policy (currency).
    :param baseline_pnl: ``[E, B]`` the baseline's.
    :param starts: ``[E, B]`` start rows of the windows.
    :param episode_length: steps of a window.
    :param baseline: the baseline's name.
    :param level: confidence level of the interval.
    :param resamples: bootstrap resamples.
    :param seed: seed of the resampling.
    :param policy: the policy's name (in messages).
    :param metric: what the values are (in messages).
    :raises ValueError: a non-finite value, naming whose, the metric and the window.
    :return: ``baseline, windows, mean_difference, ci_low, ci_high, level, block, p_value, win_share,
        windows_needed, differences`` (``ci_*``, ``p_value`` None below :data:`MIN_WINDOWS` windows;
        ``episodes`` repeats ``windows`` for older readers).
    """
    for name, values in ((policy, policy_pnl), (baseline, baseline_pnl)):
        check_finite_windows(values, starts, name, metric)
    difference = window_differences(policy_pnl, baseline_pnl, starts, episode_length)
    n = difference.numel()
    mean = float(difference.mean())
    row: dict[str, Any] = {
        "baseline": baseline, "windows": n, "episodes": n, "mean_difference": mean, "ci_low": None,
        "ci_high": None, "level": level, "block": None, "p_value": None, "standard_error": None,
        "win_share": float((difference > 0).double().mean()), "windows_needed": None,
        "differences": difference.cpu().tolist(),
    }
    if n < MIN_WINDOWS:
        return row
    block = block_length(n)
    means = block_bootstrap_means(difference, resamples, block, seed)
    tail = (1.0 - level) / 2.0
    low, high = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=means.dtype,
                                                   device=means.device)).tolist()
    # a bootstrap p-value cannot resolve below one resample: 0 resamples across 0 reads as p = 1 / resamples
    below = max(float((means <= 0).double().mean()), 1.0 / resamples)
    above = max(float((means >= 0).double().mean()), 1.0 / resamples)
    error = float(means.std())
    row.update(ci_low=low, ci_high=high, block=block, standard_error=error,
               p_value=min(1.0, 2.0 * min(below, above)),
               windows_needed=windows_needed(mean, error, n, level))
    return row


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None entries stay None and do not count).

    :param p_values: raw p-values.
    :return: adjusted p-values in the same order (monotone, capped at 1).
    """
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    m = len(present)
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(row: dict[str, Any], family: int) -> str:
    """The one-line verdict of a comparison row (after :func:`correct`).

    :param row: a row of :func:`paired_windows` with ``p_holm``.
    :param family: comparisons in the Holm family.
    :return: e.g. ``"edge over flat: not significant at 95 % (Holm over 6 comparisons; 12 windows)"``.
    """
    name, n, level = row["baseline"], row["windows"], row["level"]
    if row["p_value"] is None:
        return (f"edge over {name}: not testable ({n} independent window{'s' if n != 1 else ''}; an interval "
                f"needs at least {MIN_WINDOWS})")
    corrected = f"Holm over {family} comparisons; " if family > 1 else ""
    where = f"({corrected}{n} windows)"
    if row["p_holm"] < 1.0 - level:
        side = "positive" if row["mean_difference"] > 0 else "negative"
        return f"edge over {name}: {side}, significant at {100 * level:g} % {where}"
    return f"edge over {name}: not significant at {100 * level:g} % {where}"


def power_line(row: dict[str, Any]) -> str:
    """What the observed effect would need: e.g. ``"the observed +3.1 per window would need ~140
    independent windows (have 12)"``."""
    needed, n = row["windows_needed"], row["windows"]
    if needed is None:
        return f"no power statement from {n} window(s)"
    if math.isinf(needed):
        return f"no difference observed over {n} windows"
    return (f"the observed {row['mean_difference']:+,.4g} per window would need ~{int(needed):,} independent "
            f"windows for {100 * POWER:g} % power at {100 * row['level']:g} % (have {n})")


def correct(comparisons: dict[str, list[dict[str, Any]]]) -> int:
    """Holm-correct every comparison of an evaluation as one family, in place; add verdict and power lines.

    :param comparisons: rows of :func:`paired_windows` by policy.
    :return: the family size (comparisons with a p-value).
    """
    rows = [row for group in comparisons.values() for row in group]
    adjusted = holm([row["p_value"] for row in rows])
    family = sum(p is not None for p in adjusted)
    for row, p in zip(rows, adjusted, strict=True):
        row["p_holm"] = p
        row["correction"] = f"Holm over {family} comparisons" if family > 1 else "none (one comparison)"
        row["verdict"] = verdict(row, family)
        row["power"] = power_line(row)
    return family
