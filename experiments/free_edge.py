"""Does the synthetic market give a policy without information an edge? (issue 39, item 2)

One command (from the repository root)::

    python -m experiments.free_edge --out runs/free_edge

On held-out synthetic markets with no signal (market seeds 1-5 by default; ``foxhunt train`` trains on seed
0), it records policies that read nothing of the market and compares each with flat over the same disjoint
episode windows (:func:`foxhunt.evaluation.api.evaluate_policies`: paired per-window PnL differences,
circular block bootstrap, Holm): per seed (Holm over every policy and seed) and pooled over the seeds (Holm
over the policies). The policies: ``random``, ``flip_maker`` (LimitMaker one tick inside the own touch, full
size, long and short by turns every step: the quoting that earned a significant edge before the fix),
``constant_long`` / ``constant_short`` (full size by a Market order, then held) and ``market_maker`` (the
baseline). A PnL decomposition per window says where each policy's PnL comes from: spread capture (fill price
against the pre-trade mid), fees, and the mid's moves while it holds (adverse selection after its fills and
inventory drift). Then, on the same seeds with a planted signal (``--signal-strength``), the signal oracle
against flat: the market must still pay for information.

It prints the tables and writes ``free_edge.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from foxhunt.evaluation import stats
from foxhunt.evaluation.api import evaluate_policies
from foxhunt.evaluation.baselines import MarketMakerPolicy, RandomPolicy
from foxhunt.evaluation.metrics import episode_pnl

#: Held-out market seeds (``foxhunt train`` trains on seed 0).
SEEDS = (1, 2, 3, 4, 5)
#: The planted signal's strength of the oracle check.
SIGNAL_STRENGTH = 1.0
#: The policies without information, compared with flat.
POLICIES = ("random", "flip_maker", "constant_long", "constant_short", "market_maker")


class FlipMakerPolicy:
    """LimitMaker one tick inside the own touch (the default grid's aggressive urgency), full size, targeting
    long and short by turns every step: quoting that reads nothing of the market."""

    name = "flip_maker"

    def reset(self, num_books: int, device: torch.device) -> None:
        """Start long."""
        self._long = torch.ones(num_books, dtype=torch.bool, device=device)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Long, then short, then long ... (restarting long with each episode)."""
        self._long = torch.where(episode_start, True, ~self._long)
        actions = torch.empty((obs.shape[0], 4), dtype=torch.int64, device=obs.device)
        actions[:, 0] = 2 * self._long.long()
        actions[:, 1] = 2  # full size
        actions[:, 2] = 1  # LimitMaker
        actions[:, 3] = 2  # one tick inside the own touch
        return actions


class ConstantPolicy:
    """One fixed action every step (full size by a Market order for all of the gap: held once filled).

    :param name: its name in reports.
    :param direction: 0 short, 2 long.
    """

    def __init__(self, name: str, direction: int) -> None:
        self.name = name
        self.direction = int(direction)

    def reset(self, num_books: int, device: torch.device) -> None:
        """Build the constant action."""
        self._action = torch.tensor([self.direction, 2, 0, 2], device=device).expand(num_books, 4)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """The constant action for every book."""
        return self._action


def no_information_policies(seed: int) -> dict[str, Any]:
    """The policies of :data:`POLICIES`, by name (``seed``: the random policy's)."""
    return {"random": RandomPolicy(seed), "flip_maker": FlipMakerPolicy(),
            "constant_long": ConstantPolicy("constant_long", 2),
            "constant_short": ConstantPolicy("constant_short", 0), "market_maker": MarketMakerPolicy()}


def decomposition(recording: Any) -> dict[str, float]:
    """Mean per window of a recording's PnL and its parts: ``capture`` (pre-trade mid against the fill
    price, times the lots), ``fees`` (paid; negative = rebates), ``moves`` (the rest: the mid's moves on the
    position, from the fill's step on), with the per-step Sharpe ratio and the share of lots traded by
    LimitMaker."""
    series = recording.series
    windows = float(recording.offsets.numel())
    pnl, fees, cost = (float(series[k].double().sum()) / windows for k in ("step_pnl", "fees", "spread_cost"))
    step = series["step_pnl"].double()[series["alive"]]
    lots = float(series["traded_lots"].double().sum())
    return {"pnl": pnl, "capture": -cost, "fees": fees, "moves": pnl + fees + cost,
            "sharpe_per_step": float(step.mean() / step.std().clamp_min(1e-12)),
            "maker_share": float(series["maker_lots"].double().sum()) / lots if lots else 0.0,
            "lots": lots / windows}


def pooled(rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], length: int, name: str,
           seed: int) -> dict[str, Any]:
    """The paired comparison over the windows of every seed at once: each seed's windows keep their time
    order, and seeds follow each other (start rows shifted so that no two seeds' windows overlap)."""
    shift = 0
    policy, base, starts = [], [], []
    for p, b, s in rows:
        policy.append(p.reshape(-1))
        base.append(b.reshape(-1))
        starts.append(s.reshape(-1).cpu() + shift)
        shift = int(starts[-1].max()) + 2 * length
    return stats.paired_windows(torch.cat(policy), torch.cat(base), torch.cat(starts), length, baseline=name,
                                seed=seed)


