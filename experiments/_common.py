"""The command-line options the experiment scripts share, and what they build from them.

Every script (``learning``, ``hindsight``, ``exploration``) takes the same market, budget, agent and
held-out evaluation options, added here, so an option means the same thing in each:

* markets: ``--data``, ``--signal-strength``, ``--signal-horizon``, ``--market-steps``, ``--step-events``,
  ``--levels``, ``--episode-length``, ``--train-market-seed``, ``--eval-market-seed``;
* budget: ``--seeds``, ``--steps``, ``--n-envs``, ``--device``, ``--threads``, ``--net-arch``,
  ``--learning-rate``, ``--batch-size``, ``--buffer-size``, ``--learning-starts``, ``--train-freq``,
  ``--gradient-steps``, ``--target-update-interval``;
* training loop: ``--device-loop auto|on|off`` (BranchingIQN agents collect through
  :mod:`sb3_her_ext.device_loop` on a :class:`~foxhunt.device_env.DeviceLOBVecEnv`; ``auto``: on exactly
  on CUDA, as ``foxhunt train``; SB3 DQN / QR-DQN always run SB3's loop), ``--env-cuda-graph`` (the device
  loop's env step as a CUDA graph);
* agents and env: ``--agent-kwargs NAME=JSON`` (repeatable: a custom agent, see
  :func:`experiments.harness.define_agent`), ``--env-kwargs JSON`` (env settings over the presets for
  every agent's training env and for the held-out evaluation, e.g. ``{"reward_scale": 0.01}``);
* held-out evaluation: ``--eval-envs``, ``--eval-steps``, ``--eval-seed``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from experiments import harness

#: ``--device-loop`` values and what :attr:`harness.Budget.device_loop` gets.
DEVICE_LOOP_CHOICES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
#: Budget options that override the presets of every agent (argparse dest names).
OVERRIDE_OPTIONS = ("learning_rate", "batch_size", "buffer_size", "learning_starts", "train_freq",
                    "gradient_steps", "target_update_interval")


def add_market_arguments(parser: argparse.ArgumentParser) -> None:
    """The training market and the held-out one (see :class:`harness.MarketSetup`)."""
    group = parser.add_argument_group("markets")
    group.add_argument("--data", default="synthetic", help="'synthetic' or a LOBSTER folder (train -> test)")
    group.add_argument("--signal-strength", type=float, default=0.0, help="synthetic: planted signal")
    group.add_argument("--signal-horizon", type=int, default=1, help="synthetic: planted signal's horizon")
    group.add_argument("--market-steps", type=int, default=20_000, help="synthetic: steps of each market")
    group.add_argument("--step-events", type=int, default=None, help="LOBSTER: messages per step")
    group.add_argument("--levels", type=int, default=None, help="book levels (market and env)")
    group.add_argument("--episode-length", type=int, default=None, help="env steps per episode")
    group.add_argument("--train-market-seed", type=int, default=0, help="synthetic: training market's seed")
    group.add_argument("--eval-market-seed", type=int, default=1, help="synthetic: held-out market's seed")


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """Seeds, steps, books, device, the presets' common overrides, the training loop and the env."""
    group = parser.add_argument_group("budget (shared by every agent)")
    group.add_argument("--seeds", type=int, default=3, help="seeds per agent (0..N-1)")
    group.add_argument("--steps", type=int, default=20_000, help="training env steps (summed over books)")
    group.add_argument("--n-envs", type=int, default=8, help="training books")
    group.add_argument("--device", default="cpu", help="cpu or cuda")
    group.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 suits small nets)")
    group.add_argument("--net-arch", default=None, help="hidden widths, e.g. 64,64 (default: presets)")
    group.add_argument("--learning-rate", type=float, default=None)
    group.add_argument("--batch-size", type=int, default=None)
    group.add_argument("--buffer-size", type=int, default=None)
    group.add_argument("--learning-starts", type=int, default=None)
    group.add_argument("--train-freq", type=int, default=None, help="vector steps between gradient steps")
    group.add_argument("--gradient-steps", type=int, default=None, help="gradient steps per update")
    group.add_argument("--target-update-interval", type=int, default=None)
    group.add_argument("--device-loop", choices=list(DEVICE_LOOP_CHOICES), default="auto",
                       help="BranchingIQN agents collect through the device loop on a DeviceLOBVecEnv "
                            "(auto: on exactly on CUDA; DQN / QR-DQN always use SB3's loop)")
    group.add_argument("--env-cuda-graph", action="store_true",
                       help="CUDA-graph the device loop's env step with its autoreset (CUDA only)")
    group.add_argument("--env-kwargs", default=None, metavar="JSON",
                       help="env settings over the presets, for every agent and the evaluation, "
                            "e.g. '{\"reward_scale\": 0.01}'")
    group.add_argument("--agent-kwargs", action="append", default=[], metavar="NAME=JSON",
                       help="define agent NAME (repeatable): '{\"base\": AGENT, \"model\": {...}, "
                            "\"policy\": {...}}', merged over the base agent (default iqn)")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The held-out evaluation (see :class:`harness.EvalSettings`)."""
    group = parser.add_argument_group("held-out evaluation")
    group.add_argument("--eval-envs", type=int, default=None,
                       help="held-out books (default: synthetic 16, LOBSTER the test split walked once)")
    group.add_argument("--eval-steps", type=int, default=None, help="held-out vector steps (1 episode)")
    group.add_argument("--eval-seed", type=int, default=1000, help="seed of the held-out windows")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Reject counts argparse cannot (``--seeds`` < 1); return ``args``."""
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds} must be >= 1")
    return args


