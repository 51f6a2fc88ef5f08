"""Hindsight replay's kill criteria (issue 16), from the training diagnostics of paired runs.

    python -m experiments.hindsight --steps 20000 --n-envs 8 --seeds 3

For each seed, BranchingIQN with foxhunt's presets trains twice on the same market with the same seed:
hindsight on (``iqn``) and off (``iqn-no_hindsight``). From each run's ``diagnostics.jsonl``:

1. *injections*: within the first 10k environment steps the hindsight-on runs inject transitions
   (``backward + forward + relabel`` counts, which the buffer only makes on trade-close steps) > 0, in
   every seed;
2. *l_q no worse*: the IQN loss trajectory with hindsight is not worse than without: per seed the mean
   ``l_q`` over the intervals both runs logged; one-sided paired sign-flip permutation tests (H1: with
   hindsight higher) over the seeds' means and over every (seed, interval) pair (exact up to 2^12 sign
   patterns, else 20,000 seeded draws); the same over the last third of the intervals; PASS when no test
   finds it higher at the 5 % level.

Prints PASS/FAIL per criterion with the numbers; writes ``hindsight.json`` and ``hindsight.png`` into
``--out`` (default ``runs/experiments/hindsight``).

``--agent NAME`` compares another BranchingIQN agent (a custom one from ``--agent-kwargs NAME=JSON``
too) with hindsight on and off: the arms are ``NAME`` and ``NAME-no_hindsight`` (or ``NAME+hindsight``
and ``NAME`` when ``NAME`` has hindsight off). The market, budget, ``--device-loop``, ``--env-kwargs`` and
``--agent-kwargs`` options are those of ``experiments.learning`` (:mod:`experiments.options`); each run
trains through :mod:`foxhunt.runs` into ``<out>/<arm>/seed<k>/``; ``hindsight.json`` records the arms and
their loops.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from experiments import options, results, runner

#: Criterion 1's window: environment steps within which hindsight must have injected.
INJECTION_WINDOW = 10_000
#: Significance level of "worse" in criterion 2.
ALPHA = 0.05
#: The default agent (``--agent iqn``); :meth:`experiments.agents.Roster.hindsight_arms` gives its arms.
ON = "iqn"
#: Sign patterns a permutation test enumerates exactly; beyond, it draws this many at random (seeded).
EXACT_PATTERNS = 4096


def read_diagnostics(path: Path) -> list[dict[str, Any]]:
    """The lines of a ``diagnostics.jsonl``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def injections(lines: Sequence[dict[str, Any]], window: int = INJECTION_WINDOW) -> int:
    """Hindsight injections (backward + forward + relabel) logged at steps <= ``window``."""
    return int(sum(sum(int(line["hindsight"].get(k) or 0) for k in ("backward", "forward", "relabel"))
                   for line in lines if line.get("hindsight") and line["step"] <= window))


def lq_curve(lines: Sequence[dict[str, Any]]) -> dict[int, float]:
    """``{step: l_q}`` of the intervals that had gradient steps."""
    return {int(line["step"]): float(line["l_q"]) for line in lines if line.get("l_q") is not None}


