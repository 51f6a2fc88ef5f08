"""The ``foxhunt`` command line: ``foxhunt train | evaluate | rollout | tune``.

``foxhunt train`` with no arguments trains BranchingIQN on the built-in synthetic market (a few minutes
on a laptop CPU) and writes a run folder (see :mod:`foxhunt.runs`). ``foxhunt rollout`` scores a
uniformly random policy. ``foxhunt evaluate`` scores a saved model beside baselines
(:mod:`foxhunt.evaluation.cli`). ``foxhunt tune`` runs an Optuna study (:mod:`tuning.cli`).
``foxhunt train --config FILE`` starts from a :class:`~foxhunt.runs.RunConfig` JSON (the
options given on the command line override it); ``foxhunt train --resume RUN_DIR`` continues a run from
its newest checkpoint. ``foxhunt train --action-face joint`` trains on one branch of the 81 joint actions
instead of the four branches (``RunConfig.action_face``; hindsight is off there).

A user error (a bad option, a missing file, a used run folder) prints one line ``foxhunt: error: ...`` on
stderr and exits with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch as th

from foxhunt import presets
from foxhunt.evaluation import cli as evaluation_cli
from foxhunt.runs import EVAL_SPLITS, RunConfig

#: Exceptions that are the user's to fix: one line and exit status 2 (``--debug``: the traceback).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)

#: ``foxhunt train``'s run options: argparse destination = RunConfig field.
TRAIN_OPTIONS: tuple[str, ...] = (
    "data", "steps", "n_envs", "device", "seed", "threads", "hindsight", "eval_steps", "cuda_graph",
    "progress", "out", "checkpoint_every", "keep_checkpoints", "action_face", "eval_split",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_seed_and_device(seed: int, device_name: str, seed_name: str = "--seed",
                           device_flag: str = "--device") -> None:
    """The seed in numpy's range, the device the CPU or an available CUDA device; else ``ValueError``.

    :param seed: the seed.
    :param device_name: the device.
    :param seed_name: how messages name the seed (its option, or its field of a config file).
    :param device_flag: how messages name the device.
    """
    if not 0 <= seed < 2**32:
        raise ValueError(f"{seed_name}={seed} must lie in [0, 2**32)")
    try:
        device = th.device(device_name)
    except RuntimeError:
        raise ValueError(f"{device_flag}={device_name!r} must be cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{device_flag}={device_name!r} must be cpu or cuda")
    if device.type == "cuda" and not th.cuda.is_available():
        raise ValueError(f"{device_flag}={device_name!r}: no CUDA device is available")


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The run options given on the command line (``train``'s options default to absent).

    :param args: parsed ``train`` arguments.
    :return: RunConfig field -> value, for the options given.
    """
    return {name: getattr(args, name) for name in TRAIN_OPTIONS if hasattr(args, name)}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The :class:`RunConfig` that ``foxhunt train``'s options describe: ``--config``'s file (or the
    defaults), with the options given on the command line in place of its values.

    :param args: parsed ``train`` arguments.
    :return: the run config.
    """
    given = given_options(args)
    for name, least in (("steps", 1), ("n_envs", 1), ("eval_steps", 2), ("threads", 1),
                        ("checkpoint_every", 0), ("keep_checkpoints", 0)):
        if name in given and given[name] < least:  # eval_steps: checked before training, not after it
            raise ValueError(f"{_flag(name)}={given[name]} must be >= {least}")
    if "seed" in given and not 0 <= given["seed"] < 2**32:
        raise ValueError(f"--seed={given['seed']} must lie in [0, 2**32)")
    config_file = getattr(args, "config", None)
    base = RunConfig()
    if config_file is not None:
        if not Path(config_file).is_file():
            raise FileNotFoundError(f"--config={config_file!r}: no such file")
        base = RunConfig.load(config_file)

    def name(field: str) -> str:  # an option given, or a value of the config file
        return _flag(field) if field in given or config_file is None else f"{config_file}: {field}"

    if config_file is None and str(given.get("device", base.device)).startswith("cuda"):
        # a GPU run's sizes unless given: thousands of books through the device loop
        base = dataclasses.replace(base, n_envs=presets.GPU_N_ENVS, steps=presets.GPU_TRAIN_STEPS,
                                   checkpoint_every=presets.GPU_CHECKPOINT_EVERY)
    config = dataclasses.replace(base, **given)
    if config.data != "synthetic" and not Path(config.data).is_dir():
        raise ValueError(f"{name('data')}={config.data!r} must be 'synthetic' or a folder of LOBSTER files")
    _check_seed_and_device(config.seed, config.device, name("seed"), name("device"))
    if config.cuda_graph and th.device(config.device).type != "cuda":
        raise ValueError(f"{name('cuda_graph')} needs --device cuda, got {name('device')}={config.device!r}")
    return config


def train(args: argparse.Namespace) -> Any:
    """``foxhunt train``: :func:`foxhunt.runs.train` on the options' config, or ``--resume`` a run.

    :param args: parsed command-line arguments.
    :return: the run folder.
    """
    from foxhunt.runs import resume
    from foxhunt.runs import train as train_run

    if args.resume is not None:
        given = given_options(args)
        extra = [_flag(name) for name in given if name != "progress"]
        extra += ["--config"] if args.config is not None else []
        if extra:
            raise ValueError(
                f"--resume {args.resume} continues that run as its config.json says: {', '.join(extra)} "
                "cannot be given with it"
            )
        return resume(args.resume, progress=given.get("progress"))
    return train_run(config_from_args(args))


def rollout(args: argparse.Namespace) -> dict[str, Any]:
    """``foxhunt rollout``: a uniformly random policy, scored by foxenv.metrics.

    :param args: parsed command-line arguments.
    :return: the metrics printed.
    """
    from foxhunt.evaluation.rollout import print_summary, random_rollout

    _check_seed_and_device(args.seed, args.device)
    summary = random_rollout(
        num_steps=args.steps, num_envs=args.n_envs, data=args.data, seed=args.seed,
        device=args.device, progress=args.progress,
    )
    print_summary(f"random rollout: {args.steps} steps x {args.n_envs} books on {args.data}", summary)
    return summary


def _common(p: argparse.ArgumentParser, steps: int, n_envs: int, absent: bool = False) -> None:
    """The options ``train`` and ``rollout`` share; ``absent``: an option not given is not set at all."""
    default = (lambda value: argparse.SUPPRESS) if absent else (lambda value: value)
    p.add_argument("--data", default=default("synthetic"),
                   help="'synthetic' (built-in generator) or a LOBSTER folder (default: synthetic)")
    p.add_argument("--steps", type=int, default=default(steps), help=f"environment steps (default: {steps})")
    p.add_argument("--n-envs", type=int, default=default(n_envs),
                   help=f"books stepped together (default: {n_envs})")
    p.add_argument("--device", default=default("cpu"),
                   help="cpu or cuda (default: cpu); on cuda, train's sizes default to "
                        f"{presets.GPU_N_ENVS} books and {presets.GPU_TRAIN_STEPS:,} steps")
    p.add_argument("--seed", type=int, default=default(0), help="random seed (default: 0)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=default(True),
                   help="show a progress bar (default: on)")
    p.add_argument("--threads", type=int, default=default(1),
                   help="torch CPU threads (default: 1, fastest for these small networks)")
    _debug(p)


def _debug(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``--debug``, on the top parser (default off) and on each command (absent unless given)."""
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="on an error, show the traceback instead of one line")


