"""Optimal execution (issue 36): every execution baseline, and any trained models, on the same disjoint
held-out windows, buys and sells, by implementation shortfall in bps; one command for the table.

    python -m experiments.execution --smoke
    python -m experiments.execution --data synthetic --horizon 50 --quantity 200
    python -m experiments.execution --data /path/to/lobster/GOOG --horizon 300 --volume-share 0.05 \\
        --model iqn=runs/execute_goog/model.zip
    python -m experiments.execution --seeds 5 --faces branched joint --train-steps 200000 --device cuda
    # GOOG's session split, 5-minute parents of 10 % of the window's volume; then AAPL fitted on GOOG
    python -m experiments.execution --data ../shared/data/lobster --split-times 12:30,13:30 \
        --step-seconds 10 --horizon 30 --volume-share 0.1
    python -m experiments.execution --data ../shared/data/lobster-aapl --fit-data ../shared/data/lobster \
        --levels 1 --split-times 12:30,13:30 --step-seconds 10 --horizon 30 --volume-share 0.1

The baselines (:mod:`foxhunt.evaluation.execution_baselines`: TWAP, TWAP limit-then-market, submit-and-leave,
immediate, Almgren-Chriss, VWAP) are fitted on the fit data: the synthetic market of seed 0 (what ``foxhunt
train`` trains on), or a LOBSTER folder's ``fit`` split (``--split-times``: a session split by clock; the
``--fit-data`` folder's, another ticker's, when given); they are scored on the held-out data: the synthetic
market of seed 1, or the folder's ``test`` split. A model (``--model NAME=PATH``, trained with ``foxhunt train
--env.task execute`` and the same execute settings) is scored on the same windows with its greedy actions;
``--seeds N`` trains BranchingIQN first, ``N`` seeds per action face (``--faces``), each a ``foxhunt train``
run under ``--out``/runs (its own report there; on LOBSTER data trained on the ``fit`` split only and
reported on ``validation``), and scores them all as ``iqn_<face>_s<seed>``; each face is compared with TWAP
and the best baseline as ``iqn_<face>``, its per-window shortfall averaged over the seeds.

Writes ``execution.json`` (the settings, the fitted model, per-window shortfalls, the report),
``execution.md`` (the tables and verdicts) and ``execution.png`` (the shortfall distributions and one window's
schedules) into ``--out`` (default ``runs/experiments/execution``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from experiments.results import provenance, write_json
from foxenv.config import EnvConfig
from foxenv.execution import window_quantities
from foxhunt.evaluation.api import build_market
from foxhunt.evaluation.execution_baselines import (
    EXECUTION_BASELINES,
    almgren_chriss_kappa,
    disjoint_offsets,
    fit_execution_model,
    make_execution_baseline,
)
from foxhunt.evaluation.execution_report import (
    execution_report,
    format_report,
    plot_execution,
    score_policies,
    summarize,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.execution",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="synthetic", help="'synthetic' or a LOBSTER folder")
    parser.add_argument("--fit-data", default=None,
                        help="LOBSTER: fit the baselines and train the agents on this folder's fit split "
                             "instead of --data's (another ticker: give both --levels 1)")
    parser.add_argument("--split-times", default=None,
                        help="LOBSTER: a session split 'FIT_END,VALIDATION_END' (e.g. 12:30,13:30): fit "
                             "before the first, held out after the second (default: the loader's fractions)")
    parser.add_argument("--step-seconds", type=float, default=None,
                        help="LOBSTER: clock seconds per step (default: the loader's 100 messages a step)")
    parser.add_argument("--horizon", type=int, default=50, help="steps T of a parent order (default: 50)")
    parser.add_argument("--quantity", type=float, default=200.0,
                        help="parent quantity in shares (default: 200)")
    parser.add_argument("--volume-share", type=float, default=None,
                        help="parent quantity as this share of the window's traded volume (not --quantity)")
    parser.add_argument("--windows", type=int, default=None, help="at most this many held-out windows")
    parser.add_argument("--risk-aversion", type=float, default=1e-5,
                        help="Almgren-Chriss lambda, per currency (0: TWAP; default: 1e-5)")
    parser.add_argument("--intervals", type=int, default=10, help="TWAP limit-then-market's slices")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                        help="a trained execute model to score (repeatable)")
    parser.add_argument("--num-steps", type=int, default=20_000,
                        help="synthetic market steps (default: 20,000)")
    parser.add_argument("--signal-strength", type=float, default=None,
                        help="synthetic planted signal strength")
    parser.add_argument("--signal-horizon", type=int, default=None,
                        help="steps ahead the synthetic planted signal forecasts (default: 1)")
    parser.add_argument("--seeds", type=int, default=0, help="BranchingIQN seeds to train per face")
    parser.add_argument("--faces", nargs="+", default=["branched"], choices=["branched", "joint"],
                        help="action faces of the trained agents (default: branched)")
    parser.add_argument("--train-steps", type=int, default=20_000, help="env steps per training run")
    parser.add_argument("--n-envs", type=int, default=8, help="books per training run (default: 8)")
    parser.add_argument("--gamma", type=float, default=None,
                        help="the agents' discount (default: the presets'; the parent's shortfall is the "
                             "undiscounted return, so a long horizon wants one near 1)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="env steps between a training run's checkpoints (default: 0, none; a finished "
                             "run is reused by its model.zip)")
    parser.add_argument("--levels", type=int, default=10, help="book levels (default: 10)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="runs/experiments/execution")
    parser.add_argument("--smoke", action="store_true", help="a CPU check of seconds")
    args = parser.parse_args(argv)
    if args.split_times is not None:
        times = tuple(t.strip() for t in args.split_times.split(",") if t.strip())
        if len(times) != 2:
            parser.error(f"--split-times={args.split_times!r} must be two clock times, e.g. 12:30,13:30")
        args.split_times = times
    if args.data == "synthetic" and (args.fit_data or args.split_times or args.step_seconds):
        parser.error("--fit-data, --split-times and --step-seconds apply to LOBSTER data, not 'synthetic'")
    if args.data != "synthetic" and (args.signal_strength is not None or args.signal_horizon is not None):
        parser.error("--signal-strength and --signal-horizon apply to the synthetic market, not LOBSTER data")
    if args.signal_horizon is not None and args.signal_horizon < 1:
        parser.error(f"--signal-horizon={args.signal_horizon} must be an integer >= 1")
    if args.smoke:
        args.horizon, args.num_steps, args.windows, args.train_steps = 20, 3000, 40, 1500
    return args


def markets(args: argparse.Namespace) -> tuple[Any, Any]:
    """The fit and the held-out markets."""
    if args.data == "synthetic":
        common = {"num_steps": args.num_steps, "levels": args.levels, "device": args.device,
                  **signal_options(args)}
        return build_market("synthetic", market_seed=0, **common), build_market("synthetic", market_seed=1,
                                                                                **common)
    common = {"levels": args.levels, "device": args.device, **lobster_options(args)}
    return (build_market(args.fit_data or args.data, split="fit", **common),
            build_market(args.data, split="test", **common))


def signal_options(args: argparse.Namespace) -> dict[str, Any]:
    """The synthetic market's planted-signal options set on the command line."""
    options = {"signal_strength": args.signal_strength, "signal_horizon": args.signal_horizon}
    return {name: value for name, value in options.items() if value is not None}


