"""The ``foxhunt`` command line: ``foxhunt train | evaluate | rollout | tune``.

``foxhunt train`` with no arguments trains BranchingIQN on the built-in synthetic market (a few minutes
on a laptop CPU) and writes a run folder (see :mod:`foxhunt.runs`). ``foxhunt rollout`` scores a
uniformly random policy. ``evaluate`` and ``tune`` are being built (their issues): they exit with a clear
"not yet" message.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch as th

from foxhunt import presets
from foxhunt.runs import RunConfig


def _check_seed_and_device(args: argparse.Namespace) -> None:
    """``--seed`` in numpy's range, ``--device`` the CPU or an available CUDA device; else ``ValueError``."""
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed={args.seed} must lie in [0, 2**32)")
    try:
        device = th.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device={args.device!r} must be cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device={args.device!r} must be cpu or cuda")
    if device.type == "cuda" and not th.cuda.is_available():
        raise ValueError(f"--device={args.device!r}: no CUDA device is available")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The :class:`RunConfig` that ``foxhunt train``'s options describe.

    :param args: parsed ``train`` arguments.
    :return: the run config.
    """
    if args.steps < 1:
        raise ValueError(f"--steps={args.steps} must be >= 1")
    if args.n_envs < 1:
        raise ValueError(f"--n-envs={args.n_envs} must be >= 1")
    if args.eval_steps < 2:  # checked before training, not after it
        raise ValueError(f"--eval-steps={args.eval_steps} must be >= 2")
    if args.data != "synthetic" and not Path(args.data).is_dir():
        raise ValueError(f"--data={args.data!r} must be 'synthetic' or a folder of LOBSTER files")
    _check_seed_and_device(args)
    on_cuda = th.device(args.device).type == "cuda"
    if args.cuda_graph and not on_cuda:
        raise ValueError(f"--cuda-graph needs --device cuda, got --device={args.device!r}")
    return RunConfig(
        data=args.data, steps=args.steps, n_envs=args.n_envs, device=args.device, seed=args.seed,
        threads=args.threads, hindsight=args.hindsight, eval_steps=args.eval_steps,
        cuda_graph=args.cuda_graph, progress=args.progress, out=args.out,
    )


def train(args: argparse.Namespace) -> Any:
    """``foxhunt train``: :func:`foxhunt.runs.train` on the options' config.

    :param args: parsed command-line arguments.
    :return: the run folder.
    """
    from foxhunt.runs import train as train_run

    return train_run(config_from_args(args))


def rollout(args: argparse.Namespace) -> dict[str, Any]:
    """``foxhunt rollout``: a uniformly random policy, scored by foxenv.metrics.

    :param args: parsed command-line arguments.
    :return: the metrics printed.
    """
    from foxhunt.evaluation.rollout import print_summary, random_rollout

    _check_seed_and_device(args)
    summary = random_rollout(
        num_steps=args.steps, num_envs=args.n_envs, data=args.data, seed=args.seed,
        device=args.device, progress=args.progress,
    )
    print_summary(f"random rollout: {args.steps} steps x {args.n_envs} books on {args.data}", summary)
    return summary


def _common(p: argparse.ArgumentParser, steps: int, n_envs: int) -> None:
    p.add_argument("--data", default="synthetic",
                   help="'synthetic' (built-in generator) or a LOBSTER folder (default: synthetic)")
    p.add_argument("--steps", type=int, default=steps, help=f"environment steps (default: {steps})")
    p.add_argument("--n-envs", type=int, default=n_envs, help=f"books stepped together (default: {n_envs})")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="show a progress bar (default: on)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default: 1, fastest for these small networks)")


def build_parser() -> argparse.ArgumentParser:
    """The ``foxhunt`` argument parser.

    :return: the parser with ``train``, ``evaluate``, ``rollout`` and ``tune`` subcommands.
    """
    parser = argparse.ArgumentParser(
        prog="foxhunt",
        description="Deep RL for limit-order-book trading: train BranchingIQN, evaluate it, score a random "
        "policy, tune with Optuna.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,evaluate,rollout,tune}")

    train_parser = sub.add_parser(
        "train", help="train BranchingIQN and write a run folder",
        description="Train BranchingIQN on a LOB market; write model.zip, config.json, diagnostics.jsonl, "
        "TensorBoard logs and training.png to the run folder, then print an evaluation of the "
        "deterministic policy on held-out data (LOBSTER test split, or a synthetic market with another "
        "seed).",
    )
    _common(train_parser, presets.CPU_TRAIN_STEPS, presets.CPU_N_ENVS)
    train_parser.add_argument("--out", default=None, help="run folder (default: runs/<timestamp>)")
    train_parser.add_argument("--hindsight", action=argparse.BooleanOptionalAction, default=True,
                              help="hindsight replay injections (default: on)")
    train_parser.add_argument("--eval-steps", type=int, default=500,
                              help="vector steps of the final evaluation (default: 500)")
    train_parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                              help="run each gradient step as one CUDA graph replay (BranchingIQN's "
                                   "cuda_graph=True); CUDA only (default: on with --device cuda)")
    sub.add_parser("evaluate", help="evaluate a saved model beside baselines (not built yet)",
                   description="Not built yet: its issue is open.")
    rollout_parser = sub.add_parser(
        "rollout", help="score a uniformly random policy",
        description="Run a uniformly random policy on the vector env and print foxenv.metrics.",
    )
    _common(rollout_parser, 2000, 16)
    from tuning.cli import add_parser as add_tune_parser

    add_tune_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``foxhunt`` console script.

    :param argv: arguments (default: ``sys.argv[1:]``).
    :return: the exit status.
    """
    args = build_parser().parse_args(argv)
    if args.command == "tune":
        from tuning.cli import run as run_tune

        return run_tune(args)
    if args.command == "evaluate":
        print(f"foxhunt {args.command}: not built yet", file=sys.stderr)
        return 2
    if args.threads < 1:
        raise ValueError(f"--threads={args.threads} must be >= 1")
    th.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not th.cuda.is_available():
        print(f"--device={args.device}: no CUDA device available", file=sys.stderr)
        return 2
    if args.command == "train":
        train(args)
    else:
        rollout(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