def env_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """``--env-kwargs`` with ``--levels`` and ``--episode-length`` added (each given once, or the same).

    :raises ValueError: naming ``env-kwargs`` when it is not a JSON object of env settings, or when it
        contradicts ``--levels`` / ``--episode-length``.
    """
    env: dict[str, Any] = {}
    if args.env_kwargs:
        try:
            env = json.loads(args.env_kwargs)
        except json.JSONDecodeError as error:
            raise ValueError(f"env-kwargs={args.env_kwargs!r}: not valid JSON ({error})") from None
    env = harness.check_env_overrides(env)
    for key in ("levels", "episode_length"):
        flag = getattr(args, key)
        if flag is None:
            continue
        if key in env and env[key] != flag:
            raise ValueError(f"env-kwargs.{key}={env[key]!r} contradicts --{key.replace('_', '-')} {flag}")
        env[key] = flag
    return env


def market_setup(args: argparse.Namespace) -> harness.MarketSetup:
    """The markets the options describe (``levels`` from ``--levels`` or ``--env-kwargs``)."""
    levels = env_kwargs_of(args).get("levels")
    return harness.MarketSetup(args.data, args.signal_strength, args.signal_horizon, args.market_steps,
                               args.train_market_seed, args.eval_market_seed, args.step_events, levels)


def budget_of(args: argparse.Namespace) -> harness.Budget:
    """The budget every agent shares."""
    overrides = {key: getattr(args, key) for key in OVERRIDE_OPTIONS if getattr(args, key) is not None}
    net_arch = [int(w) for w in args.net_arch.split(",")] if args.net_arch else None
    return harness.Budget(steps=args.steps, n_envs=args.n_envs, device=args.device, overrides=overrides,
                          net_arch=net_arch, env_overrides=env_kwargs_of(args),
                          device_loop=DEVICE_LOOP_CHOICES[args.device_loop],
                          env_cuda_graph=args.env_cuda_graph)


def eval_settings(args: argparse.Namespace) -> harness.EvalSettings:
    """The held-out evaluation's books, steps and seed."""
    return harness.EvalSettings(args.eval_envs or None, args.eval_steps, args.eval_seed)


def define_agents(args: argparse.Namespace) -> dict[str, harness.AgentSpec]:
    """Forget earlier custom agents and define ``--agent-kwargs``'s, in order (a later one may build on an
    earlier one).

    :return: the custom agents by name.
    :raises ValueError: naming the bad definition and field.
    """
    harness.clear_custom_agents()
    return {spec.name: spec for spec in (harness.parse_agent_kwargs(text) for text in args.agent_kwargs)}


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command as a shell would take it again (JSON options quoted)."""
    return f"python -m experiments.{script} " + shlex.join(list(argv if argv is not None else sys.argv[1:]))


def loop_summary(loops: dict[str, str]) -> str:
    """``"iqn: device; dqn: sb3"`` from ``{run key: loop}`` (an agent's seeds share one loop)."""
    by_agent: dict[str, set[str]] = {}
    for key, loop in loops.items():
        by_agent.setdefault(key.split("/")[0], set()).add(loop)
    return "; ".join(f"{agent}: {'/'.join(sorted(found))}" for agent, found in by_agent.items())
