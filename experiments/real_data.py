"""The real-data experiment: does any agent have an edge on held-out LOBSTER data, after fees, against flat
and against a one-line rule on the same signal?

    python -m experiments.real_data --seeds 5 --steps 20000 --n-envs 16          # CPU, ~minutes per split
    python -m experiments.real_data --device cuda --seeds 5 --steps 100000 --n-envs 256

Splits (``--splits``, comma separated):

- ``session``: one day of ``--data`` (GOOG, 10 levels) cut by clock (``--split-times``, default 12:30 and
  13:30): the agents train and the imbalance rule is fitted on 09:30-12:30 (``fit``), they are scored after
  13:30 (``test``); 12:30-13:30 (``validation``) is left for model selection and not used here.
- ``cross-ticker``: train and fit on ``--data``'s fit session, score on ``--other``'s test session (AAPL),
  both read at one book level (AAPL's files have one), so the observation layout matches.
- ``cross-ticker-reverse``: the same the other way round.
- ``walk-forward`` (with ``--days FOLDER``, one LOBSTER pair per day): fit on days ``1..k``, score day
  ``k+1``, roll (``--min-fit-days``, ``--max-fit-days``); the windows of every test day are pooled into one
  paired comparison. ``foxenv.data.export.export_synthetic_days`` writes such a folder from the synthetic
  market.

Agents (``--agents``): ``iqn`` (foxhunt's default agent: :class:`foxhunt.runs.RunConfig`'s resolved
BranchingIQN, action face, presets and training loop), ``dqn`` (SB3 DQN) and ``qrdqn`` (sb3-contrib QR-DQN)
over the 81 joint actions with the same widths, batch, buffer, learning rate and replay ratio (QR-DQN with 32
quantiles, as the benchmarks' peer). Each trains
``--seeds`` seeds for ``--steps`` env steps on ``--n-envs`` books.

Scoring: every policy runs on every disjoint ``--episode-length`` window of the test session once
(:func:`foxhunt.evaluation.evaluate_policies`), beside flat, the imbalance rule (its threshold fitted on the
training session), the market maker, random and buy-and-hold. An agent's evidence is its per-window PnL
averaged over its seeds, paired with a baseline's on the same window; intervals are circular block
bootstraps over the time-ordered windows, p-values Holm-corrected over every agent x {flat, imbalance}
comparison of the split, and each comparison states how many windows its observed effect would need.

Writes into ``--out`` (default ``runs/experiments/real_data``): ``<split>.md`` and ``<split>.json`` (one table
per split), ``results.json`` (all splits, the command, timings), ``real_data.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: The splits this experiment knows.
SPLITS = ("session", "cross-ticker", "cross-ticker-reverse")
#: The agents it trains.
AGENTS = ("iqn", "dqn", "qrdqn")
#: Baselines scored beside the agents; the paired comparisons are against the first two.
BASELINES = ("flat", "imbalance", "market_maker", "random", "buy_and_hold")
COMPARED = ("flat", "imbalance")
#: QR-DQN's quantiles (benchmarks/train_step.py's peer).
QRDQN_QUANTILES = 32
#: DQN / QR-DQN arguments taken from the default agent's resolved settings (same budget and replay ratio).
SHARED_DQN_KWARGS = ("learning_rate", "buffer_size", "learning_starts", "batch_size", "gamma", "train_freq",
                     "gradient_steps", "target_update_interval", "exploration_fraction",
                     "exploration_final_eps")


@dataclass(frozen=True)
class SplitSpec:
    """Where a split trains and where it is scored."""

    name: str
    train_source: str
    train_split: str
    test_source: str
    test_split: str
    levels: int | None


def split_specs(names: Sequence[str], data: str, other: str, levels: int | None,
                days: str | None = None) -> list[SplitSpec]:
    """The :class:`SplitSpec` of each split name.

    :param names: split names from :data:`SPLITS`.
    :param data: the main LOBSTER folder (GOOG).
    :param other: the second ticker's folder (AAPL, one level).
    :param levels: book levels of the session and walk-forward splits (``None``: all of the file's).
    :param days: a folder of several LOBSTER days, for ``walk-forward``.
    :return: the specs, in order.
    """
    specs = {
        "session": SplitSpec("session", data, "fit", data, "test", levels),
        "cross-ticker": SplitSpec("cross-ticker", data, "fit", other, "test", 1),
        "cross-ticker-reverse": SplitSpec("cross-ticker-reverse", other, "fit", data, "test", 1),
        "walk-forward": SplitSpec("walk-forward", days or "", "days before", days or "", "next day", levels),
    }
    if "walk-forward" in names and not days:
        raise ValueError("--splits holds 'walk-forward', which needs --days FOLDER (a LOBSTER pair per day)")
    for name in names:
        if name not in specs:
            raise ValueError(f"--splits holds {name!r}; known splits are {', '.join(specs)}")
    return [specs[name] for name in names]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.real_data",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--data", default="../shared/data/lobster", help="main LOBSTER folder (one day)")
    parser.add_argument("--other", default="../shared/data/lobster-aapl",
                        help="second ticker's LOBSTER folder (one day) for the cross-ticker splits")
    parser.add_argument("--splits", default=",".join(SPLITS), help=f"comma-separated: {', '.join(SPLITS)}")
    parser.add_argument("--agents", default=",".join(AGENTS), help=f"comma-separated: {', '.join(AGENTS)}")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per agent (>= 1; 5 for the report)")
    parser.add_argument("--steps", type=int, default=20_000, help="training env steps per run")
    parser.add_argument("--n-envs", type=int, default=16, help="books per training vector step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gradient-steps", type=int, default=None,
                        help="gradient steps per vector step, every agent (default: the presets' 1)")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="clock seconds per market step")
    parser.add_argument("--episode-length", type=int, default=200,
                        help="steps of a training episode and of a scored window")
    parser.add_argument("--split-times", default="12:30,13:30", help="fit end and validation end (clock)")
    parser.add_argument("--levels", type=int, default=None, help="book levels of the session split")
    parser.add_argument("--days", default=None, help="walk-forward: a folder of LOBSTER days (one pair each)")
    parser.add_argument("--min-fit-days", type=int, default=1, help="walk-forward: the first fold's fit days")
    parser.add_argument("--max-fit-days", type=int, default=None,
                        help="walk-forward: a rolling window of at most this many fit days (default: all)")
    parser.add_argument("--cache-dir", default=None, help="LOBSTER cache folder (default the reader's)")
    parser.add_argument("--out", default="runs/experiments/real_data")
    parser.add_argument("--no-figure", action="store_true")
    args = parser.parse_args(argv)
    for name in ("seeds", "steps", "n_envs", "episode_length", "gradient_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    args.split_list = [s.strip() for s in args.splits.split(",") if s.strip()]
    args.agent_list = [a.strip() for a in args.agents.split(",") if a.strip()]
    for agent in args.agent_list:
        if agent not in AGENTS:
            parser.error(f"--agents holds {agent!r}; known agents are {', '.join(AGENTS)}")
    times = [t.strip() for t in args.split_times.split(",")]
    if len(times) != 2:
        parser.error(f"--split-times={args.split_times!r} must be two clock times, e.g. 12:30,13:30")
    args.split_times = tuple(times)
    try:
        split_specs(args.split_list, args.data, args.other, args.levels, args.days)
    except ValueError as error:
        parser.error(str(error))
    return args


def load(source: str, split: str, levels: int | None, args: argparse.Namespace) -> Any:
    """One session of a LOBSTER folder as a :class:`~foxenv.data.MarketData` on ``args.device``."""
    from foxenv.data import load_market

    return load_market(source, split=split, split_times=args.split_times, step_seconds=args.step_seconds,
                       levels=levels, cache_dir=args.cache_dir, device=args.device)


def folds(spec: SplitSpec, args: argparse.Namespace) -> Any:
    """``(label, training market, test market)`` of each fold: one for a session split, one per test day for
    walk-forward (fit on the days before it, :func:`foxenv.data.walk_forward`)."""
    from foxenv.data import find_lobster_days, load_market, walk_forward

    if spec.name != "walk-forward":
        yield "", load(spec.train_source, spec.train_split, spec.levels, args), load(
            spec.test_source, spec.test_split, spec.levels, args)
        return
    days = find_lobster_days(spec.train_source)
    options = {"step_seconds": args.step_seconds, "levels": spec.levels, "cache_dir": args.cache_dir,
               "device": args.device}
    for fit_days, test_day in walk_forward(len(days), args.min_fit_days, args.max_fit_days):
        label = f"fit {days[fit_days[0]].date}..{days[fit_days[-1]].date}, test {days[test_day].date}: "
        yield (label, load_market(spec.train_source, days=fit_days, **options),
               load_market(spec.train_source, days=[test_day], **options))


def run_config(args: argparse.Namespace, seed: int, levels: int) -> Any:
    """The default agent's :class:`~foxhunt.runs.RunConfig` for this budget (its resolved settings are what
    every agent here trains with)."""
    from foxhunt.runs import RunConfig

    model_kwargs = {} if args.gradient_steps is None else {"gradient_steps": args.gradient_steps}
    return RunConfig(steps=args.steps, n_envs=args.n_envs, device=args.device, seed=seed, progress=False,
                     checkpoint_every=0, model_kwargs=model_kwargs,
                     env_kwargs={"episode_length": args.episode_length, "levels": levels})


def train_agent(agent: str, market: Any, seed: int, levels: int, args: argparse.Namespace) -> Any:
    """Train one agent on ``market`` (the training session) and return the model."""
    from foxhunt.device_lob_env import DeviceLOBVecEnv
    from foxhunt.envs import LOBVecEnv

    config = run_config(args, seed, levels)
    env_kwargs = config.resolved_env_kwargs()
    env_kwargs.pop("market_seed", None)  # the market is loaded already
    env_kwargs["episode_length"] = min(int(env_kwargs["episode_length"]), market.num_steps - 1)
    model_kwargs = config.resolved_model_kwargs()
    if agent == "iqn":
        from sb3_her_ext.algorithm import BranchingIQN

        face = config.resolved_action_face()
        if config.resolved_device_loop():
            env = DeviceLOBVecEnv(args.n_envs, device=args.device, seed=seed, data=market, action_face=face,
                                  **env_kwargs)
        else:
            env = LOBVecEnv(args.n_envs, device=args.device, seed=seed, data=market, action_face=face,
                            **env_kwargs)
        model = BranchingIQN("MlpPolicy", env, seed=seed, device=args.device,
                             cuda_graph=config.resolved_cuda_graph(),
                             policy_kwargs=config.resolved_policy_kwargs(), **model_kwargs)
    else:
        env = LOBVecEnv(args.n_envs, device=args.device, seed=seed, data=market, action_face="joint",
                        **env_kwargs)
        kwargs = {k: model_kwargs[k] for k in SHARED_DQN_KWARGS if k in model_kwargs}
        policy_kwargs: dict[str, Any] = {"net_arch": list(config.resolved_policy_kwargs()["net_arch"])}
        if agent == "qrdqn":  # the benchmarks' peer: sb3-contrib's default 200 runs ~20x slower on a CPU
            policy_kwargs["n_quantiles"] = QRDQN_QUANTILES
        if agent == "dqn":
            from stable_baselines3 import DQN as cls
        else:
            try:
                from sb3_contrib import QRDQN as cls
            except ImportError:
                raise ValueError("--agents holds 'qrdqn', which needs sb3-contrib: pip install -e '.[bench]'"
                                 ) from None
        model = cls("MlpPolicy", env, seed=seed, device=args.device, policy_kwargs=policy_kwargs, **kwargs)
    model.learn(args.steps)
    return model


def _mean_std(values: Sequence[float]) -> dict[str, Any]:
    array = np.asarray(values, dtype=float)
    finite = array[np.isfinite(array)]
    mean = float(finite.mean()) if finite.size else math.nan
    std = float(finite.std(ddof=1)) if finite.size > 1 else 0.0
    return {"mean": mean, "std": std, "values": array.tolist()}


#: Metrics of the table: key of compute_metrics, column title, format.
TABLE = (("pnl", "PnL after fees", "{:,.0f}"), ("pnl_per_episode", "PnL / window", "{:,.1f}"),
         ("pnl_bps_of_notional", "bps of notional", "{:.2f}"), ("sharpe", "Sharpe / step", "{:.4f}"),
         ("trades", "closed trades", "{:,.0f}"))


def pool(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One policy's table metrics over several folds: PnL, trades, notional and windows summed, PnL per window
    and bps of notional from the sums, Sharpe per step the mean over folds (one fold: its own metrics)."""
    pnl = sum(float(m["pnl"]) for m in metrics)
    notional = sum(float(m["notional_traded"]) for m in metrics)
    windows = sum(int(m["episodes"]) for m in metrics)
    return {"pnl": pnl, "pnl_per_episode": pnl / max(windows, 1),
            "pnl_bps_of_notional": 1e4 * pnl / notional if notional > 0 else math.nan,
            "sharpe": float(np.mean([float(m["sharpe"]) for m in metrics])),
            "trades": float(sum(int(m["trades"]) for m in metrics))}