def sign_flip_p(differences: Sequence[float]) -> float:
    """One-sided p-value of a paired sign-flip permutation test of ``mean(differences) > 0``: the share of
    sign patterns whose mean is at least the observed one (every pattern up to :data:`EXACT_PATTERNS`, else
    that many seeded random ones and the observed one)."""
    d = np.asarray(differences, dtype=float)
    if 2 ** d.size <= EXACT_PATTERNS:
        signs = 1 - 2 * ((np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1)
    else:
        draws = np.random.default_rng(0).choice([-1.0, 1.0], size=(EXACT_PATTERNS, d.size))
        signs = np.vstack([np.ones(d.size), draws])
    means = (signs * d).mean(axis=1)
    return float(np.mean(means >= d.mean() - 1e-12 * np.abs(d).max()))


def _paired(on: Sequence[dict[int, float]], off: Sequence[dict[int, float]], tail: float) -> dict[str, Any]:
    """Per-seed means over the last ``tail`` share of the intervals both runs logged, and the tests."""
    seed_means_on, seed_means_off, diffs = [], [], []
    for curve_on, curve_off in zip(on, off, strict=True):
        steps = sorted(set(curve_on) & set(curve_off))
        steps = steps[len(steps) - max(1, round(tail * len(steps))):] if steps else []
        a = np.array([curve_on[s] for s in steps])
        b = np.array([curve_off[s] for s in steps])
        seed_means_on.append(float(a.mean()) if steps else float("nan"))
        seed_means_off.append(float(b.mean()) if steps else float("nan"))
        diffs.extend((a - b).tolist())
    result: dict[str, Any] = {
        "mean_lq_on": seed_means_on, "mean_lq_off": seed_means_off,
        "mean_difference": float(np.mean(np.subtract(seed_means_on, seed_means_off))),
        "intervals_paired": len(diffs),
    }
    if len(seed_means_on) >= 2:
        result["seeds_p_on_higher"] = sign_flip_p(np.subtract(seed_means_on, seed_means_off))
    if len(diffs) >= 2 and any(d != 0 for d in diffs):
        result["intervals_p_on_higher"] = sign_flip_p(diffs)
    p_values = [result[k] for k in ("seeds_p_on_higher", "intervals_p_on_higher") if k in result]
    # with too few pairs for a test, "no worse" falls back to the sign of the mean difference
    result["pass"] = all(p >= ALPHA for p in p_values) if p_values else bool(result["mean_difference"] <= 0)
    return result


def compare_lq(on: Sequence[dict[int, float]], off: Sequence[dict[int, float]]) -> dict[str, Any]:
    """Criterion 2's numbers from paired per-seed ``l_q`` curves: over the whole trajectory and over its
    last third (where a worse end can hide behind a better start); it passes when neither is worse."""
    whole = _paired(on, off, 1.0)
    late = _paired(on, off, 1 / 3)
    return {**whole, "last_third": late, "pass": whole["pass"] and late["pass"]}


def plot(curves_on: Sequence[dict[int, float]], curves_off: Sequence[dict[int, float]],
         counts: Sequence[list[tuple[int, int]]], path: Path, title: str) -> Path:
    """l_q with and without hindsight (a thin line per seed, the mean thick) and cumulative injections."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for curves, label, color in ((curves_on, "hindsight on", "C0"), (curves_off, "hindsight off", "C3")):
        for curve in curves:
            ax.plot(list(curve), list(curve.values()), color=color, lw=0.6, alpha=0.4)
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if steps:
            ax.plot(steps, [np.mean([curve[s] for curve in curves]) for s in steps], color=color,
                    lw=2, label=f"{label} (mean of {len(curves)} seeds)")
    ax.set_yscale("log")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("l_q (IQN quantile-Huber loss, PopArt-normalised)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    for i, run in enumerate(counts):
        if run:
            steps, values = zip(*run, strict=True)
            bx.plot(steps, np.cumsum(values), label=f"seed {i}")
    bx.axvline(INJECTION_WINDOW, color="k", ls="--", lw=0.8, label=f"{INJECTION_WINDOW} steps")
    bx.set_xlabel("environment steps")
    bx.set_ylabel("cumulative hindsight injections")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.hindsight",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", default="runs/experiments/hindsight")
    parser.add_argument("--agent", default=ON,
                        help="the BranchingIQN agent compared with hindsight on and off (custom ones too)")
    options.add_arguments(parser, evaluation=False)
    parser.add_argument("--reuse", action="store_true",
                        help="read the diagnostics of runs already finished in --out with the same agent and "
                             "config instead of training them again")
    parser.add_argument("--no-progress", action="store_true")
    return options.parse(parser, argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both arms over the seeds, check the criteria, write the JSON and the figure."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    origin = results.provenance()  # the code as it was when the run started
    roster = options.roster_of(args)
    on, off = roster.hindsight_arms(args.agent)
    setup = options.setup_of(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seeds))
    loops = {arm: setup.loop_of(roster.get(arm)) for arm in (on, off)}
    print(f"{setup.describe()}\narms {on} (hindsight on) / {off} (off) x seeds {seeds}; {args.steps} steps x "
          f"{args.n_envs} books on {args.device} (loops: {loops}); output {out}")
    lines: dict[str, list[list[dict[str, Any]]]] = {on: [], off: []}
    for arm, seed in tqdm([(a, s) for s in seeds for a in (on, off)], desc="training",
                          disable=args.no_progress):
        agent, folder = roster.get(arm), out / arm / f"seed{seed}"
        if not (args.reuse and runner.load(agent, seed, setup, folder)):
            runner.train(agent, seed, setup, folder)
        lines[arm].append(read_diagnostics(folder / "diagnostics.jsonl"))

    injected = [injections(run) for run in lines[on]]
    crit1 = {"injections_within_10k": injected, "pass": all(n > 0 for n in injected),
             "window_steps": INJECTION_WINDOW, "covered": args.steps >= INJECTION_WINDOW}
    crit1["pass"] = crit1["pass"] and crit1["covered"]
    curves_on = [lq_curve(run) for run in lines[on]]
    curves_off = [lq_curve(run) for run in lines[off]]
    crit2 = compare_lq(curves_on, curves_off)
    late = crit2["last_third"]
    counts = [[(int(line["step"]), sum(int(line["hindsight"].get(k) or 0) for k in ("backward", "forward",
                                                                                      "relabel")))
               for line in run if line.get("hindsight")] for run in lines[on]]
    title = (f"hindsight kill criteria, {on} vs {off}: {setup.describe()}; {args.steps} steps x "
             f"{args.n_envs} books, {len(seeds)} seeds, loops {loops}")
    plot(curves_on, curves_off, counts, out / "hindsight.png", title)

    def pval(result: dict[str, Any], key: str) -> str:
        return f"{result.get(key, float('nan')):.3f}"

    verdicts = [
        (f"1. injections > 0 within {INJECTION_WINDOW} steps (every seed)", crit1["pass"],
         f"injections per seed {injected}" + ("" if crit1["covered"] else f"; only {args.steps} steps ran")),
        ("2. l_q with hindsight no worse than without", crit2["pass"],
         f"mean l_q on {np.round(crit2['mean_lq_on'], 4).tolist()} vs off "
         f"{np.round(crit2['mean_lq_off'], 4).tolist()}; mean difference {crit2['mean_difference']:+.4f}; "
         f"sign-flip p(on higher) over seeds {pval(crit2, 'seeds_p_on_higher')}, over "
         f"{crit2['intervals_paired']} intervals {pval(crit2, 'intervals_p_on_higher')}; last third: mean "
         f"difference {late['mean_difference']:+.4f}, p over seeds {pval(late, 'seeds_p_on_higher')}, over "
         f"{late['intervals_paired']} intervals {pval(late, 'intervals_p_on_higher')}"),
    ]
    for label, passed, numbers in verdicts:
        print(f"{'PASS' if passed else 'FAIL'}  {label}: {numbers}")
    payload = {"experiment": "hindsight", "command": options.command_line("hindsight", argv),
               "args": vars(args), "provenance": origin, "market": setup.describe(),
               "arms": {"on": on, "off": off}, "agents": {a: roster.get(a).record() for a in (on, off)},
               "env_overrides": setup.env_kwargs, "loops": loops,
               "criteria": {"injections": crit1, "l_q": crit2},
               "verdicts": [{"criterion": c, "pass": p, "numbers": n} for c, p, n in verdicts],
               "curves": {"on": curves_on, "off": curves_off}}
    results.write_json(out / "hindsight.json", payload)
    print(f"written: {out}/hindsight.json, hindsight.png")
    return payload


if __name__ == "__main__":
    main()
