"""Command-line options of the config tree, shared by ``foxhunt train`` and ``foxhunt tune``.

One option per field of :class:`~foxhunt.runs.RunConfig` and its sections, named by its dotted path
(``--n-envs``, ``--env.episode-length``, ``--algorithm.learning-rate``), with the field's docstring as help,
in one argument group per section; ``--hyperparams KEY:VALUE ...`` sets any of them as rl-zoo3 does.
:func:`config_from_args` turns the parsed options into a checked ``RunConfig``; its errors name the option
as typed. :class:`Parser` is an ``ArgumentParser`` whose errors are one line and a hint to ``--help``.

Building a parser here imports neither torch nor numpy (``tests/test_imports.py`` checks it): ``foxhunt
--help`` and an argument error answer at once, and the heavy imports come when a command runs.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from foxhunt import presets
from foxhunt.config import field_docs
from foxhunt.runs import EVAL_METRICS, EVAL_SPLITS, SECTIONS, RunConfig, field_names

#: Exceptions that are the user's to fix: one line and exit status 2 (``--debug``: the traceback).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)
#: The choices of the config fields that take one of a few names.
CHOICES: dict[str, tuple[str, ...]] = {"action_face": presets.ACTION_FACES, "eval_split": EVAL_SPLITS,
                                       "eval_metric": EVAL_METRICS,
                                       "env.fill_model": ("conservative", "optimistic")}
#: The market options ``--env.market`` takes besides the env fields (``foxenv.factory.MARKET_KWARGS``,
#: written out so that the help needs no torch; ``tests/foxhunt/test_cli.py`` checks they agree).
MARKET_OPTIONS: tuple[str, ...] = (
    "step_events", "step_seconds", "split", "train_fraction", "validation_fraction", "split_times", "days",
    "num_steps", "cache_dir", "market_seed", "price_band", "tick_size", "signal_strength", "signal_horizon",
    "wave_rate", "wave_length_mean", "wave_drift_ticks", "wave_onset_signal", "wave_end_signal",
    "wave_reversal",
)
#: The argument group of each part of the config tree in ``foxhunt train --help``.
GROUP_TITLES: dict[str, str] = {
    "": "run (data, sizes, device, seed, evaluation, checkpoints)",
    "env": "env (foxenv's settings and the market's options)",
    "algorithm": "algorithm (BranchingIQN's arguments)",
    "policy": "policy (the network's arguments)",
}


#: Seconds per unit of a duration (:func:`parse_duration`).
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds of a duration: a number of seconds (``5400``), or numbers with units ``s``, ``m``, ``h``, ``d``
    (``90m``, ``1.5h``, ``1h30m``).

    :raises argparse.ArgumentTypeError: naming the text, unless it is such a duration above 0 (a
        ``ValueError``: argparse says it as it is).
    """
    clean = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)", clean)
    unitless = len(parts) > 1 and not all(unit for _, unit in parts)
    if not parts or "".join(number + unit for number, unit in parts) != clean or unitless:
        raise argparse.ArgumentTypeError(f"{text!r} is no duration: give seconds (5400) or units s, m, h, d "
                                         "(90m, 1.5h, 1h30m)")
    seconds = sum(float(number) * DURATION_UNITS[unit or "s"] for number, unit in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a duration above 0")
    return seconds


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` naming the choice closest to ``word``, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line and a hint to ``--help`` (not the whole usage), and
    whose unrecognised options get the closest option's name."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` and a hint on stderr, exit with status 2."""
        prog = self.prog
        unknown = re.fullmatch(r"unrecognized arguments: (\S+).*", message, re.S)
        if unknown and unknown[1].startswith("--"):  # a subcommand's leftovers come up to its parent
            options = _options(self)
            close = difflib.get_close_matches(unknown[1].split("=")[0], list(options), n=1)
            if close:
                message, prog = f"{message}; did you mean {close[0]!r}?", options[close[0]]
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:  # a misspelt subcommand or choice value
            message += did_you_mean(choice[1], re.findall(r"'([^']*)'", choice[2]))
        self.exit(2, f"{self.prog}: error: {message}\n({prog} --help lists the options)\n")


def _options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The long options of ``parser`` and of its subcommands' parsers -> the ``prog`` of their parser."""
    options: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options = {**_options(sub), **options}
        options.update({option: parser.prog for option in action.option_strings if option.startswith("--")})
    return options


def flag(name: str) -> str:
    """The option of a dotted config field: ``n_envs`` -> ``--n-envs``, ``algorithm.batch_size`` ->
    ``--algorithm.batch-size``."""
    return "--" + name.replace("_", "-")


def parse_value(text: str) -> Any:
    """A command-line value: a Python/JSON literal (``3``, ``1e-4``, ``[64, 64]``, ``{"a": true}``,
    ``None``, ``true``), else the text itself."""
    literal = {"true": "True", "false": "False", "null": "None", "none": "None"}.get(text.lower(), text)
    try:
        return ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_mapping(text: str) -> dict[str, Any]:
    """A JSON object (or Python dict literal) given on the command line, else an ``ArgumentTypeError``."""
    value = parse_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a JSON object; give one such as '{{\"signal_strength\": 1.0}}'"
        )
    return value


