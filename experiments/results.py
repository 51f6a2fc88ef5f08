"""Scoring and reporting an experiment: every trained model and the baselines (flat, random, buy-and-hold; the
oracle on planted markets) on the same held-out windows with :func:`foxhunt.evaluation.evaluate_policies`,
the summary over seeds, the markdown table, the figures and the provenance of a result.
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.agents import Agent
from experiments.runner import Setup


def evaluate(models: Mapping[str, Any], setup: Setup, progress: bool = False) -> Any:
    """Score ``models`` (by name) and the baselines together on the held-out market.

    :return: :class:`foxhunt.evaluation.Evaluation`.
    """
    from foxhunt.evaluation import evaluate_policies
    from foxhunt.evaluation.api import split_env_kwargs

    env_kwargs, market_kwargs = split_env_kwargs(setup.config(Agent("evaluation"), 0).resolved_env_kwargs())
    market_kwargs.pop("market_seed", None)
    if setup.synthetic:
        market_kwargs["num_steps"] = setup.market_steps
    return evaluate_policies(
        dict(models), setup.data, n_envs=setup.eval_envs, steps=setup.eval_steps, seed=setup.eval_seed,
        market_seed=setup.eval_market_seed,
        train_market_seed=setup.train_market_seed if setup.synthetic else None, split="test",
        env_kwargs=env_kwargs, market_kwargs=market_kwargs, device=setup.device, progress=progress,
    )


def run_key(agent: str, seed: int) -> str:
    """The name of one trained run among the evaluated policies."""
    return f"{agent}/seed{seed}"


#: Metrics the tables summarise: key in :func:`compute_metrics`, column title, format.
TABLE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("pnl", "PnL after fees", "{:,.0f}"),
    ("sharpe", "Sharpe / step", "{:.3f}"),
    ("trades", "closed trades", "{:,.0f}"),
    ("maker_share", "maker share", "{:.2f}"),
)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values (NaN when none)."""
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return math.nan, math.nan
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def summarise(evaluation: Any, agents: Sequence[str], seeds: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per agent (over seeds) and per baseline: mean, std and per-seed values of the table's metrics, and
    the share of the oracle's PnL captured when the oracle ran."""
    results = evaluation.results
    oracle = results["oracle"].metrics["pnl"] if "oracle" in results else None
    rows: dict[str, dict[str, Any]] = {}
    groups = {agent: [run_key(agent, s) for s in seeds] for agent in agents}
    groups.update({name: [name] for name in results if "/" not in name})
    for group, keys in groups.items():
        row: dict[str, Any] = {"n": len(keys)}
        for metric, _, _ in TABLE_METRICS:
            values = [float(results[k].metrics.get(metric, math.nan)) for k in keys]
            row[metric] = {"mean": mean_std(values)[0], "std": mean_std(values)[1], "values": values}
        if oracle is not None:
            shares = [float(results[k].metrics["pnl"]) / oracle if oracle else math.nan for k in keys]
            row["oracle_share"] = {"mean": mean_std(shares)[0], "std": mean_std(shares)[1], "values": shares}
        row["baseline"] = "/" not in keys[0]
        rows[group] = row
    return rows


def markdown_table(rows: Mapping[str, Mapping[str, Any]], times: Mapping[str, float] | None = None) -> str:
    """The summary as a markdown table (mean ± std over seeds; baselines have one value)."""
    oracle = any("oracle_share" in row for row in rows.values())
    head = ["policy", "seeds", *[title for _, title, _ in TABLE_METRICS]]
    if oracle:
        head.append("share of oracle PnL")
    if times:
        head.append("train s / seed")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        cells = [name, "baseline" if row["baseline"] else str(row["n"])]
        for metric, _, fmt in TABLE_METRICS:
            value = row[metric]
            if not math.isfinite(value["mean"]):
                cells.append("–")  # e.g. the maker share of a policy that never trades
            elif row["n"] == 1:
                cells.append(fmt.format(value["mean"]))
            else:
                cells.append(f"{fmt.format(value['mean'])} ± {fmt.format(value['std'])}")
        if oracle:
            share = row.get("oracle_share")
            if share is None:
                cells.append("")
            elif row["n"] == 1:
                cells.append(f"{100 * share['mean']:.1f} %")
            else:
                cells.append(f"{100 * share['mean']:.1f} ± {100 * share['std']:.1f} %")
        if times:
            cells.append(f"{times[name]:.0f}" if name in times else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- figures


def _extent(value: Mapping[str, Any]) -> list[float]:
    """The seed values and the ends of the error bar of one bar."""
    return [*value["values"], value["mean"] + value["std"], value["mean"] - value["std"]]


def bar_chart(rows: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> Path:
    """PnL and per-step Sharpe per policy: bars at the seed mean, a dot per seed, error bar = std. The random
    baseline, far below the rest, is drawn off scale with its value written in when it would flatten them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    wide = len(names) > 8
    fig, axes = plt.subplots(2 if wide else 1, 1 if wide else 2,
                             figsize=(min(16.0, 0.6 * len(names) + 4), 9 if wide else 4.5))
    panels = (("pnl", "PnL after fees (currency)"), ("sharpe", "Sharpe per step"))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        means = np.array([rows[n][metric]["mean"] for n in names], dtype=float)
        stds = np.array([rows[n][metric]["std"] for n in names], dtype=float)
        colors = ["0.6" if rows[n]["baseline"] else "C0" for n in names]
        x = np.arange(len(names))
        ax.bar(x, means, yerr=stds, color=colors, capsize=3)
        for i, n in enumerate(names):
            values = rows[n][metric]["values"]
            ax.scatter(np.full(len(values), i), values, color="k", s=10, zorder=3)
        others = [v for n in names if n != "random" for v in _extent(rows[n][metric]) if math.isfinite(v)]
        if "random" in rows and others:
            low, high = min(min(others), 0.0), max(max(others), 0.0)
            pad = 0.1 * (high - low or 1.0)
            value = rows["random"][metric]["mean"]
            if value < low - 2 * pad or value > high + 2 * pad:
                ax.set_ylim(low - pad, high + pad)
                j = names.index("random")
                ax.annotate(f"{value:,.3g}\n(off scale)", (j, low - pad if value < low else high + pad),
                            xytext=(0, 12 if value < low else -24), textcoords="offset points", ha="center",
                            fontsize=7)
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(textwrap.fill(title + "  (grey: baselines; dots: seeds; bars: mean ± std)", 120), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_chart(curves: Mapping[str, Sequence[Sequence[tuple[int, float]]]], path: Path, title: str,
                ylabel: str = "mean episode reward (last 100 episodes)") -> Path:
    """One line per agent (the mean over seeds at the shared points), a thin line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, runs) in enumerate(curves.items()):
        color = f"C{i % 10}"
        for run in runs:
            if run:
                ax.plot(*zip(*run, strict=True), color=color, lw=0.6, alpha=0.35)
        length = min((len(run) for run in runs), default=0)
        if length:
            steps = [runs[0][j][0] for j in range(length)]
            mean = np.mean([[run[j][1] for j in range(length)] for run in runs], axis=0)
            ax.plot(steps, mean, color=color, lw=1.8, label=name)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 100), fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def provenance() -> dict[str, Any]:
    """Commit, date, machine and devices of a result."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
                   f"{torch.get_num_threads()} torch threads)",
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }


def write_json(path: Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON (NaN and infinities as strings)."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, np.generic):
            return clean(value.item())
        return value

    path.write_text(json.dumps(clean(payload), indent=2))
    return path
