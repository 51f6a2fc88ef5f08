"""``foxhunt tune``: an Optuna study over BranchingIQN (:mod:`tuning.study`).

One process is one worker. Several workers share a study through a common storage::

    # one host, one worker per visible GPU (tuning.workers)
    foxhunt tune --storage postgresql://user@dbhost/foxhunt --study-name s1 --resume --n-workers auto

Several hosts run the same command against the same PostgreSQL URL; a worker killed mid-trial has its
trial re-run by another worker after ``--grace-period``. Each trial's draws are seeded by the sampler seed
and the trial's number, so workers and resumed studies with one seed propose new parameters.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from foxhunt.options import Parser, add_config_options, add_field_options, config_from_args, report_errors
from foxhunt.runs import RunConfig
from tuning.settings import METRICS, PRUNERS, SAMPLERS, StudySettings

#: RunConfig fields that ``foxhunt tune`` does not take as options: the study has its own folder, progress
#: bar and split (every trial gets them from the study's settings).
NOT_OPTIONS = ("out", "progress", "eval_split")
#: StudySettings fields that the worker launcher sets (:mod:`tuning.workers`), not options
LAUNCHER_FIELDS = ("worker", "write_outputs")
#: the help of the study options whose default the command decides
HELPS = {
    "out": "study folder (default: studies/<study-name>)",
    "n_trials": "trials this worker runs (default: 20, or none without --timeout)",
    "sampler_seed": "the sampler's seed; each trial draws from (seed, trial number), so workers and resumed "
    "studies propose new parameters (default: --seed)",
    "metric": f"held-out metric to maximise: {', '.join(METRICS)} (default: sharpe)",
    "pruner": f"{', '.join(PRUNERS)} (default: median)",
    "sampler": f"{', '.join(SAMPLERS)} (default: tpe, multivariate)",
    "resume": "continue the study (create it if missing); without it an existing study is an error",
    "eval_split": "what trials are scored on: 'validation' (LOBSTER: trained on the first 75% of the train "
    "split, scored on the rest; synthetic: a market of its own), leaving the test data for the final score "
    "of the best config, or 'test' (default: validation)",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``foxhunt tune`` parser: the study's options, and the base RunConfig's fields as ``foxhunt train``
    names them (generated from the config tree).

    :return: the parser.
    """
    p = Parser(
        prog="foxhunt tune", usage="%(prog)s [--study-name NAME] [--storage URL] [--resume] [OPTION ...]",
        description="Tune BranchingIQN with Optuna: each trial trains foxhunt.runs.train on the train split "
        "and is scored on held-out data. Writes study.db (unless --storage), trials/, best_config.json "
        "and plots to the study folder. Trials that raise are marked FAIL and not retried; trials of a "
        "worker that died are retried after --grace-period. The run options (--steps, --n-envs, "
        "--action-face, --algorithm.gamma, ..., --hyperparams) set the base config of every trial.",
    )
    study = p.add_argument_group("study (tuning.settings.StudySettings)")
    study.add_argument("--config", default=None,
                       help="base RunConfig JSON that every trial starts from (the run options override it)")
    study.add_argument("--space", default=None, help="YAML or JSON file overriding the search space")
    study.add_argument("--n-workers", default="1",
                       help="worker processes sharing the study: N, or 'auto' (--workers-per-gpu on each "
                       "visible GPU); --n-trials is then their total (default: 1, this process)")
    study.add_argument("--workers-per-gpu", type=int, default=1,
                       help="workers on each GPU with --n-workers auto (default: 1)")
    study.add_argument("--debug", action="store_true",
                       help="on an error, show the traceback instead of one line")
    add_field_options(study, StudySettings, skip=LAUNCHER_FIELDS, helps=HELPS)
    add_config_options(p, skip=NOT_OPTIONS, title="the base config of every trial: ")
    return p


def full_run_config(args: argparse.Namespace) -> RunConfig:
    """The config whose evaluation and checkpoints ``best_config.json`` takes: ``--config`` or the defaults
    (a trial's ``--eval-steps`` and its no-checkpoints are its budget, not the full run's).

    :param args: parsed ``tune`` arguments.
    :return: the config.
    """
    return RunConfig.load(args.config) if args.config else RunConfig()


def base_config(args: argparse.Namespace) -> RunConfig:
    """The base RunConfig of every trial: ``--config`` (or the defaults) with the given options over it.

    :param args: parsed ``tune`` arguments.
    :return: the base config.
    """
    return config_from_args(args, base=RunConfig(), skip=NOT_OPTIONS)


def settings_from_args(args: argparse.Namespace, seed: int) -> StudySettings:
    """The study settings of ``foxhunt tune``'s options.

    :param args: parsed ``tune`` arguments.
    :param seed: the trials' seed (the sampler's default seed).
    :return: the settings.
    """
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(StudySettings)
             if hasattr(args, f.name)}
    name = given.get("study_name", StudySettings.study_name)
    return StudySettings(**{"out": str(Path("studies") / name), "sampler_seed": seed,
                            "n_trials": None if "timeout" in given else 20, **given})


def run(args: argparse.Namespace) -> int:
    """``foxhunt tune``: check every input, then run this worker's share of the study.

    :param args: parsed ``tune`` arguments, or ``foxhunt``'s with the unparsed ``tune_args``.
    :return: the exit status.
    """
    if hasattr(args, "tune_args"):  # parsed before anything heavy is imported (--help answers at once)
        args = build_parser().parse_args(args.tune_args)
    import torch as th

    from tuning.space import load_space
    from tuning.study import StudyFailed, tune
    from tuning.workers import launch, parse_n_workers, worker_devices

    n_workers = parse_n_workers(args.n_workers)
    devices = None
    if n_workers != 1:
        device = getattr(args, "device", None)
        devices = worker_devices(n_workers, device, th.cuda.device_count(), args.workers_per_gpu)
        if device is None and n_workers is None:
            args.device = "cuda"  # workers on GPUs: a GPU run's sizes unless given (config_from_args)
    config = base_config(args)
    settings = settings_from_args(args, config.seed)
    space = load_space(args.space)
    try:
        if devices is None:
            tune(config, space, settings, full=full_run_config(args))
            return 0
        return launch(config, space, settings, devices, full=full_run_config(args))
    except StudyFailed as error:
        print(f"foxhunt: error: {error}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``foxhunt tune ARGV`` on its own (``python -m tuning.cli``).

    :param argv: arguments (default: ``sys.argv[1:]``).
    :return: the exit status: 0, or 2 after a user error (one line on stderr).
    """
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args), args.debug, prog="foxhunt tune")


if __name__ == "__main__":
    sys.exit(main())