def lobster_options(args: argparse.Namespace) -> dict[str, Any]:
    """The LOBSTER loader's options set on the command line (session split, step clock)."""
    options: dict[str, Any] = {}
    if args.split_times is not None:
        options["split_times"] = list(args.split_times)
    if args.step_seconds is not None:
        options["step_seconds"] = args.step_seconds
    return options


def train_agents(args: argparse.Namespace, unit: dict[str, Any]) -> dict[str, Path]:
    """Train ``--seeds`` BranchingIQN runs per face (``foxhunt train`` on the fit data's market: the synthetic
    seed 0, or the folder's training split); returns name -> model file."""
    if args.seeds < 1:
        return {}
    from foxhunt.runs import RunConfig, train

    env = {"task": "execute", "episode_length": args.horizon, "levels": args.levels, **unit,
           **signal_options(args)}
    synthetic = args.data == "synthetic"
    # LOBSTER: train on the fit split only (the run's own report then scores the validation split), so
    # the agents see what the baselines are fitted on and nothing of the held-out test split
    run_options = {} if synthetic else {"eval_split": "validation"}
    env.update({} if synthetic else lobster_options(args))
    if args.gamma is not None:
        run_options["model_kwargs"] = {"gamma": args.gamma}
    models = {}
    for face in args.faces:
        for seed in range(args.seeds):
            name = f"iqn_{face}_s{seed}"
            folder = Path(args.out) / "runs" / name
            if not (folder / "model.zip").is_file():
                config = RunConfig(data=args.fit_data or args.data, steps=args.train_steps,
                                   n_envs=args.n_envs, seed=seed,
                                   device=args.device, action_face=face, progress=False, out=str(folder),
                                   checkpoint_every=args.checkpoint_every,
                                   synthetic_market_steps=args.num_steps, env_kwargs=env, **run_options)
                train(config)
            models[name] = folder / "model.zip"
    return models


