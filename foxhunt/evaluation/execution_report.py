"""The execute task's evaluation: every policy on the same disjoint held-out windows, buys and sells, scored
by implementation shortfall in bps, with paired comparisons against TWAP and the best baseline.

Per policy and side: the mean, standard deviation and quantiles of the per-window shortfall (bps of the
parent's notional, lower is better). Per comparison: the per-window difference ``baseline shortfall - policy
shortfall`` (positive: the policy did better) over the disjoint windows, with the circular block bootstrap's
interval, Holm's correction over every comparison of the report, and the power line
(:mod:`foxhunt.evaluation.stats`). Buys and sells of the same window are not independent evidence, so each
side is its own set of comparisons (one Holm family over both).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from foxenv.config import EnvConfig
from foxenv.data.market import MarketData
from foxhunt.evaluation import stats
from foxhunt.evaluation.execution_baselines import EXECUTION_BASELINES, score_windows

#: Quantiles of the per-window shortfall in the report.
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
#: The sides scored.
SIDES = ("buy", "sell")


def score_policies(policies: Mapping[str, Any], market: MarketData, config: EnvConfig, offsets: torch.Tensor,
                   device: str | torch.device = "cpu") -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """Every policy on every window, as a buy and as a sell (:func:`score_windows`).

    :param policies: name -> policy (baselines of :mod:`~foxhunt.evaluation.execution_baselines`, or a
        model's :class:`~foxhunt.evaluation.baselines.ModelPolicy` on ``config``'s grid).
    :param market: the held-out market.
    :param config: the execute config (its ``exec_side`` is replaced by each side).
    :param offsets: ``[W]`` start rows of disjoint windows.
    :param device: where the envs run.
    :return: side -> name -> :func:`score_windows`'s result.
    """
    import dataclasses

    scores: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for side in SIDES:
        sided = dataclasses.replace(config, exec_side=side)
        scores[side] = {name: score_windows(policy, market, sided, offsets, device) for name, policy in
                        policies.items()}
    return scores


def summarize(shortfall: torch.Tensor) -> dict[str, Any]:
    """Mean, standard deviation and :data:`QUANTILES` of per-window shortfalls (bps)."""
    values = shortfall.double()
    quantiles = torch.quantile(values, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
    return {"windows": int(values.numel()), "mean_bps": float(values.mean()),
            "std_bps": float(values.std()) if values.numel() > 1 else 0.0,
            **{f"q{int(round(100 * q)):02d}_bps": v for q, v in zip(QUANTILES, quantiles, strict=True)}}


def execution_report(scores: Mapping[str, Mapping[str, Mapping[str, torch.Tensor]]], offsets: torch.Tensor,
                     horizon: int, level: float = 0.95, resamples: int = stats.RESAMPLES) -> dict[str, Any]:
    """Summaries and paired comparisons of :func:`score_policies`' scores.

    Every policy but TWAP is compared with TWAP; every policy that is not a baseline (a model) also with the
    best baseline of its side (the lowest mean shortfall), when that is not TWAP.

    :param scores: side -> name -> result.
    :param offsets: ``[W]`` the windows' start rows.
    :param horizon: steps of a window.
    :param level: confidence level of the intervals.
    :param resamples: bootstrap resamples.
    :return: ``{"summary": {side: {name: summary}}, "comparisons": {side: {name: [rows]}}, "family": n,
        "best_baseline": {side: name}}``; a row is :func:`stats.paired_windows`' in bps of shortfall saved.
    """
    starts = torch.as_tensor(offsets).reshape(1, -1)
    summary: dict[str, dict[str, Any]] = {}
    comparisons: dict[str, list[dict[str, Any]]] = {}
    best: dict[str, str] = {}
    for side, by_name in scores.items():
        summary[side] = {name: summarize(result["shortfall_bps"]) for name, result in by_name.items()}
        baselines = [name for name in by_name if name in EXECUTION_BASELINES]
        best[side] = min(baselines, key=lambda name: summary[side][name]["mean_bps"]) if baselines else ""
        for name, result in by_name.items():
            against = [] if name == "twap" or "twap" not in by_name else ["twap"]
            if name not in EXECUTION_BASELINES and best[side] not in ("", "twap"):
                against.append(best[side])
            rows = []
            for other in against:
                saved = -result["shortfall_bps"].reshape(1, -1)  # higher is better, as PnL
                row = stats.paired_windows(saved, -by_name[other]["shortfall_bps"].reshape(1, -1), starts,
                                           horizon, baseline=other, level=level, resamples=resamples,
                                           policy=name, metric="shortfall saved (bps)")
                row["side"] = side
                rows.append(row)
            if rows:
                comparisons[f"{side}:{name}"] = rows
    family = stats.correct(comparisons)
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {side: {} for side in scores}
    for key, rows in comparisons.items():
        side, name = key.split(":", 1)
        grouped[side][name] = rows
    return {"summary": summary, "comparisons": grouped, "family": family, "best_baseline": best}


def format_report(report: Mapping[str, Any]) -> str:
    """The report as markdown: one table of shortfalls per side, then the comparisons with their verdicts."""
    lines = []
    for side, by_name in report["summary"].items():
        lines += [f"### {side}s: implementation shortfall, bps of the parent's notional (lower is better)",
                  "", "| policy | windows | mean | std | 5 % | median | 95 % |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in sorted(by_name.items(), key=lambda item: item[1]["mean_bps"]):
            lines.append(f"| {name} | {row['windows']} | {row['mean_bps']:+.3f} | {row['std_bps']:.3f} | "
                         f"{row['q05_bps']:+.3f} | {row['q50_bps']:+.3f} | {row['q95_bps']:+.3f} |")
        lines += ["", f"| {side}s: policy vs | bps saved per window | {_level(report)} interval | p (Holm) | "
                  "verdict |", "|---|---:|---:|---:|---|"]
        for name, rows in report["comparisons"].get(side, {}).items():
            for row in rows:
                interval = ("n/a" if row["ci_low"] is None else
                            f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]")
                p = "n/a" if row["p_holm"] is None else f"{row['p_holm']:.3g}"
                lines.append(f"| {name} vs {row['baseline']} | {row['mean_difference']:+.3f} | {interval} | "
                             f"{p} | {row['verdict']}; {row['power']} |")
        lines.append("")
    return "\n".join(lines)


def _level(report: Mapping[str, Any]) -> str:
    for by_name in report["comparisons"].values():
        for rows in by_name.values():
            return f"{100 * rows[0]['level']:g} %"
    return "95 %"


def plot_execution(scores: Mapping[str, Mapping[str, Mapping[str, torch.Tensor]]], path: str | Path,
                   window: int = 0) -> Path:
    """A figure: the per-window shortfall of every policy (box plots, buys and sells), and one window's
    schedules (share of the parent done after each step) over its mid path.

    :param scores: :func:`score_policies`' scores.
    :param path: the PNG to write.
    :param window: which window's schedule to draw (its index in ``offsets``).
    :return: the path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = list(scores)
    figure, axes = plt.subplots(1, len(sides) + 1, figsize=(5 * (len(sides) + 1), 4.2))
    for axis, side in zip(axes, sides, strict=False):
        names = list(scores[side])
        axis.boxplot([scores[side][n]["shortfall_bps"].numpy() for n in names], showfliers=False)
        axis.set_xticks(range(1, len(names) + 1), names, rotation=35, ha="right", fontsize=8)
        axis.axhline(0.0, color="grey", lw=0.6)
        axis.set_ylabel("shortfall, bps (lower is better)")
        axis.set_title(f"{side}s, {scores[side][names[0]]['shortfall_bps'].numel()} windows")
    axis = axes[-1]
    side = sides[0]
    for name, result in scores[side].items():
        done = result["done"][:, window].numpy()
        axis.step(range(1, done.shape[0] + 1), done, where="post", label=name, lw=1.2)
    axis.set_xlabel("step")
    axis.set_ylabel("share of the parent done")
    axis.set_title(f"one {side} window's schedules")
    axis.legend(fontsize=7, loc="lower right")
    price = axis.twinx()
    first = next(iter(scores[side].values()))
    price.plot(range(1, first["mid"].shape[0] + 1), first["mid"][:, window].numpy(), color="black", lw=0.8,
               alpha=0.5)
    price.set_ylabel("mid")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def evaluate_execution(policies: Mapping[str, Any], fit: MarketData, held_out: MarketData, config: EnvConfig,
                       out: str | Path | None = None, device: str | torch.device = "cpu",
                       windows: int | None = None, risk_aversion: float = 1e-5, intervals: int = 10,
                       title: str = "Execution") -> dict[str, Any]:
    """The execute task's evaluation: the baselines fitted on ``fit``, then they and ``policies`` (models, as
    :class:`~foxhunt.evaluation.baselines.ModelPolicy` or anything with ``predict``) on the disjoint windows
    of ``held_out``, buys and sells; the report written to ``out`` (``execution.md``, ``execution.json``,
    ``execution.png``) when given.

    :return: ``{"report", "shortfall_bps", "offsets", "model", "table"}``.
    """
    import dataclasses

    from foxenv.execution import window_quantities
    from foxhunt.evaluation.baselines import ModelPolicy
    from foxhunt.evaluation.execution_baselines import (
        almgren_chriss_kappa,
        disjoint_offsets,
        fit_execution_model,
        make_execution_baseline,
    )

    horizon = config.episode_length
    offsets = disjoint_offsets(held_out.num_steps, horizon, windows)
    if offsets.numel() == 0:
        raise ValueError(f"the held-out market {held_out.name!r} ({held_out.num_steps} steps) holds no "
                         f"window of episode_length={horizon}")
    model = fit_execution_model(fit, float(window_quantities(fit, config).mean()) / horizon)
    kappa = almgren_chriss_kappa(risk_aversion, model.sigma, model.eta)
    at_touch = config.grid.at_touch
    scored: dict[str, Any] = {name: make_execution_baseline(name, horizon, model, risk_aversion, intervals,
                                                            at_touch) for name in EXECUTION_BASELINES}
    for name, policy in policies.items():
        scored[name] = policy if hasattr(policy, "act") else ModelPolicy(policy, name=name, grid=config.grid)
    scores = score_policies(scored, held_out, config, offsets, device)
    report = execution_report(scores, offsets, horizon)
    header = (f"{title}: held out {held_out.name}, fitted on {fit.name}; T = {horizon} steps, "
              f"Q = {config.exec_quantity:g} {config.exec_quantity_unit}, {offsets.numel()} disjoint windows;"
              " "
              f"sigma {model.sigma:.4g}, eta {model.eta:.4g}, Almgren-Chriss lambda {risk_aversion:g} "
              f"(kappa T {kappa * horizon:.3g})\n\n")
    table = header + format_report(report)
    payload = {"report": report, "offsets": offsets.tolist(), "model": dataclasses.asdict(model),
               "shortfall_bps": {side: {name: result["shortfall_bps"].tolist() for name, result in by.items()}
                                 for side, by in scores.items()}, "table": table}
    if out is not None:
        import json

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "execution.md").write_text(table)
        (out / "execution.json").write_text(json.dumps(_finite(payload), indent=2))
        plot_execution(scores, out / "execution.png")
    return payload


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats as strings (JSON has no infinity)."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def evaluate_execution_run(model: Any, out: Path, data: str, config_kwargs: Mapping[str, Any],
                           market_kwargs: Mapping[str, Any], *, fit_seed: int, held_out_seed: int,
                           fit_split: str, held_out_split: str, device: str = "cpu") -> dict[str, Any]:
    """``foxhunt train``'s final evaluation of an execute run: :func:`evaluate_execution` of the model, fitted
    on the run's training data (the synthetic market of ``fit_seed``, or the LOBSTER split ``fit_split``)
    and scored on its held-out data (``held_out_seed``, or ``held_out_split``); the report is written to the
    run folder and printed.

    :param model: the trained model.
    :param out: the run folder.
    :param data: the run's data source.
    :param config_kwargs: the run's :class:`EnvConfig` fields.
    :param market_kwargs: its market options.
    """
    from foxhunt.evaluation.api import build_market

    config = EnvConfig(**config_kwargs)
    options = {"levels": config.levels, **market_kwargs}
    if data == "synthetic":
        fit = build_market("synthetic", market_seed=fit_seed, device=device, **options)
        held_out = build_market("synthetic", market_seed=held_out_seed, device=device, **options)
    else:
        fit = build_market(data, split=fit_split, device=device, **options)
        held_out = build_market(data, split=held_out_split, device=device, **options)
    payload = evaluate_execution({"policy": model}, fit, held_out, config, out=out, device=device,
                                 title=f"Execution evaluation of {out / 'model.zip'}")
    print(payload["table"])
    return payload


def load_execution_model(path: str | Path, grid: Any, device: str = "cpu") -> Any:
    """Load a model trained on the execute task (``foxhunt.evaluation.model_file.load_model`` checks the
    trading grids only) and check that it acts on ``grid``'s faces.

    :param path: the ``.zip``.
    :param grid: the execute config's grid (:class:`~foxenv.execution.ExecutionGrid`).
    :param device: device of the network.
    :raises ValueError: when no algorithm loads it or it acts on another space.
    """
    from foxhunt.evaluation.model_file import check_action_space, load_saved_model

    path = Path(path)
    model = load_saved_model(path, device)
    check_action_space(model, str(path), grid=grid)
    return model
