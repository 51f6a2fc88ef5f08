"""The ``foxhunt`` command line: ``foxhunt train | evaluate | watch | rollout | tune``.

``foxhunt train`` with no arguments trains BranchingIQN on the built-in synthetic market (a few minutes
on a laptop CPU) and writes a run folder (see :mod:`foxhunt.runs`). Its options are generated from the
config tree (:class:`~foxhunt.runs.RunConfig`, :mod:`foxhunt.options`): one per field, named by its dotted
path (``--n-envs``, ``--action-face``, ``--env.episode-length``, ``--algorithm.learning-rate``), with the
field's docstring as help, one help group per section; ``--hyperparams algorithm.gamma:0.98
env.episode_length:200`` sets any of them as rl-zoo3 does. ``--time-limit 90m`` stops training early (then
saved and evaluated), ``--exp-name NAME`` names the run folder; off a terminal a progress line comes every
30 s (:mod:`foxhunt.callbacks`).
``foxhunt train --config FILE`` starts from a RunConfig JSON (a run's ``config.json`` or a study's
``best_config.json``; the options given override it); ``foxhunt train --resume RUN_DIR`` continues a run
from its newest checkpoint. ``foxhunt rollout`` scores a uniformly random policy. ``foxhunt evaluate``
scores a saved model beside baselines (:mod:`foxhunt.evaluation.cli`); ``foxhunt watch`` animates its greedy
play of one book on the same held-out data (:mod:`foxhunt.evaluation.watch`). ``foxhunt tune`` runs an Optuna
study (:mod:`tuning.cli`, imported only when the command runs).

A user error (a bad option, a missing file, a used run folder) prints one line ``foxhunt: error: ...`` on
stderr, naming the option as typed, and exits with status 2; ``--debug`` shows the traceback instead.
The parser is built without torch (the config tree's options: :mod:`foxhunt.options`), so ``--help``,
``--version`` and a mistyped option answer at once; a command imports what it needs when it runs
(``evaluate`` and ``tune`` parse their own arguments then).
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from foxhunt import presets
from foxhunt.options import (
    USER_ERRORS,
    Parser,
    add_config_options,
    add_field_options,
    config_from_args,
    flag,
    given_options,
    parse_duration,
    parse_value,
    report_errors,
)

__all__ = ["USER_ERRORS", "add_config_options", "add_field_options", "build_parser", "config_from_args",
           "flag", "given_options", "main", "parse_value", "report_errors", "run", "version"]
#: Names of values inside the libraries -> the option a ``foxhunt`` user typed for them.
TYPED_NAMES: dict[str, str] = {"source": "--data=", "resume": "--resume=", "target": ""}


def version() -> str:
    """foxhunt's installed version (``0+unknown`` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("foxhunt")
    except PackageNotFoundError:
        return "0+unknown"


