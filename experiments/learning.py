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

Training loop: ``--device-loop auto|on|off`` (default ``auto``: on exactly on CUDA, as ``foxhunt train``).
On, the BranchingIQN agents collect through the device loop (``sb3_her_ext.device_loop``) on a
``foxhunt.device_env.DeviceLOBVecEnv``; DQN and QR-DQN keep SB3's loop on ``FlatActionVecEnv(LOBVecEnv)``.
``--env-cuda-graph`` also CUDA-graphs the device loop's env step. The evaluation is the same for every
policy either way; ``results.json`` (``loops``), each ``run.json`` (``loop``) and ``results.md`` record which
loop trained each run.

Custom agents: ``--agent-kwargs NAME=JSON`` (repeatable) defines agent ``NAME`` as a known agent
(``"base"``, default ``iqn``; an earlier custom one too) with ``"model"`` and ``"policy"`` arguments merged
over it (each key replaces the base's), then ``--agents`` may name it::

    --agent-kwargs 'iqn_x={"base": "iqn_lean", "model": {"learning_rate": 1e-4},
                           "policy": {"net_arch": [256, 256]}}' --agents iqn_x,iqn_lean,dqn

``--env-kwargs JSON`` sets env options (``foxenv.config.EnvConfig`` fields) over the presets for every
agent's training env and for the held-out evaluation, e.g. ``--env-kwargs '{"reward_scale": 0.01}'``.
A bad name, key or JSON is a ValueError naming it, raised before any training. ``--reuse`` retrains a run
whose recorded loop, books, env options or agent recipe differ from the command's.

The market, budget and evaluation options are shared with ``experiments.hindsight`` and
``experiments.exploration`` (``experiments/_common.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from experiments import _common, harness


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.learning",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--name", default="learning", help="experiment name (the default output folder)")
    parser.add_argument("--out", default=None, help="output folder (default runs/experiments/<name>)")
    parser.add_argument("--agents", default=",".join(harness.DEFAULT_AGENTS),
                        help="comma-separated agents (iqn, iqn_lean, dqn, qrdqn, iqn-no_X, iqn_lean+X, and "
                             "the --agent-kwargs ones)")
    parser.add_argument("--ablations", action="store_true", help="add iqn-no_<feature> for every feature")
    parser.add_argument("--addbacks", action="store_true", help="add iqn_lean+<feature> for every feature")
    _common.add_market_arguments(parser)
    _common.add_budget_arguments(parser)
    _common.add_eval_arguments(parser)
    parser.add_argument("--reuse", action="store_true",
                        help="load runs already finished in the output folder instead of training them again")
    parser.add_argument("--no-progress", action="store_true")
    return _common.check_args(parser, parser.parse_args(argv))


def agent_list(args: argparse.Namespace) -> list[str]:
    """The agents to train, validated, in order, without repeats (define the custom ones first)."""
    names = [a.strip() for a in args.agents.split(",") if a.strip()]
    if args.ablations:
        names += harness.ablation_agents()
    if args.addbacks:
        names += harness.addback_agents()
    names = list(dict.fromkeys(names))
    for name in names:
        harness.agent_spec(name)  # ValueError naming an unknown agent before any training
    return names


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the experiment; return what ``results.json`` holds."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    origin = harness.provenance()  # the code as it was when the run started
    custom = _common.define_agents(args)
    agents = agent_list(args)
    idle = [name for name in custom if name not in agents]
    if idle:
        print(f"defined by --agent-kwargs but not in --agents (not trained): {', '.join(idle)}")
    seeds = list(range(args.seeds))
    setup = _common.market_setup(args)
    budget = _common.budget_of(args)
    out = Path(args.out or Path("runs") / "experiments" / args.name)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    loops = {a: budget.loop_of(a) for a in agents}
    print(f"{setup.describe()}\nagents {agents} x seeds {seeds}; {args.steps} steps x {args.n_envs} books "
          f"on {args.device} (loops: {loops}); output {out}")

    market = setup.train_market(args.device)
    runs: list[harness.TrainedRun] = []
    bar = tqdm([(a, s) for a in agents for s in seeds], desc="training", disable=not progress)
    for agent, seed in bar:
        bar.set_postfix_str(f"{agent} seed {seed}")
        done = harness.load_run(agent, seed, out, args.device, args.steps, budget) if args.reuse else None
        runs.append(done or harness.train_agent(agent, seed, market, setup, budget, out, progress=False))
    del market

    settings = _common.eval_settings(args)
    models = {harness.run_key(r.agent, r.seed): r.model for r in runs}
    evaluation = harness.evaluate_models(models, setup, budget, settings, progress=progress)
    rows = harness.summarise(evaluation, agents, seeds)
    times = {a: sum(r.seconds for r in runs if r.agent == a) / len(seeds) for a in agents}
    table = harness.markdown_table(rows, times)
    title = f"{args.name}: {setup.describe()}; {args.steps} steps x {args.n_envs} books, {len(seeds)} seeds"
    harness.bar_chart(rows, out / "bars.png", title)
    curves = {a: [r.curve for r in runs if r.agent == a] for a in agents}
    harness.curve_chart(curves, out / "curves.png", f"{args.name}: training episode reward")

    command = _common.command_line("learning", argv)
    run_loops = {harness.run_key(r.agent, r.seed): r.loop for r in runs}
    payload = {
        "experiment": "learning",
        "command": command,
        "args": vars(args),
        "provenance": origin,
        "market": setup.describe(),
        "agents": {a: vars(harness.agent_spec(a)) for a in agents},
        "env_overrides": budget.env_overrides,
        "loops": run_loops,
        "summary": rows,
        "train_seconds": {harness.run_key(r.agent, r.seed): r.seconds for r in runs},
        "curves": {harness.run_key(r.agent, r.seed): r.curve for r in runs},
        "evaluation": evaluation.to_json(),
    }
    harness.write_json(out / "results.json", payload)
    held = evaluation.setup
    held_out = (f"held-out: {held['books']} books x {held['vector_steps']} steps, "
                f"{held['independent_steps']} independent steps, market {held['market']}")
    trained = f"training loops: {_common.loop_summary(run_loops)}"
    (out / "results.md").write_text(f"# {args.name}\n\n`{command}`\n\n{setup.describe()}; {held_out}; "
                                    f"{trained}\n\n{table}\n\n![bars](bars.png)\n\n![curves](curves.png)\n")
    print(f"\n{held_out}; {trained}\n\n{table}\n\nwritten: {out}/results.json, results.md, bars.png, "
          "curves.png")
    return payload


if __name__ == "__main__":
    main()
