"""Time to a score: seconds and env steps until the held-out share of the oracle's PnL first reaches 50 %.

For each planted market (``--strengths``, horizon ``--signal-horizon``), agent (``--agents``, the names of
:mod:`experiments.agents`: ``iqn_joint`` the default agent on the joint face, ``iqn_fast`` the settings
of ``foxhunt train --recipe fast``, ``iqn`` the branched presets, ``dqn``, ``qrdqn``, and ``--agent-kwargs``
custom ones) and seed, one ``learn`` call trains
on the training market (synthetic seed ``--train-market-seed``) and a callback scores the greedy policy every
``--score-every`` env steps on the held-out market (seed ``--eval-market-seed``): the same books, windows and
recorder as :func:`foxhunt.evaluation.evaluate_policies`, the actions taken from the policy on device tensors
(no numpy round trip). The share is the policy's PnL after fees over the oracle's on the same windows. The
run stops at the first score ``>= --target``, or when its training seconds pass ``--cap-seconds``, or at
``--steps`` (then it is reported as ``> cap``).

Clocks, each run (synchronised on CUDA at every score, never inside a training step):

* ``train_s``: wall time of ``learn`` up to the score, minus the scoring time (what the table reports);
* ``warmup_s``: the part of it before ``learning_starts`` (random actions, no gradient step);
* ``first_chunk_s`` / ``steady_s_per_kstep``: the first scoring interval with gradient steps (it holds
  CUDA-graph captures and compiles) and the mean seconds per 1,000 env steps of the later intervals;
* ``score_s``: the scoring itself, counted apart.

Many seeds at once (``--concurrent K``, issue 24): a BranchingIQN agent's seeds train K at a time in this
process, each in a thread on a CUDA stream of its own (:mod:`sb3_her_ext.concurrent`; each seed's results
are the ones it gets alone), or with ``--processes`` in K fresh processes. Then each such agent first trains
seed 0 alone (in threads after an untimed warm-up run; with ``--processes`` in one fresh process) and the
table's line ``concurrency`` gives the wall seconds of each batch of K seeds against that one seed,
their ratio (the target: 5 seeds in <= 2x one seed's wall), and whether seed 0 scored the same points in
its batch as alone. DQN / QR-DQN seeds train one at a time (SB3's DQN draws from numpy's global generator).

Usage::

    python benchmarks/time_to_score.py --device cuda --strengths 2 1 --seeds 5 \
        --agents iqn_joint,iqn,dqn,qrdqn --n-envs 64 --steps 512000 --score-every 32768 --cap-seconds 60
    python benchmarks/time_to_score.py --device cuda --strengths 1 --seeds 5 --agents iqn_fast,dqn \
        --n-envs 64 --score-every 65536 --eval-envs 64 --cap-seconds 60   # the weak signal in seconds
    python benchmarks/time_to_score.py --device cuda --strengths 1 --seeds 5 --concurrent 5 --processes \
        --agents iqn_joint --run-to-budget       # 5 seeds at once vs 1 seed: the wall ratio
    python benchmarks/time_to_score.py --quick      # tiny CPU smoke run

Prints one table per market and writes ``benchmarks/results/time_to_score.json`` (or ``--out``) and, beside
it, a ``.png`` of every run's share against seconds and env steps; ``--plot JSON ...`` redraws saved results
(several merged by market) without training.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages
from _common import default_out, machine_info, write_json  # noqa: E402

from experiments import options, results, runner  # noqa: E402
from experiments.agents import Agent  # noqa: E402
from experiments.scoring import (  # noqa: E402  (shared with hindsight_speed)
    HeldOutScorer,
    train_scored,
    train_scored_in_process,
)
from sb3_her_ext.concurrent import run_concurrently, run_in_processes  # noqa: E402

RESULTS = default_out("time_to_score")


def run_one(agent: Agent, seed: int, setup: runner.Setup, scorer: HeldOutScorer,
            args: argparse.Namespace) -> dict[str, Any]:
    """Train ``agent`` with ``seed`` until it scores ``args.target`` (or the cap); its record."""
    return train_scored(agent, seed, setup, scorer, every=args.score_every, target=args.target,
                        cap_seconds=args.cap_seconds, run_to_budget=args.run_to_budget)


def run_seeds(agent: Agent, setup: runner.Setup, scorer: HeldOutScorer, args: argparse.Namespace,
              printed: Any = print) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every seed of ``agent``: one at a time, or (BranchingIQN with ``--concurrent K`` > 1) in batches of K
    trained at once, after seed 0 alone (and an untimed warm-up run) for the wall-time ratio.

    :param printed: called with each finished run (``printed(run)``).
    :return: the runs in seed order, and the concurrency record (None when seeds ran one at a time).
    """
    seeds = list(range(args.seeds))
    if args.concurrent <= 1 or agent.algorithm != "iqn":
        runs = []
        for seed in seeds:
            runs.append(run_one(agent, seed, setup, scorer, args))
            printed(runs[-1])
        return runs, None
    def in_processes(batch: list[int]) -> list[dict[str, Any]]:
        return run_in_processes(train_scored_in_process, [
            (agent, seed, setup, args.score_every, args.target, args.cap_seconds, args.run_to_budget)
            for seed in batch], [f"{agent.name} seed {seed}" for seed in batch])

    if not args.processes:  # CUDA, cuBLAS and cuda_ext loaded outside the clock (a process counts them)
        run_one(agent, 0, dataclasses.replace(setup, steps=min(setup.steps, args.score_every)), scorer, args)
    began = time.perf_counter()
    alone = in_processes([0])[0] if args.processes else run_one(agent, 0, setup, scorer, args)
    alone_wall = time.perf_counter() - began
    runs, walls = [], []
    for first in range(0, len(seeds), args.concurrent):
        batch = seeds[first:first + args.concurrent]
        began = time.perf_counter()
        if args.processes:
            runs += in_processes(batch)
        else:
            tasks = [lambda seed=seed: run_one(agent, seed, setup, scorer, args) for seed in batch]
            runs += run_concurrently(tasks, [f"{agent.name} seed {seed}" for seed in batch],
                                     [setup.device] * len(batch))
        walls.append({"seeds": len(batch), "wall_s": time.perf_counter() - began})
        for run in runs[-len(batch):]:
            printed(run)
    same = [(p["steps"], p["share"]) for p in runs[0]["points"]] == [(p["steps"], p["share"])
                                                                      for p in alone["points"]]
    record = {"concurrent": args.concurrent, "mode": "processes" if args.processes else "threads",
              "alone_wall_s": alone_wall, "batches": walls,
              "ratio": walls[0]["wall_s"] / alone_wall, "seed0_same_points": same,
              "alone_points": alone["points"]}
    return runs, record


