"""Hindsight judged by its own promise (issue 23.2): environment steps and seconds until the held-out share of
the oracle's PnL first reaches 50 %, with and without hindsight, on a market where exit timing is the skill.

    python -m experiments.hindsight_speed --device cuda --seeds 5      # the measurement
    python -m experiments.hindsight_speed --quick                      # a CPU smoke run (seconds)

The market has planted waves (``--market-kwargs``, default :data:`WAVES`; :func:`foxenv.data.synthetic.
wave_schedule`): the onset of a wave shows in the top-of-book imbalance, its end only weakly, and it gives its
move back after its end, so exiting early and holding on both cost; the oracle is the wave oracle (perfect
foresight of the waves' timing). The agent (``--agent``, default the default face's agent: ``iqn_joint`` on
the joint face) trains twice per seed, hindsight on and off (``Roster.hindsight_arms``), each run scored on
the held-out market every ``--score-every`` env steps (:mod:`experiments.scoring`, as
``benchmarks/time_to_score.py``) until the share reaches ``--target`` (or ``--cap-seconds`` of training, or
``--steps``: then it is censored at what it trained). ``--concurrent-seeds K`` trains K runs at once (a thread
and a CUDA stream each, :mod:`sb3_her_ext.concurrent`; with ``--processes`` a fresh process each; a seed's two
arms side by side): the env steps are those of a run alone, the seconds those of a shared device.

The statistics over the paired seeds: each arm's mean env steps and seconds to the target with a bootstrap
95 % interval, and the speed-up ``mean(off) / mean(on)`` with a paired bootstrap interval (the seeds resampled
together; :func:`foxhunt.evaluation.stats.block_bootstrap_means` with blocks of one). A censored run counts at
what it trained, a lower bound of its time: censored "off" runs make the speed-up a lower bound, censored "on"
runs an upper one (the table says which). The plan's target: >= 2x fewer steps with hindsight (its aim 10x);
its kill criterion: unless the speed-up's interval lies above 1, hindsight stays off by default.

Writes ``hindsight_speed.json``, ``hindsight_speed.md`` (the table) and ``hindsight_speed.png`` (share
against env steps per seed and arm; steps to the target per seed) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from experiments import options, results, scoring
from sb3_her_ext.concurrent import run_concurrently, run_in_processes

#: The waves of the measurement's market (over :class:`foxenv.data.SyntheticProfile`'s wave defaults: a wave
#: every ~50 quiet steps, 20 steps long on average, 10 ticks a step, given back after its end). There the
#: best fixed holding period after an onset (20 steps) earns ~45 % of the wave oracle's PnL, 10 or 30 steps
#: ~23 / ~39 % (seed 1, 16 books x 500 steps): 50 % needs some exit timing.
WAVES: dict[str, float] = {"wave_rate": 0.02}
#: The plan's target: hindsight reaches the score in at least this many times fewer env steps.
TARGET_SPEEDUP = 2.0
#: Bootstrap resamples of the intervals, and their confidence level.
RESAMPLES, LEVEL = 10_000, 0.95


def default_agent() -> str:
    """The agent of the default action face (``foxhunt.presets.ACTION_FACE``)."""
    from foxhunt import presets

    return "iqn_joint" if presets.ACTION_FACE == "joint" else "iqn"


def to_target(run: dict[str, Any], key: str, share: float | None = None) -> tuple[float, bool]:
    """A run's env steps (``key="steps"``) or training seconds (``"seconds"``) to the target, and whether it
    is censored (not reached: then what it trained, a lower bound).

    :param share: another bar than the run's target, at most it: its first crossing among the run's scored
        points (None: the run's target).
    """
    if share is None and run["reached"]:
        return float(run[key]), False
    crossed = next((p for p in run["points"] if p["share"] >= share), None) if share is not None else None
    if crossed is not None:
        return float(crossed["steps"] if key == "steps" else crossed["train_s"]), False
    return float(run["trained_steps"] if key == "steps" else (run["trained_s"] or math.nan)), True


def interval(draws: torch.Tensor, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap draws."""
    tail = (1.0 - level) / 2.0
    low, high = torch.quantile(draws.double(), torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
    return float(low), float(high)


def compare(runs_on: Sequence[dict[str, Any]], runs_off: Sequence[dict[str, Any]], key: str,
            resamples: int = RESAMPLES, seed: int = 0, share: float | None = None) -> dict[str, Any]:
    """Each arm's mean ``key`` to the target with its bootstrap interval, and the speed-up ``mean(off) /
    mean(on)`` with a paired bootstrap interval over the seeds.

    :param runs_on: the hindsight-on runs, in seed order.
    :param runs_off: the hindsight-off runs, same seeds.
    :param key: ``"steps"`` or ``"seconds"``.
    :param share: a lower bar than the runs' target (:func:`to_target`); None: the target.
    :return: ``on`` / ``off`` (values, censored flags, mean, interval), ``speedup`` and its interval, and
        ``bound``: ``"exact"``, ``"lower"`` (only "off" runs censored), ``"upper"`` (only "on") or ``"none"``
        (both).
    """
    from foxhunt.evaluation.stats import block_bootstrap_means

    if len(runs_on) != len(runs_off) or not runs_on:
        raise ValueError(f"{len(runs_on)} runs with hindsight and {len(runs_off)} without: pairs are needed")
    out: dict[str, Any] = {}
    draws = {}
    for arm, runs in (("on", runs_on), ("off", runs_off)):
        values, censored = zip(*(to_target(run, key, share) for run in runs), strict=True)
        tensor = torch.tensor(values, dtype=torch.float64)
        # the same seed draws the same seed indices for both arms: a paired resample
        draws[arm] = block_bootstrap_means(tensor, resamples=resamples, block=1, seed=seed)
        out[arm] = {"values": list(values), "censored": list(censored), "mean": float(tensor.mean()),
                    "interval": interval(draws[arm])}
    out["speedup"] = out["off"]["mean"] / out["on"]["mean"]
    out["speedup_interval"] = interval(draws["off"] / draws["on"])
    on_cut, off_cut = any(out["on"]["censored"]), any(out["off"]["censored"])
    out["bound"] = {(False, False): "exact", (False, True): "lower", (True, False): "upper",
                    (True, True): "none"}[(on_cut, off_cut)]
    return out


def verdict(steps: dict[str, Any]) -> dict[str, Any]:
    """The plan's target (>= 2x fewer steps) and kill criterion (speed-up interval above 1) from
    :func:`compare`'s env steps."""
    low = steps["speedup_interval"][0]
    helps = low > 1.0 and steps["bound"] in ("exact", "lower")
    target = helps and steps["speedup"] >= TARGET_SPEEDUP
    return {"target_speedup": TARGET_SPEEDUP, "target_met": target, "helps": helps,
            "decision": ("hindsight speeds learning: on by default is supported" if helps else
                         "kill criterion: no demonstrated speed-up, hindsight stays off by default")}


def _ci(values: dict[str, Any], fmt: str) -> str:
    low, high = values["interval"]
    at_least = "≥ " if any(values["censored"]) else ""  # censored runs count at what they trained
    return f"{at_least}{fmt.format(values['mean'])} ({fmt.format(low)} – {fmt.format(high)})"


def _per_seed(values: dict[str, Any], fmt: str) -> str:
    return " / ".join(("≥ " if cut else "") + fmt.format(v)
                      for v, cut in zip(values["values"], values["censored"], strict=True))


def table(arms: dict[str, str], runs: dict[str, list[dict[str, Any]]], steps: dict[str, Any],
          seconds: dict[str, Any], decision: dict[str, Any], target: float,
          lower: tuple[float, dict[str, Any]] | None = None) -> str:
    """The markdown table: per arm the runs that reached the target, mean env steps and seconds to it with
    intervals and per seed, the best and final shares; then the speed-up and the verdict."""
    pct = f"{100 * target:.0f} %"
    head = ["arm", "hindsight", f"reached {pct}", f"env steps to {pct}: mean (95 % CI)", "per seed",
            f"training s to {pct}: mean (95 % CI)", "per seed", "best share (mean ± std)",
            "final share (mean ± std)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for side in ("on", "off"):
        arm = arms[side]
        best = [r["best_share"] for r in runs[arm]]
        final = [r["final_share"] for r in runs[arm]]
        lines.append("| " + " | ".join([
            arm, side, f"{sum(r['reached'] for r in runs[arm])}/{len(runs[arm])}",
            _ci(steps[side], "{:,.0f}"), _per_seed(steps[side], "{:,.0f}"), _ci(seconds[side], "{:.1f}"),
            _per_seed(seconds[side], "{:.1f}"),
            f"{100 * np.mean(best):.1f} ± {100 * np.std(best, ddof=1 if len(best) > 1 else 0):.1f} %",
            f"{100 * np.mean(final):.1f} ± {100 * np.std(final, ddof=1 if len(final) > 1 else 0):.1f} %",
        ]) + " |")
    bound = {"exact": "", "lower": " (a lower bound: runs without hindsight censored)",
             "upper": " (an upper bound: runs with hindsight censored)",
             "none": " (both arms censored: no bound)"}
    lines += [
        "",
        f"Speed-up with hindsight, mean env steps off / on: **{steps['speedup']:.2f}x** (paired bootstrap "
        f"95 % CI {steps['speedup_interval'][0]:.2f} – {steps['speedup_interval'][1]:.2f})"
        f"{bound[steps['bound']]}; "
        f"training seconds: {seconds['speedup']:.2f}x ({seconds['speedup_interval'][0]:.2f} – "
        f"{seconds['speedup_interval'][1]:.2f}){bound[seconds['bound']]}.",
        f"Target >= {TARGET_SPEEDUP:g}x fewer steps: **{'PASS' if decision['target_met'] else 'FAIL'}**; "
        f"{decision['decision']}.",
    ]
    if lower is not None:
        bar, low = lower
        lines.append(
            f"At the lower bar of {100 * bar:.0f} % (first crossing among the scored points; context, not "
            f"the verdict): env steps {_ci(low['on'], '{:,.0f}')} with hindsight, "
            f"{_ci(low['off'], '{:,.0f}')} without; speed-up {low['speedup']:.2f}x "
            f"({low['speedup_interval'][0]:.2f} – {low['speedup_interval'][1]:.2f}){bound[low['bound']]}.")
    return "\n".join(lines)


def plot(arms: dict[str, str], runs: dict[str, list[dict[str, Any]]], steps: dict[str, Any], target: float,
         path: Path, title: str) -> Path:
    """Share of the oracle against env steps (a line per seed and arm) and env steps to the target per seed
    (hollow: censored)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"on": "C0", "off": "C3"}
    for side in ("on", "off"):
        for i, run in enumerate(runs[arms[side]]):
            points = run["points"]
            ax.plot([p["steps"] for p in points], [100 * p["share"] for p in points], color=colors[side],
                    lw=1, alpha=0.7, label=f"{arms[side]} (hindsight {side})" if i == 0 else None)
        values, cut = steps[side]["values"], steps[side]["censored"]
        seeds = np.arange(len(values)) + (0.1 if side == "on" else -0.1)
        bx.scatter(seeds, values, color=colors[side], label=f"hindsight {side}",
                   facecolors=["none" if c else colors[side] for c in cut])
    ax.axhline(100 * target, color="k", ls="--", lw=0.8)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("held-out share of the oracle's PnL (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    bx.set_xticks(range(len(steps["on"]["values"])))
    bx.set_xlabel("seed")
    bx.set_ylabel(f"env steps to {100 * target:.0f} % (hollow: not reached, what it trained)")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.suptitle("\n".join(textwrap.wrap(title, 160)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (the experiments' market, budget and evaluation options, and the ones here)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.hindsight_speed",
                                     description=(__doc__ or "").split("\n\n")[0])
    options.add_arguments(parser)
    parser.set_defaults(seeds=5, steps=262_144, n_envs=64, market_steps=100_000,
                        market_kwargs=json.dumps(WAVES))
    parser.add_argument("--agent", default=None,
                        help="the BranchingIQN agent compared with hindsight on and off (default: the "
                             "default face's, iqn_joint on the joint face; custom ones too)")
    parser.add_argument("--target", type=float, default=0.5, help="share of the oracle's held-out PnL")
    parser.add_argument("--lower-bar", type=float, default=0.25,
                        help="also compare the env steps to this lower share (context; 0: none)")
    parser.add_argument("--score-every", type=int, default=32_768, help="env steps between scores")
    parser.add_argument("--cap-seconds", type=float, default=600.0, help="training seconds per run")
    parser.add_argument("--run-to-budget", action="store_true",
                        help="train on past the target to --steps (or the cap): the whole curve")
    parser.add_argument("--processes", action="store_true",
                        help="train each batch of --concurrent-seeds runs in fresh processes, one each, not "
                             "threads (their host work overlaps; threads share the GIL)")
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/hindsight_speed"))
    parser.add_argument("--quick", action="store_true", help="a tiny CPU smoke run (seconds)")
    parser.add_argument("--no-progress", action="store_true")
    args = options.parse(parser, argv)
    if args.quick:
        given = list(argv if argv is not None else sys.argv[1:])
        args.device, args.steps, args.n_envs, args.market_steps = "cpu", 400, 4, 3_000
        args.seeds = args.seeds if "--seeds" in given else 2
        args.score_every, args.learning_starts, args.batch_size, args.net_arch = 200, 100, 16, "16"
        args.eval_envs, args.eval_steps, args.cap_seconds, args.episode_length = 2, 100, 60.0, 100
    if args.score_every < 1 or args.target <= 0 or args.cap_seconds <= 0:
        parser.error(f"--score-every {args.score_every}, --target {args.target} and --cap-seconds "
                     f"{args.cap_seconds} must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train both arms over the seeds, scored as they train; write the JSON, the table and the figure."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    origin = results.provenance()
    roster = options.roster_of(args)
    on, off = roster.hindsight_arms(args.agent or default_agent())
    arms = {"on": on, "off": off}
    setup = options.setup_of(args)
    scorer = scoring.HeldOutScorer(setup)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{setup.describe()}; oracle held-out PnL {scorer.oracle_pnl:,.0f}\narms {on} (hindsight on) / "
          f"{off} (off) x seeds 0..{args.seeds - 1}; {args.steps:,} steps x {args.n_envs} books on "
          f"{args.device}, "
          f"scored every {args.score_every:,} steps; output {out}", flush=True)
    payload: dict[str, Any] = {
        "experiment": "hindsight_speed", "command": options.command_line("hindsight_speed", argv),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "provenance": origin, "market": setup.describe(), "oracle_pnl": scorer.oracle_pnl, "arms": arms,
        "agents": {a: roster.get(a).record() for a in (on, off)}, "target": args.target,
        "runs": {on: [], off: []},
    }
    runs: dict[str, list[dict[str, Any]]] = payload["runs"]
    pairs = [(s, side) for s in range(args.seeds) for side in ("on", "off")]  # a seed's arms side by side
    batch = args.concurrent_seeds
    for first in tqdm(range(0, len(pairs), batch), desc="training", disable=args.no_progress):
        jobs = pairs[first:first + batch]
        tasks = [lambda seed=seed, side=side: scoring.train_scored(
            roster.get(arms[side]), seed, setup, scorer, every=args.score_every, target=args.target,
            cap_seconds=args.cap_seconds, run_to_budget=args.run_to_budget) for seed, side in jobs]
        names = [f"{arms[side]} seed {seed}" for seed, side in jobs]
        if args.processes:
            done = run_in_processes(scoring.train_scored_in_process, [
                (roster.get(arms[side]), seed, setup, args.score_every, args.target, args.cap_seconds,
                 args.run_to_budget) for seed, side in jobs], names)
        else:
            done = (run_concurrently(tasks, names, [setup.device] * len(jobs)) if len(jobs) > 1
                    else [tasks[0]()])
        for (seed, side), run in zip(jobs, done, strict=True):
            runs[arms[side]].append(run)
            reached = (f"{run['steps']:,} steps, {run['seconds']:.1f} s" if run["reached"] else
                       f"not reached in {run['trained_steps']:,} steps")
            print(f"seed {seed} hindsight {side}: {reached}; best share {100 * run['best_share']:.1f} %",
                  flush=True)
        results.write_json(out / "hindsight_speed.json", payload)  # what is done survives a cut-short run
    steps = compare(runs[on], runs[off], "steps")
    seconds = compare(runs[on], runs[off], "seconds")
    decision = verdict(steps)
    lower = None
    if args.lower_bar and args.lower_bar < args.target:
        lower = (args.lower_bar, compare(runs[on], runs[off], "steps", share=args.lower_bar))
    markdown = table(arms, runs, steps, seconds, decision, args.target, lower)
    title = (f"hindsight speed: {on} vs {off}, {setup.describe()}; {args.steps:,} steps x {args.n_envs} "
             f"books, {args.seeds} seeds, {args.device}")
    plot(arms, runs, steps, args.target, out / "hindsight_speed.png", title)
    payload.update({"steps": steps, "seconds": seconds, "verdict": decision, "table": markdown,
                    "lower_bar": None if lower is None else {"share": lower[0], "steps": lower[1]}})
    results.write_json(out / "hindsight_speed.json", payload)
    (out / "hindsight_speed.md").write_text(f"`{payload['command']}`\n\n{setup.describe()}\n\n{markdown}\n")
    print("\n" + markdown)
    print(f"written: {out}/hindsight_speed.json, hindsight_speed.md, hindsight_speed.png")
    return payload


if __name__ == "__main__":
    main()
