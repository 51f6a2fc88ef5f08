"""Does a planted market need several sizes and order types? The best rule of a family that knows the planted
signal, fitted on the training market, and its action mix on the held-out one.

    python -m experiments.market_mix --signal-strength 2 --signal-horizon 5 --max-positions 100,400,1000

The oracle (:class:`foxhunt.evaluation.baselines.OraclePolicy`) goes all in with Market orders, so its mix
is one size and one order type whatever the market. A mix criterion ("Half > 15 %, LimitMaker > 5 %") is
fair only on a market where a good policy needs those sizes and order types. :class:`RulePolicy` keeps the
oracle's forecast (the mid move still to come, ``m`` ticks, against the round trip's cost ``c``: spread plus
two taker fees) and adds a *sizing* rule (Quarter, Half or Full by the edge ratio ``|m| / c``) and an
*order* rule (how it enters and how it exits: Market, IoC, LimitMaker). :data:`SIZINGS` x :data:`ENTRIES` x
:data:`EXITS` make the family; the all-in Market rule is the oracle itself. The family is scored on the
training market and the best rule by PnL after fees is scored on the held-out market beside the oracle.
Where the best rule clears the floors of :data:`MIX_FLOORS` and out-earns the
oracle, the market needs those sizes and order types; where the all-in Market rule wins, it does not.

``--max-positions`` repeats the search for several ``max_position`` settings (a position larger than the
book's depth walks the book, so sizing can pay). Prints a table and writes ``market_mix.json`` and
``market_mix.md`` into ``--out`` (default ``runs/experiments/market_mix``).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from experiments import results
from foxenv import spec
from foxenv.config import EnvConfig
from foxhunt.evaluation.baselines import POSITION_FROM_END, OraclePolicy

#: The plan's least shares of the greedy action mix (issue 23.3): (branch, value index, value name, share).
MIX_FLOORS: tuple[tuple[str, int, str, float], ...] = (
    ("magnitude", 1, "Half", 0.15), ("magnitude", 2, "Full", 0.10),
    ("order", 1, "LimitMaker", 0.05), ("order", 2, "IoC", 0.03),
)

#: Value names of each branch, in the tables and figures.
VALUE_NAMES: dict[str, tuple[str, ...]] = {
    "direction": ("short", "flat", "long"),
    "magnitude": ("Quarter", "Half", "Full"),
    "order": ("Market", "LimitMaker", "IoC"),
    "urgency": spec.URGENCIES,
}
#: The two counts of the action mix: every live book-step, and the *working* ones (target != position held).
MIX_SCOPES = ("all", "working")
#: Sizing rules: edge ratios ``|m| / c`` above which the target is Half and Full (Quarter from 1 up).
SIZINGS: dict[str, tuple[float, float]] = {"all_in": (1.0, 1.0), "graded_1.5_2.5": (1.5, 2.5),
                                           "graded_2_4": (2.0, 4.0)}
#: How a rule enters or adds to a position: (order index, urgency index) of :mod:`foxenv.spec`, or
#: :data:`BY_EDGE`.
ENTRIES: dict[str, tuple[int, int]] = {"market": (0, 2), "ioc_touch": (2, 0), "ioc_1tick": (2, 1),
                                       "maker_touch": (1, 1), "by_edge": (-1, -1)}
#: The entry that follows the edge: LimitMaker at the touch up to the Half ratio, IoC at the touch up to the
#: Full ratio, Market above (patient when the edge is thin, urgent when it is large).
BY_EDGE = (-1, -1)
#: The (order, urgency) of :data:`BY_EDGE`'s three bands.
EDGE_BANDS = ((1, 1), (2, 0), (0, 2))
#: How a rule reduces a position to flat.
EXITS: dict[str, tuple[int, int]] = {"market": (0, 2), "ioc_touch": (2, 0), "maker_touch": (1, 1)}
#: The family's member that is the oracle (all in, Market in and out).
ORACLE_RULE = "all_in/market/market"


def action_mix(series: Mapping[str, torch.Tensor], max_position: float) -> dict[str, Any]:
    """The action mix of a recorded run, over every live book-step and over the working ones.

    :param series: a recording's series (``actions`` ``[N, B, 4]``, ``position``, ``alive``,
        ``episode_start``: :data:`foxhunt.evaluation.recorder.SERIES`).
    :param max_position: the env's ``max_position`` (lots), which turns an action into its target.
    :return: ``{"all": {branch: [share of each value]}, "working": {...}, "steps": {"all": n, "working": n}}``
        (a scope with no step has NaN shares).
    """
    actions = series["actions"].long()
    alive = series["alive"].bool()
    held = torch.roll(series["position"].double(), 1, dims=0)
    held[0] = 0.0
    held = held.masked_fill(series["episode_start"].bool(), 0.0)  # every episode starts flat
    directions = torch.tensor(spec.DIRECTIONS, dtype=torch.float64, device=actions.device)
    magnitudes = torch.tensor(spec.MAGNITUDES, dtype=torch.float64, device=actions.device)
    target = directions[actions[..., 0]] * magnitudes[actions[..., 1]] * float(max_position)
    working = alive & ((target - held).abs() > 1e-9)
    out: dict[str, Any] = {"steps": {}}
    for scope, mask in zip(MIX_SCOPES, (alive, working), strict=True):
        chosen = actions[mask]
        out["steps"][scope] = int(chosen.shape[0])
        out[scope] = {
            branch: [float((chosen[:, b] == v).double().mean()) if chosen.shape[0] else math.nan
                     for v in range(spec.ACTION_NVEC[b])]
            for b, branch in enumerate(spec.BRANCH_NAMES)
        }
    return out


def clears_floors(mix: Mapping[str, Sequence[float]]) -> dict[str, bool]:
    """Whether one mix clears each floor of :data:`MIX_FLOORS`: ``{value name: share > floor}``."""
    return {name: bool(mix[branch][index] > floor) for branch, index, name, floor in MIX_FLOORS}


class RulePolicy(OraclePolicy):
    """The oracle's forecast with a sizing and an order rule.

    With ``r = |m| / c`` (the expected move over the round trip's cost) and ``s`` the side of ``m``: when
    ``r > 1`` the target is ``s`` times Quarter, Half (``r > sizing[0]``) or Full (``r > sizing[1]``), never
    below the position already held on that side; when ``r <= 1`` the position is held while ``s`` still
    points its way, else the target is flat. Orders that open, add or flip use ``entry``, orders that go
    flat use ``exit``; a step whose target equals the position repeats ``entry`` (no order is sent).

    :param signal_strength: the planted strength (> 0).
    :param signal_horizon: the planted horizon.
    :param sizing: the edge ratios above which the target is Half and Full (``(1, 1)``: always Full).
    :param entry: ``(order, urgency)`` indices of opening orders, or :data:`BY_EDGE`.
    :param exit: ``(order, urgency)`` indices of closing orders.
    :param oracle_kwargs: :class:`OraclePolicy`'s other arguments (levels, fees, tick, price, profile).
    """

    def __init__(self, signal_strength: float, signal_horizon: int, sizing: tuple[float, float] = (1.0, 1.0),
                 entry: tuple[int, int] = (0, 2), exit: tuple[int, int] = (0, 2), name: str = ORACLE_RULE,
                 **oracle_kwargs: Any) -> None:
        super().__init__(signal_strength, signal_horizon, **oracle_kwargs)
        if not 1.0 <= sizing[0] <= sizing[1]:
            raise ValueError(f"sizing={sizing} must be edge ratios 1 <= half <= full")
        for label, (order, urgency) in (("entry", entry), ("exit", exit)):
            if label == "entry" and tuple(entry) == BY_EDGE:
                continue
            if order not in range(len(spec.ORDER_TYPES)) or urgency not in range(len(spec.URGENCIES)):
                raise ValueError(f"{label}={(order, urgency)} must be (order, urgency) indices in [0, 3)")
        self.sizing, self.entry, self.exit, self.name = tuple(sizing), tuple(entry), tuple(exit), name

    def reset(self, num_books: int, device: torch.device) -> None:
        """Clear the signal memory; put the sizes and the order bands on the device once."""
        super().reset(num_books, device)
        self._sizes = torch.tensor(spec.MAGNITUDES, dtype=torch.float64, device=device)
        bands = EDGE_BANDS if self.entry == BY_EDGE else (self.entry,) * 3
        self._bands = torch.tensor(bands, dtype=torch.int64, device=device)

    def act(self, obs: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
        """Sized target along the expected move; the entry or exit order that works it."""
        move = self.expected_move(obs, episode_start)
        ratio = move.abs() / (obs[:, self.spread_column].double() + self.fee_ticks)
        side = torch.sign(move)
        held = obs[:, POSITION_FROM_END].double()  # position / max_position
        held_side, held_size = torch.sign(held), held.abs()
        band = (ratio > self.sizing[0]).long() + (ratio > self.sizing[1]).long()
        sized = self._sizes[band]
        sized = torch.where(held_side == side, torch.maximum(sized, held_size), sized)
        size = torch.where(ratio > 1.0, sized, torch.where(held_side == side, held_size, 0.0))
        direction = torch.where(size > 0, side, 0.0)
        # the magnitude index whose size is nearest (a partly filled position keeps its intended size)
        magnitude = (size[:, None] - self._sizes[None, :]).abs().argmin(dim=1)
        closing = (direction == 0) & (held_size > 0)
        entry = self._bands[band]  # by the edge, or the one entry in every band
        actions = torch.empty((obs.shape[0], 4), dtype=torch.int64, device=obs.device)
        actions[:, 0] = direction.long() + 1
        actions[:, 1] = torch.where(direction == 0, 2, magnitude)
        actions[:, 2] = torch.where(closing, self.exit[0], entry[:, 0])
        actions[:, 3] = torch.where(closing, self.exit[1], entry[:, 1])
        return actions


def rule_family(signal_strength: float, signal_horizon: int, **oracle_kwargs: Any) -> dict[str, RulePolicy]:
    """Every rule of :data:`SIZINGS` x :data:`ENTRIES` x :data:`EXITS`, by ``"sizing/entry/exit"``."""
    return {f"{s}/{e}/{x}": RulePolicy(signal_strength, signal_horizon, SIZINGS[s], ENTRIES[e], EXITS[x],
                                       name=f"{s}/{e}/{x}", **oracle_kwargs)
            for s in SIZINGS for e in ENTRIES for x in EXITS}


def oracle_kwargs_of(market_kwargs: Mapping[str, Any], env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The oracle's arguments for a planted synthetic market and env (as the evaluation builds its oracle)."""
    config = EnvConfig(**env_kwargs)
    knobs = {k: market_kwargs[k] for k in ("vol_ticks",) if k in market_kwargs}
    return {"signal_strength": float(market_kwargs["signal_strength"]),
            "signal_horizon": int(market_kwargs.get("signal_horizon", 1)), "levels": config.levels,
            "taker_fee_bps": config.taker_fee_bps, "tick_size": float(market_kwargs.get("tick_size", 0.01)),
            "price": float(market_kwargs.get("start_price", 580.0)), **knobs}


def score(policy: Any, market: Any, env_kwargs: Mapping[str, Any], books: int, steps: int | None,
          seed: int, device: str) -> dict[str, Any]:
    """PnL, Sharpe per step, trades and action mix of one policy on ``books`` windows of ``market``."""
    from foxhunt.evaluation.metrics import compute_metrics
    from foxhunt.evaluation.recorder import record

    recording = record(policy, market, num_books=books, num_steps=steps, seed=seed,
                       env_kwargs=dict(env_kwargs), device=device)
    metrics = compute_metrics(recording)
    return {"pnl": float(metrics["pnl"]), "sharpe": float(metrics["sharpe"]),
            "trades": int(metrics["trades"]),
            "mix": action_mix(recording.series, EnvConfig(**env_kwargs).max_position)}


def probe(market_kwargs: Mapping[str, Any], env_kwargs: Mapping[str, Any], *, train_market_seed: int = 0,
          eval_market_seed: int = 1, books: int = 16, steps: int | None = None, seed: int = 1000,
          device: str = "cpu", rules: Sequence[str] | None = None) -> dict[str, Any]:
    """Fit the rule family on the training market, score the best rule and the oracle held out.

    :param market_kwargs: the synthetic market's options (``signal_strength`` > 0, ``num_steps``, ...).
    :param env_kwargs: :class:`~foxenv.config.EnvConfig` fields.
    :param rules: the rules to fit over (default: the whole family; the oracle's is always among them).
    :return: ``{"fit": {rule: {"pnl", "sharpe"}}, "best": name, "held_out": {"oracle": ..., "best": ...}}``
        (each held-out entry: PnL, Sharpe, trades, mix; ``"clears"``: the best rule's mix against the floors).
    """
    from foxhunt.evaluation.api import build_market, plan_windows

    if not float(market_kwargs.get("signal_strength", 0) or 0) > 0:
        raise ValueError("market_kwargs.signal_strength must be > 0: the rules trade the planted signal")
    options = dict(market_kwargs)
    options.pop("market_seed", None)
    if "levels" in env_kwargs:  # as the training env and the evaluation generate their market
        options.setdefault("levels", env_kwargs["levels"])
    family = rule_family(**oracle_kwargs_of(options, env_kwargs))
    if rules is not None:
        unknown = [r for r in rules if r not in family]
        if unknown:
            raise ValueError(f"rules holds {unknown[0]!r}; rules are named sizing/entry/exit, e.g. "
                             f"{ORACLE_RULE!r}")
        family = {r: family[r] for r in dict.fromkeys([ORACLE_RULE, *rules])}
    length = int(env_kwargs.get("episode_length", EnvConfig().episode_length))
    fit: dict[str, dict[str, float]] = {}
    held: dict[str, Any] = {}
    for name, market_seed in (("fit", train_market_seed), ("held_out", eval_market_seed)):
        market = build_market("synthetic", market_seed=market_seed, device=device, **options)
        n, vector_steps, _ = plan_windows(market.num_steps, length, books, steps, books)
        if name == "fit":
            for rule, policy in family.items():
                found = score(policy, market, env_kwargs, n, vector_steps, seed, device)
                fit[rule] = {"pnl": found["pnl"], "sharpe": found["sharpe"]}
            best = max(fit, key=lambda r: fit[r]["pnl"])
        else:
            for label, rule in (("oracle", ORACLE_RULE), ("best", best)):
                held[label] = {"rule": rule, **score(family[rule], market, env_kwargs, n, vector_steps, seed,
                                                     device)}
    for entry in held.values():
        entry["clears"] = {scope: clears_floors(entry["mix"][scope]) for scope in MIX_SCOPES}
    return {"fit": fit, "best": best, "held_out": held}


# ---------------------------------------------------------------------------------------------------- CLI


def _pct(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.1f} %"


def mix_cells(mix: Mapping[str, Any], scope: str = "working") -> list[str]:
    """Shares of each floor's value (:data:`MIX_FLOORS`) in one mix."""
    return [_pct(mix[scope][branch][index]) for branch, index, _, _ in MIX_FLOORS]


def table(probes: Mapping[str, Mapping[str, Any]]) -> str:
    """One markdown row per setting and policy (the oracle, the best fitted rule)."""
    floors = [f"{name} (> {100 * floor:.0f} %)" for _, _, name, floor in MIX_FLOORS]
    head = ["setting", "policy", "rule", "held-out PnL", "Sharpe / step", "trades", *floors,
            "clears every floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for setting, found in probes.items():
        for label in ("oracle", "best"):
            entry = found["held_out"][label]
            clears = all(entry["clears"]["working"].values())
            lines.append("| " + " | ".join([setting, label, f"`{entry['rule']}`", f"{entry['pnl']:,.0f}",
                                             f"{entry['sharpe']:.3f}", f"{entry['trades']:,}",
                                             *mix_cells(entry["mix"]), "yes" if clears else "no"]) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m experiments.market_mix",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", default="runs/experiments/market_mix")
    parser.add_argument("--signal-strength", type=float, default=2.0)
    parser.add_argument("--signal-horizon", type=int, default=5)
    parser.add_argument("--market-steps", type=int, default=20_000)
    parser.add_argument("--train-market-seed", type=int, default=0)
    parser.add_argument("--eval-market-seed", type=int, default=1)
    parser.add_argument("--max-positions", default="100", help="comma-separated max_position settings (lots)")
    parser.add_argument("--env-kwargs", default="{}", metavar="JSON", help="env settings over the presets")
    parser.add_argument("--eval-envs", type=int, default=16, help="books (disjoint windows) per market")
    parser.add_argument("--eval-seed", type=int, default=1000)
    parser.add_argument("--rules", default=None,
                        help="comma-separated rules (sizing/entry/exit) to fit over (default: all)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if not args.signal_strength > 0:
        parser.error(f"--signal-strength {args.signal_strength} must be > 0 (the rules trade the signal)")
    if args.train_market_seed == args.eval_market_seed:
        parser.error(f"--eval-market-seed {args.eval_market_seed} equals the training market's seed")
    try:
        args.positions = [float(p) for p in args.max_positions.split(",") if p.strip()]
        args.env = json.loads(args.env_kwargs)
    except ValueError as error:
        parser.error(f"--max-positions / --env-kwargs: {error}")
    if not args.positions or min(args.positions) <= 0:
        parser.error(f"--max-positions {args.max_positions!r} must be positive numbers")
    args.rule_names = None if args.rules is None else [r.strip() for r in args.rules.split(",") if r.strip()]
    if not isinstance(args.env, dict):
        parser.error(f"--env-kwargs {args.env_kwargs!r} must be a JSON object")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Probe each setting; print and write the table."""
    from foxenv.config import split_env_kwargs
    from foxhunt.presets import CPU

    args = parse_args(argv)
    origin = results.provenance()
    env, market = split_env_kwargs({"episode_length": CPU.env.episode_length, **args.env})
    market = {**market, "signal_strength": args.signal_strength, "signal_horizon": args.signal_horizon,
              "num_steps": args.market_steps}
    probes = {}
    for position in args.positions:
        setting = f"max_position {position:g}"
        probes[setting] = probe(market, {**env, "max_position": position},
                                train_market_seed=args.train_market_seed,
                                eval_market_seed=args.eval_market_seed, books=args.eval_envs,
                                seed=args.eval_seed, device=args.device, rules=args.rule_names)
        best = probes[setting]["best"]
        print(f"{setting}: best rule on the training market {best} "
              f"(fit PnL {probes[setting]['fit'][best]['pnl']:,.0f} against the oracle's "
              f"{probes[setting]['fit'][ORACLE_RULE]['pnl']:,.0f})")
    command = "python -m experiments.market_mix " + shlex.join(list(sys.argv[1:] if argv is None else argv))
    text = (f"# market mix\n\n`{command}`\n\nplanted signal {args.signal_strength} x {args.signal_horizon}, "
            f"markets of {args.market_steps} steps, fit on seed {args.train_market_seed}, held out seed "
            f"{args.eval_market_seed}, {args.eval_envs} books; mix over the working book-steps\n\n"
            f"{table(probes)}\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "market_mix.md").write_text(text)
    payload = {"experiment": "market_mix", "command": command, "args": vars(args),
               "provenance": origin, "probes": probes}
    results.write_json(out / "market_mix.json", payload)
    print(f"\n{text}\nwritten: {out}/market_mix.json, market_mix.md")
    return payload


if __name__ == "__main__":
    main()