def concurrency_line(agent: str, record: dict[str, Any]) -> str:
    """One line: a batch's wall against one seed's, the ratio, whether seed 0 scored the same."""
    batch = record["batches"][0]
    return (f"concurrency {agent} ({record.get('mode', 'threads')}): {batch['seeds']} seeds at once in "
            f"{batch['wall_s']:.1f} s vs one seed "
            f"alone {record['alone_wall_s']:.1f} s: ratio {record['ratio']:.2f} (target <= 2); seed 0 "
            f"{'scored the same points' if record['seed0_same_points'] else 'scored OTHER points'} in the "
            "batch as alone")


def summarise(runs: Sequence[dict[str, Any]], cap: float) -> dict[str, Any]:
    """Median and spread of the time to the target over seeds (a seed that never reached it counts as
    infinite: the median is ``> cap`` when half or more did not)."""
    seconds = sorted(r["seconds"] if r["reached"] else math.inf for r in runs)
    steps = sorted(r["steps"] if r["reached"] else math.inf for r in runs)
    reached = [r for r in runs if r["reached"]]
    finals = [float(r["final_share"]) for r in runs]
    return {
        "seeds": len(runs), "reached": len(reached),
        "median_s": statistics.median(seconds), "min_s": seconds[0], "max_s": seconds[-1],
        "median_steps": statistics.median(steps),
        "best_share_mean": float(np.mean([r["best_share"] for r in runs])),
        "best_share_std": float(np.std([r["best_share"] for r in runs], ddof=1)) if len(runs) > 1 else 0.0,
        "final_share_mean": float(np.mean(finals)),
        "final_share_std": float(np.std(finals, ddof=1)) if len(runs) > 1 else 0.0,
        "final_shares": finals, "train_s_mean": float(np.mean([r["trained_s"] or 0.0 for r in runs])),
        "score_s": float(sum(r["score_s"] for r in runs)), "cap_s": cap,
    }


def _seconds(value: float, cap: float) -> str:
    return f"> {cap:.0f}" if not math.isfinite(value) else f"{value:.1f}"


