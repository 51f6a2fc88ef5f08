"""The plan's criteria for the default agent (issue 23.3): a greedy action mix that does not collapse and a
held-out Sharpe that holds from epoch to epoch once the learning curve has converged.

    python -m experiments.criteria --signal-strength 2 --signal-horizon 5 --steps 40000 --n-envs 8 --seeds 5

Each seed trains one agent (``--agent``, default ``default``: the agent ``foxhunt train`` builds, BranchingIQN
with the presets on :data:`foxhunt.presets.ACTION_FACE`) in one ``learn`` call:

* *warm-up*: ``--steps`` environment steps (summed over books), a fixed budget at which the curve has
  converged, chosen from the learning experiment (``experiments/README.md`` (a): the default agent's
  held-out Sharpe is at its plateau after 40k steps x 8 books on the CPU and 256k x 64 on the H200). ε
  decays within the warm-up as in a run of that budget alone (:func:`warmup_schedule`), so the epochs run
  at the final ε (PER's β and the IQR bonus still anneal over the whole run). The report shows the held-out
  Sharpe at the warm-up's end (*epoch 0*) beside the epochs' and the training curve, so a curve still
  rising shows as such;
* then ``--epochs`` (5) *epochs* of ``--epoch-steps`` environment steps each; by default one epoch is one
  pass over the training market: as many book-steps as the training market has rows (``--market-steps``),
  so the unit is the data, not the number of books or the machine.

After the warm-up and after each epoch the greedy policy is scored on the held-out market (the same windows
every time, :func:`foxhunt.evaluation.evaluate_policies`; the oracle beside it on a planted market): the
per-step Sharpe of the PnL after fees (:func:`foxenv.metrics.sharpe_ratio`, pooled over book-steps; the
project's table metric), PnL and share of the oracle's PnL, and the action mix. Criteria (each seed):

1. after the last epoch the greedy magnitude is Half > 15 % and Full > 10 % of book-steps, the greedy order
   LimitMaker > 5 % and IoC > 3 % (:data:`experiments.market_mix.MIX_FLOORS`);
2. the Sharpe of epochs 2..E lies within ±0.3 of epoch 1's (:data:`SHARPE_BAND`).

The mix is counted over every book-step (the criterion as written) and over the *working* book-steps, those
whose target position differs from the position held before the step (where size and order type decide
something). The oracle's mix on the same windows says whether the criterion is fair on the market: an oracle
that never uses a size or an order type shows that the market does not need it.

Writes ``criteria.json``, ``criteria.md`` (the tables) and ``criteria.png`` (Sharpe per epoch per seed; the
action mix, agent against oracle) into ``--out`` (default ``runs/experiments/criteria``); each run trains
through :mod:`foxhunt.runs` into ``<out>/<agent>/seed<k>/``. The market, budget and held-out options are
those of ``experiments.learning`` (:mod:`experiments.options`).
"""

from __future__ import annotations

import argparse
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from experiments import market_mix, options, results, runner
from experiments.agents import Agent, Roster
from experiments.market_mix import MIX_FLOORS, MIX_SCOPES, VALUE_NAMES, action_mix
from foxenv import spec
from foxenv.config import EnvConfig, split_env_kwargs

#: Epochs after the warm-up.
EPOCHS = 5
#: Largest distance of an epoch's Sharpe from epoch 1's (the plan's criterion).
SHARPE_BAND = 0.3
#: The name ``--agent`` takes for the agent ``foxhunt train`` builds.
DEFAULT_AGENT = "default"
def default_agent() -> Agent:
    """The agent ``foxhunt train`` builds: BranchingIQN, the presets, :data:`foxhunt.presets.ACTION_FACE`
    (hindsight as :class:`foxhunt.runs.RunConfig` resolves it for that face)."""
    from foxhunt.presets import ACTION_FACE

    return Agent(DEFAULT_AGENT, action_face=ACTION_FACE)


def warmup_schedule(agent: Agent, setup: runner.Setup, warmup: int) -> Agent:
    """The agent with ε decaying within the warm-up as in a run of ``warmup`` steps alone: the run's
    ``exploration_fraction`` (of the whole budget ``setup.steps``) scaled by ``warmup / setup.steps``, so the
    warm-up is the run whose budget is known to converge and the epochs continue at the final ε."""
    fraction = float(setup.config(agent, 0).resolved_model_kwargs()["exploration_fraction"])
    return replace(agent, model={**agent.model, "exploration_fraction": fraction * warmup / setup.steps})


