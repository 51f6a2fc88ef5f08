"""The command-line options the experiment scripts share, and the :class:`~experiments.runner.Setup` and
:class:`~experiments.agents.Roster` they give.

* markets: ``--data``, ``--signal-strength``, ``--signal-horizon``, ``--market-kwargs`` (more synthetic
  profile knobs: the waves), ``--market-steps``, ``--step-events``,
  ``--levels``, ``--episode-length``, ``--train-market-seed``, ``--eval-market-seed``;
* budget: ``--seeds``, ``--concurrent-seeds``, ``--steps``, ``--n-envs``, ``--device``, ``--threads``,
  ``--net-arch``, and the
  overrides of every agent's ``--learning-rate``, ``--batch-size``, ``--buffer-size``, ``--learning-starts``,
  ``--train-freq``, ``--gradient-steps``, ``--target-update-interval``; ``--device-loop auto|on|off``
  (BranchingIQN agents collect through the device loop; ``auto``: on exactly on CUDA, as ``foxhunt train``;
  DQN / QR-DQN always run SB3's loop);
* agents and env: ``--agent-kwargs NAME=JSON`` (repeatable: a custom agent, :meth:`Roster.define`),
  ``--env-kwargs JSON`` (env settings over the presets for every agent and the held-out evaluation);
* held-out evaluation: ``--eval-envs``, ``--eval-steps``, ``--eval-seed``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from experiments.agents import Roster
from experiments.runner import Setup

#: ``--device-loop`` values and what :attr:`Setup.device_loop` gets.
DEVICE_LOOP_CHOICES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
#: Options that override the presets of every agent (argparse dest names).
OVERRIDE_OPTIONS = ("learning_rate", "batch_size", "buffer_size", "learning_starts", "train_freq",
                    "gradient_steps", "target_update_interval")


def add_arguments(parser: argparse.ArgumentParser, evaluation: bool = True) -> None:
    """The shared options (see the module docstring); ``evaluation``: with the held-out evaluation's."""
    group = parser.add_argument_group("markets")
    group.add_argument("--data", default="synthetic", help="'synthetic' or a LOBSTER folder (train -> test)")
    group.add_argument("--signal-strength", type=float, default=0.0, help="synthetic: planted signal")
    group.add_argument("--signal-horizon", type=int, default=1, help="synthetic: planted signal's horizon")
    group.add_argument("--market-kwargs", default=None, metavar="JSON",
                       help="synthetic: more profile knobs of both markets, e.g. '{\"wave_rate\": 0.02}'")
    group.add_argument("--market-steps", type=int, default=20_000, help="synthetic: steps of each market")
    group.add_argument("--step-events", type=int, default=None, help="LOBSTER: messages per step")
    group.add_argument("--levels", type=int, default=None, help="book levels (market and env)")
    group.add_argument("--episode-length", type=int, default=None, help="env steps per episode")
    group.add_argument("--train-market-seed", type=int, default=0, help="synthetic: training market's seed")
    group.add_argument("--eval-market-seed", type=int, default=None,
                       help="synthetic: held-out market's seed (default: the training market's + 1)")
    group = parser.add_argument_group("budget (shared by every agent)")
    group.add_argument("--seeds", type=int, default=3, help="seeds per agent (0..N-1)")
    group.add_argument("--concurrent-seeds", type=int, default=1, metavar="K",
                       help="train up to K BranchingIQN runs at once in this process (a thread and CUDA "
                            "stream each; each run's results as trained alone); DQN / QR-DQN one at a time")
    group.add_argument("--steps", type=int, default=20_000, help="training env steps (summed over books)")
    group.add_argument("--n-envs", type=int, default=8, help="training books")
    group.add_argument("--device", default="cpu", help="cpu or cuda")
    group.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 suits small nets)")
    group.add_argument("--net-arch", default=None, help="hidden widths, e.g. 64,64 (default: presets)")
    for name in OVERRIDE_OPTIONS:
        group.add_argument(f"--{name.replace('_', '-')}", type=float if name == "learning_rate" else int)
    group.add_argument("--device-loop", choices=list(DEVICE_LOOP_CHOICES), default="auto",
                       help="BranchingIQN agents collect through the device loop (auto: on exactly on CUDA; "
                            "DQN / QR-DQN always use SB3's loop)")
    group.add_argument("--env-kwargs", default=None, metavar="JSON",
                       help="env settings over the presets, for every agent and the evaluation, "
                            "e.g. '{\"reward_scale\": 0.01}'")
    group.add_argument("--agent-kwargs", action="append", default=[], metavar="NAME=JSON",
                       help="define agent NAME (repeatable): '{\"base\": AGENT, \"model\": {...}, "
                            "\"policy\": {...}}', merged over the base agent (default iqn)")
    if evaluation:
        group = parser.add_argument_group("held-out evaluation")
        group.add_argument("--eval-envs", type=int, default=None,
                           help="held-out books (default: synthetic 16, LOBSTER the test split walked once)")
        group.add_argument("--eval-steps", type=int, default=None, help="held-out vector steps (1 episode)")
        group.add_argument("--eval-seed", type=int, default=1000, help="seed of the held-out windows")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and reject counts argparse cannot (``--seeds`` < 1, ``--concurrent-seeds`` < 1)."""
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds} must be >= 1")
    if getattr(args, "concurrent_seeds", 1) < 1:
        parser.error(f"--concurrent-seeds {args.concurrent_seeds} must be >= 1")
    return args


def env_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """``--env-kwargs`` with ``--levels`` and ``--episode-length`` added (each given once, or the same).

    :raises ValueError: naming ``env-kwargs`` when it is not a JSON object of env settings, or when it
        contradicts ``--levels`` / ``--episode-length``.
    """
    from foxenv.config import EnvConfig

    env: Any = {}
    if args.env_kwargs:
        try:
            env = json.loads(args.env_kwargs)
        except json.JSONDecodeError as error:
            raise ValueError(f"env-kwargs={args.env_kwargs!r}: not valid JSON ({error})") from None
    if not isinstance(env, dict):
        raise ValueError(f"env-kwargs={env!r} must be a JSON object of env settings")
    fields = [f.name for f in dataclasses.fields(EnvConfig)]
    for key in env:
        if key not in fields:
            raise ValueError(f"env-kwargs.{key} is not an env setting (foxenv.config.EnvConfig); known: "
                             f"{', '.join(fields)} (markets have their own options)")
    for key in ("levels", "episode_length"):
        flag = getattr(args, key)
        if flag is not None and key in env and env[key] != flag:
            raise ValueError(f"env-kwargs.{key}={env[key]!r} contradicts --{key.replace('_', '-')} {flag}")
        if flag is not None:
            env[key] = flag
    return env


def market_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """``--market-kwargs``: synthetic profile knobs (checked by the market generator's own names).

    :raises ValueError: naming ``market-kwargs`` when it is not a JSON object of known knobs.
    """
    from foxenv.data import SyntheticProfile

    if not getattr(args, "market_kwargs", None):
        return {}
    try:
        market = json.loads(args.market_kwargs)
    except json.JSONDecodeError as error:
        raise ValueError(f"market-kwargs={args.market_kwargs!r}: not valid JSON ({error})") from None
    if not isinstance(market, dict):
        raise ValueError(f"market-kwargs={market!r} must be a JSON object of synthetic profile knobs")
    known = [f.name for f in dataclasses.fields(SyntheticProfile)]
    for key in market:
        if key not in known or key in ("signal_strength", "signal_horizon"):
            raise ValueError(f"market-kwargs.{key} is not a synthetic profile knob this option sets; known: "
                             f"{', '.join(k for k in known if not k.startswith('signal_'))}")
    return market


def setup_of(args: argparse.Namespace) -> Setup:
    """The markets, budget and held-out evaluation the options describe."""
    overrides = {key: getattr(args, key) for key in OVERRIDE_OPTIONS if getattr(args, key) is not None}
    evaluation = {"eval_envs": args.eval_envs or None, "eval_steps": args.eval_steps,
                  "eval_seed": args.eval_seed} if hasattr(args, "eval_seed") else {}
    return Setup(
        data=args.data, signal_strength=args.signal_strength, signal_horizon=args.signal_horizon,
        market=market_kwargs_of(args),
        market_steps=args.market_steps, train_market_seed=args.train_market_seed,
        eval_market_seed=args.eval_market_seed, step_events=args.step_events, steps=args.steps,
        n_envs=args.n_envs, device=args.device, threads=args.threads,
        device_loop=DEVICE_LOOP_CHOICES[args.device_loop], model_kwargs=overrides,
        net_arch=[int(w) for w in args.net_arch.split(",")] if args.net_arch else None,
        env_kwargs=env_kwargs_of(args), **evaluation,
    )


def roster_of(args: argparse.Namespace) -> Roster:
    """The agents: the built-in ones and ``--agent-kwargs``'s, defined in order (a later one may build on an
    earlier one).

    :raises ValueError: naming the bad definition and field.
    """
    return Roster(args.agent_kwargs)


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command as a shell would take it again (JSON options quoted)."""
    return f"python -m experiments.{script} " + shlex.join(list(argv if argv is not None else sys.argv[1:]))