def table(rows: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]], target: float) -> str:
    """A markdown table: per agent the median (min-max) seconds and steps to the target, and per seed."""
    head = ["agent", "reached", f"median s to {100 * target:.0f} %", "min - max s", "median env steps",
            "best share (mean ± std)", "final share (mean ± std)", "per seed s", "trained s (mean)",
            "warm-up s", "steady s / 1k steps", "scoring s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for agent, row in rows.items():
        cap = row["cap_s"]
        per_seed = " / ".join(_seconds(r["seconds"] if r["reached"] else math.inf, cap) for r in runs[agent])
        warm = [r["warmup_s"] for r in runs[agent] if r["warmup_s"] is not None]
        steady = [r["steady_s_per_kstep"] for r in runs[agent] if r["steady_s_per_kstep"] is not None]
        steps = row["median_steps"]
        lines.append("| " + " | ".join([
            agent, f"{row['reached']}/{row['seeds']}", _seconds(row["median_s"], cap),
            f"{_seconds(row['min_s'], cap)} - {_seconds(row['max_s'], cap)}",
            "–" if not math.isfinite(steps) else f"{steps:,.0f}",
            f"{100 * row['best_share_mean']:.1f} ± {100 * row['best_share_std']:.1f} %",
            f"{100 * row['final_share_mean']:.1f} ± {100 * row['final_share_std']:.1f} %", per_seed,
            f"{row['train_s_mean']:.1f}",
            f"{np.mean(warm):.2f}" if warm else "–", f"{np.mean(steady):.3f}" if steady else "–",
            f"{row['score_s']:.1f}",
        ]) + " |")
    return "\n".join(lines)


def merged_runs(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The runs of several results by market (strength) and agent, in the order given."""
    markets: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for result in results:
        for strength, market in result["markets"].items():
            for agent, agent_runs in market.get("runs", {}).items():
                markets.setdefault(strength, {}).setdefault(agent, []).extend(agent_runs)
    return markets


def plot(results: Sequence[dict[str, Any]], path: Path, target: float = 0.5) -> Path:
    """The scored points of every run: held-out share of the oracle's PnL against seconds of training (left)
    and env steps (right), one row per market, a color per agent, a line per seed; a dot where a seed first
    reached ``target``.

    :param results: this benchmark's JSON results (several: their markets' runs merged by strength).
    :param path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markets = merged_runs(results)
    if not markets:
        raise ValueError("time_to_score plot: the results hold no runs")
    fig, axes = plt.subplots(len(markets), 2, figsize=(12, 4.2 * len(markets)), squeeze=False)
    for row, (strength, runs) in zip(axes, sorted(markets.items()), strict=True):
        for color, (agent, agent_runs) in enumerate(runs.items()):
            for i, run in enumerate(agent_runs):
                points = run["points"]
                shares = [100 * p["share"] for p in points]
                for ax, key in zip(row, ("train_s", "steps"), strict=True):
                    ax.plot([p[key] for p in points], shares, color=f"C{color}", lw=1, alpha=0.75,
                            label=f"{agent} ({len(agent_runs)} seeds)" if i == 0 else None)
                    first = next((p for p in points if p["share"] >= target), None)
                    if first is not None:
                        ax.plot(first[key], 100 * first["share"], "o", color=f"C{color}", ms=4)
        for ax, label in zip(row, ("seconds of training (scoring apart)", "environment steps"), strict=True):
            ax.axhline(100 * target, color="k", ls="--", lw=0.8)
            ax.set_xlabel(label)
            ax.set_ylabel("held-out share of the oracle's PnL (%)")
            ax.set_title(f"planted signal strength {strength}", fontsize=9)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (the experiments' market, budget and evaluation options, plus the ones here)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_arguments(parser)
    parser.set_defaults(signal_horizon=5, seeds=5, steps=512_000, n_envs=64, market_steps=100_000)
    parser.add_argument("--strengths", type=float, nargs="+", default=[2.0, 1.0],
                        help="planted signal strengths, one market each (overrides --signal-strength)")
    parser.add_argument("--agents", default="iqn_joint,iqn_fast,iqn,dqn,qrdqn", help="comma separated")
    parser.add_argument("--target", type=float, default=0.5, help="share of the oracle's held-out PnL")
    parser.add_argument("--score-every", type=int, default=32_768, help="env steps between scores")
    parser.add_argument("--cap-seconds", type=float, default=1200.0, help="training seconds per run")
    parser.add_argument("--run-to-budget", action="store_true",
                        help="train on past the target to --steps (or the cap): the share at the budget too")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--concurrent", type=int, default=1, metavar="K",
                        help="train a BranchingIQN agent's seeds K at once (threads, a CUDA stream each) and "
                             "report the wall of a batch against one seed alone (default 1: one at a time)")
    parser.add_argument("--processes", action="store_true",
                        help="with --concurrent K: the K seeds (and seed 0 alone) in fresh processes, one "
                             "each, not threads (each process's start counted)")
    parser.add_argument("--quick", action="store_true", help="a tiny CPU smoke run")
    parser.add_argument("--plot", type=Path, nargs="+", default=None, metavar="JSON",
                        help="train nothing: plot these results (runs merged by market) to --out's .png")
    args = options.parse(parser, argv)
    if args.quick:
        given = argv if argv is not None else sys.argv
        args.device, args.steps, args.n_envs, args.market_steps = "cpu", 600, 4, 2_000
        args.seeds = args.seeds if "--seeds" in given else 1
        args.strengths, args.score_every, args.learning_starts, args.batch_size = [2.0], 200, 200, 16
        args.eval_envs, args.eval_steps, args.net_arch, args.cap_seconds = 2, 50, "16", 60.0
        args.agents = args.agents if "--agents" in given else "iqn_joint,dqn"
    if args.concurrent < 1:
        parser.error(f"--concurrent {args.concurrent} must be >= 1")
    if args.score_every < 1 or args.target <= 0 or args.cap_seconds <= 0:
        parser.error(f"--score-every {args.score_every}, --target {args.target} and --cap-seconds "
                     f"{args.cap_seconds} must be positive")
    return args


def _record_run(label: str, runs: dict[str, list[dict[str, Any]]], agent: str, market: dict[str, Any],
                result: dict[str, Any], args: argparse.Namespace, run: dict[str, Any]) -> None:
    """Print a finished run's line, add it to ``runs`` and write the JSON so far."""
    shown = _seconds(run["seconds"] if run["reached"] else math.inf, args.cap_seconds)
    print(f"{label} seed {run['seed']}: {shown} s, best share {100 * run['best_share']:.1f} %, final "
          f"{100 * run['final_share']:.1f} %, trained {run['trained_steps']:,} steps in "
          f"{run['trained_s'] or 0:.1f} s, scoring {run['score_s']:.1f} s", flush=True)
    runs.setdefault(agent, []).append(run)
    market["runs"] = runs
    write_json(args.out, result)  # what is done survives a command cut short


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every market, agent and seed; print the tables; write the JSON."""
    args = parse_args(argv)
    if args.plot is not None:
        missing = [str(path) for path in args.plot if not path.is_file()]
        if missing:
            raise SystemExit(f"time_to_score: --plot: no such file: {', '.join(missing)}")
        results_read = [json.loads(path.read_text()) for path in args.plot]
        print(f"wrote {plot(results_read, args.out.with_suffix('.png'), args.target)}")
        return {"plotted": [str(path) for path in args.plot]}
    th.set_num_threads(args.threads)
    roster = options.roster_of(args)
    agents = [roster.get(a.strip()) for a in args.agents.split(",") if a.strip()]  # unknown: fails first
    result: dict[str, Any] = {"command": "python benchmarks/time_to_score.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "machine": machine_info(),
        "provenance": results.provenance(), "target": args.target, "markets": {}}
    for strength in args.strengths:
        args.signal_strength = strength
        setup = options.setup_of(args)
        scorer = HeldOutScorer(setup)
        runs: dict[str, list[dict[str, Any]]] = {}
        concurrency: dict[str, dict[str, Any]] = {}
        for agent in agents:
            market = {"oracle_pnl": scorer.oracle_pnl, "runs": runs}
            printed = functools.partial(_record_run, f"strength {strength:g} {agent.name}", runs, agent.name,
                                        market, result, args)
            result["markets"][f"{strength:g}"] = market
            _, record = run_seeds(agent, setup, scorer, args, printed)
            if record is not None:
                concurrency[agent.name] = record
        rows = {agent: summarise(agent_runs, args.cap_seconds) for agent, agent_runs in runs.items()}
        print(f"\n{setup.describe()}; oracle held-out PnL {scorer.oracle_pnl:,.0f}")
        print(table(rows, runs, args.target) + "\n", flush=True)
        for name, record in concurrency.items():
            print(concurrency_line(name, record), flush=True)
        result["markets"][f"{strength:g}"] = {"setup": setup.describe(), "oracle_pnl": scorer.oracle_pnl,
                                              "summary": rows, "runs": runs, "concurrency": concurrency}
    write_json(args.out, result)
    print(f"wrote {plot([result], args.out.with_suffix('.png'), args.target)}")
    return result


if __name__ == "__main__":
    main()
