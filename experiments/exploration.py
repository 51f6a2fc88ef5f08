"""Exploration's success criteria (issue 16), on the greedy policy scored on a held-out market.

    python -m experiments.exploration --steps 20000 --n-envs 8 --seeds 3

Each seed trains one agent (``--agent``, default ``iqn``: BranchingIQN with foxhunt's presets) in one
``learn`` call, stopping at five equal fractions of the budget (the *evaluation epochs*) to score its greedy
policy on the same held-out windows. Criteria, required of every seed:

1. after training, the greedy policy's magnitude branch picks Half > 15 % and Full > 10 % of book-steps;
2. its order branch picks LimitMaker > 5 % and IoC > 3 %;
3. the per-step Sharpe of evaluation epochs 2-5 lies within ±0.3 of epoch 1's;
4. no CUDA-graph recapture during training (at most one graph per step kind; CUDA runs only).

Prints PASS/FAIL per criterion with the numbers; writes ``exploration.json`` and ``exploration.png`` into
``--out`` (default ``runs/experiments/exploration``).

The market, budget, held-out evaluation, ``--device-loop``, ``--env-kwargs`` and ``--agent-kwargs`` options
are those of ``experiments.learning`` (:mod:`experiments.options`): ``--agent`` may name a custom agent;
``exploration.json`` records it and the loop that trained it. Each run trains through :mod:`foxhunt.runs`
into ``<out>/<agent>/seed<k>/``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from experiments import options, results, runner
from experiments.runner import CurveCallback
from foxhunt.evaluation.api import split_env_kwargs

#: Evaluation epochs per run.
EPOCHS = 5
#: Least shares of the greedy action mix: (branch, value index, value name, share).
MIX_FLOORS: tuple[tuple[str, int, str, float], ...] = (
    ("magnitude", 1, "Half", 0.15), ("magnitude", 2, "Full", 0.10),
    ("order", 1, "LimitMaker", 0.05), ("order", 2, "IoC", 0.03),
)
#: Largest distance of an epoch's Sharpe from epoch 1's.
SHARPE_BAND = 0.3
#: Step kinds a graphed BranchingIQN captures once each (plain and vaccine).
GRAPH_KINDS = 2


def judge(epochs: Sequence[Sequence[dict[str, Any]]], graph_captures: Sequence[int], cuda: bool) -> (
    list[tuple[str, bool | None, str]]
):
    """PASS (True), FAIL (False) or not applicable (None) per criterion, with the numbers.

    :param epochs: per seed, the metrics of each evaluation epoch (the last = after training).
    :param graph_captures: per seed, the CUDA graphs captured during training.
    :param cuda: whether the runs were graphed on CUDA.
    """
    verdicts: list[tuple[str, bool | None, str]] = []
    for branch in ("magnitude", "order"):
        floors = [f for f in MIX_FLOORS if f[0] == branch]
        shares = [[run[-1]["action_mix"][branch][index] for _, index, _, _ in floors] for run in epochs]
        passed = all(share > floor for run in shares for share, (_, _, _, floor) in zip(run, floors,
                                                                                        strict=True))
        label = " and ".join(f"{name} > {100 * floor:.0f} %" for _, _, name, floor in floors)
        numbers = "; ".join(
            f"{name} per seed {[f'{100 * run[i]:.1f} %' for run in shares]}"
            for i, (_, _, name, _) in enumerate(floors))
        verdicts.append((f"{branch}: {label}", passed, numbers))
    sharpes = [[float(e["sharpe"]) for e in run] for run in epochs]
    gaps = [[s - run[0] for s in run[1:]] for run in sharpes]
    passed = all(abs(g) <= SHARPE_BAND for run in gaps for g in run)
    verdicts.append((f"Sharpe of epochs 2-{EPOCHS} within ±{SHARPE_BAND} of epoch 1", passed,
                     "per seed " + "; ".join(f"[{', '.join(f'{s:.3f}' for s in run)}]" for run in sharpes)))
    if cuda:
        verdicts.append(("no CUDA-graph recapture", all(n <= GRAPH_KINDS for n in graph_captures),
                         f"graphs captured per seed {list(graph_captures)} (<= {GRAPH_KINDS})"))
    else:
        verdicts.append(("no CUDA-graph recapture", None, "not applicable: CPU run (no CUDA graphs)"))
    return verdicts


def plot(epochs: Sequence[Sequence[dict[str, Any]]], marks: Sequence[int], path: Path, title: str) -> Path:
    """Sharpe per evaluation epoch per seed (with the ±0.3 band around epoch 1) and the final action mix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, run in enumerate(epochs):
        sharpe = [float(e["sharpe"]) for e in run]
        ax.plot(marks, sharpe, marker="o", color=f"C{i}", label=f"seed {i}")
        ax.fill_between(marks, sharpe[0] - SHARPE_BAND, sharpe[0] + SHARPE_BAND, color=f"C{i}", alpha=0.08)
    ax.set_xlabel("environment steps at the evaluation")
    ax.set_ylabel("held-out Sharpe per step (greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    names = {"direction": ("short", "flat", "long"), "magnitude": ("Quarter", "Half", "Full"),
             "order": ("Market", "LimitMaker", "IoC"), "urgency": ("1/3", "2/3", "all")}
    width = 0.8 / max(len(epochs), 1)
    labels = [f"{b[:3]}\n{v}" for b in names for v in names[b]]
    x = np.arange(len(labels))
    for i, run in enumerate(epochs):
        values = [share for b in names for share in run[-1]["action_mix"][b]]
        bx.bar(x + (i - (len(epochs) - 1) / 2) * width, values, width, color=f"C{i}", label=f"seed {i}")
    for branch, index, _, floor in MIX_FLOORS:
        j = list(names).index(branch) * 3 + index
        bx.hlines(floor, j - 0.45, j + 0.45, color="k", lw=1.5)
    bx.set_xticks(x, labels, fontsize=7, rotation=45)
    bx.set_ylabel("share of book-steps (greedy, after training)")
    bx.set_title("final greedy action mix; black bars: the criteria's floors", fontsize=8)
    bx.grid(axis="y", alpha=0.3)
    bx.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class GraphCounter(CurveCallback):
    """A :class:`~experiments.runner.CurveCallback` that also keeps every CUDA graph a graphed BranchingIQN
    captured (gradient steps, fused collect + train blocks): more than one per step kind is a recapture."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.graphs: list[Any] = []  # the graph objects themselves: an id() could be reused after a free

    def _on_step(self) -> bool:
        graphs = [getattr(getattr(self.model, name, None), "graph", None)
                  for name in ("_graphed_step", "_graphed_vaccine_step")]
        block = getattr(getattr(self.model, "collector", None), "block", None)  # BranchingIQN's fused graphs
        graphs += list(block.graphs.values()) if block is not None else []
        self.graphs += [g for g in graphs if g is not None and not any(g is known for known in self.graphs)]
        return super()._on_step()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.exploration",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", default="runs/experiments/exploration")
    parser.add_argument("--agent", default="iqn", help="agent name as in experiments.learning (custom too)")
    options.add_arguments(parser)
    parser.add_argument("--no-progress", action="store_true")
    return options.parse(parser, argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train over the seeds with evaluation epochs, check the criteria, write the JSON and the figure."""
    from foxhunt.evaluation import evaluate

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    origin = results.provenance()  # the code as it was when the run started
    agent = options.roster_of(args).get(args.agent)
    setup = options.setup_of(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs, market_kwargs = split_env_kwargs(setup.config(agent, 0).resolved_env_kwargs())
    market_kwargs.pop("market_seed", None)
    if setup.synthetic:
        market_kwargs["num_steps"] = setup.market_steps
    loop = setup.loop_of(agent)
    print(f"{setup.describe()}\n{args.agent} x seeds {list(range(args.seeds))}; {args.steps} steps x "
          f"{args.n_envs} books on {args.device} ({loop} loop); output {out}")

    epochs: list[list[dict[str, Any]]] = []
    captures: list[int] = []
    marks: list[int] = []
    for seed in tqdm(range(args.seeds), desc="seeds", disable=args.no_progress):
        scores: list[dict[str, Any]] = []
        marks = []

        def at_epoch(model: Any, k: int, scores: list[dict[str, Any]] = scores, marks: list[int] = marks) -> (
            None
        ):
            result = evaluate(model, setup.data, n_envs=setup.eval_envs, steps=setup.eval_steps,
                              seed=setup.eval_seed, market_seed=setup.eval_market_seed, split="test",
                              env_kwargs=env_kwargs, market_kwargs=market_kwargs, device=args.device,
                              name="policy")
            scores.append(result.metrics)
            marks.append(int(model.num_timesteps))

        counter = GraphCounter(args.steps, checkpoints=EPOCHS, at_checkpoint=at_epoch)
        runner.train(agent, seed, setup, out / args.agent / f"seed{seed}", counter)
        epochs.append(scores)
        captures.append(len(counter.graphs))

    cuda = torch.device(args.device).type == "cuda" and agent.algorithm == "iqn"
    verdicts = judge(epochs, captures, cuda)
    for label, passed, numbers in verdicts:
        print(f"{'n/a ' if passed is None else 'PASS' if passed else 'FAIL'}  {label}: {numbers}")
    title = (f"exploration criteria, {args.agent}: {setup.describe()}; {args.steps} steps x {args.n_envs} "
             f"books, {args.seeds} seeds, {loop} loop")
    plot(epochs, marks, out / "exploration.png", title)
    payload = {"experiment": "exploration", "command": options.command_line("exploration", argv),
               "args": vars(args), "provenance": origin, "market": setup.describe(), "agent": agent.record(),
               "env_overrides": setup.env_kwargs, "loop": loop,
               "verdicts": [{"criterion": c, "pass": p, "numbers": n} for c, p, n in verdicts],
               "epoch_steps": marks, "graph_captures": captures,
               "epochs": [[{k: e[k] for k in ("sharpe", "pnl", "trades", "action_mix")} for e in run]
                          for run in epochs]}
    results.write_json(out / "exploration.json", payload)
    print(f"written: {out}/exploration.json, exploration.png")
    return payload


if __name__ == "__main__":
    main()
