"""The ``foxhunt`` command line: ``foxhunt train | evaluate | rollout | tune``.

``foxhunt train`` with no arguments trains BranchingIQN on the built-in synthetic market (a few minutes
on a laptop CPU) and writes a run folder (see :mod:`foxhunt.runs`). Its options are generated from the
config tree (:class:`~foxhunt.runs.RunConfig`): one per field, named by its dotted path (``--n-envs``,
``--action-face``, ``--env.episode-length``, ``--algorithm.learning-rate``), with the field's docstring as
help; ``--hyperparams algorithm.gamma:0.98 env.episode_length:200`` sets any of them as rl-zoo3 does.
``foxhunt train --config FILE`` starts from a RunConfig JSON (a run's ``config.json`` or a study's
``best_config.json``; the options given override it); ``foxhunt train --resume RUN_DIR`` continues a run
from its newest checkpoint. ``foxhunt rollout`` scores a uniformly random policy. ``foxhunt evaluate``
scores a saved model beside baselines (:mod:`foxhunt.evaluation.cli`). ``foxhunt tune`` runs an Optuna
study (:mod:`tuning.cli`, imported only when the command runs).

A user error (a bad option, a missing file, a used run folder) prints one line ``foxhunt: error: ...`` on
stderr, naming the option as typed, and exits with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch as th

from foxenv.checks import check_device
from foxhunt import presets
from foxhunt.config import field_docs
from foxhunt.evaluation import cli as evaluation_cli
from foxhunt.runs import EVAL_SPLITS, SECTIONS, RunConfig, field_names

#: Exceptions that are the user's to fix: one line and exit status 2 (``--debug``: the traceback).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)
#: The choices of the config fields that take one of a few names.
CHOICES: dict[str, tuple[str, ...]] = {"action_face": presets.ACTION_FACES, "eval_split": EVAL_SPLITS,
                                       "env.fill_model": ("conservative", "optimistic")}


def flag(name: str) -> str:
    """The option of a dotted config field: ``n_envs`` -> ``--n-envs``, ``algorithm.batch_size`` ->
    ``--algorithm.batch-size``."""
    return "--" + name.replace("_", "-")


def version() -> str:
    """foxhunt's installed version (``0+unknown`` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("foxhunt")
    except PackageNotFoundError:
        return "0+unknown"


# ------------------------------------------------------------------------------------------ config options


def parse_value(text: str) -> Any:
    """A command-line value: a Python/JSON literal (``3``, ``1e-4``, ``[64, 64]``, ``{"a": 1}``, ``None``,
    ``true``), else the text itself."""
    literal = {"true": "True", "false": "False", "null": "None", "none": "None"}.get(text.lower(), text)
    try:
        return ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        return text


def add_field_options(parser: Any, cls: type, prefix: str = "", skip: Sequence[str] = (),
                      helps: Mapping[str, str] | None = None) -> None:
    """One option per field of the dataclass ``cls`` (but nested dataclasses and ``skip``), named and
    stored by ``prefix`` + its name, absent from the namespace unless given; its doc is the help.

    :param parser: a parser (or an argument group of one).
    :param cls: a dataclass whose fields all have defaults.
    :param prefix: the fields' dotted prefix (``"algorithm."``).
    :param skip: dotted names left out.
    :param helps: field name -> help, in place of its doc (and default).
    """
    hints, docs, defaults = typing.get_type_hints(cls), {**field_docs(cls), **(helps or {})}, cls()
    for f in dataclasses.fields(cls):
        name, hint, default, doc = prefix + f.name, hints[f.name], getattr(defaults, f.name), docs.get(f.name)
        doc = doc or ""
        if name in skip or dataclasses.is_dataclass(hint):
            continue
        kind: dict[str, Any] = {"type": parse_value, "metavar": "VALUE"}
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        scalars = {str if arg is Path else arg for arg in (typing.get_args(hint) if union else (hint,))}
        scalars.discard(type(None))
        if scalars == {bool}:
            kind = {"action": argparse.BooleanOptionalAction}
        elif name in CHOICES:
            kind = {"choices": CHOICES[name]}
        elif len(scalars) == 1 and next(iter(scalars)) in (int, float, str):
            scalar = next(iter(scalars))
            kind = {"type": scalar, "metavar": scalar.__name__.upper()}
        if f.name not in (helps or {}) and default is not None and not re.search("default:|preset", doc):
            doc += f" (default: {default})"
        doc = re.sub(r":\w+:`~?([\w.]+)`", r"\1", doc).replace("``", "")  # reST roles read as plain names
        parser.add_argument(flag(name), dest=name, default=argparse.SUPPRESS, help=doc.replace("%", "%%"),
                            **kind)


