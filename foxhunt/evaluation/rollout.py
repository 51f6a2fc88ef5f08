"""A uniformly random policy on the vector env (``foxhunt rollout``), scored with :mod:`foxenv.metrics`.

It is the baseline every trained agent should beat, and a quick end-to-end check of an env setup. The
rollout is one call of the evaluation recorder (:func:`foxhunt.evaluation.recorder.record`): series on the
env's device, copied to the host once at the end.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from foxenv import metrics
from foxenv.config import EnvConfig
from foxenv.data.market import MarketData
from foxenv.gym_env import DataSource
from foxhunt.evaluation.baselines import NVEC, RandomPolicy
from foxhunt.evaluation.metrics import BRANCH_NAMES
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
    :return: :func:`foxenv.metrics.summarize`'s dict (``sharpe``, ``max_drawdown``, ``turnover``,
        ``total_pnl``, ``hit_rate``, ``num_trades``, ``steps``, ``episodes``, ``mean_episode_reward``,
        ``action_mix``) plus ``num_envs``, ``num_steps``, ``seed``, ``device``, ``market`` and
        ``book_steps_per_second``. Per-step quantities are in currency (PnL) and lots (turnover).
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
    rec = record(RandomPolicy(seed), market, num_books=num_envs, num_steps=int(num_steps), seed=seed,
                 env_kwargs=config_kwargs, device=device, progress=progress)
    s = rec.series
    summary = metrics.summarize(
        step_pnl=s["step_pnl"].T,
        positions=s["position"].T,
        trade_pnl=s["trade_pnl"].T,
        trade_closed=s["trade_closed"].T,
        episode_starts=s["episode_start"].T,
        actions=s["actions"],
        episode_rewards=finished_episode_rewards(rec),
        nvec=NVEC,
        branch_names=BRANCH_NAMES,
    )
    summary.update(
        num_envs=rec.num_books,
        num_steps=int(num_steps),
        seed=int(seed),
        device=str(s["equity"].device),
        market=market.name,
        book_steps_per_second=rec.num_books * int(num_steps) / max(rec.elapsed_s, 1e-9),
    )
    return summary


def print_summary(title: str, summary: dict[str, Any]) -> None:
    """Print a metrics dict, one ``key: value`` per line."""
    print(f"\n{title}")
    for key, value in summary.items():
        if isinstance(value, float):
            print(f"  {key:>22}: {value:.6g}")
        elif isinstance(value, dict):
            print(f"  {key:>22}:")
            for name, row in value.items():
                shown = [round(v, 3) for v in row] if isinstance(row, list) else row
                print(f"  {name:>24}  {shown}")
        else:
            print(f"  {key:>22}: {value}")
