"""Does it learn? Train several agents over seeds on one market and score them with the baselines on a
held-out one.

    python -m experiments.learning --name planted --signal-strength 0.5 --signal-horizon 5 \\
        --steps 20000 --n-envs 8 --seeds 3

Agents (``--agents``, comma separated): ``iqn`` (BranchingIQN with foxhunt's presets, hindsight on),
``iqn_lean`` (no hindsight, one ensemble head, no PopArt, no IQR / ensemble bonuses, ε multipliers 1, no
Boltzmann, no vaccine, c51_alpha 0, bottlenecks 64), ``dqn`` and ``qrdqn`` (SB3 DQN / sb3-contrib QR-DQN
over the 81 flat actions, same widths, batch, buffer, learning rate, replay ratio and budget);
``--ablations`` adds ``iqn-no_<feature>`` (presets with one feature off), ``--addbacks`` adds
``iqn_lean+<feature>``. Writes ``results.json``, ``results.md``, ``bars.png`` and ``curves.png`` into
``--out`` (default ``runs/experiments/<name>``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from experiments import harness


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.learning",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--name", default="learning", help="experiment name (the default output folder)")
    parser.add_argument("--out", default=None, help="output folder (default runs/experiments/<name>)")
    parser.add_argument("--data", default="synthetic", help="'synthetic' or a LOBSTER folder (train -> test)")
    parser.add_argument("--signal-strength", type=float, default=0.0, help="synthetic: planted signal")
    parser.add_argument("--signal-horizon", type=int, default=1, help="synthetic: planted signal's horizon")
    parser.add_argument("--market-steps", type=int, default=20_000, help="synthetic: steps of each market")
    parser.add_argument("--step-events", type=int, default=None, help="LOBSTER: messages per step")
    parser.add_argument("--levels", type=int, default=None, help="book levels (market and env)")
    parser.add_argument("--episode-length", type=int, default=None, help="env steps per episode")
    parser.add_argument("--train-market-seed", type=int, default=0)
    parser.add_argument("--eval-market-seed", type=int, default=1)
    parser.add_argument("--agents", default=",".join(harness.DEFAULT_AGENTS),
                        help="comma-separated agents (iqn, iqn_lean, dqn, qrdqn, iqn-no_X, iqn_lean+X)")
    parser.add_argument("--ablations", action="store_true", help="add iqn-no_<feature> for every feature")
    parser.add_argument("--addbacks", action="store_true", help="add iqn_lean+<feature> for every feature")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per agent (0..N-1)")
    parser.add_argument("--steps", type=int, default=20_000, help="training env steps (summed over books)")
    parser.add_argument("--n-envs", type=int, default=8, help="training books")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--net-arch", default=None, help="hidden widths, e.g. 64,64 (default: presets)")
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--buffer-size", type=int, default=None)
    parser.add_argument("--learning-starts", type=int, default=None)
    parser.add_argument("--train-freq", type=int, default=None, help="vector steps between gradient steps")
    parser.add_argument("--gradient-steps", type=int, default=None, help="gradient steps per update")
    parser.add_argument("--target-update-interval", type=int, default=None)
    parser.add_argument("--eval-envs", type=int, default=None,
                        help="held-out books (default: synthetic 16, LOBSTER the test split walked once)")
    parser.add_argument("--eval-steps", type=int, default=None, help="held-out vector steps (1 episode)")
    parser.add_argument("--eval-seed", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 suits small nets)")
    parser.add_argument("--reuse", action="store_true",
                        help="load runs already finished in the output folder instead of training them again")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds} must be >= 1")
    return args


def agent_list(args: argparse.Namespace) -> list[str]:
    """The agents to train, validated, in order, without repeats."""
    names = [a.strip() for a in args.agents.split(",") if a.strip()]
    if args.ablations:
        names += harness.ablation_agents()
    if args.addbacks:
        names += harness.addback_agents()
    names = list(dict.fromkeys(names))
    for name in names:
        harness.agent_spec(name)  # ValueError naming an unknown agent before any training
    return names


def budget_of(args: argparse.Namespace) -> harness.Budget:
    """The budget every agent shares."""
    overrides = {key: getattr(args, key) for key in ("learning_rate", "batch_size", "buffer_size",
                                                     "learning_starts", "train_freq", "gradient_steps",
                                                     "target_update_interval")
                 if getattr(args, key) is not None}
    net_arch = [int(w) for w in args.net_arch.split(",")] if args.net_arch else None
    env = {key: getattr(args, key) for key in ("levels", "episode_length") if getattr(args, key) is not None}
    return harness.Budget(steps=args.steps, n_envs=args.n_envs, device=args.device, overrides=overrides,
                          net_arch=net_arch, env_overrides=env)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the experiment; return what ``results.json`` holds."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    origin = harness.provenance()  # the code as it was when the run started
    agents = agent_list(args)
    seeds = list(range(args.seeds))
    setup = harness.MarketSetup(args.data, args.signal_strength, args.signal_horizon, args.market_steps,
                                args.train_market_seed, args.eval_market_seed, args.step_events, args.levels)
    budget = budget_of(args)
    out = Path(args.out or Path("runs") / "experiments" / args.name)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    print(f"{setup.describe()}\nagents {agents} x seeds {seeds}; {args.steps} steps x {args.n_envs} books "
          f"on {args.device}; output {out}")

    market = setup.train_market(args.device)
    runs: list[harness.TrainedRun] = []
    bar = tqdm([(a, s) for a in agents for s in seeds], desc="training", disable=not progress)
    for agent, seed in bar:
        bar.set_postfix_str(f"{agent} seed {seed}")
        done = harness.load_run(agent, seed, out, args.device, args.steps) if args.reuse else None
        runs.append(done or harness.train_agent(agent, seed, market, setup, budget, out, progress=False))
    del market

    eval_envs = args.eval_envs or None
    settings = harness.EvalSettings(eval_envs, args.eval_steps, args.eval_seed)
    models = {harness.run_key(r.agent, r.seed): r.model for r in runs}
    evaluation = harness.evaluate_models(models, setup, budget, settings, progress=progress)
    rows = harness.summarise(evaluation, agents, seeds)
    times = {a: sum(r.seconds for r in runs if r.agent == a) / len(seeds) for a in agents}
    table = harness.markdown_table(rows, times)
    title = f"{args.name}: {setup.describe()}; {args.steps} steps x {args.n_envs} books, {len(seeds)} seeds"
    harness.bar_chart(rows, out / "bars.png", title)
    curves = {a: [r.curve for r in runs if r.agent == a] for a in agents}
    harness.curve_chart(curves, out / "curves.png", f"{args.name}: training episode reward")

    command = "python -m experiments.learning " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {
        "experiment": "learning",
        "command": command,
        "args": vars(args),
        "provenance": origin,
        "market": setup.describe(),
        "agents": {a: vars(harness.agent_spec(a)) for a in agents},
        "summary": rows,
        "train_seconds": {harness.run_key(r.agent, r.seed): r.seconds for r in runs},
        "curves": {harness.run_key(r.agent, r.seed): r.curve for r in runs},
        "evaluation": evaluation.to_json(),
    }
    harness.write_json(out / "results.json", payload)
    held = evaluation.setup
    held_out = (f"held-out: {held['books']} books x {held['vector_steps']} steps, "
                f"{held['independent_steps']} independent steps, market {held['market']}")
    (out / "results.md").write_text(f"# {args.name}\n\n`{command}`\n\n{setup.describe()}; {held_out}\n\n"
                                    f"{table}\n\n![bars](bars.png)\n\n![curves](curves.png)\n")
    print(f"\n{held_out}\n\n{table}\n\nwritten: {out}/results.json, results.md, bars.png, curves.png")
    return payload


if __name__ == "__main__":
    main()