def add_config_options(parser: Any, skip: Sequence[str] = ()) -> None:
    """One option per field of the config tree (but ``skip``), absent from the namespace unless given;
    ``--hyperparams KEY:VALUE ...``.

    :param parser: the command's parser (or an argument group of it).
    :param skip: dotted names that the command does not take.
    """
    add_field_options(parser, RunConfig, skip=skip)
    for name, section in SECTIONS.items():
        add_field_options(parser, section, f"{name}.", skip)
    parser.add_argument("--hyperparams", nargs="+", default=argparse.SUPPRESS, metavar="KEY:VALUE",
                        help="config fields by dotted name, as rl-zoo3's --hyperparams: "
                             "algorithm.learning_rate:1e-4 env.episode_length:200 (a name of one section "
                             "may be given bare: gamma:0.98); the options given override them")


def _field_name(key: str, names: Sequence[str]) -> str:
    """The dotted field a ``--hyperparams`` key names: itself, or the one field of that bare name."""
    if key in names or key.startswith("env.market."):
        return key
    matches = [name for name in names if name.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"--hyperparams {key}: ambiguous, give one of {matches}")
    raise ValueError(f"--hyperparams {key}: no config field of that name (fields: {', '.join(names)})")


def given_options(args: argparse.Namespace, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The config fields set on the command line: ``--hyperparams``, then the options given.

    :param args: parsed arguments of a command with :func:`add_config_options`.
    :param skip: the fields that are no options of the command (its own options of those names).
    :return: dotted field name -> value.
    """
    names = [name for name in field_names() if name not in skip]
    given: dict[str, Any] = {}
    for item in getattr(args, "hyperparams", []):
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--hyperparams {item!r} must be KEY:VALUE")
        given[_field_name(key, names)] = parse_value(value)
    given.update({name: value for name, value in vars(args).items() if name in names})
    return given


def renaming(message: str, name: Callable[[str], str]) -> str:
    """``message`` with each ``RunConfig.FIELD`` written as ``name(FIELD)``."""
    return re.sub(r"RunConfig\.((?:[a-z_]+\.)*[a-z_]+)", lambda match: name(match[1]), message)


def config_from_args(args: argparse.Namespace, base: RunConfig | None = None,
                     skip: Sequence[str] = (), check: bool = True) -> RunConfig:
    """The :class:`RunConfig` of the options: ``--config``'s file (or ``base``, or the defaults) with the
    fields given on the command line in place of its values; checked as :meth:`RunConfig.check` does. Errors
    name the option typed (``--n-envs=0 must be >= 1``) or the file's field.

    ``--recipe NAME`` (:data:`foxhunt.presets.RECIPES`) sets its fields over the file's (or the defaults'),
    and the options given override it.

    :param args: parsed arguments of a command with :func:`add_config_options` and ``--config`` (and
        optionally ``--recipe``).
    :param base: the config without ``--config`` (``None``: the defaults, a GPU's sizes on CUDA).
    :param skip: as :func:`given_options`.
    :param check: run :meth:`RunConfig.check` (its device, data folder, memory); off, only the values' types.
    :return: the run config.
    """
    typed = given_options(args, skip)
    recipe = getattr(args, "recipe", None)
    if recipe is not None and recipe not in presets.RECIPES:
        raise ValueError(f"--recipe={recipe!r}: no such recipe (recipes: {', '.join(presets.RECIPES)})")
    given = {**(presets.RECIPES[recipe] if recipe is not None else {}), **typed}
    config_file = getattr(args, "config", None)
    if config_file is not None:
        if not Path(config_file).is_file():
            raise FileNotFoundError(f"--config={config_file!r}: no such file")
        base = RunConfig.load(config_file)

    def name(field: str) -> str:  # an option given, a value of the recipe, or one of the config file
        if field in typed or (field not in given and config_file is None):
            return flag(field)
        return f"--recipe {recipe}: {field}" if field in given else f"{config_file}: {field}"

    if base is None and str(given.get("device", "cpu")).startswith("cuda"):
        # a GPU run's sizes unless given: thousands of books through the device loop
        base = presets.GPU
    try:
        config = (base or RunConfig()).with_values(given)
        if check:
            config.check()
    except ValueError as error:
        raise ValueError(renaming(str(error), name)) from None
    return config


def train(args: argparse.Namespace) -> Any:
    """``foxhunt train``: :func:`foxhunt.runs.train` on the options' config, or ``--resume`` a run.

    :param args: parsed command-line arguments.
    :return: the run folder.
    """
    from foxhunt.runs import resume
    from foxhunt.runs import train as train_run

    if getattr(args, "print_config", False):  # the resolved config as JSON; no run folder
        config = (RunConfig.load(Path(args.resume) / "config.json") if args.resume is not None
                  else config_from_args(args, check=False))
        print(json.dumps(config.resolved().to_dict(), indent=2))
        return None
    if args.resume is not None:
        given = given_options(args)
        extra = [flag(name) for name in given if name != "progress"]
        extra += [f"--{name}" for name in ("config", "recipe") if getattr(args, name) is not None]
        if extra:
            raise ValueError(
                f"--resume {args.resume} continues that run as its config.json says: {', '.join(extra)} "
                "cannot be given with it"
            )
        return resume(args.resume, progress=given.get("progress"),
                      allow_market_change=args.allow_market_change)
    if args.allow_market_change:
        raise ValueError("--allow-market-change goes with --resume RUN_DIR (a new run has no market to "
                         "change)")
    return train_run(config_from_args(args))


def rollout(args: argparse.Namespace) -> dict[str, Any]:
    """``foxhunt rollout``: a uniformly random policy on ``foxhunt train``'s env settings, scored as
    ``foxhunt evaluate`` scores (one vocabulary, units printed).

    :param args: parsed command-line arguments.
    :return: the metrics printed.
    """
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
    summary = random_rollout(
        num_steps=args.steps, num_envs=args.n_envs, data=args.data, seed=args.seed,
        device=args.device, progress=args.progress, **market, **defaults.resolved_env_kwargs(),
    )
    print_summary(f"random rollout: {args.steps} steps x {args.n_envs} books on {args.data}", summary)
    return summary


def _debug(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``--debug``, on the top parser (default off) and on each command (absent unless given)."""
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="on an error, show the traceback instead of one line")


