"""``foxhunt tune``: an Optuna study over BranchingIQN (:mod:`tuning.study`).

One process is one worker. Several workers share a study through a common storage::

    # one host, one worker per GPU (all with --resume, so whichever starts first creates the study)
    for k in 0 1 2 3; do
        foxhunt tune --storage postgresql://user@dbhost/foxhunt --study-name s1 --resume \\
            --device cuda:$k --sampler-seed $k &
    done

Several hosts run the same command against the same PostgreSQL URL (each with its own ``--sampler-seed``
and ``--out``); a worker killed mid-trial has its trial re-run by another worker after ``--grace-period``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch as th

from foxhunt.runs import EVAL_SPLITS, RunConfig

# kept in step with tuning.objective.METRICS and tuning.study (imported lazily: `foxhunt --help` stays fast)
METRICS = ("sharpe", "pnl", "mean_episode_reward")
PRUNERS = ("median", "hyperband", "none")
SAMPLERS = ("tpe", "random")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand to ``foxhunt``'s subparsers.

    :param sub: the ``add_subparsers`` object of ``foxhunt``'s parser.
    :return: the ``tune`` parser.
    """
    p = sub.add_parser(
        "tune",
        help="Optuna study over BranchingIQN (TPE, pruning, SQLite or PostgreSQL storage)",
        description="Tune BranchingIQN with Optuna: each trial trains foxhunt.runs.train on the train split "
        "and is scored on held-out data. Writes study.db (unless --storage), trials/, best_config.json "
        "and plots to the study folder. Trials that raise are marked FAIL and not retried; trials of a "
        "worker that died are retried after --grace-period.",
    )
    p.add_argument("--study-name", default="foxhunt", help="study name in the storage (default: foxhunt)")
    p.add_argument(
        "--storage",
        default=None,
        help="SQLAlchemy URL, e.g. postgresql://user@host:5432/db (default: sqlite file "
        "study.db in the study folder)",
    )
    p.add_argument(
        "--n-trials",
        type=int,
        default=None,
        help="trials this worker runs (default: 20 unless --timeout is given)",
    )
    p.add_argument("--timeout", type=float, default=None, help="seconds after which no new trial starts")
    p.add_argument(
        "--steps", type=int, default=None, help="training steps per trial (default: foxhunt train's)"
    )
    p.add_argument(
        "--n-envs", type=int, default=None, help="books stepped together (default: foxhunt train's)"
    )
    p.add_argument("--eval-steps", type=int, default=None, help="vector steps of each held-out evaluation")
    p.add_argument("--data", default=None, help="'synthetic' or a LOBSTER folder (default: synthetic)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:K (default: cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per trial (default: 1)")
    p.add_argument(
        "--seed", type=int, default=None, help="seed of every trial's training and evaluation (default: 0)"
    )
    p.add_argument(
        "--sampler-seed",
        type=int,
        default=None,
        help="the sampler's seed; give each worker its own (default: --seed)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="base RunConfig JSON that every trial starts from (the options above override it)",
    )
    p.add_argument("--space", default=None, help="YAML or JSON file overriding the search space")
    p.add_argument(
        "--eval-split",
        choices=EVAL_SPLITS,
        default="validation",
        help="what trials are scored on: 'validation' (LOBSTER: trained on the first 75%% of the train "
        "split, scored on the rest; synthetic: a market of its own), leaving the test data for the final "
        "score of the best config, or 'test' (default: validation)",
    )
    p.add_argument(
        "--metric",
        default="sharpe",
        help=f"held-out metric to maximise: {', '.join(METRICS)} (default: sharpe)",
    )
    p.add_argument("--pruner", default="median", help=f"{', '.join(PRUNERS)} (default: median)")
    p.add_argument("--sampler", default="tpe", help=f"{', '.join(SAMPLERS)} (default: tpe, multivariate)")
    p.add_argument(
        "--n-startup-trials",
        type=int,
        default=5,
        help="random trials before TPE, and completed trials before the median pruner acts (default: 5)",
    )
    p.add_argument(
        "--n-evaluations",
        type=int,
        default=4,
        help="held-out evaluations during each trial, reported to the pruner (default: 4)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the study (create it if missing); without it an existing study is an error",
    )
    p.add_argument("--out", default=None, help="study folder (default: studies/<study-name>)")
    p.add_argument(
        "--heartbeat-interval", type=int, default=60, help="seconds between heartbeats (default: 60)"
    )
    p.add_argument(
        "--grace-period",
        type=int,
        default=120,
        help="seconds without heartbeat before a trial is re-run (default: 120)",
    )
    p.add_argument("--max-retry", type=int, default=3, help="re-runs of one dead worker's trial (default: 3)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bar over trials (default: on)",
    )
    return p


def base_config(args: argparse.Namespace) -> RunConfig:
    """The base RunConfig of every trial: ``--config`` (or the defaults) with the given options over it.

    :param args: parsed ``tune`` arguments.
    :return: the base config.
    """
    base = RunConfig.load(args.config) if args.config else RunConfig()
    overrides = {
        name: getattr(args, name)
        for name in ("data", "steps", "n_envs", "eval_steps", "device", "threads", "seed")
        if getattr(args, name) is not None
    }
    values = {**base.to_dict(), **overrides}
    config = RunConfig.from_dict(values)
    if config.data != "synthetic" and not Path(config.data).is_dir():
        raise ValueError(f"--data={config.data!r} must be 'synthetic' or a folder of LOBSTER files")
    try:
        device = th.device(config.device)
    except RuntimeError:
        raise ValueError(f"--device={config.device!r} must be cpu, cuda or cuda:K") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device={config.device!r} must be cpu, cuda or cuda:K")
    if device.type == "cuda" and not th.cuda.is_available():
        raise ValueError(f"--device={config.device!r}: no CUDA device is available")
    config.resolved_cuda_graph()  # a cuda_graph the device cannot run fails here, not in every trial
    return config


def settings_from_args(args: argparse.Namespace, seed: int) -> Any:
    """The study settings of ``foxhunt tune``'s options.

    :param args: parsed ``tune`` arguments.
    :param seed: the trials' seed (the sampler's default seed).
    :return: the :class:`~tuning.study.StudySettings`.
    """
    from tuning.study import StudySettings

    n_trials = args.n_trials if args.n_trials is not None or args.timeout is not None else 20
    return StudySettings(
        study_name=args.study_name,
        out=args.out or str(Path("studies") / args.study_name),
        storage=args.storage,
        n_trials=n_trials,
        timeout=args.timeout,
        metric=args.metric,
        pruner=args.pruner,
        sampler=args.sampler,
        sampler_seed=args.sampler_seed if args.sampler_seed is not None else seed,
        n_startup_trials=args.n_startup_trials,
        n_evaluations=args.n_evaluations,
        resume=args.resume,
        heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period,
        max_retry=args.max_retry,
        progress=args.progress,
        eval_split=args.eval_split,
    )


def run(args: argparse.Namespace) -> int:
    """``foxhunt tune``: check every input, then run this worker's share of the study.

    :param args: parsed ``tune`` arguments.
    :return: the exit status.
    """
    from tuning.space import load_space
    from tuning.study import tune

    config = base_config(args)
    settings = settings_from_args(args, config.seed)
    space = load_space(args.space)
    tune(config, space, settings)
    return 0
