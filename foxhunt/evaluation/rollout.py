"""A uniformly random policy on the vector env (``foxhunt rollout``), scored like every evaluation
(:func:`foxhunt.evaluation.metrics.compute_metrics`: the vocabulary and units of :mod:`foxenv.metrics`).

It is the baseline every trained agent should beat, and a quick end-to-end check of an env setup. The
rollout is one call of the evaluation recorder (:func:`foxhunt.evaluation.recorder.record`): series on the
env's device, copied to the host once at the end.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from foxenv import metrics
from foxenv.config import EnvConfig
from foxenv.data.market import MarketData
from foxenv.gym_env import DataSource
from foxhunt.evaluation.baselines import RandomPolicy
from foxhunt.evaluation.metrics import compute_metrics
from foxhunt.evaluation.recorder import Recording, record


def finished_episode_rewards(recording: Recording) -> torch.Tensor:
    """Total reward of every finished episode: full windows, and windows a book left early (terminated).

    :param recording: the run.
    :return: 1-D float64 on the recording's device.
    """
    s = recording.series
    episodes = recording.episode_index()
    windows = int(recording.offsets.shape[0])
    totals = torch.zeros((windows, recording.num_books), dtype=torch.float64, device=episodes.device)
    totals.index_add_(0, episodes, s["reward"])
    full = recording.num_steps // recording.episode_length
    finished = torch.zeros_like(totals, dtype=torch.bool)
    finished[:full] = True
    if full < windows:  # the partial last window: only books the env already terminated
        finished[full] = ~s["alive"][-1]
    return totals[finished]


def random_rollout(
    num_steps: int = 2000,
    num_envs: int = 16,
    data: DataSource = "synthetic",
    seed: int = 0,
    device: torch.device | str = "cpu",
    progress: bool = True,
    market_steps: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run a uniformly random policy for ``num_steps`` vector steps and summarise it.

    All books start their episodes together at planned, distinct windows of the market
    (:func:`~foxhunt.evaluation.recorder.plan_offsets`); PnL, positions and turnover are counted per
    episode (a new episode starts flat with no cash) and then pooled over the run.

    :param num_steps: vector steps (each steps all ``num_envs`` books); >= 2.
    :param num_envs: number of books.
    :param data: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` pair, or a ``MarketData``.
    :param seed: seeds the episode windows, the env and the random policy.
    :param device: device of the env and of the recorded series.
    :param progress: show a tqdm progress bar.
    :param market_steps: ``load_market``'s ``num_steps`` (length of the market timeline; the name
        ``num_steps`` is taken by the rollout length).
    :param kwargs: :class:`~foxenv.config.EnvConfig` fields and ``load_market`` options.
    :return: :func:`~foxhunt.evaluation.metrics.compute_metrics`'s dict (units:
        :data:`foxenv.metrics.UNITS`) plus ``mean_episode_reward`` over the ``episodes_finished``, and
        ``num_envs``, ``num_steps``, ``seed``, ``device``, ``market`` and ``book_steps_per_second``.
    """
    if int(num_steps) != num_steps or num_steps < 2:
        raise ValueError(f"num_steps={num_steps} must be an integer >= 2")
    fields = {f.name for f in dataclasses.fields(EnvConfig)}
    config_kwargs = {k: v for k, v in kwargs.items() if k in fields}
    market_kwargs = {k: v for k, v in kwargs.items() if k not in fields}
    if market_steps is not None:
        market_kwargs["num_steps"] = market_steps
    if isinstance(data, MarketData):
        market = data.to(device)
    else:
        from foxenv.data import load_market

        market = load_market(data, seed=market_kwargs.pop("market_seed", 0), device=device, **market_kwargs)
    rec = record(RandomPolicy(seed, EnvConfig(**config_kwargs).grid), market, num_books=num_envs,
                 num_steps=int(num_steps), seed=seed, env_kwargs=config_kwargs, device=device,
                 progress=progress)
    summary = compute_metrics(rec)
    rewards = finished_episode_rewards(rec)
    summary.update(
        mean_episode_reward=float(rewards.mean()) if rewards.numel() else float("nan"),
        episodes_finished=int(rewards.numel()),
    )
    summary.update(
        num_envs=rec.num_books,
        num_steps=int(num_steps),
        seed=int(seed),
        device=str(rec.series["equity"].device),
        market=market.name,
        book_steps_per_second=rec.num_books * int(num_steps) / max(rec.elapsed_s, 1e-9),
    )
    return summary


def print_summary(title: str, summary: dict[str, Any]) -> None:
    """Print a metrics dict, one ``name: value unit`` per line (units of :data:`foxenv.metrics.UNITS`, the
    currency named; the action mix with its labels)."""
    named = metrics.units(summary.get("currency", "currency"))
    labels = summary.get("action_labels", {})
    print(f"\n{title}")
    for key, value in summary.items():
        if key in ("action_labels", "currency"):
            continue
        unit = named.get(key, "")
        if key == "book_steps_per_second":
            unit = "book-steps per second of wall time"
        if isinstance(value, float):
            shown = f"{value:.6g}" if math.isfinite(value) else "n/a"
            print(f"  {key:>22}: {shown}  {unit}".rstrip())
        elif isinstance(value, dict):
            print(f"  {key:>22}:  {unit}".rstrip())
            for name, row in value.items():
                names = labels.get(name, [str(i) for i in range(len(row))])
                print(f"  {name:>24}  " + "  ".join(f"{n} {v:.3f}" for n, v in zip(names, row, strict=True)))
        else:
            print(f"  {key:>22}: {value}  {unit}".rstrip())