#: Start-row offset between folds: windows of different folds (different days) never count as overlapping.
FOLD_OFFSET = 2**40


def summarise(evaluations: Sequence[Any], agents: Sequence[str], seeds: Sequence[int],
              level: float = 0.95) -> dict[str, Any]:
    """Per agent (over seeds) and per baseline the table's metrics pooled over the folds; per agent the paired
    comparisons of its seed-mean window PnL against flat and the imbalance rule over every fold's windows,
    Holm-corrected over the split's family."""
    from foxhunt.evaluation import stats
    from foxhunt.evaluation.metrics import episode_pnl

    results = [evaluation.results for evaluation in evaluations]
    groups = {agent: [f"{agent}/seed{s}" for s in seeds] for agent in agents}
    groups.update({name: [name] for name in results[0] if "/" not in name})
    pooled = {key: pool([fold[key].metrics for fold in results]) for keys in groups.values() for key in keys}
    rows = {group: {"seeds": len(keys) if group in agents else None,
                    **{metric: _mean_std([pooled[k][metric] for k in keys]) for metric, _, _ in TABLE}}
            for group, keys in groups.items()}
    recordings = [next(iter(fold.values())).recording for fold in results]
    starts = torch.cat([r.offsets.reshape(-1) + k * FOLD_OFFSET for k, r in enumerate(recordings)])

    def windows(key: str) -> torch.Tensor:
        return torch.cat([episode_pnl(fold[key].recording).reshape(-1).cpu() for fold in results])

    comparisons: dict[str, list[dict[str, Any]]] = {}
    for agent in agents:
        seed_mean = torch.stack([windows(k) for k in groups[agent]]).mean(dim=0)
        comparisons[agent] = [
            stats.paired_windows(seed_mean, windows(b), starts, recordings[0].episode_length, baseline=b,
                                 level=level)
            for b in COMPARED if b in results[0]
        ]
    family = stats.correct(comparisons)
    for group in comparisons.values():
        for row in group:
            row.pop("differences")
    return {"rows": rows, "comparisons": comparisons, "family": family}


