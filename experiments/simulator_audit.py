"""Simulator audit: adverse selection and resting-order fill rates, on GOOG and on the synthetic market.

One command (from the repository root)::

    python -m experiments.simulator_audit --out runs/audit

It measures, on every market it is given (GOOG at 100 and 20 messages a step, the synthetic market with
its default flow (persistent metaorders, the sweep gate of issue 39), with ``METAORDER_FLOW`` (before the
sweep gate), ``AUDIT_FLOW`` (the audit's market, before metaorders) and with ``LEGACY_FLOW`` (the market
before the audit)):

(a) adverse selection: how the signed trade flow of a step (buyer- minus seller-initiated executed
    shares, ``exec_ask - exec_bid``) predicts the mid move over the next ``k`` steps (correlation, and the
    regression slope in ticks per share); ``k = 0`` is the move of the step itself; with the lag-1
    autocorrelations of that flow and of the mid move (how persistent the flow is);
(b) fill rates of a resting order at distance ``d`` ticks behind the own touch (``d = -1`` one tick
    inside the spread, where the spread allows; ``0`` at the touch): the share of orders that the env's
    fill rules (``fill_model`` conservative and optimistic, with ``order_latency`` 0 and 1) fill at all
    within ``h`` steps, the share of the order's size they fill, the share of cases where the market
    actually traded at or strictly through that price within ``h`` steps, and the mark-out of a fill
    (``side * (mid 20 steps after the fill step - price)``, ticks: the maker's edge after adverse
    selection).

It prints the tables and writes ``audit.json`` and ``audit.md`` (the Markdown tables) under ``--out``.
Everything is tensors: the replay of the orders runs over all posting rows at once, with a Python loop
over the ``h`` steps of the horizon only.
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

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data import load_market
from foxenv.data.market import FLOW_WIDTH, MarketData
from foxenv.data.synthetic import AUDIT_FLOW, LEGACY_FLOW, METAORDER_FLOW, generate_synthetic
from foxenv.matching import meet_flow, meet_flow_conservative

HORIZONS = (0, 1, 5, 20)
DISTANCES = (-1, 0, 1, 2, 3, 5)
FILL_HORIZONS = (1, 5, 20)
MARKOUT_STEPS = 20
ORDER_SIZE = 25.0  # lots: the smallest magnitude (0.25) of the default max_position (100)
QUEUE_POWER = 2.0  # EnvConfig().queue_power
DEFAULT_LOBSTER = "/work/shared/data/lobster"


def mid_ticks(market: MarketData) -> torch.Tensor:
    """``[T]`` float64 mid of each snapshot, in ticks."""
    return (market.bid_price[:, 0] + market.ask_price[:, 0]).double() / (2.0 * market.tick_size)


def signed_flow(market: MarketData) -> torch.Tensor:
    """``[T]`` float64 buyer- minus seller-initiated executed shares of each step."""
    return market.exec_ask.double().sum(1) - market.exec_bid.double().sum(1)


def adverse_selection(
    market: MarketData, horizons: tuple[int, ...] = HORIZONS
) -> dict[str, dict[str, float]]:
    """Correlation and OLS slope (ticks per share) of the ``k``-step mid move after a step on its flow.

    :param market: the timeline (snapshot ``t`` is the book at the end of step ``t``).
    :param horizons: ``k`` values; 0 = the move during the step itself.
    :return: ``{str(k): {"corr", "slope_ticks_per_share", "slope_ticks_per_100", "n"}}``.
    """
    flow, mid = signed_flow(market), mid_ticks(market)
    out: dict[str, dict[str, float]] = {}
    for k in horizons:
        if k == 0:
            x, y = flow[1:], mid[1:] - mid[:-1]
        else:
            x, y = flow[: -k], mid[k:] - mid[:-k]
        x, y = x - x.mean(), y - y.mean()
        slope = float((x * y).sum() / (x * x).sum().clamp_min(1e-300))
        corr = float((x * y).sum() / ((x * x).sum() * (y * y).sum()).sqrt().clamp_min(1e-300))
        out[str(k)] = {"corr": corr, "slope_ticks_per_share": slope, "slope_ticks_per_100": 100 * slope,
                       "n": int(x.numel())}
    return out


def _lag_correlation(series: torch.Tensor, lag: int = 1) -> float:
    """Autocorrelation of ``series`` at ``lag``."""
    x, y = series[:-lag] - series[:-lag].mean(), series[lag:] - series[lag:].mean()
    return float((x * y).sum() / ((x * x).sum() * (y * y).sum()).sqrt().clamp_min(1e-300))


def persistence(market: MarketData) -> dict[str, float]:
    """Lag-1 and lag-2 autocorrelations of the signed flow, and lag-1 of the mid move (in ticks)."""
    flow, move = signed_flow(market), mid_ticks(market).diff()
    return {"flow_autocorr_1": _lag_correlation(flow, 1), "flow_autocorr_2": _lag_correlation(flow, 2),
            "move_autocorr_1": _lag_correlation(move, 1)}


def _side_tables(market: MarketData, side: int) -> dict[str, torch.Tensor]:
    """The own-side book (ticks, sizes), touch, and flow grids a resting order of ``side`` meets."""
    tick = market.tick_size
    if side > 0:  # a buy rests among the bids, is hit by sellers (exec_bid), traded through below it
        prices, sizes = market.bid_price, market.bid_size
        executed, cancelled = market.exec_bid, market.cancel_bid
        through = torch.cat([torch.zeros_like(executed[:, :1]), executed.cumsum(1)[:, :-1]], 1)
    else:  # a sell rests among the asks, lifted by buyers (exec_ask), traded through above it
        prices, sizes = market.ask_price, market.ask_size
        executed, cancelled = market.exec_ask, market.cancel_ask
        through = torch.cat([executed.flip(1).cumsum(1).flip(1)[:, 1:], torch.zeros_like(executed[:, :1])], 1)
    return {
        "ticks": torch.round(prices.double() / tick).to(torch.int64),
        "sizes": sizes.double(),
        "executed": executed.double(),
        "cancelled": cancelled.double(),
        "through": through.double(),
        "spread": torch.round((market.ask_price[:, 0] - market.bid_price[:, 0]).double() / tick),
    }


def replay_orders(
    market: MarketData, side: int, distance: int, horizon: int, fill_model: str, latency: int = 0,
    size: float = ORDER_SIZE,
) -> dict[str, torch.Tensor]:
    """Post one order of ``size`` at every eligible snapshot ``i`` and let it meet the flow of steps
    ``i + 1 + latency .. i + horizon`` by the env's rules (as :class:`foxenv.core.BatchedLOB` does: queue
    ahead = visible size at its price when it starts resting, ProbQueue cancellations, executions at its
    price, trades through it; the edge column of the grid counts as through when its price is off the
    grid).

    :return: per posting row ``[N]``: ``filled`` shares, ``first_fill`` step of the first fill (-1 none),
        ``touched`` (the market traded at or through its price in the horizon), ``through`` (strictly
        through), ``price`` in ticks.
    """
    sides = _side_tables(market, side)
    steps = market.num_steps
    rows = torch.arange(steps - horizon - MARKOUT_STEPS)
    touch = sides["ticks"][rows, 0]
    price = touch - side * distance
    if distance < 0:  # inside the spread: only where the spread leaves room
        rows = rows[sides["spread"][rows] >= 2 * (-distance)]
        touch = sides["ticks"][rows, 0]
        price = touch - side * distance
    width = FLOW_WIDTH
    ahead = torch.zeros(rows.numel(), dtype=torch.float64)
    filled = torch.zeros_like(ahead)
    first_fill = torch.full_like(rows, -1)
    touched = torch.zeros(rows.numel(), dtype=torch.bool)
    crossed = torch.zeros_like(touched)
    for j in range(1, horizon + 1):
        start = rows + j - 1  # the snapshot at the start of flow step rows + j
        visible = (sides["sizes"][start] * (sides["ticks"][start] == price[:, None])).sum(1)
        flow_row = rows + j
        column = price - market.flow_ref_tick[flow_row] + width // 2
        clamped = column.clamp(0, width - 1)
        executed = sides["executed"][flow_row, clamped]
        cancelled = sides["cancelled"][flow_row, clamped]
        through = sides["through"][flow_row, clamped]
        at_price = column == clamped
        beyond = side * (column - clamped) > 0
        through = torch.where(beyond, through + executed, through)
        executed, cancelled = executed * at_price, cancelled * at_price
        touched |= (executed + through) > 0
        crossed |= through > 0
        if j <= latency:
            continue
        if j == latency + 1:
            ahead = visible
        remaining = size - filled
        if fill_model == "optimistic":
            fill, ahead = meet_flow(ahead, remaining, visible, executed, cancelled, through > 0, QUEUE_POWER)
        else:
            fill, ahead = meet_flow_conservative(ahead, remaining, visible, executed, cancelled, through,
                                                 QUEUE_POWER)
        first_fill = torch.where((first_fill < 0) & (fill > 0), flow_row, first_fill)
        filled = filled + fill
    return {"filled": filled, "first_fill": first_fill, "touched": touched, "through": crossed,
            "price": price}


def fill_table(
    market: MarketData, models: tuple[tuple[str, int], ...], size: float = ORDER_SIZE
) -> list[dict[str, Any]]:
    """Fill statistics of orders of ``size`` shares by distance, horizon and (fill model, latency), buys
    and sells pooled."""
    mid = mid_ticks(market)
    table = []
    for distance in DISTANCES:
        for horizon in FILL_HORIZONS:
            row: dict[str, Any] = {"distance": distance, "horizon": horizon}
            for model, latency in models:
                runs = [(s, replay_orders(market, s, distance, horizon, model, latency, size))
                        for s in (1, -1)]
                filled = torch.cat([r["filled"] for _, r in runs])
                row["touched"] = float(torch.cat([r["touched"] for _, r in runs]).double().mean())
                row["through"] = float(torch.cat([r["through"] for _, r in runs]).double().mean())
                key = f"{model}_lat{latency}"
                row[f"{key}_any"] = float((filled > 0).double().mean())
                row[f"{key}_share"] = float(filled.mean() / size)
                markouts = []
                for s, r in runs:
                    hit = r["first_fill"] >= 0
                    after = mid[r["first_fill"][hit] + MARKOUT_STEPS]
                    markouts.append(s * (after - r["price"][hit].double()))
                markout = torch.cat(markouts)
                row[f"{key}_markout"] = float(markout.mean()) if markout.numel() else float("nan")
            row["n"] = int(filled.numel())
            table.append(row)
    return table


def check_against_env(market: MarketData, models: tuple[tuple[str, int], ...], horizon: int = 5) -> float:
    """Largest difference, in shares, between :func:`replay_orders` and the env's own step
    (:class:`foxenv.core.BatchedLOB`, one book per posting row, a LimitMaker buy of the smallest magnitude
    held for ``horizon`` steps) over the three LimitMaker urgencies (``d`` = 1, 0, -1) and ``models``."""
    worst = 0.0
    for model, latency in models:
        for urgency, distance in ((0, 1), (1, 0), (2, -1)):
            replay = replay_orders(market, 1, distance, horizon, model, latency)
            rows = torch.arange(market.num_steps - horizon - MARKOUT_STEPS)
            if distance < 0:
                spread = torch.round((market.ask_price[:, 0] - market.bid_price[:, 0]) / market.tick_size)
                rows = rows[spread[rows] >= 2]
            config = EnvConfig(levels=market.num_levels, episode_length=horizon, fill_model=model,
                               order_latency=latency, queue_power=QUEUE_POWER)
            env = BatchedLOB(market, rows.numel(), config, seed=0)
            state = env.state_dict()
            state["offset"] = rows.clone()
            env.load_state_dict(state)
            action = torch.tensor([[2, 0, 1, urgency]]).repeat(rows.numel(), 1)  # long, 0.25, LimitMaker
            for _ in range(horizon):
                info = env.step(action)[4]
            worst = max(worst, float((info["position"] - replay["filled"]).abs().max()))
    return worst


def describe(market: MarketData) -> dict[str, float]:
    """A few level statistics: steps, share of steps with executions on a side, mean executed shares."""
    executed = market.exec_bid.double().sum(1) + market.exec_ask.double().sum(1)
    move = mid_ticks(market).diff()
    return {
        "steps": market.num_steps,
        "steps_with_sell_execution": float((market.exec_bid.sum(1) > 0).double().mean()),
        "steps_with_buy_execution": float((market.exec_ask.sum(1) > 0).double().mean()),
        "executed_per_step": float(executed.mean()),
        "mid_move_std_ticks": float(move.std()),
        "spread_median_ticks": float(torch.round(
            (market.ask_price[:, 0] - market.bid_price[:, 0]).double() / market.tick_size).median()),
        **persistence(market),
    }


def print_tables(name: str, result: dict[str, Any], models: tuple[tuple[str, int], ...]) -> None:
    print(f"\n== {name}: {json.dumps(result['describe'])}")
    print(f"replay vs the env's step: largest difference {result['max_diff_replay_vs_env_shares']} shares")
    print("adverse selection (k = steps after the flow's step; 0 = same step):")
    for k, stats in result["adverse_selection"].items():
        slope = stats["slope_ticks_per_100"]
        print(f"  k={k:>2}  corr {stats['corr']:+.3f}  slope {slope:+.3f} ticks / 100 sh")
    head = "   d   h  touched through " + " ".join(f"{m[:5]}{lat}:any/share/mko" for m, lat in models)
    print(head)
    for row in result["fills"]:
        cells = " ".join(
            f"{row[f'{m}_lat{lat}_any']:.3f}/{row[f'{m}_lat{lat}_share']:.3f}/{row[f'{m}_lat{lat}_markout']:+6.1f}"
            for m, lat in models
        )
        where = f"{row['distance']:>2} {row['horizon']:>3}"
        print(f"  {where}  {row['touched']:.3f}   {row['through']:.3f}   {cells}")


def markdown(results: dict[str, Any], meta: dict[str, Any], models: tuple[tuple[str, int], ...]) -> str:
    """The audit's tables as Markdown (what ``experiments/README.md`` shows)."""
    lines = [
        "| market | steps | a side trades in | k=0 corr / slope | k=1 | k=5 | k=20 | flow autocorr lag 1 / 2 "
        "| mid move autocorr | mid move std |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        d = result["describe"]
        trades = (d["steps_with_sell_execution"] + d["steps_with_buy_execution"]) / 2
        stats = result["adverse_selection"].values()
        cells = [f"{s['corr']:+.3f} / {s['slope_ticks_per_100']:+.2f}" for s in stats]
        tail = (f" | {d['flow_autocorr_1']:+.3f} / {d['flow_autocorr_2']:+.3f} | "
                f"{d['move_autocorr_1']:+.3f} | {d['mid_move_std_ticks']:.1f} |")
        lines.append(f"| {name} | {d['steps']} | {100 * trades:.0f} % | " + " | ".join(cells) + tail)
    lines += ["", "Slopes in ticks of mid move per 100 shares of signed flow (buys minus sells).", ""]
    heads = " | ".join(f"{m} lat {lat}: filled / share / mark-out" for m, lat in models)
    lines += [f"| market | d | h | traded at or through / strictly through | {heads} |",
              "|---|---|---|---|" + "---|" * len(models)]
    for name, result in results.items():
        for row in result["fills"]:
            if row["distance"] not in (-1, 0, 1, 3) or row["horizon"] not in (1, 5):
                continue
            cells = " | ".join(
                f"{row[f'{m}_lat{lat}_any']:.2f} / {row[f'{m}_lat{lat}_share']:.2f} / "
                f"{row[f'{m}_lat{lat}_markout']:+.1f}" for m, lat in models
            )
            lines.append(f"| {name} | {row['distance']} | {row['horizon']} | "
                         f"{row['touched']:.2f} / {row['through']:.2f} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/audit", help="folder of audit.json (created)")
    parser.add_argument("--lobster", default=DEFAULT_LOBSTER, help="folder of the GOOG LOBSTER pair")
    parser.add_argument("--step-events", type=int, nargs="+", default=[100, 20], help="GOOG messages a step")
    parser.add_argument("--synthetic-steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0, help="synthetic market seed")
    parser.add_argument("--order-size", type=float, default=ORDER_SIZE, help="shares of the replayed orders")
    args = parser.parse_args(argv)
    models = (("conservative", 0), ("conservative", 1), ("optimistic", 0))
    markets: dict[str, MarketData] = {}
    for events in args.step_events:
        markets[f"GOOG {events} msg/step"] = load_market(args.lobster, step_events=events)
    markets["synthetic (default)"] = generate_synthetic(args.synthetic_steps, seed=args.seed)
    markets["synthetic METAORDER_FLOW (before the sweep gate)"] = generate_synthetic(
        args.synthetic_steps, seed=args.seed, **METAORDER_FLOW
    )
    markets["synthetic AUDIT_FLOW (before metaorders)"] = generate_synthetic(
        args.synthetic_steps, seed=args.seed, **AUDIT_FLOW
    )
    markets["synthetic LEGACY_FLOW (before the audit)"] = generate_synthetic(
        args.synthetic_steps, seed=args.seed, **LEGACY_FLOW
    )
    results: dict[str, Any] = {}
    for name, market in markets.items():
        result = {
            "describe": describe(market),
            "adverse_selection": adverse_selection(market),
            "fills": fill_table(market, models, args.order_size),
            "max_diff_replay_vs_env_shares": check_against_env(market, models),
        }
        results[name] = result
        print_tables(name, result, models)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = git.stdout.strip()
    shown = sys.argv[1:] if argv is None else argv
    meta = {"command": "python -m experiments.simulator_audit " + " ".join(shown), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
            "order_size": args.order_size, "markout_steps": MARKOUT_STEPS, "queue_power": QUEUE_POWER}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(json.dumps({"meta": meta, "markets": results}, indent=1))
    (out / "audit.md").write_text(markdown(results, meta, models))
    print(f"\nwrote {out / 'audit.json'} ({json.dumps(meta)})")
    return results


if __name__ == "__main__":
    main()