def build_parser() -> argparse.ArgumentParser:
    """The ``foxhunt`` argument parser.

    :return: the parser with ``train``, ``evaluate``, ``rollout`` and ``tune`` subcommands (``tune``'s
        arguments are parsed by :mod:`tuning.cli` when it runs).
    """
    parser = argparse.ArgumentParser(
        prog="foxhunt",
        description="Deep RL for limit-order-book trading: train BranchingIQN, evaluate it, score a random "
        "policy, tune with Optuna.",
    )
    parser.add_argument("--version", action="version", version=f"foxhunt {version()}")
    _debug(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,evaluate,rollout,tune}")

    train_parser = sub.add_parser(
        "train", help="train BranchingIQN and write a run folder",
        description="Train BranchingIQN on a LOB market; write model.zip, config.json, diagnostics.jsonl, "
        "TensorBoard logs and training.png to the run folder, then print an evaluation of the "
        "deterministic policy on held-out data (LOBSTER test split, or a synthetic market with another "
        "seed). Checkpoints every --checkpoint-every steps; --resume RUN_DIR continues a killed run from its "
        "newest one. Each option sets the RunConfig field of its name; on --device cuda the sizes default "
        f"to {presets.GPU.n_envs} books and {presets.GPU.steps:,} steps.",
    )
    train_parser.add_argument("--config", default=None, metavar="FILE",
                              help="start from this RunConfig JSON (a run's config.json, a study's "
                                   "best_config.json); the options given on the command line override it")
    train_parser.add_argument("--recipe", default=None, choices=sorted(presets.RECIPES),
                              help="a named set of settings over the defaults (or --config's), the options "
                                   "given overriding it; fast: the settings that learn the planted signal "
                                   "fastest (64 books, 2^20 steps, rollouts of 8 steps, batch 256, lr 1e-3, "
                                   "gamma 0.9, one Q head, C51 loss weight 0)")
    train_parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                              help="continue the run in RUN_DIR from its newest checkpoint, as its "
                                   "config.json says")
    train_parser.add_argument("--allow-market-change", action="store_true",
                              help="with --resume: go on although config.json now names another market than "
                                   "the checkpoint was made on (the books start afresh on it)")
    train_parser.add_argument("--print-config", action="store_true",
                              help="print the config the run would use, every value resolved, as JSON (a "
                                   "config.json) and exit: no run folder, no training (its device need not "
                                   "be present here)")
    add_config_options(train_parser)
    _debug(train_parser)
    evaluation_cli.add_parser(sub)
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
    tune_parser = sub.add_parser(
        "tune", help="Optuna study over BranchingIQN (TPE, pruning, SQLite or PostgreSQL storage); "
        "foxhunt tune --help lists its options", add_help=False, prefix_chars="+",
    )
    tune_parser.add_argument("tune_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
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


def report_errors(command: Callable[[], int], debug: bool, prog: str = "foxhunt") -> int:
    """Run ``command``; a user error (:data:`USER_ERRORS`) becomes one stderr line and exit status 2.

    :param command: what to run.
    :param debug: raise the error instead (its traceback).
    :param prog: how the line starts.
    :return: the command's exit status, or 2.
    """
    try:
        return command()
    except USER_ERRORS as error:
        if debug:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``foxhunt`` console script.

    :param argv: arguments (default: ``sys.argv[1:]``).
    :return: the exit status: 0, or 2 after a user error (printed as one line on stderr).
    """
    args = build_parser().parse_args(argv)
    debug = args.debug or "--debug" in getattr(args, "tune_args", ())
    return report_errors(lambda: run(args), debug)


if __name__ == "__main__":
    sys.exit(main())
