"""Write an evaluation's ``report.md``, ``evaluation.json`` and figures into a folder, and print a summary."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from foxenv.metrics import units
from foxhunt.evaluation.api import Evaluation

#: Metrics in the report's table, in order.
TABLE_METRICS = (
    "pnl", "pnl_per_episode", "pnl_bps_of_notional", "sharpe", "sharpe_annualised", "sortino",
    "max_drawdown", "turnover", "notional_traded", "hit_rate", "trades", "fills", "fees", "spread_cost",
    "maker_share", "resting_share", "resting_distance", "time_in_market", "mean_abs_position",
)


#: The references the headline states the policy's PnL as a share of: (name, what it is). A reference's PnL is
#: its result's (a policy run on the same windows, as the oracle) or, for a bound that is no policy,
#: ``setup["reference_pnl"][name]`` on the same windows; a reference with neither is left out (the oracle
#: exists on a planted-signal market only).
HEADLINE_REFERENCES: tuple[tuple[str, str], ...] = (("oracle", "the oracle's PnL"),)


def headline_shares(evaluation: Evaluation, main: str) -> list[dict[str, Any]]:
    """The main policy's PnL as a share of each reference's (:data:`HEADLINE_REFERENCES`) on the same windows.

    :param evaluation: the evaluation.
    :param main: the policy the report is about.
    :return: one ``{"reference", "label", "share", "pnl", "reference_pnl"}`` per reference present;
        ``share`` is None when the reference made no profit.
    """
    pnl = float(evaluation.results[main].metrics["pnl"])
    shares = []
    for name, label in HEADLINE_REFERENCES:
        result = evaluation.results.get(name)
        value = (result.metrics["pnl"] if result is not None
                 else evaluation.setup.get("reference_pnl", {}).get(name))
        if value is None or name == main:
            continue
        reference = float(value)
        share = pnl / reference if reference > 0 and math.isfinite(reference) else None
        shares.append({"reference": name, "label": label, "share": share, "pnl": pnl,
                       "reference_pnl": reference})
    return shares


def headline_lines(evaluation: Evaluation, main: str) -> list[str]:
    """``share of the oracle's PnL: 60.0 %`` (one line per reference; none without a reference)."""
    lines = []
    for row in headline_shares(evaluation, main):
        shown = "n/a (it made no profit)" if row["share"] is None else f"{100 * row['share']:.1f} %"
        lines.append(f"share of {row['label']}: {shown} ({main} {_fmt(row['pnl'])}, {row['reference']} "
                     f"{_fmt(row['reference_pnl'])}, same windows)")
    return lines


def interval_note(setup: dict[str, Any]) -> str:
    """How the comparisons' intervals and verdicts are computed: the level, unadjusted intervals, and the
    multiple-comparison correction of the verdicts' p-values."""
    level = setup.get("level", 0.95)
    return (f"intervals: {100 * level:g} % circular block bootstrap over the windows, not Holm-adjusted; "
            f"verdicts: {_correction(setup)}")


def _units(evaluation: Evaluation, main: str) -> dict[str, str]:
    """The vocabulary's units with the evaluation's currency named."""
    return units(evaluation.results[main].metrics.get("currency", "currency"))


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def held_out_line(setup: dict[str, Any]) -> str:
    """One line saying what the evaluation data was and how it is held out."""
    if setup.get("market_seed") is not None:
        train = setup.get("train_market_seed")
        trained = f", training market seed {train}" if train is not None else ""
        return f"synthetic, market seed {setup['market_seed']}{trained}"
    if setup.get("split"):
        return f"{setup['split']} split"
    return str(setup.get("data"))


def _clock_span(setup: dict[str, Any]) -> str:
    """``, clock 15:30:07-15:59:59`` of LOBSTER data (the steps scored), else nothing."""
    if not setup.get("clock"):
        return ""
    from foxhunt.evaluation.model_file import clock

    first, last = setup["clock"]
    return f", clock {clock(first)}-{clock(last)}"


def json_document(evaluation: Evaluation, main: str) -> dict[str, Any]:
    """``evaluation.json``: the main policy's metrics at the top level, then every policy, comparisons and
    the setup."""
    return _clean({
        "eval_data": held_out_line(evaluation.setup),
        "policy": main,
        "shares": {row["reference"]: row["share"] for row in headline_shares(evaluation, main)},
        **evaluation.results[main].metrics,
        "units": _units(evaluation, main),
        **evaluation.to_json(),
    })


def _interval(row: dict[str, Any]) -> str:
    if row["ci_low"] is None:
        return "none (fewer than 2 windows)"
    return f"[{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}]"


def _correction(setup: dict[str, Any]) -> str:
    correction = setup.get("correction", "none")
    if correction == "none":
        return "no multiple-comparison correction (at most one testable comparison)"
    return f"p-values corrected with {correction}"


def comparison_lines(evaluation: Evaluation) -> list[str]:
    """The report's paired-comparison section: one table per policy, then its verdict and power lines."""
    setup = evaluation.setup
    windows = setup.get("windows", setup["books"] * setup["episodes_per_book"])
    level = setup.get("level", 0.95)
    lines = ["", "## Paired comparison (per-window PnL, policy minus baseline, same windows)", "",
             f"**{windows} independent window(s)** of {setup['episode_length']} steps (disjoint; every "
             f"policy ran on the same ones). Intervals: {100 * level:g} % circular block bootstrap over the "
             f"time-ordered windows (unadjusted); {_correction(setup)}; verdicts use the corrected p.", ""]
    if windows < 2:
        lines += ["With one window there is no interval and no verdict: evaluate a longer split, shorter "
                  "episodes or finer steps.", ""]
    for name, rows in evaluation.comparisons.items():
        if not rows:
            continue
        lines += [f"**{name}**", "", "| baseline | mean difference / window | CI | p (Holm) | windows | "
                  "policy ahead in |", "|---|---|---|---|---|---|"]
        for row in rows:
            p_holm = "n/a" if row.get("p_holm") is None else f"{row['p_holm']:.3g}"
            lines.append(
                f"| {row['baseline']} | {_fmt(row['mean_difference'])} | {_interval(row)} | "
                f"{p_holm} | {row['windows']} | {row['win_share']:.0%} |"
            )
        lines += [""] + [f"- {row['verdict']}; {row['power']}" for row in rows] + [""]
    return lines


