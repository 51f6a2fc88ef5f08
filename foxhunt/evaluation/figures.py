"""The figures of an evaluation report: equity and drawdown, a book's position over the mid with its trades,
the action mix per branch, and the distribution of per-episode PnL."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from foxenv.metrics import ACTION_LABELS  # noqa: E402
from foxhunt.evaluation.api import Evaluation  # noqa: E402
from foxhunt.evaluation.metrics import BRANCH_NAMES, episode_pnl  # noqa: E402

_STYLE = {"flat": ("0.55", ":"), "random": ("tab:red", "--"), "buy_and_hold": ("tab:brown", "-."),
          "oracle": ("tab:green", "-")}


def _currency(evaluation: Evaluation) -> str:
    """The currency of the evaluation's PnL (``foxenv.metrics.currency_of`` its market)."""
    return next(iter(evaluation.results.values())).metrics.get("currency", "currency")


def _style(name: str, index: int) -> tuple[str, str]:
    return _STYLE.get(name, (f"C{index % 10}" if index % 10 not in (2, 3, 5) else "tab:blue", "-"))


def _host(tensor) -> np.ndarray:  # noqa: ANN001 (a torch tensor)
    return tensor.detach().cpu().double().numpy()


def plot_equity(evaluation: Evaluation, path: Path) -> Path:
    """Equity (cumulative PnL summed over books) of every policy, and its drawdown, against steps."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=(2, 1))
    length = evaluation.setup["episode_length"]
    curves = {name: np.cumsum(_host(result.series["step_pnl"]).sum(axis=1))
              for name, result in evaluation.results.items()}
    # a baseline far off the others' scale (random's costs, usually) would flatten every other curve
    others = [np.abs(c).max() for n, c in curves.items() if n != "random"]
    scale = max(others) if others else 0.0
    clip = "random" in curves and scale > 0 and np.abs(curves["random"]).max() > 4 * scale
    for i, (name, equity) in enumerate(curves.items()):
        drawdown = np.maximum.accumulate(np.concatenate([[0.0], equity]))[1:] - equity
        color, style = _style(name, i)
        label = f"{name} ({equity[-1]:,.0f})" + (", off scale" if clip and name == "random" else "")
        top.plot(equity, color=color, linestyle=style, linewidth=1.6, label=label)
        bottom.plot(-drawdown, color=color, linestyle=style, linewidth=1.3)
    if clip:
        top.set_ylim(-1.15 * scale, 1.15 * scale)
        bottom.set_ylim(-1.15 * scale, 0.05 * scale)
    steps = evaluation.setup["vector_steps"]
    for axis in (top, bottom):
        for boundary in range(length, steps, length):
            axis.axvline(boundary, color="0.85", linewidth=0.8, zorder=0)
        axis.grid(alpha=0.3)
    top.axhline(0, color="black", linewidth=0.6)
    top.set_ylabel(f"equity, summed over books\n({_currency(evaluation)})")
    top.set_title(f"Equity after fees: {evaluation.setup['books']} books, {evaluation.setup['market']}"
                  "\n(grey lines: episode boundaries, all books restart together)", fontsize=10)
    top.legend(loc="upper left", fontsize=9)
    bottom.set_ylabel(f"drawdown\n({_currency(evaluation)})")
    bottom.set_xlabel("step (each step moves every book once)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_position(evaluation: Evaluation, name: str, path: Path, book: int = 0, max_steps: int = 500) -> Path:
    """One book of policy ``name``: the mid with its buys and sells marked, and its position below."""
    series = evaluation.results[name].series
    steps = min(max_steps, series["mid"].shape[0])
    mid_before = _host(series["prev_mid"][:steps, book])
    position = _host(series["position"][:steps, book])
    change = np.diff(np.concatenate([[0.0], position]))
    starts = _host(series["episode_start"][:steps, book]).astype(bool)
    change = np.where(starts, position, change)
    x = np.arange(steps)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=(2, 1))
    top.plot(x, mid_before, color="0.3", linewidth=1.0, label="mid before the step")
    buys, sells = change > 0, change < 0
    top.scatter(x[buys], mid_before[buys], marker="^", color="tab:green", s=28, zorder=3,
                label=f"bought ({int(buys.sum())})")
    top.scatter(x[sells], mid_before[sells], marker="v", color="tab:red", s=28, zorder=3,
                label=f"sold ({int(sells.sum())})")
    top.set_ylabel(f"mid price ({_currency(evaluation)})")
    top.legend(loc="best", fontsize=9)
    top.grid(alpha=0.3)
    top.set_title(f"{name}: book {book}, first {steps} steps (episode start row "
                  f"{int(evaluation.results[name].recording.offsets[0, book])})", fontsize=10)
    bottom.fill_between(x, position, step="post", color="tab:blue", alpha=0.35)
    bottom.step(x, position, where="post", color="tab:blue", linewidth=1.0)
    bottom.axhline(0, color="black", linewidth=0.6)
    bottom.set_ylabel("position (lots)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_action_mix(evaluation: Evaluation, path: Path) -> Path:
    """Share of each value of each branch, one group of bars per policy."""
    names = [n for n in evaluation.results if n != "flat"] or list(evaluation.results)
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.8), sharey=True)
    width = 0.8 / len(names)
    for b, (axis, branch) in enumerate(zip(axes, BRANCH_NAMES, strict=True)):
        for i, name in enumerate(names):
            shares = evaluation.results[name].metrics["action_mix"][branch]
            color, _ = _style(name, list(evaluation.results).index(name))
            axis.bar(np.arange(len(shares)) + (i - (len(names) - 1) / 2) * width, shares, width, color=color,
                     label=name if b == 0 else None)
        labels = evaluation.results[names[0]].metrics.get("action_labels", ACTION_LABELS)[branch]
        axis.set_xticks(range(len(labels)), labels, fontsize=8 if len(labels) > 3 else None)
        axis.set_title(branch)
        axis.set_ylim(0, 1)
        axis.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("share of book-steps")
    fig.legend(loc="upper center", ncol=len(names), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_episode_pnl(evaluation: Evaluation, path: Path) -> Path:
    """Distribution of per-episode PnL of every policy (box plot with every episode as a dot)."""
    names = list(evaluation.results)
    values = [_host(episode_pnl(evaluation.results[n].recording)).reshape(-1) for n in names]
    fig, axis = plt.subplots(figsize=(max(6, 1.6 * len(names) + 2), 4.5))
    axis.boxplot(values, showfliers=False)
    jitter = np.random.default_rng(0)
    for i, (name, v) in enumerate(zip(names, values, strict=True)):
        color, _ = _style(name, i)
        axis.scatter(i + 1 + jitter.uniform(-0.15, 0.15, v.size), v, s=10, alpha=0.6, color=color)
    axis.set_xticks(range(1, len(names) + 1), names)
    axis.axhline(0, color="black", linewidth=0.6)
    axis.set_ylabel(f"PnL per episode window ({_currency(evaluation)}, after fees)")
    axis.set_title(f"Per-episode PnL ({values[0].size} windows of up to {evaluation.setup['episode_length']} "
                   "steps, the same for every policy)", fontsize=10)
    axis.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(evaluation: Evaluation, out: Path, main: str) -> dict[str, Path]:
    """Every figure of the report into ``out``.

    :param evaluation: the evaluation.
    :param out: the folder.
    :param main: the policy whose position is drawn.
    :return: the PNG paths by figure name.
    """
    out.mkdir(parents=True, exist_ok=True)
    return {
        "equity": plot_equity(evaluation, out / "eval_equity.png"),
        "position": plot_position(evaluation, main, out / "eval_position.png"),
        "action_mix": plot_action_mix(evaluation, out / "eval_action_mix.png"),
        "episode_pnl": plot_episode_pnl(evaluation, out / "eval_episode_pnl.png"),
    }