def exp_name(text: str) -> str:
    """``--exp-name``'s value: letters, digits, ``.``, ``_`` and ``-`` (a folder name's prefix)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text):
        raise argparse.ArgumentTypeError(f"{text!r} must be letters, digits, '.', '_' or '-' (a folder name)")
    return text


def train(args: argparse.Namespace) -> Any:
    """``foxhunt train``: :func:`foxhunt.runs.train` on the options' config, or ``--resume`` a run;
    ``--time-limit`` stops training early (then saved and evaluated as a finished run).

    :param args: parsed command-line arguments.
    :return: the run folder.
    """
    import json

    from foxhunt.runs import RunConfig, resume
    from foxhunt.runs import train as train_run

    if getattr(args, "print_config", False):  # the resolved config as JSON; no run folder
        config = (RunConfig.load(Path(args.resume) / "config.json") if args.resume is not None
                  else config_from_args(args, check=False))
        print(json.dumps(config.resolved().to_dict(), indent=2))
        return None
    callbacks = []
    if args.time_limit is not None:
        from foxhunt.callbacks import TimeLimitCallback, format_duration

        limit = f"--time-limit {format_duration(args.time_limit)}"
        callbacks.append(TimeLimitCallback(args.time_limit, limit))
    if args.resume is not None:
        given = given_options(args)
        extra = [flag(name) for name in given if name != "progress"]
        extra += [f"--{name.replace('_', '-')}" for name in ("config", "recipe", "exp_name")
                  if getattr(args, name) is not None]
        if extra:
            raise ValueError(
                f"--resume {args.resume} continues that run as its config.json says: {', '.join(extra)} "
                "cannot be given with it"
            )
        if not (Path(args.resume) / "config.json").is_file():
            raise FileNotFoundError(f"--resume {args.resume!r}: no run folder there (no config.json)")
        return resume(args.resume, callbacks, progress=given.get("progress"),
                      allow_market_change=args.allow_market_change)
    if args.allow_market_change:
        raise ValueError("--allow-market-change goes with --resume RUN_DIR (a new run has no market to "
                         "change)")
    config = config_from_args(args)
    if args.exp_name is not None:
        import dataclasses

        from foxhunt.run_folder import DEFAULT_RUNS_ROOT

        if config.out is not None:
            raise ValueError(f"--exp-name {args.exp_name} names a new folder under {DEFAULT_RUNS_ROOT}/: "
                             "give it or --out, not both")
        name = f"{args.exp_name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        config = dataclasses.replace(config, out=str(DEFAULT_RUNS_ROOT / name))
    for callback in callbacks:
        callback.total = config.steps
    return train_run(config, callbacks)


def rollout(args: argparse.Namespace) -> dict[str, Any]:
    """``foxhunt rollout``: a uniformly random policy on ``foxhunt train``'s env settings, scored as
    ``foxhunt evaluate`` scores (one vocabulary, units printed).

    :param args: parsed command-line arguments.
    :return: the metrics printed.
    """
    from foxenv.checks import check_device
    from foxhunt.evaluation.rollout import print_summary, random_rollout
    from foxhunt.runs import RunConfig

    for name, least in (("steps", 2), ("n_envs", 1), ("threads", 1)):
        if getattr(args, name) < least:
            raise ValueError(f"{flag(name)}={getattr(args, name)} must be >= {least}")
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed={args.seed} must lie in [0, 2**32)")
    check_device(args.device, "--device")
    defaults = RunConfig()  # foxhunt train's env settings and synthetic market
    market = {"market_steps": defaults.synthetic_market_steps} if args.data == "synthetic" else {}
    _check_rollout_memory(args, defaults.resolved_env_kwargs())
    summary = random_rollout(
        num_steps=args.steps, num_envs=args.n_envs, data=args.data, seed=args.seed,
        device=args.device, progress=args.progress, **market, **defaults.resolved_env_kwargs(),
    )
    print_summary(f"random rollout: {args.steps} steps x {args.n_envs} books on {args.data}", summary)
    return summary


def _check_rollout_memory(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> None:
    """Refuse a rollout whose books and recorded series do not fit in the device's free memory, before
    anything is allocated (one line naming ``--n-envs`` or ``--steps``)."""
    from foxhunt.preflight import EVAL_BYTES_PER_BOOK_STEP, book_bytes, check_fits

    parts = {"books": (("--n-envs",), float(args.n_envs) * book_bytes(env_kwargs)),
             "recorded series": (("--steps", "--n-envs"),
                                 float(args.steps) * args.n_envs * EVAL_BYTES_PER_BOOK_STEP)}
    check_fits(parts, args.device, {"--n-envs": args.n_envs / 16, "--steps": args.steps / 2000})


def _debug(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``--debug``, on the top parser (default off) and on each command (absent unless given)."""
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="on an error, show the traceback instead of one line")