def _default(f: dataclasses.Field) -> Any:
    """A dataclass field's default, without building the class (a RunConfig checks its env: torch)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _doc(name: str, doc: str, default: Any, own_help: bool) -> str:
    """A field's help: its doc, its default, the market's options for ``env.market``; reST as plain text."""
    if name == "env.market":
        doc += f" Options: {', '.join(MARKET_OPTIONS)}; e.g. '{{\"signal_strength\": 1.0}}'."
    if not own_help and default not in (None, {}) and not re.search("default:|preset", doc):
        doc += f" (default: {default})"
    doc = re.sub(r":\w+:`~?([\w.]+)`", r"\1", doc).replace("``", "")  # reST roles read as plain names
    return doc.replace("%", "%%")


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
    hints, docs = typing.get_type_hints(cls), {**field_docs(cls), **(helps or {})}
    for f in dataclasses.fields(cls):
        name, hint = prefix + f.name, hints[f.name]
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
        elif name == "env.market":
            kind = {"type": parse_mapping, "metavar": "JSON"}
        elif len(scalars) == 1 and next(iter(scalars)) in (int, float, str):
            scalar = next(iter(scalars))
            kind = {"type": scalar, "metavar": scalar.__name__.upper()}
        doc = _doc(name, docs.get(f.name) or "", _default(f), f.name in (helps or {}))
        parser.add_argument(flag(name), dest=name, default=argparse.SUPPRESS, help=doc, **kind)


def add_config_options(parser: argparse.ArgumentParser, skip: Sequence[str] = (), title: str = "") -> None:
    """One option per field of the config tree (but ``skip``), absent from the namespace unless given, in
    one argument group per section (:data:`GROUP_TITLES`); ``--hyperparams KEY:VALUE ...``.

    :param parser: the command's parser.
    :param skip: dotted names that the command does not take.
    :param title: words put before each group's title (``foxhunt tune``: the base config of the trials).
    """
    run = parser.add_argument_group(title + GROUP_TITLES[""])
    add_field_options(run, RunConfig, skip=skip, helps={
        "progress": "show progress: a bar on a terminal, else (a log file, a batch job) a line every 30 s "
                    "with steps, rate, ETA and episode reward (default: on)"})
    run.add_argument("--hyperparams", nargs="+", default=argparse.SUPPRESS, metavar="KEY:VALUE",
                     help="config fields by dotted name, as rl-zoo3's --hyperparams: "
                          "algorithm.learning_rate:1e-4 env.episode_length:200 (a name of one section or a "
                          "market option may be given bare: gamma:0.98, signal_strength:1); the options "
                          "given override them")
    for name, section in SECTIONS.items():
        add_field_options(parser.add_argument_group(title + GROUP_TITLES[name]), section, f"{name}.", skip)


def _field_name(key: str, names: Sequence[str]) -> str:
    """The dotted field a ``--hyperparams`` key names: itself, the one field of that bare name, or
    ``env.market.KEY`` for a market option."""
    if key in names or key.startswith("env.market."):
        return key
    matches = [name for name in names if name.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"--hyperparams {key}: ambiguous, give one of {matches}")
    if key in MARKET_OPTIONS:
        return f"env.market.{key}"
    bare = sorted({name.rsplit(".", 1)[-1] for name in names} | set(MARKET_OPTIONS))
    hint = did_you_mean(key, [*names, *bare]) or " (foxhunt train --help lists them)"
    raise ValueError(f"--hyperparams {key}: no config field or market option of that name{hint}")


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
    market = given.get("env.market")
    if isinstance(market, dict):  # --env.market JSON and --hyperparams env.market.KEY:VALUE together
        for name in [name for name in given if name.startswith("env.market.")]:
            market.setdefault(name.removeprefix("env.market."), given.pop(name))
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
        market_key = field == "env.market" and any(key.startswith("env.market.") for key in typed)
        if field in typed or market_key or (field not in given and config_file is None):
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
        raise ValueError(renaming_flags(renaming(str(error), name), name)) from None
    return config


def renaming_flags(message: str, name: Callable[[str], str]) -> str:
    """``message`` with each option of a config field (``--algorithm.buffer-size``, as the preflight names
    them) written as ``name(FIELD)``: a value that came from ``--config``'s file or a recipe is named there,
    not as an option the user did not type."""
    fields = set(field_names())

    def rename(match: re.Match[str]) -> str:
        field = match[1].replace("-", "_")
        return name(field) if field in fields else match[0]

    return re.sub(r"(?<![\w-])--([a-z][a-z0-9_.-]*[a-z0-9])", rename, message)


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
