"""A uniformly random policy on the vector env, scored with :mod:`foxenv.metrics`.

It is the baseline every trained agent should beat, and a quick end-to-end check of an env setup
(``foxhunt rollout`` on the command line). The loop keeps everything on the env's device and
only moves the recorded series to the host once, at the end.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from foxenv import metrics
from foxenv.gym_env import DataSource
from foxenv.vector_env import make_vec


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

    Finished episodes restart at once (same-step autoreset); PnL, positions and turnover are
    counted per episode (a reset book starts flat with no cash) and then pooled over the run.

    :param num_steps: vector steps (each steps all ``num_envs`` books); >= 2.
    :param num_envs: number of books.
    :param data: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` pair, or a ``MarketData``.
    :param seed: seeds the env and the random policy.
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
    if market_steps is not None:
        kwargs["num_steps"] = market_steps
    env = make_vec(num_envs, data=data, device=device, seed=seed, return_tensors=True, **kwargs)
    dev = env.device
    generator = torch.Generator(device=dev).manual_seed(int(seed))
    nvec = torch.as_tensor(env.single_action_space.nvec, dtype=torch.float32, device=dev)
    shape = (int(num_steps), env.num_envs)
    step_pnl = torch.zeros(shape, dtype=torch.float64, device=dev)
    positions = torch.zeros(shape, dtype=torch.float64, device=dev)
    trade_pnl = torch.zeros(shape, dtype=torch.float64, device=dev)
    trade_closed = torch.zeros(shape, dtype=torch.bool, device=dev)
    episode_starts = torch.zeros(shape, dtype=torch.bool, device=dev)
    finished_return = torch.full(shape, float("nan"), dtype=torch.float64, device=dev)
    actions = torch.zeros((*shape, nvec.shape[0]), dtype=torch.int8, device=dev)

    env.reset(seed=seed)
    previous_equity = torch.zeros(env.num_envs, dtype=torch.float64, device=dev)
    episode_return = torch.zeros(env.num_envs, dtype=torch.float64, device=dev)
    starting = torch.ones(env.num_envs, dtype=torch.bool, device=dev)
    started = time.perf_counter()
    for t in tqdm(range(int(num_steps)), desc="random rollout", disable=not progress):
        action = (torch.rand((env.num_envs, nvec.shape[0]), generator=generator, device=dev) * nvec).long()
        _, reward, terminated, truncated, info = env.step(action)
        done = terminated | truncated
        equity = info["equity"]
        step_pnl[t] = equity - previous_equity
        positions[t] = info["position"]
        trade_pnl[t] = info["trade_pnl"]
        trade_closed[t] = info["trade_closed"]
        episode_starts[t] = starting
        actions[t] = action.to(torch.int8)
        episode_return = episode_return + reward.to(torch.float64)
        finished_return[t] = torch.where(done, episode_return, finished_return[t])
        episode_return = torch.where(done, torch.zeros_like(episode_return), episode_return)
        previous_equity = torch.where(done, torch.zeros_like(equity), equity)
        starting = done
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - started

    episode_rewards = finished_return[~torch.isnan(finished_return)]
    summary = metrics.summarize(
        step_pnl=step_pnl.T,
        positions=positions.T,
        trade_pnl=trade_pnl.T,
        trade_closed=trade_closed.T,
        episode_starts=episode_starts.T,
        actions=actions,
        episode_rewards=episode_rewards,
        nvec=tuple(int(n) for n in env.single_action_space.nvec),
        branch_names=env.core.BRANCH_NAMES,
    )
    summary.update(
        num_envs=env.num_envs,
        num_steps=int(num_steps),
        seed=int(seed),
        device=str(dev),
        market=env.market.name,
        book_steps_per_second=env.num_envs * int(num_steps) / elapsed,
    )
    env.close()
    return summary


def evaluate_agent(model: Any, env: Any, num_steps: int) -> dict[str, Any]:
    """Run the deterministic policy for ``num_steps`` vector steps and score it with foxenv.metrics.

    :param model: a trained model with SB3's ``predict``.
    :param env: a :class:`LOBVecEnv` (its ``last_info_tensors`` give equity, position and trades).
    :param num_steps: vector steps (>= 2).
    :return: :func:`foxenv.metrics.summarize`'s dict (Sharpe, max drawdown, hit rate, action mix, ...).
    """
    from foxenv import metrics

    if num_steps < 2:
        raise ValueError(f"num_steps={num_steps} must be >= 2")
    n_envs, nvec = env.num_envs, [int(n) for n in env.action_space.nvec]
    step_pnl = np.zeros((num_steps, n_envs))
    positions = np.zeros((num_steps, n_envs))
    trade_pnl = np.zeros((num_steps, n_envs))
    trade_closed = np.zeros((num_steps, n_envs), dtype=bool)
    episode_starts = np.zeros((num_steps, n_envs), dtype=bool)
    actions = np.zeros((num_steps, n_envs, len(nvec)), dtype=np.int64)
    episode_rewards: list[float] = []
    previous_equity = np.zeros(n_envs)
    starting = np.ones(n_envs, dtype=bool)
    obs = env.reset()
    for t in range(num_steps):
        action, _ = model.predict(obs, deterministic=True)
        obs, _, done, infos = env.step(action)
        info = {k: v.detach().cpu().numpy() for k, v in env.last_info_tensors.items()}
        step_pnl[t] = info["equity"] - previous_equity
        positions[t] = info["position"]
        trade_pnl[t] = info["trade_pnl"]
        trade_closed[t] = info["trade_closed"]
        episode_starts[t] = starting
        actions[t] = action
        episode_rewards += [info_i["episode"]["r"] for info_i in infos if "episode" in info_i]
        previous_equity = np.where(done, 0.0, info["equity"])
        starting = done
    return metrics.summarize(
        step_pnl=step_pnl.T,
        positions=positions.T,
        trade_pnl=trade_pnl.T,
        trade_closed=trade_closed.T,
        episode_starts=episode_starts.T,
        actions=actions.transpose(1, 0, 2),
        episode_rewards=np.asarray(episode_rewards),
        nvec=nvec,
        branch_names=list(env.branch_names),
    )


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