def _add_train_parser(sub: Any) -> None:
    """``foxhunt train``: the command's own options, then one group per section of the config tree."""
    p = sub.add_parser(
        "train", help="train BranchingIQN and write a run folder",
        usage="%(prog)s [--config FILE | --recipe NAME | --resume RUN_DIR] [--time-limit DURATION] "
        "[OPTION ...]",
        description="Train BranchingIQN on a LOB market; write model.zip, config.json, diagnostics.jsonl, "
        "TensorBoard logs and training.png to the run folder, then print an evaluation of the "
        "deterministic policy on held-out data (LOBSTER test split, or a synthetic market with another "
        "seed). Checkpoints every --checkpoint-every steps; --resume RUN_DIR continues a killed run from its "
        "newest one. Off a terminal (a log file, a batch job) a progress line is printed every 30 s. Each "
        "option below 'run' sets the RunConfig field of its name; on --device cuda the sizes default "
        f"to {presets.GPU_N_ENVS} books and {presets.GPU_STEPS:,} steps.",
    )
    command = p.add_argument_group("command (this invocation, not recorded in config.json)")
    command.add_argument("--config", default=None, metavar="FILE",
                         help="start from this RunConfig JSON (a run's config.json, a study's "
                              "best_config.json); the options given on the command line override it")
    command.add_argument("--recipe", default=None, choices=sorted(presets.RECIPE_NAMES),
                         help="a named set of settings over the defaults (or --config's), the options "
                              "given overriding it; fast: the settings that learn the planted signal "
                              "fastest (64 books, 2^20 steps, rollouts of 8 steps, batch 256, lr 1e-3, "
                              "gamma 0.9, one Q head, C51 loss weight 0)")
    command.add_argument("--resume", default=None, metavar="RUN_DIR",
                         help="continue the run in RUN_DIR from its newest checkpoint, as its "
                              "config.json says")
    command.add_argument("--allow-market-change", action="store_true",
                         help="with --resume: go on although config.json now names another market than "
                              "the checkpoint was made on (the books start afresh on it)")
    command.add_argument("--time-limit", type=parse_duration, default=None, metavar="DURATION",
                         help="stop training after this wall time (seconds, or 90m, 1.5h, 1h30m; counted "
                              "from the first step), then save the model and a checkpoint and evaluate "
                              "as usual; the report says where training was cut (--resume goes on)")
    command.add_argument("--exp-name", type=exp_name, default=None, metavar="NAME",
                         help="name the new run folder runs/NAME-<timestamp>-<random> (instead of "
                              "runs/<timestamp>-<random>; --out names it outright)")
    command.add_argument("--print-config", action="store_true",
                         help="print the config the run would use, every value resolved, as JSON (a "
                              "config.json) and exit: no run folder, no training (its device need not "
                              "be present here)")
    _debug(command)
    add_config_options(p)