def build_parser() -> argparse.ArgumentParser:
    """The ``foxhunt`` argument parser.

    :return: the parser with ``train``, ``evaluate``, ``rollout`` and ``tune`` subcommands.
    """
    parser = argparse.ArgumentParser(
        prog="foxhunt",
        description="Deep RL for limit-order-book trading: train BranchingIQN, evaluate it, score a random "
        "policy, tune with Optuna.",
    )
    _debug(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,evaluate,rollout,tune}")

    train_parser = sub.add_parser(
        "train", help="train BranchingIQN and write a run folder",
        description="Train BranchingIQN on a LOB market; write model.zip, config.json, diagnostics.jsonl, "
        "TensorBoard logs and training.png to the run folder, then print an evaluation of the "
        "deterministic policy on held-out data (LOBSTER test split, or a synthetic market with another "
        "seed). Checkpoints every --checkpoint-every steps; --resume RUN_DIR continues a killed run from its "
        "newest one.",
    )
    defaults = RunConfig()
    _common(train_parser, defaults.steps, defaults.n_envs, absent=True)
    train_parser.add_argument("--config", default=None, metavar="FILE",
                              help="start from this RunConfig JSON (a run's config.json, say); the options "
                                   "given on the command line override its values")
    train_parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                              help="continue the run in RUN_DIR from its newest checkpoint, as its "
                                   "config.json says")
    train_parser.add_argument("--out", default=argparse.SUPPRESS,
                              help="run folder, new or empty (default: runs/<timestamp>-<random>)")
    train_parser.add_argument("--hindsight", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                              help="hindsight replay injections (default: on with the branched action face, "
                                   "off with the joint one, which cannot take it)")
    train_parser.add_argument("--action-face", choices=presets.ACTION_FACES, default=argparse.SUPPRESS,
                              help="the action BranchingIQN learns on: 'branched' (four branches: direction, "
                                   "magnitude, order, urgency) or 'joint' (one branch of the 81 joint "
                                   f"actions) (default: {presets.ACTION_FACE})")
    train_parser.add_argument("--eval-steps", type=int, default=argparse.SUPPRESS,
                              help=f"vector steps of the final evaluation (default: {defaults.eval_steps})")
    train_parser.add_argument("--eval-split", choices=EVAL_SPLITS, default=argparse.SUPPRESS,
                              help="held-out data of the final evaluation: 'test', or 'validation' for model "
                                   "selection that leaves the test data unseen (LOBSTER: train on the first "
                                   "75%% of the train split, score on the rest; synthetic: a third market) "
                                   f"(default: {defaults.eval_split})")
    train_parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction,
                              default=argparse.SUPPRESS,
                              help="run each gradient step as one CUDA graph replay (BranchingIQN's "
                                   "cuda_graph=True); CUDA only (default: on with --device cuda)")
    train_parser.add_argument("--checkpoint-every", type=int, default=argparse.SUPPRESS,
                              help="environment steps between checkpoints, 0 for none "
                                   f"(default: {defaults.checkpoint_every})")
    train_parser.add_argument("--keep-checkpoints", type=int, default=argparse.SUPPRESS,
                              help="checkpoints kept, the newest; 0 for all "
                                   f"(default: {defaults.keep_checkpoints})")
    evaluation_cli.add_parser(sub)
    rollout_parser = sub.add_parser(
        "rollout", help="score a uniformly random policy",
        description="Run a uniformly random policy on the vector env and print foxenv.metrics.",
    )
    _common(rollout_parser, 2000, 16)
    from tuning.cli import add_parser as add_tune_parser

    add_tune_parser(sub)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the parsed command.

    :param args: parsed command-line arguments.
    :return: the exit status.
    """
    if args.command == "evaluate":
        return evaluation_cli.run(args)
    if args.command == "tune":
        from tuning.cli import run as run_tune

        return run_tune(args)
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads={threads} must be >= 1")
        th.set_num_threads(threads)
    if args.command == "train":
        train(args)
    else:
        rollout(args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``foxhunt`` console script.

    :param argv: arguments (default: ``sys.argv[1:]``).
    :return: the exit status: 0, or 2 after a user error (printed as one line on stderr).
    """
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"foxhunt: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