def run(seeds: tuple[int, ...], signal_strength: float, seed: int = 0) -> dict[str, Any]:
    """Every comparison of the experiment (see the module docstring).

    :return: ``{"per_seed": {policy: [row per seed]}, "pooled": {policy: row}, "decomposition": {policy:
        [per seed]}, "oracle": [row per seed], "oracle_pooled": row}``.
    """
    per_seed: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    parts: dict[str, list[dict[str, float]]] = {name: [] for name in (*POLICIES, "flat")}
    windows: dict[str, list[Any]] = {name: [] for name in POLICIES}
    length = 0
    for market_seed in seeds:
        evaluation = evaluate_policies(no_information_policies(seed), baselines=("flat",), seed=seed,
                                       market_seed=market_seed, train_market_seed=0)
        flat = evaluation.results["flat"].recording
        length = flat.episode_length
        parts["flat"].append(decomposition(flat))
        for name in POLICIES:
            row = evaluation.comparisons[name][0]
            row["market_seed"] = market_seed
            per_seed[name].append(row)
            recording = evaluation.results[name].recording
            parts[name].append(decomposition(recording))
            windows[name].append((episode_pnl(recording), episode_pnl(flat), flat.offsets))
    stats.correct({f"{name} seed {row['market_seed']}": [row] for name in POLICIES for row in per_seed[name]})
    pooled_rows = {name: pooled(windows[name], length, "flat", seed) for name in POLICIES}
    stats.correct({name: [row] for name, row in pooled_rows.items()})
    oracle_rows, oracle_windows = [], []
    for market_seed in seeds:
        evaluation = evaluate_policies({"signal_oracle": "oracle"}, baselines=("flat",), seed=seed,
                                       market_seed=market_seed, train_market_seed=0,
                                       market_kwargs={"signal_strength": signal_strength})
        row = evaluation.comparisons["signal_oracle"][0]
        row["market_seed"] = market_seed
        oracle_rows.append(row)
        oracle, flat = evaluation.results["signal_oracle"].recording, evaluation.results["flat"].recording
        oracle_windows.append((episode_pnl(oracle), episode_pnl(flat), flat.offsets))
    stats.correct({f"oracle seed {row['market_seed']}": [row] for row in oracle_rows})
    oracle_pooled = pooled(oracle_windows, length, "flat", seed)
    stats.correct({"oracle": [oracle_pooled]})
    return {"per_seed": per_seed, "pooled": pooled_rows, "decomposition": parts, "oracle": oracle_rows,
            "oracle_pooled": oracle_pooled}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _significant(row: dict[str, Any]) -> str:
    """``better`` / ``worse`` than flat where the Holm-adjusted p-value is under 0.05, else ``no``."""
    if row["p_holm"] >= 0.05:
        return "no"
    return "better" if row["mean_difference"] > 0 else "worse"


def _seeds(rows: list[dict[str, Any]]) -> str:
    """Seeds whose own comparison is significantly better / worse than flat (Holm over the family)."""
    better = sum(_significant(r) == "better" for r in rows)
    worse = sum(_significant(r) == "worse" for r in rows)
    return f"{better} / {worse} of {len(rows)}"


def table(result: dict[str, Any]) -> str:
    """The Markdown table: per policy, pooled over the seeds (PnL parts: mean per window over the seeds)."""
    lines = ["| policy | PnL − flat per window, 95 % interval | Holm p | significant | seeds better / worse "
             "(Holm) | Sharpe / step | capture | fees | mid moves |", "|---|---|---|---|---|---|---|---|---|"]
    for name in POLICIES:
        row = result["pooled"][name]
        parts = result["decomposition"][name]
        cells = [f"{row['mean_difference']:+,.1f} [{row['ci_low']:+,.1f}, {row['ci_high']:+,.1f}]",
                 f"{row['p_holm']:.3f}", _significant(row), _seeds(result["per_seed"][name]),
                 f"{_mean([p['sharpe_per_step'] for p in parts]):+.4f}"]
        cells += [f"{_mean([p[k] for p in parts]):+,.1f}" for k in ("capture", "fees", "moves")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    row = result["oracle_pooled"]
    lines.append(f"| signal oracle (planted signal) | {row['mean_difference']:+,.1f} [{row['ci_low']:+,.1f}, "
                 f"{row['ci_high']:+,.1f}] | {row['p_holm']:.3f} | {_significant(row)} | "
                 f"{_seeds(result['oracle'])} | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/free_edge", help="folder of free_edge.json (created)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="held-out market seeds")
    parser.add_argument("--signal-strength", type=float, default=SIGNAL_STRENGTH,
                        help="planted signal of the oracle check")
    args = parser.parse_args(argv)
    if 0 in args.seeds:
        parser.error("--seeds holds 0, the training market's seed: not held out")
    started = time.time()
    result = run(tuple(args.seeds), args.signal_strength)
    text = table(result)
    print(text)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    shown = sys.argv[1:] if argv is None else argv
    meta = {"command": "python -m experiments.free_edge " + " ".join(shown), "commit": git.stdout.strip(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
            "seconds": round(time.time() - started, 1), "seeds": args.seeds,
            "signal_strength": args.signal_strength}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "free_edge.json").write_text(json.dumps({"meta": meta, **result}, indent=1))
    print(f"wrote {out / 'free_edge.json'} ({json.dumps(meta)})")
    return result


if __name__ == "__main__":
    main()