def _add_delegated_parser(sub: Any, name: str, help_text: str) -> None:
    """A command whose arguments its own module parses when it runs (``foxhunt NAME --help`` included), so
    that ``foxhunt``'s parser needs none of its imports."""
    p = sub.add_parser(name, help=help_text, add_help=False, prefix_chars="+")
    p.add_argument(f"{name}_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """The ``foxhunt`` argument parser (built without importing torch).

    :return: the parser with ``train``, ``evaluate``, ``rollout`` and ``tune`` subcommands (``evaluate``'s
        arguments are parsed by :func:`evaluate_parser`, ``tune``'s by :mod:`tuning.cli`, when they run).
    """
    parser = Parser(
        prog="foxhunt",
        description="Deep RL for limit-order-book trading: train BranchingIQN, evaluate it, score a random "
        "policy, tune with Optuna.",
    )
    parser.add_argument("--version", action="version", version=f"foxhunt {version()}")
    _debug(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,evaluate,watch,rollout,tune}")
    _add_train_parser(sub)
    _add_delegated_parser(sub, "evaluate", "evaluate a saved model beside baselines on held-out data; "
                          "foxhunt evaluate --help lists its options")
    _add_delegated_parser(sub, "watch", "animate a saved model's greedy play of one book on held-out data "
                          "(a GIF); foxhunt watch --help lists its options")
    rollout_parser = sub.add_parser(
        "rollout", help="score a uniformly random policy",
        description="Run a uniformly random policy on foxhunt train's env settings and print its metrics "
        "(the names and units of foxhunt evaluate's report).",
    )
    rollout_parser.add_argument("--data", default="synthetic",
                                help="'synthetic' (built-in generator) or a LOBSTER folder "
                                     "(default: synthetic)")
    rollout_parser.add_argument("--steps", type=int, default=2000, help="environment steps (default: 2000)")
    rollout_parser.add_argument("--n-envs", type=int, default=16, help="books stepped together (default: 16)")
    rollout_parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    rollout_parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    rollout_parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                                help="show a progress bar (default: on)")
    rollout_parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    _debug(rollout_parser)
    _add_delegated_parser(sub, "tune", "Optuna study over BranchingIQN (TPE, pruning, SQLite or PostgreSQL "
                          "storage); foxhunt tune --help lists its options")
    return parser


def evaluate_parser() -> argparse.ArgumentParser:
    """The parser of ``foxhunt evaluate ARGS`` (:mod:`foxhunt.evaluation.cli`; imports the evaluation)."""
    from foxhunt.evaluation import cli as evaluation_cli

    parser = Parser(prog="foxhunt")
    sub = parser.add_subparsers(dest="command", required=True)
    evaluation_cli.add_parser(sub)
    _debug(sub.choices["evaluate"])
    return parser


def watch_parser() -> argparse.ArgumentParser:
    """The parser of ``foxhunt watch ARGS`` (:mod:`foxhunt.evaluation.watch`)."""
    from foxhunt.evaluation import watch

    parser = Parser(prog="foxhunt")
    sub = parser.add_subparsers(dest="command", required=True)
    watch.add_parser(sub)
    _debug(sub.choices["watch"])
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the parsed command.

    :param args: parsed command-line arguments.
    :return: the exit status.
    """
    if args.command == "evaluate":
        from foxhunt.evaluation import cli as evaluation_cli

        if hasattr(args, "evaluate_args"):
            args = evaluate_parser().parse_args(["evaluate", *args.evaluate_args])
        return evaluation_cli.run(args)
    if args.command == "watch":
        from foxhunt.evaluation import watch

        if hasattr(args, "watch_args"):
            args = watch_parser().parse_args(["watch", *args.watch_args])
        return watch.run(args)
    if args.command == "tune":
        from tuning.cli import run as run_tune

        return run_tune(args)
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads={threads} must be >= 1")
        import torch as th

        th.set_num_threads(threads)
    if args.command == "train":
        train(args)
    else:
        rollout(args)
    return 0


def typed_names(message: str) -> str:
    """``message`` with the libraries' names of values (``source=``, ``resume=``, ``target=``) written as
    the options typed (:data:`TYPED_NAMES`)."""
    return re.sub(r"(?<![\w.-])(source|resume|target)=", lambda match: TYPED_NAMES[match[1]], message)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``foxhunt`` console script.

    :param argv: arguments (default: ``sys.argv[1:]``).
    :return: the exit status: 0, or 2 after a user error (printed as one line on stderr).
    """
    args = build_parser().parse_args(argv)
    rest = [arg for name in ("tune_args", "evaluate_args", "watch_args") for arg in getattr(args, name, ())]
    debug = args.debug or "--debug" in rest

    def command() -> int:
        try:
            return run(args)
        except USER_ERRORS as error:
            if debug:
                raise
            message = typed_names(str(error))
            if message == str(error):
                raise
            raise (ValueError if isinstance(error, ValueError) else OSError)(message) from None

    return report_errors(command, debug)


if __name__ == "__main__":
    sys.exit(main())