def agent_of(name: str, roster: Roster) -> Agent:
    """``--agent``'s agent: :func:`default_agent` for ``"default"``, else the roster's (custom ones too)."""
    return default_agent() if name == DEFAULT_AGENT else roster.get(name)


# -------------------------------------------------------------------------------------------- judging


def sharpe_gap(sharpes: Sequence[float]) -> float:
    """Largest ``|Sharpe of epoch k - Sharpe of epoch 1|`` over epochs 2.. (``sharpes[0]`` is epoch 1)."""
    return max((abs(s - sharpes[0]) for s in sharpes[1:]), default=0.0)


def judge(runs: Sequence[Mapping[str, Any]], scope: str = "all") -> list[dict[str, Any]]:
    """PASS or FAIL per criterion, per seed and over the seeds (PASS: every seed passes).

    :param runs: per seed, ``{"epochs": [epoch 0 (end of warm-up), epoch 1, ..., epoch E]}``, each epoch
        ``{"sharpe": float, "mix": action_mix(...)}``.
    :param scope: the mix the floors are judged on (:data:`MIX_SCOPES`).
    :return: one row per criterion: ``{"criterion", "values" (per seed), "passed" (per seed), "mean",
        "std", "pass"}``.
    """
    rows: list[dict[str, Any]] = []
    for branch, index, name, floor in MIX_FLOORS:
        values = [float(run["epochs"][-1]["mix"][scope][branch][index]) for run in runs]
        rows.append({"criterion": f"{name} > {100 * floor:.0f} %", "branch": branch, "value": name,
                     "floor": floor, "values": values, "passed": [v > floor for v in values]})
    gaps = [sharpe_gap([float(e["sharpe"]) for e in run["epochs"][1:]]) for run in runs]
    epochs = len(runs[0]["epochs"]) - 1 if runs else EPOCHS
    rows.append({"criterion": f"Sharpe of epochs 2-{epochs} within ±{SHARPE_BAND} of epoch 1",
                 "value": "sharpe_gap", "floor": SHARPE_BAND, "values": gaps,
                 "passed": [math.isfinite(g) and g <= SHARPE_BAND for g in gaps]})
    for row in rows:
        row["mean"], row["std"] = results.mean_std(row["values"])
        row["pass"] = all(row["passed"])
    return rows


