"""Where the joint face cannot go: branched against joint BranchingIQN on the wide action grid (issue 23.1).

    python -m experiments.wide_actions --seeds 5 --steps 40000 --n-envs 8

The wide grid (``EnvConfig.action_grid="wide"``, :data:`foxenv.spec.WIDE_GRID`) has ten sizes and twelve price
levels per order type: ``MultiDiscrete([3, 10, 3, 12])`` on the branched face, 1,080 codes on the joint face,
where the joint agent's one head must value every combination on its own. Every agent (``--agents``; default
the branched ``iqn`` with foxhunt's presets and hindsight, the joint ``iqn_joint``, SB3 DQN and sb3-contrib
QR-DQN on the joint face) trains on the planted market (strength 2, horizon 5 by default) over ``--seeds``
seeds (``--peer-seeds`` for DQN / QR-DQN, the slow SB3 loops), and all are scored with flat, random and the
oracle on the same held-out windows. The oracle trades the planted signal with the grid's full size and a
Market order for all of the gap, which every grid holds, so it is the same policy (and PnL) on either grid.

Training seconds are each run's ``learn()`` wall; under ``--concurrent-seeds K`` (BranchingIQN runs K at once,
one CUDA stream each) that of a run sharing the device with K - 1 others, so compare agents at the same K.

Writes ``wide_actions.json`` (per seed: share of the oracle's held-out PnL, PnL, Sharpe, training seconds;
mean and std per agent), ``wide_actions.md`` (the table) and ``wide_actions.png`` (share of oracle per agent,
and against training seconds) into ``--out`` (default ``runs/experiments/<name>``). ``--smoke`` shrinks
everything to a CPU check of seconds.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from tqdm.auto import tqdm

from experiments import agents, options, results, runner

#: Agents trained when ``--agents`` is not given: the branched agent, the joint one and the peers.
DEFAULT_AGENTS = ("iqn", "iqn_joint", "dqn", "qrdqn")
#: The file of a run folder holding the seconds of its ``learn()`` (what ``--reuse`` reads back).
LEARN_SECONDS = "learn_seconds.txt"
#: What ``--smoke`` sets: a budget of seconds on a CPU (tiny market, books, nets and evaluation).
SMOKE = {"seeds": 2, "steps": 160, "n_envs": 2, "market_steps": 1_200, "episode_length": 40,
         "net_arch": "16", "buffer_size": 400, "batch_size": 16, "learning_starts": 80,
         "target_update_interval": 50, "train_freq": 4, "eval_envs": 2, "eval_steps": 20}


class LearnTimer(BaseCallback):
    """Wall seconds of ``learn()`` alone (from its first to its last callback; the run folder's own report
    and evaluation, which a BranchingIQN run writes after it, are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = math.nan
        self._start = 0.0

    def _on_training_start(self) -> None:
        self._start = time.perf_counter()

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()  # this run's stream (its own under --concurrent-seeds)
        self.seconds = time.perf_counter() - self._start


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (the shared options of :mod:`experiments.options`, the planted market by default)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.wide_actions",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--name", default="wide_actions", help="experiment name (the default output folder)")
    parser.add_argument("--out", default=None, help="output folder (default runs/experiments/<name>)")
    parser.add_argument("--agents", default=",".join(DEFAULT_AGENTS), help="comma-separated agents")
    parser.add_argument("--action-grid", default="wide",
                        help="the env's action grid (a name of foxenv.spec.ACTION_GRIDS, or a JSON mapping)")
    parser.add_argument("--peer-seeds", type=int, default=None,
                        help="seeds of DQN / QR-DQN (default: --seeds; their SB3 loop is the slow part)")
    parser.add_argument("--smoke", action="store_true", help="a CPU check of seconds (tiny everything)")
    options.add_arguments(parser)
    parser.add_argument("--reuse", action="store_true",
                        help="load runs already finished in the output folder instead of training them again")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(signal_strength=2.0, signal_horizon=5, seeds=5)
    args = options.parse(parser, argv)
    if args.smoke:  # the smoke budget, but for the options given
        given = {word.split("=")[0] for word in (sys.argv[1:] if argv is None else argv)}
        for key, value in SMOKE.items():
            if f"--{key.replace('_', '-')}" not in given:
                setattr(args, key, value)
    if args.peer_seeds is not None and not 1 <= args.peer_seeds <= args.seeds:
        parser.error(f"--peer-seeds {args.peer_seeds} must lie in [1, --seeds {args.seeds}]")
    return args