def _rule(setup: dict[str, Any]) -> str:
    fit = setup.get("fitted_baselines", {}).get("imbalance")
    if not fit:
        return "n/a"
    return f"{fit['order']} orders above |imbalance| {fit['threshold']:g} (fit PnL {fit['fit_pnl']:,.0f})"


def combined_setup(evaluations: Sequence[Any]) -> dict[str, Any]:
    """The setup of one fold's evaluation, or the folds' markets, steps and windows together."""
    if len(evaluations) == 1:
        setup = evaluations[0].setup
        if "imbalance" in setup.get("fitted_baselines", {}):
            setup["fitted_baselines"]["imbalance"]["rule"] = _rule(setup)
        return {**setup, "folds": 1}
    setups = [evaluation.setup for evaluation in evaluations]
    rules = [_rule(s) for s in setups]
    return {"market": " | ".join(s["market"] for s in setups), "folds": len(setups),
            "market_steps": sum(s["market_steps"] for s in setups),
            "windows": sum(s["windows"] for s in setups), "episode_length": setups[0]["episode_length"],
            "fitted_baselines": {"imbalance": {"rule": "; ".join(rules)}},
            "per_fold": setups}


def _cell(value: dict[str, Any], fmt: str, seeds: int | None) -> str:
    if not math.isfinite(value["mean"]):
        return "–"
    if seeds and seeds > 1:
        return f"{fmt.format(value['mean'])} ± {fmt.format(value['std'])}"
    return fmt.format(value["mean"])


