"""Training curves from a diagnostics JSONL file: one PNG with reward, losses, hindsight counts and ε."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sb3_her_ext.diagnostics import read_diagnostics  # noqa: E402


def _series(records: list[dict], *keys: str) -> list[float]:
    """The value at ``record[keys[0]][keys[1]]...`` of every record, NaN where missing."""
    values = []
    for record in records:
        value = record
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        values.append(float(value) if isinstance(value, int | float) else float("nan"))
    return values


def plot_training(diagnostics_path: str | Path, out_path: str | Path, hindsight: bool = True) -> Path:
    """Draw the training curves of a run into a PNG.

    Four panels against environment steps: mean episode reward; IQN and C51 losses; hindsight rows
    injected per interval (backward, forward, relabel); per-branch ε.

    :param diagnostics_path: the run's ``diagnostics.jsonl``.
    :param out_path: PNG file to write (its folder must exist).
    :param hindsight: whether the run had hindsight replay on (off: its panel says so instead of drawing
        zeros that would read as "on, but injecting nothing").
    :return: ``out_path``.
    """
    records = read_diagnostics(diagnostics_path)
    if not records:
        raise ValueError(f"diagnostics_path={diagnostics_path} holds no diagnostics lines")
    steps = [record["step"] for record in records]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    ax = axes[0, 0]
    ax.plot(steps, _series(records, "ep_rew_mean"), marker=".")
    ax.set(title="episode reward (mean of last 100)", xlabel="env steps",
           ylabel="reward per episode (env reward units)")
    ax = axes[0, 1]
    ax.plot(steps, _series(records, "l_q"), label="IQN")
    ax.plot(steps, _series(records, "l_c51"), label="C51")
    ax.set(title="losses", xlabel="env steps", ylabel="loss per gradient step (log scale)", yscale="log")
    ax.legend()
    ax = axes[1, 0]
    ax.set(title="hindsight rows per interval", xlabel="env steps", ylabel="rows injected per log interval")
    if hindsight:
        for kind in ("backward", "forward", "relabel"):
            ax.plot(steps, _series(records, "hindsight", kind), label=kind)
        ax.legend()
    else:
        ax.text(0.5, 0.5, "hindsight replay off in this run", ha="center", va="center",
                transform=ax.transAxes)
        ax.set(xticks=[], yticks=[])
    ax = axes[1, 1]
    for name in records[-1].get("eps", {}):
        ax.plot(steps, _series(records, "eps", name), label=name)
    ax.set(title="exploration ε per branch", xlabel="env steps", ylabel="ε (share of random actions)",
           ylim=(0, 1.05))
    ax.legend()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