def grid_env_kwargs(args: argparse.Namespace) -> str:
    """``--env-kwargs`` with ``--action-grid`` in it (as JSON).

    :raises ValueError: naming ``env-kwargs`` when it names another grid.
    """
    import json

    from foxenv.spec import action_grid

    grid: Any = args.action_grid
    if isinstance(grid, str) and grid.lstrip().startswith("{"):
        grid = json.loads(grid)
    action_grid(grid)  # one line naming a bad grid before anything trains
    env = json.loads(args.env_kwargs) if args.env_kwargs else {}
    if not isinstance(env, dict):
        raise ValueError(f"env-kwargs={env!r} must be a JSON object of env settings")
    if "action_grid" in env and env["action_grid"] != grid:
        raise ValueError(f"env-kwargs.action_grid={env['action_grid']!r} contradicts --action-grid {grid!r}")
    return json.dumps({**env, "action_grid": grid})


def seeds_of(agent: agents.Agent, args: argparse.Namespace) -> list[int]:
    """The seeds ``agent`` trains: all of ``--seeds``, or ``--peer-seeds`` for DQN / QR-DQN."""
    count = args.seeds if agent.algorithm == "iqn" or args.peer_seeds is None else args.peer_seeds
    return list(range(count))


def per_seed(evaluation: Any, runs: Sequence[runner.TrainedRun], seconds: Mapping[str, float]) -> (
    dict[str, list[dict[str, Any]]]
):
    """Per agent, one row per seed: share of the oracle's PnL, PnL, Sharpe and the seconds of ``learn()``
    (``seconds``, by run key; the whole run's, report included, where it was not timed: a reused run)."""
    metrics = evaluation.results
    oracle = float(metrics["oracle"].metrics["pnl"]) if "oracle" in metrics else math.nan
    table: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        scored = metrics[results.run_key(run.agent, run.seed)].metrics
        pnl = float(scored["pnl"])
        key = results.run_key(run.agent, run.seed)
        table.setdefault(run.agent, []).append({
            "seed": run.seed, "oracle_share": pnl / oracle if oracle else math.nan, "pnl": pnl,
            "sharpe": float(scored["sharpe"]), "train_seconds": seconds.get(key, run.seconds),
            "run_seconds": run.seconds, "loop": run.loop, "action_mix": scored["action_mix"]})
    return table