def markdown(spec: SplitSpec, summary: dict[str, Any], setup: dict[str, Any],
             args: argparse.Namespace) -> str:
    """One split's table and verdicts as markdown."""
    fitted = setup.get("fitted_baselines", {}).get("imbalance", {})
    lines = [
        f"### {spec.name}: train {Path(spec.train_source).name} ({spec.train_split}), score "
        f"{Path(spec.test_source).name} ({spec.test_split})",
        "",
        f"Test: {setup['market']} ({setup['market_steps']:,} steps of {args.step_seconds:g} s), "
        f"**{setup['windows']} independent windows** of {setup['episode_length']} steps; "
        f"levels {spec.levels or 'all'}; {args.seeds} seeds x {args.steps:,} env steps on {args.n_envs} "
        f"books ({args.device}); the imbalance rule fitted on the training session: "
        f"{fitted.get('rule', 'n/a')}. Agents: mean ± std over seeds.",
        "",
        "| policy | seeds | " + " | ".join(title for _, title, _ in TABLE) + " |",
        "|---|---|" + "---|" * len(TABLE),
    ]
    for name, row in summary["rows"].items():
        cells = [_cell(row[m], fmt, row["seeds"]) for m, _, fmt in TABLE]
        lines.append(f"| {name} | {row['seeds'] or 'baseline'} | " + " | ".join(cells) + " |")
    lines += ["", "Paired over windows (agent's seed-mean PnL minus the baseline's, per window; CI: "
              "unadjusted 95 % circular block bootstrap; p and verdict: Holm over "
              f"{summary['family']} comparisons):", "",
              "| agent | baseline | mean difference / window | CI | p (Holm) | verdict | power |",
              "|---|---|---|---|---|---|---|"]
    for agent, group in summary["comparisons"].items():
        for row in group:
            ci = "none" if row["ci_low"] is None else f"[{row['ci_low']:+,.1f}, {row['ci_high']:+,.1f}]"
            p = "n/a" if row["p_holm"] is None else f"{row['p_holm']:.3g}"
            lines.append(f"| {agent} | {row['baseline']} | {row['mean_difference']:+,.1f} | {ci} | {p} | "
                         f"{row['verdict']} | {row['power']} |")
    lines += ["", f"**Verdict:** {headline(summary, setup['windows'])}"]
    return "\n".join(lines) + "\n"