def fairness(references: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per reference policy (the oracle, the best rule of :mod:`experiments.market_mix`) and scope, its own
    share of each floor's value and whether it clears the floor: a floor that no good policy clears asks for
    a size or order type the market does not need."""
    return {label: {scope: {name: {"share": float(ref["mix"][scope][branch][index]),
                                   "clears": bool(ref["mix"][scope][branch][index] > floor)}
                            for branch, index, name, floor in MIX_FLOORS} for scope in MIX_SCOPES}
            for label, ref in references.items()}


def needed(fair: Mapping[str, Any], reference: str) -> tuple[list[str], list[str]]:
    """The floors the reference policy clears on its working steps, and those it does not."""
    if reference not in fair:
        return [], []
    clears = fair[reference]["working"]
    return [n for n, v in clears.items() if v["clears"]], [n for n, v in clears.items() if not v["clears"]]


# ------------------------------------------------------------------------------------------ reporting


def _pct(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.1f} %"


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "**FAIL**"


def criteria_table(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int], fair: Mapping[str, Any],
                   scope: str = "all") -> str:
    """The criteria as a markdown table: per seed (value and verdict), mean ± std, the verdict over the seeds
    and each reference policy's own share on the same windows (same scope)."""
    head = ["criterion", *[f"seed {s}" for s in seeds], "mean ± std", "verdict (every seed)", *fair]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        sharpe = row["value"] == "sharpe_gap"
        fmt = (lambda v: f"{v:.3f}") if sharpe else _pct
        cells = [row["criterion"] + (" (largest gap)" if sharpe else "")]
        cells += [f"{fmt(v)} {'PASS' if ok else 'FAIL'}" for v, ok in zip(row["values"], row["passed"],
                                                                         strict=True)]
        cells.append(f"{fmt(row['mean'])} ± {fmt(row['std'])}" if len(seeds) > 1 else fmt(row["mean"]))
        cells.append(f"{_verdict(row['pass'])} ({sum(row['passed'])}/{len(seeds)})")
        for label in fair:
            share = fair[label][scope].get(row["value"])
            cells.append("n/a" if share is None else
                         f"{_pct(share['share'])} {'(clears)' if share['clears'] else '(does not clear)'}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def epoch_table(runs: Sequence[Mapping[str, Any]], seeds: Sequence[int],
                references: Mapping[str, Mapping[str, Any]]) -> str:
    """Held-out Sharpe per step (and share of the oracle's PnL) per epoch, per seed and mean ± std, and the
    reference policies' on the same windows."""
    count = len(runs[0]["epochs"])
    head = ["seed", *[f"epoch {k}" + (" (warm-up end)" if k == 0 else "") for k in range(count)]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(epoch: Mapping[str, Any]) -> str:
        share = epoch.get("oracle_share", math.nan)
        return f"{epoch['sharpe']:.3f}" + (f" ({100 * share:.0f} %)" if math.isfinite(share) else "")

    for seed, run in zip(seeds, runs, strict=True):
        lines.append("| " + " | ".join([str(seed), *[cell(e) for e in run["epochs"]]]) + " |")
    means = []
    for k in range(count):
        sharpe = results.mean_std([r["epochs"][k]["sharpe"] for r in runs])
        share = results.mean_std([r["epochs"][k].get("oracle_share", math.nan) for r in runs])
        shares = f" ({100 * share[0]:.0f} ± {100 * share[1]:.0f} %)" if math.isfinite(share[0]) else ""
        means.append(f"{sharpe[0]:.3f} ± {sharpe[1]:.3f}{shares}")
    lines.append("| " + " | ".join(["mean ± std", *means]) + " |")
    for label, ref in references.items():
        lines.append(f"| {label} | " + " | ".join([cell(ref)] * count) + " |")
    return "\n".join(lines)


def mix_table(runs: Sequence[Mapping[str, Any]], references: Mapping[str, Mapping[str, Any]]) -> str:
    """The action mix after the last epoch: every branch value, the agent's mean ± std over seeds beside the
    reference policies', over all book-steps and over the working ones."""
    head = ["branch", "value", *[f"{who}, {scope} steps" for scope in MIX_SCOPES
                                 for who in ("agent", *references)]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for branch in spec.BRANCH_NAMES:
        for v, value in enumerate(VALUE_NAMES[branch]):
            cells = [branch if v == 0 else "", value]
            for scope in MIX_SCOPES:
                mean, std = results.mean_std([r["epochs"][-1]["mix"][scope][branch][v] for r in runs])
                cells.append(f"{_pct(mean)} ± {_pct(std)}" if len(runs) > 1 else _pct(mean))
                cells += [_pct(ref["mix"][scope][branch][v]) for ref in references.values()]
            lines.append("| " + " | ".join(cells) + " |")
    cells = ["book-steps", ""]
    for scope in MIX_SCOPES:
        cells.append(f"{results.mean_std([r['epochs'][-1]['mix']['steps'][scope] for r in runs])[0]:,.0f}")
        cells += [f"{ref['mix']['steps'][scope]:,}" for ref in references.values()]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: Sequence[Mapping[str, Any]], marks: Sequence[int], references: Mapping[str, Mapping[str, Any]],
         path: Path, title: str) -> Path:
    """Three panels: the training curve per seed (the warm-up's end and the epochs marked), the held-out
    Sharpe per epoch per seed (the ±0.3 band around epoch 1, the references dashed) and the final action
    mix over every book-step (bars: the agent's seed mean, dots: seeds; hatched: the references; black
    ticks: the floors)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cx, ax, bx) = plt.subplots(1, 3, figsize=(18, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.7]})
    for i, run in enumerate(runs):
        if run.get("curve"):
            cx.plot(*zip(*run["curve"], strict=True), color=f"C{i}", lw=1, label=f"seed {run['seed']}")
    for k, mark in enumerate(marks):
        cx.axvline(mark, color="k", lw=1.2 if k == 0 else 0.5, ls="-" if k == 0 else ":")
    cx.set_xlabel("environment steps (solid: warm-up end; dotted: epoch ends)")
    cx.set_ylabel("training episode reward (ε-greedy, recent episodes)")
    cx.set_title("has the curve converged by the warm-up's end?", fontsize=8)
    cx.grid(alpha=0.3)
    epochs = np.arange(len(runs[0]["epochs"]))
    for i, run in enumerate(runs):
        sharpe = [float(e["sharpe"]) for e in run["epochs"]]
        ax.plot(epochs, sharpe, marker="o", color=f"C{i}", label=f"seed {run['seed']}")
        ax.fill_between(epochs[1:], sharpe[1] - SHARPE_BAND, sharpe[1] + SHARPE_BAND, color=f"C{i}",
                        alpha=0.07)
    for j, (label, ref) in enumerate(references.items()):
        ax.axhline(ref["sharpe"], color=f"{0.2 * j}", ls=("--", ":")[j % 2], lw=1, label=label)
    ax.set_xticks(epochs, ["warm-up\nend" if k == 0 else str(k) for k in epochs])
    ax.set_xlabel(f"epoch (env steps at each: {', '.join(f'{m:,}' for m in marks)})", fontsize=7)
    ax.set_ylabel("held-out Sharpe per step (greedy)")
    ax.set_title(f"shaded: ±{SHARPE_BAND} around epoch 1", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    labels = [f"{branch[:3]}\n{value}" for branch in spec.BRANCH_NAMES for value in VALUE_NAMES[branch]]
    x = np.arange(len(labels))
    width = 0.8 / (1 + len(references))
    values = np.array([[share for branch in spec.BRANCH_NAMES
                        for share in run["epochs"][-1]["mix"]["all"][branch]] for run in runs])
    left = x - 0.4 + width / 2
    bx.bar(left, values.mean(axis=0), width, color="C0", label="agent (seed mean)")
    for row in values:
        bx.scatter(left, row, color="k", s=8, zorder=3)
    for j, (label, ref) in enumerate(references.items()):
        shares = [share for branch in spec.BRANCH_NAMES for share in ref["mix"]["all"][branch]]
        bx.bar(left + (j + 1) * width, shares, width, color=("0.75", "0.5")[j % 2], hatch="//", label=label)
    for branch, index, _, floor in MIX_FLOORS:
        j = spec.BRANCH_NAMES.index(branch) * 3 + index
        bx.hlines(floor, j - 0.45, j + 0.45, color="k", lw=1.5)
    bx.set_xticks(x, labels, fontsize=7)
    bx.set_ylabel("share of book-steps (greedy, after the last epoch)")
    bx.set_title("action mix on the held-out market; black ticks: the criteria's floors", fontsize=8)
    bx.grid(axis="y", alpha=0.3)
    bx.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 160), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------- running


class EpochCallback(runner.CurveCallback):
    """A :class:`~experiments.runner.CurveCallback` that calls ``at_checkpoint(model, k)`` at the end of the
    warm-up (``k = 0``) and of each epoch (``k = 1..E``, the last one at the end of training)."""

    def __init__(self, warmup: int, epoch_steps: int, epochs: int, at_checkpoint: Any) -> None:
        super().__init__(warmup + epochs * epoch_steps, checkpoints=epochs + 1, at_checkpoint=at_checkpoint)
        self.marks = [warmup + k * epoch_steps for k in range(epochs + 1)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.criteria",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", default="runs/experiments/criteria")
    parser.add_argument("--agent", default=DEFAULT_AGENT,
                        help="agent name as in experiments.learning (custom too); default: foxhunt train's")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="epochs after the warm-up (>= 2)")
    parser.add_argument("--epoch-steps", type=int, default=None,
                        help="env steps of an epoch (default: --market-steps, one pass over the training "
                             "market)")
    parser.add_argument("--rules", default=None,
                        help="comma-separated rules of experiments.market_mix to fit the best rule over "
                             "(default: the whole family; 'none': no best rule)")
    options.add_arguments(parser)
    parser.add_argument("--no-progress", action="store_true")
    args = options.parse(parser, argv)
    if args.epochs < 2:
        parser.error(f"--epochs {args.epochs} must be >= 2 (epochs 2.. are compared with epoch 1)")
    if args.epoch_steps is not None and args.epoch_steps < 1:
        parser.error(f"--epoch-steps {args.epoch_steps} must be >= 1")
    return args


def best_rule(args: argparse.Namespace, setup: runner.Setup, env_kwargs: Mapping[str, Any],
              market_kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The best rule of :mod:`experiments.market_mix` fitted on the training market and scored on the
    held-out windows the agent is scored on (None without a planted signal, e.g. on waves alone, or with
    ``--rules none``)."""
    if not (setup.synthetic and setup.signal_strength > 0) or args.rules == "none":
        return None
    rules = None if args.rules is None else [r.strip() for r in args.rules.split(",") if r.strip()]
    found = market_mix.probe(market_kwargs, env_kwargs, train_market_seed=setup.train_market_seed,
                             eval_market_seed=setup.eval_market_seed, books=setup.eval_envs or 16,
                             steps=setup.eval_steps, seed=setup.eval_seed, device=setup.device, rules=rules)
    return {**found["held_out"]["best"], "fit": found["fit"]}


def score(model: Any, setup: runner.Setup, env_kwargs: Mapping[str, Any], market_kwargs: Mapping[str, Any],
          device: str, max_position: float) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The held-out score of ``model`` (Sharpe, PnL, trades, action mix, share of the oracle's PnL) and of
    the oracle when the market has one (else None)."""
    from foxhunt.evaluation import evaluate_policies

    evaluation = evaluate_policies({"policy": model}, setup.data, baselines=(), n_envs=setup.eval_envs,
                                   steps=setup.eval_steps, seed=setup.eval_seed,
                                   market_seed=setup.eval_market_seed, split="test",
                                   env_kwargs=env_kwargs, market_kwargs=market_kwargs, device=device)
    found = {}
    for name, result in evaluation.results.items():
        found[name] = {"sharpe": float(result.metrics["sharpe"]), "pnl": float(result.metrics["pnl"]),
                       "trades": int(result.metrics["trades"]),
                       "mix": action_mix(result.series, max_position)}
    policy, oracle = found["policy"], found.get("oracle")
    policy["oracle_share"] = policy["pnl"] / oracle["pnl"] if oracle and oracle["pnl"] else math.nan
    return policy, oracle


def train_seeds(args: argparse.Namespace, agent: Any, setup: runner.Setup, seeds: list[int], epoch_steps: int,
                out: Path, score_of: Any) -> tuple[list[dict[str, Any]], list[int], dict[str, Any] | None]:
    """Train one run a seed, scoring it after the warm-up and after every epoch with ``score_of(model)``.

    :return: the runs (seed, per-epoch scores, step marks, seconds, curve), the last run's step marks and
        the oracle's score (None without an oracle).
    """
    runs: list[dict[str, Any]] = []
    marks: list[int] = []
    oracle: dict[str, Any] | None = None
    for seed in tqdm(seeds, desc="seeds", disable=args.no_progress):
        epochs: list[dict[str, Any]] = []
        marks = []

        def at_epoch(model: Any, k: int, epochs: list[dict[str, Any]] = epochs,
                     marks: list[int] = marks) -> None:
            nonlocal oracle
            policy, oracle = score_of(model)
            epochs.append(policy)
            marks.append(int(model.num_timesteps))

        callback = EpochCallback(args.steps, epoch_steps, args.epochs, at_epoch)
        trained = runner.train(agent, seed, setup, out / agent.name / f"seed{seed}", callback)
        runs.append({"seed": seed, "epochs": epochs, "marks": list(marks), "seconds": trained.seconds,
                     "curve": trained.curve})
    return runs, marks, oracle


def fairness_line(references: dict[str, dict[str, Any]], fair: dict[str, Any]) -> str:
    """What the market needs: which floors each reference policy clears on its working steps."""
    notes = []
    for label in references:
        clears, misses = needed(fair, label)
        rule = f" `{references[label]['rule']}`" if "rule" in references[label] else ""
        notes.append(f"{label}{rule} (held-out PnL {references[label]['pnl']:,.0f}, Sharpe "
                     f"{references[label]['sharpe']:.3f}) on its working steps clears "
                     f"{', '.join(clears) or 'no floor'}" + (f", not {', '.join(misses)}" if misses else ""))
    return "; ".join(notes) or "no reference policy (no planted signal)"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Warm up, train the epochs with a held-out evaluation after each, judge, write the tables and figure."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    origin = results.provenance()  # the code as it was when the run started
    agent = agent_of(args.agent, options.roster_of(args))
    warm = options.setup_of(args)
    epoch_steps = args.epoch_steps or warm.market_steps
    setup = replace(warm, steps=args.steps + args.epochs * epoch_steps)
    agent = warmup_schedule(agent, setup, args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs, market_kwargs = split_env_kwargs(setup.config(agent, 0).resolved_env_kwargs())
    market_kwargs.pop("market_seed", None)
    if setup.synthetic:
        market_kwargs["num_steps"] = setup.market_steps
    max_position = EnvConfig(**env_kwargs).max_position
    loop = setup.loop_of(agent)
    seeds = list(range(args.seeds))
    print(f"{setup.describe()}\n{agent.name} ({agent.action_face} face) x seeds {seeds}; warm-up "
          f"{args.steps} steps, then {args.epochs} epochs of {epoch_steps} steps, x {args.n_envs} books on "
          f"{args.device} ({loop} loop); output {out}")
    best = best_rule(args, setup, env_kwargs, market_kwargs)
    runs, marks, oracle = train_seeds(
        args, agent, setup, seeds, epoch_steps, out,
        lambda model: score(model, setup, env_kwargs, market_kwargs, args.device, max_position),
    )

    references: dict[str, dict[str, Any]] = {}
    if oracle is not None:
        references["oracle"] = {**oracle, "oracle_share": 1.0}
    if best is not None:
        share = best["pnl"] / oracle["pnl"] if oracle and oracle["pnl"] else math.nan
        references["best rule"] = {**best, "oracle_share": share}
    rows, working = judge(runs), judge(runs, "working")
    fair = fairness(references)
    title = (f"criteria, {agent.name} ({agent.action_face} face): {setup.describe()}; warm-up {args.steps} + "
             f"{args.epochs} x {epoch_steps} steps x {args.n_envs} books, {len(seeds)} seed(s), {loop} loop")
    command = options.command_line("criteria", argv)
    verdict_lines = [f"{'PASS' if r['pass'] else 'FAIL'}  {r['criterion']}: per seed "
                     + ", ".join(f"{v:.3f}" for v in r["values"]) for r in rows]
    fair_line = fairness_line(references, fair)
    seconds = results.mean_std([r["seconds"] for r in runs])
    text = "\n\n".join([
        f"# criteria: {agent.name}", f"`{command}`",
        f"{title}. Epoch = {epoch_steps:,} env steps (summed over books); warm-up = {args.steps:,}. "
        f"Held out: {setup.eval_envs or 'the default (synthetic 16)'} books, market seed "
        f"{setup.eval_market_seed}; Sharpe per step of the PnL after fees; train {seconds[0]:.0f} ± "
        f"{seconds[1]:.0f} s per seed."
        + (" The best rule: experiments.market_mix's family fitted on the training market." if best else ""),
        "## Criteria (mix over every book-step, after the last epoch)", criteria_table(rows, seeds, fair),
        f"What the market needs: {fair_line}.",
        "## The mix criteria over the working book-steps (target differs from the position held)",
        criteria_table(working[:-1], seeds, fair, "working"),
        "## Held-out Sharpe per step per epoch (share of the oracle's PnL)",
        epoch_table(runs, seeds, references),
        "## Action mix after the last epoch, agent against the references", mix_table(runs, references),
        "![criteria](criteria.png)",
    ]) + "\n"
    plot(runs, marks, references, out / "criteria.png", title)
    (out / "criteria.md").write_text(text)
    payload = {"experiment": "criteria", "command": command, "args": vars(args), "provenance": origin,
               "market": setup.describe(), "agent": agent.record(), "env_overrides": setup.env_kwargs,
               "loop": loop, "warmup_steps": args.steps, "epoch_steps": epoch_steps, "epochs": args.epochs,
               "criteria": rows, "criteria_working": working[:-1], "references": references,
               "fairness": fair, "runs": runs}
    results.write_json(out / "criteria.json", payload)
    print("\n".join(verdict_lines) + f"\n{fair_line}\n\n{text}\nwritten: {out}/criteria.json, criteria.md, "
          "criteria.png")
    return payload


if __name__ == "__main__":
    main()