def markdown(evaluation: Evaluation, main: str, title: str, figures: dict[str, Path]) -> str:
    """The text of ``report.md``."""
    setup = evaluation.setup
    names = list(evaluation.results)
    named_units = _units(evaluation, main)
    lines = [
        f"# {title}",
        "",
        *[f"**{line}**" for line in headline_lines(evaluation, main)],
        *([""] if headline_lines(evaluation, main) else []),
        f"- data: **{held_out_line(setup)}** ({setup['market']}, {setup['market_steps']:,} steps"
        f"{_clock_span(setup)})",
        f"- {setup['books']} books x {setup['vector_steps']:,} steps = {setup['book_steps']:,} book-steps, "
        f"episodes of {setup['episode_length']} steps, {setup['episodes_per_book']} per book; "
        f"**{setup['independent_steps']:,} independent steps** (distinct market rows stepped from; every "
        "policy ran on the same windows)",
        f"- step clock: {setup['step_seconds']:.4g} s per step ({setup['step_seconds_source']}); annualised "
        "ratios assume 252 x 6.5 h of trading a year",
        f"- seed {setup['seed']} (episode windows, random baseline); device {setup['device']}",
        *[f"- note: {note}" for note in setup.get("notes", [])],
        *[f"- {name} fitted on {fit['fit_market']} ({fit['fit_steps']:,} steps): threshold "
          f"{fit['threshold']:g}, {fit['order']} orders, fit PnL {fit['fit_pnl']:,.0f}"
          for name, fit in setup.get("fitted_baselines", {}).items()],
        "",
        "## Metrics",
        "",
        "| metric | " + " | ".join(names) + " | unit |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    for metric in TABLE_METRICS:
        row = [_fmt(evaluation.results[n].metrics.get(metric)) for n in names]
        lines.append(f"| {metric} | " + " | ".join(row) + f" | {named_units.get(metric, '')} |")
    lines += comparison_lines(evaluation)
    lines += ["## Action mix (share of book-steps per value)", ""]
    for name in names:
        mix = evaluation.results[name].metrics["action_mix"]
        labels = evaluation.results[name].metrics.get("action_labels", {})
        shown = "; ".join(
            f"{b}: " + ", ".join(f"{label} {v:.2f}" for label, v in
                                 zip(labels.get(b, range(len(values))), values, strict=True))
            for b, values in mix.items()
        )
        lines.append(f"- {name}: {shown}")
    lines += ["", "## Figures", ""]
    captions = {
        "equity": "equity of every policy (summed over books) and its drawdown",
        "position": f"{main}: one book's position over the mid, trades marked",
        "action_mix": "action mix per branch",
        "episode_pnl": "per-episode PnL distribution",
    }
    for key, path in figures.items():
        lines.append(f"![{captions.get(key, key)}]({path.name})")
        lines.append("")
    return "\n".join(lines)


def write_report(evaluation: Evaluation, out: str | Path, main: str, title: str = "Evaluation",
                 plots: bool = True) -> dict[str, Path]:
    """Write ``report.md``, ``evaluation.json`` and the figures into ``out``.

    :param evaluation: the evaluation.
    :param out: the folder (a run folder, or ``--out``).
    :param main: the policy the report is about (its metrics head ``evaluation.json``).
    :param title: the report's title.
    :param plots: draw the figures.
    :return: the written paths by name.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path] = {}
    if plots:
        from foxhunt.evaluation.figures import plot_all

        figures = plot_all(evaluation, out, main)
    (out / "evaluation.json").write_text(json.dumps(json_document(evaluation, main), indent=2))
    (out / "report.md").write_text(markdown(evaluation, main, title, figures))
    return {"report": out / "report.md", "json": out / "evaluation.json", **figures}


def print_evaluation(evaluation: Evaluation, main: str, title: str) -> None:
    """Print the main policy's metrics, then one line per policy and the paired comparisons."""
    from foxhunt.evaluation.rollout import print_summary

    print_summary(title, evaluation.results[main].metrics)
    print(f"\n  {'policy':>14} {'pnl':>12} {'sharpe/step':>12} {'max_dd':>10} {'trades':>8} {'fees':>10}")
    for name, result in evaluation.results.items():
        m = result.metrics
        print(f"  {name:>14} {m['pnl']:>12,.0f} {m['sharpe']:>12.4f} {m['max_drawdown']:>10,.0f} "
              f"{m['trades']:>8,} {m['fees']:>10,.0f}")
    for note in evaluation.setup.get("notes", []):
        print(f"  note: {note}")
    for line in headline_lines(evaluation, main):
        print(f"\n  {line}")
    if any(evaluation.comparisons.values()):
        print(f"\n  {interval_note(evaluation.setup)}")
    for name, rows in evaluation.comparisons.items():
        for row in rows:
            interval = ("no interval" if row["ci_low"] is None
                        else f"[{row['ci_low']:+,.1f}, {row['ci_high']:+,.1f}] ({100 * row['level']:g} % CI, "
                        "not Holm-adjusted)")
            print(f"  {name} - {row['baseline']}: {row['mean_difference']:+,.1f} per window {interval} over "
                  f"{row['windows']} window(s): {row['verdict']}")