def seed_report(scores: dict[str, dict[str, dict[str, Any]]], offsets: Any, horizon: int,
                faces: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, Any]]]]:
    """The report with each face's trained seeds as one policy, ``iqn_<face>``: its per-window shortfall the
    mean over the seeds (a seed's luck is not a window's evidence), compared with TWAP and the best baseline
    (one Holm family); each seed keeps its own summary row, not compared.

    :return: the report and the scores with the seed means added.
    """
    scores = {side: dict(by) for side, by in scores.items()}
    seeds: dict[str, list[str]] = {}
    for face in faces:
        names = [name for name in next(iter(scores.values())) if name.startswith(f"iqn_{face}_s")]
        if names:
            seeds[f"iqn_{face}"] = names
    for by in scores.values():
        for mean, names in seeds.items():
            by[mean] = {key: torch.stack([by[name][key].double() for name in names]).mean(dim=0)
                        for key in ("shortfall_bps", "done", "mid")}
    each = {name for names in seeds.values() for name in names}
    compared = {side: {name: r for name, r in by.items() if name not in each} for side, by in scores.items()}
    report = execution_report(compared, offsets, horizon)
    for side, by in scores.items():
        for name in each:
            report["summary"][side][name] = summarize(by[name]["shortfall_bps"])
    return report, scores


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fit, score, report; returns the JSON payload."""
    started = time.time()
    fit, test = markets(args)
    if args.volume_share is None:
        unit = {"exec_quantity": args.quantity, "exec_quantity_unit": "shares"}
    else:
        unit = {"exec_quantity": args.volume_share, "exec_quantity_unit": "volume"}
    config = EnvConfig(levels=args.levels, episode_length=args.horizon, task="execute", **unit)
    offsets = disjoint_offsets(test.num_steps, args.horizon, args.windows)
    slice_shares = float(window_quantities(fit, config).mean()) / args.horizon
    model = fit_execution_model(fit, slice_shares)
    kappa = almgren_chriss_kappa(args.risk_aversion, model.sigma, model.eta)
    policies: dict[str, Any] = {name: make_execution_baseline(name, args.horizon, model, args.risk_aversion,
                                                              args.intervals, config.grid.at_touch)
                                for name in EXECUTION_BASELINES}
    for spec in args.model:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--model {spec!r} must be NAME=PATH")
        from foxhunt.evaluation.baselines import ModelPolicy
        from foxhunt.evaluation.execution_report import load_execution_model

        model_file = load_execution_model(path, config.grid, device=args.device)
        policies[name] = ModelPolicy(model_file, name=name, grid=config.grid)
    for name, path in train_agents(args, unit).items():
        from foxhunt.evaluation.baselines import ModelPolicy
        from foxhunt.evaluation.execution_report import load_execution_model

        policies[name] = ModelPolicy(load_execution_model(path, config.grid, device=args.device), name=name,
                                     grid=config.grid)
    scores = score_policies(policies, test, config, offsets, args.device)
    report, scores = seed_report(scores, offsets, args.horizon, args.faces if args.seeds > 0 else [])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = format_report(report)
    parent = (f"Q = {args.quantity:g} shares" if args.volume_share is None else
              f"Q = {args.volume_share:g} of the window's volume")
    header = (f"Execution on {args.data} (held out: {test.name}; fitted on {fit.name}), T = {args.horizon} "
              f"steps, {parent}, "
              f"{len(offsets)} disjoint windows; fitted sigma {model.sigma:.4g}, eta {model.eta:.4g}; "
              f"Almgren-Chriss lambda {args.risk_aversion:g}, kappa T {kappa * args.horizon:.3g}\n\n")
    (out / "execution.md").write_text(header + table)
    plot_execution(scores, out / "execution.png")
    payload = {"command": " ".join(["python -m experiments.execution", *sys.argv[1:]]),
               **provenance(), "settings": vars(args), "model": dataclasses.asdict(model),
               "offsets": offsets.tolist(),
               "shortfall_bps": {side: {name: result["shortfall_bps"].tolist() for name, result in by.items()}
                                 for side, by in scores.items()},
               "report": report, "seconds": time.time() - started}
    write_json(out / "execution.json", payload)
    print(header + table)
    print(f"wrote {out / 'execution.md'}, {out / 'execution.json'}, {out / 'execution.png'}")
    return payload


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