def summary_of(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Mean and sample std over seeds of each per-seed number."""
    out: dict[str, dict[str, Any]] = {}
    for agent, seeds in rows.items():
        out[agent] = {"seeds": len(seeds)}
        for key in ("oracle_share", "pnl", "sharpe", "train_seconds"):
            mean, std = results.mean_std([row[key] for row in seeds])
            out[agent][key] = {"mean": mean, "std": std}
    return out


def markdown(rows: Mapping[str, Sequence[Mapping[str, Any]]], summary: Mapping[str, Mapping[str, Any]],
             baselines: Mapping[str, float]) -> str:
    """The table: per agent mean ± std and every seed's share of the oracle and training seconds."""
    lines = ["| agent | seeds | share of oracle PnL, mean ± std | per seed | Sharpe / step | train s / seed, "
             "mean ± std | per seed |", "|---|---|---|---|---|---|---|"]
    for agent, seeds in rows.items():
        s = summary[agent]
        share, sharpe, seconds = s["oracle_share"], s["sharpe"], s["train_seconds"]
        lines.append(
            f"| {agent} | {s['seeds']} | {100 * share['mean']:.1f} ± {100 * share['std']:.1f} % | "
            + " / ".join(f"{100 * r['oracle_share']:.1f}" for r in seeds) + " % | "
            + f"{sharpe['mean']:.3f} ± {sharpe['std']:.3f} | {seconds['mean']:.1f} ± {seconds['std']:.1f} | "
            + " / ".join(f"{r['train_seconds']:.1f}" for r in seeds) + " |")
    for name, pnl in baselines.items():
        share = pnl / baselines["oracle"] if baselines.get("oracle") else math.nan
        lines.append(f"| {name} (baseline) | – | {100 * share:.1f} % (PnL {pnl:,.0f}) | | | | |")
    return "\n".join(lines)


def figure(rows: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str) -> Path:
    """Share of the oracle's PnL per agent (bar at the mean, a dot per seed, error bar the std), and each
    seed's share against its training seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, scatter) = plt.subplots(1, 2, figsize=(11, 4.5))
    names = list(rows)
    for i, name in enumerate(names):
        shares = np.array([100 * r["oracle_share"] for r in rows[name]], dtype=float)
        seconds = np.array([r["train_seconds"] for r in rows[name]], dtype=float)
        color = f"C{i % 10}"
        bars.bar(i, np.nanmean(shares), yerr=np.nanstd(shares, ddof=1) if len(shares) > 1 else 0.0,
                 color=color, capsize=3)
        bars.scatter(np.full(len(shares), i), shares, color="k", s=10, zorder=3)
        scatter.scatter(seconds, shares, color=color, label=name)
    bars.axhline(0.0, color="k", lw=0.6)
    bars.set_xticks(range(len(names)), names, rotation=30, ha="right")
    bars.set_ylabel("share of the oracle's held-out PnL (%)")
    scatter.set_xlabel("training seconds per seed")
    scatter.set_ylabel("share of the oracle's held-out PnL (%)")
    scatter.axhline(0.0, color="k", lw=0.6)
    scatter.legend(fontsize=8)
    for axis in (bars, scatter):
        axis.grid(alpha=0.3)
    fig.suptitle(textwrap.fill(title, 120), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the experiment; return what ``wide_actions.json`` holds."""
    args = parse_args(argv)
    args.env_kwargs = grid_env_kwargs(args)
    torch.set_num_threads(args.threads)
    origin = results.provenance()
    roster = options.roster_of(args)
    names = list(dict.fromkeys(a.strip() for a in args.agents.split(",") if a.strip()))
    for name in names:
        roster.get(name)  # ValueError naming an unknown agent before any training
    setup = options.setup_of(args)
    if not setup.planted:
        raise ValueError("the experiment scores against the oracle: give --signal-strength > 0")
    out = Path(args.out or Path("runs") / "experiments" / args.name)
    out.mkdir(parents=True, exist_ok=True)
    plan = [(name, seed) for name in names for seed in seeds_of(roster.get(name), args)]
    print(f"{setup.describe()}; action grid {args.action_grid}\nagents {names}; {args.steps} steps x "
          f"{args.n_envs} books on {args.device}; output {out}")

    jobs = [(roster.get(name), seed, out / name / f"seed{seed}") for name, seed in plan]
    loaded = [runner.load(agent, seed, setup, folder) if args.reuse else None for agent, seed, folder in jobs]
    pending = [job for job, done in zip(jobs, loaded, strict=True) if done is None]
    timers = [LearnTimer() for _ in pending]

    def finished(run: runner.TrainedRun) -> None:
        timer = timers[next(i for i, job in enumerate(pending) if job[2] == run.folder)]
        (run.folder / LEARN_SECONDS).write_text(f"{timer.seconds!r}\n")
        bar.update()

    with tqdm(total=len(pending), desc="training", disable=args.no_progress) as bar:
        fresh = iter(runner.train_all(pending, setup, args.concurrent_seeds, timers, on_done=finished))
    runs = [done or next(fresh) for done in loaded]
    seconds = {results.run_key(r.agent, r.seed): float((r.folder / LEARN_SECONDS).read_text())
               for r in runs if (r.folder / LEARN_SECONDS).is_file()}

    evaluation = results.evaluate({results.run_key(r.agent, r.seed): r.model for r in runs}, setup,
                                  progress=not args.no_progress)
    rows = per_seed(evaluation, runs, seconds)
    summary = summary_of(rows)
    baselines = {name: float(r.metrics["pnl"]) for name, r in evaluation.results.items() if "/" not in name}
    table = markdown(rows, summary, baselines)
    command = options.command_line("wide_actions", argv)
    held = evaluation.setup
    grid = held["env_config"].get("action_grid", {"name": "default"})
    title = (f"{args.name}: {setup.describe()}; action grid {grid['name']}; {args.steps} steps x "
             f"{args.n_envs} books; held out {held['books']} books x {held['vector_steps']} steps")
    figure(rows, out / "wide_actions.png", title)
    payload = {
        "experiment": "wide_actions", "command": command, "args": vars(args), "provenance": origin,
        "market": setup.describe(), "action_grid": grid, "agents": {a: roster.get(a).record() for a in names},
        "per_seed": rows, "summary": summary, "baselines": baselines, "held_out": {
            k: held[k] for k in ("books", "vector_steps", "independent_steps", "market")},
        "evaluation": evaluation.to_json(),
    }
    results.write_json(out / "wide_actions.json", payload)
    (out / "wide_actions.md").write_text(f"# {args.name}\n\n`{command}`\n\n{title}\n\n{table}\n\n"
                                         "![share of oracle](wide_actions.png)\n")
    print(f"\n{title}\n\n{table}\n\nwritten: {out}/wide_actions.json, wide_actions.md, wide_actions.png")
    return payload


if __name__ == "__main__":
    main()