def headline(summary: dict[str, Any], windows: int) -> str:
    """One sentence for the split: which agents beat flat and the imbalance rule (Holm-corrected), or that no
    edge is detectable with this many windows."""
    rows = [(agent, row) for agent, group in summary["comparisons"].items() for row in group]
    winners = [f"{agent} over {row['baseline']}" for agent, row in rows
               if row["p_holm"] is not None and row["p_holm"] < 0.05 and row["mean_difference"] > 0]
    beats_both = sorted({agent for agent, _ in rows
                         if all(f"{agent} over {b}" in winners for b in COMPARED)})
    if beats_both:
        return (f"{', '.join(beats_both)}: positive held-out PnL after fees above flat and the imbalance "
                f"rule, significant at 95 % (Holm over {summary['family']}; {windows} windows)")
    found = f" (only {', '.join(winners)})" if winners else ""
    return (f"no agent shows an edge over both flat and the imbalance rule detectable with {windows} windows "
            f"at 95 % (Holm over {summary['family']}){found}; the power column says how many windows each "
            "observed effect would need")


def figure(results: dict[str, Any], path: Path) -> Path:
    """Each agent's paired edge per window (seed-mean PnL minus the baseline's) over flat and over the
    imbalance rule, with its 95 % interval, one panel per split: the evidence the verdicts read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.0 * len(results), 3.8), squeeze=False)
    for axis, (split, result) in zip(axes[0], results.items(), strict=True):
        comparisons = result["summary"]["comparisons"]
        for k, baseline in enumerate(COMPARED):
            rows = [(agent, row) for agent, group in comparisons.items() for row in group
                    if row["baseline"] == baseline]
            x = np.arange(len(rows)) + (k - 0.5) * 0.3
            means = np.array([row["mean_difference"] for _, row in rows])
            low = np.array([row["ci_low"] if row["ci_low"] is not None else row["mean_difference"]
                            for _, row in rows])
            high = np.array([row["ci_high"] if row["ci_high"] is not None else row["mean_difference"]
                             for _, row in rows])
            axis.errorbar(x, means, yerr=[means - low, high - means], fmt="o", capsize=4,
                          label=f"minus {baseline}")
        axis.axhline(0.0, color="black", linewidth=0.8)
        axis.set_xticks(np.arange(len(comparisons)), list(comparisons))
        axis.set_title(f"{split}: {result['setup']['windows']} windows")
        axis.set_ylabel("PnL after fees per window (currency)")
        axis.legend(fontsize=8)
    fig.suptitle("Paired edge per window\n95 % block-bootstrap interval (unadjusted)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_split(spec: SplitSpec, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Train every agent and seed on the split's training session, score them and the baselines on its test
    session, write ``<split>.md`` / ``<split>.json``."""
    from foxhunt.evaluation import evaluate_policies

    started = time.perf_counter()
    seeds = list(range(args.seeds))
    evaluations, seconds = [], {}
    for label, train_market, test_market in folds(spec, args):
        levels = spec.levels or min(train_market.num_levels, test_market.num_levels)
        models = {}
        for agent in args.agent_list:
            for seed in seeds:
                key, tick = f"{agent}/seed{seed}", time.perf_counter()
                models[key] = train_agent(agent, train_market, seed, levels, args)
                seconds[f"{label}{key}"] = time.perf_counter() - tick
                took = seconds[f"{label}{key}"]
                print(f"[{spec.name}] {label}{agent} seed {seed}: {took:.1f} s", flush=True)
        evaluations.append(evaluate_policies(
            models, test_market, baselines=BASELINES, fit_data=train_market, seed=1000, device=args.device,
            env_kwargs={"episode_length": args.episode_length, "levels": levels}))
    summary = summarise(evaluations, args.agent_list, seeds)
    setup = combined_setup(evaluations)
    result = {"spec": spec.__dict__, "setup": setup, "summary": summary,
              "train_seconds": seconds, "seconds": time.perf_counter() - started,
              "policies": [{name: r.metrics for name, r in e.results.items()} for e in evaluations]}
    (out / f"{spec.name}.md").write_text(markdown(spec, summary, setup, args))
    (out / f"{spec.name}.json").write_text(json.dumps(_clean(result), indent=2))
    return result


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the experiment; return every split's result."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = {}
    for spec in split_specs(args.split_list, args.data, args.other, args.levels, args.days):
        results[spec.name] = run_split(spec, args, out)
        print((out / f"{spec.name}.md").read_text(), flush=True)
    payload = {"command": vars(args) | {"split_times": list(args.split_times)}, "splits": results,
               "seconds": time.perf_counter() - started}
    (out / "results.json").write_text(json.dumps(_clean(payload), indent=2, default=str))
    if not args.no_figure:
        figure(results, out / "real_data.png")
    print(f"wrote {out} in {payload['seconds']:.0f} s")
    return results


if __name__ == "__main__":
    main()
