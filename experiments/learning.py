"""Does it learn? Train several agents over seeds on one market and score them with the baselines on a
held-out one.

    python -m experiments.learning --name planted --signal-strength 0.5 --signal-horizon 5 \\
        --steps 20000 --n-envs 8 --seeds 3

Agents (``--agents``, comma separated; :mod:`experiments.agents`): ``iqn``, ``iqn_joint``, ``iqn_lean``,
``dqn``, ``qrdqn``, the ``--agent-kwargs`` ones; ``--ablations`` adds ``iqn-no_<feature>``, ``--addbacks``
``iqn_lean+<feature>``. Each run trains through :mod:`foxhunt.runs` into ``<out>/<agent>/seed<k>/``; every
model and the baselines are then scored on the same held-out windows. Writes ``results.json``,
``results.md`` (the table), ``bars.png`` and ``curves.png`` into ``--out`` (default
``runs/experiments/<name>``). ``--reuse`` loads runs already finished there with the same agent and config.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from experiments import agents, options, results, runner


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.learning",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--name", default="learning", help="experiment name (the default output folder)")
    parser.add_argument("--out", default=None, help="output folder (default runs/experiments/<name>)")
    parser.add_argument("--agents", default=",".join(agents.DEFAULT_AGENTS), help="comma-separated agents")
    parser.add_argument("--ablations", action="store_true", help="add iqn-no_<feature> for every feature")
    parser.add_argument("--addbacks", action="store_true", help="add iqn_lean+<feature> for every feature")
    options.add_arguments(parser)
    parser.add_argument("--reuse", action="store_true",
                        help="load runs already finished in the output folder instead of training them again")
    parser.add_argument("--processes", action="store_true",
                        help="train each batch of --concurrent-seeds BranchingIQN runs in fresh processes, "
                             "one each, not threads (their host work overlaps; threads share the GIL)")
    parser.add_argument("--no-progress", action="store_true")
    return options.parse(parser, argv)


def agent_list(args: argparse.Namespace, roster: agents.Roster) -> list[str]:
    """The agents to train, validated, in order, without repeats."""
    names = [a.strip() for a in args.agents.split(",") if a.strip()]
    names += agents.ablation_agents() if args.ablations else []
    names += agents.addback_agents() if args.addbacks else []
    names = list(dict.fromkeys(names))
    for name in names:
        roster.get(name)  # ValueError naming an unknown agent before any training
    return names


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the experiment; return what ``results.json`` holds."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    origin = results.provenance()  # the code as it was when the run started
    roster = options.roster_of(args)
    names = agent_list(args, roster)
    seeds = list(range(args.seeds))
    setup = options.setup_of(args)
    out = Path(args.out or Path("runs") / "experiments" / args.name)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{setup.describe()}\nagents {names} x seeds {seeds}; {args.steps} steps x {args.n_envs} books on "
          f"{args.device}; output {out}")

    jobs = [(roster.get(name), seed, out / name / f"seed{seed}") for name in names for seed in seeds]
    loaded = [runner.load(agent, seed, setup, folder) if args.reuse else None for agent, seed, folder in jobs]
    pending = [job for job, done in zip(jobs, loaded, strict=True) if done is None]
    with tqdm(total=len(pending), desc="training", disable=args.no_progress) as bar:
        fresh = iter(runner.train_all(pending, setup, args.concurrent_seeds, on_done=lambda _: bar.update(),
                                         processes=args.processes))
    runs = [done or next(fresh) for done in loaded]

    evaluation = results.evaluate({results.run_key(r.agent, r.seed): r.model for r in runs}, setup,
                                  progress=not args.no_progress)
    rows = results.summarise(evaluation, names, seeds)
    times = {a: sum(r.seconds for r in runs if r.agent == a) / len(seeds) for a in names}
    table = results.markdown_table(rows, times)
    title = f"{args.name}: {setup.describe()}; {args.steps} steps x {args.n_envs} books, {len(seeds)} seeds"
    results.bar_chart(rows, out / "bars.png", title)
    results.curve_chart({a: [r.curve for r in runs if r.agent == a] for a in names}, out / "curves.png",
                        f"{args.name}: training episode reward")
    command = options.command_line("learning", argv)
    loops = {results.run_key(r.agent, r.seed): r.loop for r in runs}
    payload = {
        "experiment": "learning", "command": command, "args": vars(args), "provenance": origin,
        "market": setup.describe(), "agents": {a: roster.get(a).record() for a in names},
        "env_overrides": setup.env_kwargs, "loops": loops, "summary": rows,
        "train_seconds": {results.run_key(r.agent, r.seed): r.seconds for r in runs},
        "curves": {results.run_key(r.agent, r.seed): r.curve for r in runs},
        "evaluation": evaluation.to_json(),
    }
    results.write_json(out / "results.json", payload)
    held = evaluation.setup
    held_out = (f"held-out: {held['books']} books x {held['vector_steps']} steps, "
                f"{held['independent_steps']} independent steps, market {held['market']}")
    trained = "training loops: " + "; ".join(f"{a}: {setup.loop_of(roster.get(a))}" for a in names)
    (out / "results.md").write_text(f"# {args.name}\n\n`{command}`\n\n{setup.describe()}; {held_out}; "
                                    f"{trained}\n\n{table}\n\n![bars](bars.png)\n\n![curves](curves.png)\n")
    print(f"\n{held_out}; {trained}\n\n{table}\n\nwritten: {out}/results.json, results.md, bars.png, "
          "curves.png")
    return payload


if __name__ == "__main__":
    main()
