"""``foxhunt evaluate``: score a run's model (or a saved model) beside baselines on held-out data.

``foxhunt evaluate RUN_DIR`` reads the run's ``config.json`` and ``model.zip`` and, unless told otherwise,
evaluates as the run's own final evaluation did: its env settings, data, held-out split or market, books,
evaluation steps and seed, so with no options it reproduces the run's ``evaluation.json``; a run stopped
before it ended is scored with its newest checkpoint. ``foxhunt evaluate MODEL.zip`` takes the settings the
model file carries (its run's config: the same evaluation as ``RUN_DIR``; the presets' for a file without
them). Every market option the model was trained with is used (``split_times``, fractions, aggregation, the
synthetic knobs); ``--env.market`` changes them deliberately, and a LOBSTER test window that overlaps the
training clock on the same files is refused. Each evaluation gets a folder of its own,
``RUN_DIR/evaluations/<stamp>/`` (beside the model for a ``.zip``; ``--out`` names another), so the run's own
report is never overwritten. A model of the execute task (``--env.task execute``) gets the run's own
execution report instead (:func:`run_execution`: the execution baselines fitted on the training market, every
policy on the held-out market's disjoint windows, buys and sells, by implementation shortfall).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foxhunt.evaluation.names import BASELINES  # the parser imports nothing heavy: the libraries load in run

if TYPE_CHECKING:
    from foxhunt.evaluation.target import Target

#: LOBSTER splits (foxenv.data.SPLITS, which imports torch; checked equal by the tests).
SPLITS = ("all", "train", "test", "fit", "validation")


def add_parser(subparsers: Any) -> None:
    """Add the ``evaluate`` subcommand to ``foxhunt``'s subparsers.

    :param subparsers: the object ``ArgumentParser.add_subparsers`` returned.
    """
    p = add_target_parser(
        subparsers, "evaluate", "evaluate a saved model beside baselines on held-out data",
        "Run the greedy policy of a run folder's model.zip (or a saved model) and, on the same books and "
        "episode windows, the baselines and any other models; write report.md, evaluation.json and "
        "eval_*.png. Synthetic data is held out by a market seed other than the training one; a LOBSTER "
        "split is walked in disjoint episode windows.",
    )
    p.add_argument("--baselines", nargs="*", default=None,
                   choices=BASELINES, help="baselines run beside the model (default: flat random "
                   "buy_and_hold, on LOBSTER data also imbalance (fitted on the fit data) and market_maker; "
                   "the oracle joins on a planted-signal market)")
    p.add_argument("--models", nargs="*", default=[], help="other saved models to compare (.zip)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per book (default: the run's eval_steps, else one episode)")
    p.add_argument("--n-envs", type=int, default=None,
                   help="books (default: the run's n_envs; for a model .zip synthetic 16, LOBSTER the "
                   "split's disjoint episode windows)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the episode windows and the random baseline (default: the run's evaluation "
                   "seed, its seed + 1000; for a model .zip 0)")
    p.add_argument("--out", default=None,
                   help="report folder, new or empty (default: a new RUN_DIR/evaluations/<stamp>/, or "
                   "evaluations/<stamp>/ beside the model)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="write the PNGs")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False,
                   help="show progress bars (default: off)")


def add_target_parser(subparsers: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A subcommand on a run folder or model (``foxhunt evaluate``, ``foxhunt watch``): its parser with the
    target, the options that choose its held-out market (:func:`add_market_options`) and ``--device``.

    :param subparsers: the object ``ArgumentParser.add_subparsers`` returned.
    :param name: the subcommand.
    :param help: its line in ``foxhunt --help``.
    :param description: its ``--help`` text.
    :return: the subcommand's parser.
    """
    p = subparsers.add_parser(name, help=help, description=description)
    add_market_options(p)
    p.add_argument("--device", default=None,
                   help="cpu or cuda (default: the run's device where it exists here, else cpu)")
    return p


def add_market_options(p: argparse.ArgumentParser) -> None:
    """The target and the options that choose its held-out market (``foxhunt evaluate`` and ``foxhunt
    watch``: :func:`resolve_settings` reads them).

    :param p: the subcommand's parser.
    """
    p.add_argument("target", help="a run folder (with config.json and model.zip) or a model .zip")
    p.add_argument("--data", default=None,
                   help="'synthetic' or a LOBSTER folder (default: the run's data, else synthetic)")
    p.add_argument("--split", default=None, choices=SPLITS,
                   help="held-out data: a LOBSTER split, or on synthetic data 'validation' for the third "
                   "market (default: the run's eval_split, else test)")
    p.add_argument("--market-seed", type=int, default=None,
                   help="synthetic evaluation market's seed (default: the training market's seed + 1, + 2 "
                   "for --split validation)")
    p.add_argument("--signal-strength", type=float, default=None,
                   help="synthetic: planted-signal strength (default: the run's, else 0)")
    p.add_argument("--signal-horizon", type=int, default=None,
                   help="synthetic: planted-signal horizon in steps (default: the run's, else 1)")
    p.add_argument("--env.market", dest="env_market", default=None, metavar="JSON",
                   help="market options over the model's own, as a JSON object (as foxhunt train's "
                   "--env.market): LOBSTER load options (split_times, train_fraction, step_seconds, "
                   "step_events, ...) or synthetic generator knobs; null puts one back to its default. A "
                   "LOBSTER window that overlaps the training clock on the same files is refused")


def _check(args: argparse.Namespace) -> None:
    for name in ("steps", "n_envs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')}={value} must be >= 1")
    if args.seed is not None and not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed={args.seed} must lie in [0, 2**32)")
    check_market_options(args)
    from foxhunt.preflight import check_evaluation_size

    check_evaluation_size(args.steps, args.n_envs, args.device or "cpu")


def check_market_options(args: argparse.Namespace) -> None:
    """:func:`add_market_options`' values and ``--device``, before any model is loaded.

    :raises ValueError: one line naming the option and its value.
    """
    if args.signal_strength is not None and args.signal_strength < 0:
        raise ValueError(f"--signal-strength={args.signal_strength} must be >= 0")
    if args.signal_horizon is not None and args.signal_horizon < 1:
        raise ValueError(f"--signal-horizon={args.signal_horizon} must be >= 1")
    if args.market_seed is not None and not 0 <= args.market_seed < 2**32:
        raise ValueError(f"--market-seed={args.market_seed} must lie in [0, 2**32)")
    from foxenv.checks import check_device

    if args.device is not None:
        check_device(args.device, "--device")


def market_overrides(text: str | None, synthetic: bool) -> dict[str, Any]:
    """``--env.market``'s options: a JSON object of market options known for the data.

    :param text: the option's value (None: not given).
    :param synthetic: whether the evaluation market is the synthetic generator.
    :return: option name -> value.
    :raises ValueError: one line naming the option and the value.
    """
    import difflib
    import json

    if text is None:
        return {}
    try:
        given = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--env.market={text!r} is not valid JSON ({error.msg})") from None
    if not isinstance(given, dict):
        raise ValueError(f"--env.market={text!r} must be a JSON object of market options")
    if "market_seed" in given:
        raise ValueError("--env.market holds 'market_seed': give the evaluation market's seed with "
                         "--market-seed")
    known = market_option_names(synthetic)
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise ValueError(f"--env.market holds {key!r}, not a {'synthetic' if synthetic else 'LOBSTER'} "
                             f"market option{hint}")
    return given


def market_option_names(synthetic: bool) -> list[str]:
    """The market options of the synthetic generator or of a LOBSTER load (``foxenv.data.load_market``)."""
    import inspect

    from foxenv.data import load_market
    from foxenv.data.synthetic import SyntheticProfile

    if synthetic:
        return sorted({*SyntheticProfile.__dataclass_fields__, "num_steps", "tick_size"})
    skip = {"source", "split", "device", "seed", "cache_dir", "signal_strength", "signal_horizon", "waves",
            "levels"}
    return sorted(set(inspect.signature(load_market).parameters) - skip)


def market_settings(target: Target, synthetic: bool, overrides: dict[str, Any]) -> (
    tuple[dict[str, Any], list[str]]
):
    """The env settings an evaluation uses: the model's (every market option it was trained with), less the
    options of another data source, with ``--env.market`` over them.

    :param target: the model and its settings.
    :param synthetic: whether the evaluation data is synthetic.
    :param overrides: ``--env.market``'s options.
    :return: ``(env kwargs, notes for the report)``.
    """
    from foxenv.config import split_env_kwargs

    config_kwargs, options = split_env_kwargs(target.env_kwargs)
    trained = target.trained_source or ("synthetic" if target.data == "synthetic" else "lobster")
    scored = "synthetic" if synthetic else "lobster"
    notes = []
    if trained != scored:
        dropped = {k: v for k, v in options.items() if k != "market_seed"}
        if dropped:
            notes.append(f"the model's {trained} market options {dropped} do not apply to {scored} data: "
                         "not used")
        options = {k: v for k, v in options.items() if k == "market_seed"}
    if overrides:
        notes.append(f"market options set with --env.market (not the model's): {overrides}")
        options = {k: v for k, v in {**options, **overrides}.items() if overrides.get(k, v) is not None}
    return {**config_kwargs, **options}, notes


def _check_out(out: str | None) -> None:
    """``--out`` must be a new or empty folder: an evaluation never overwrites another report."""
    if out is not None and Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise ValueError(f"--out={out!r} must be a new or empty folder (an evaluation never overwrites "
                         "another report)")


def _report_folder(out: str | None, home: Path) -> Path:
    """``out`` (created), else a new ``home/evaluations/<YYYYmmdd-HHMMSS>-<6 hex>/``."""
    from foxhunt.run_folder import unique_run_folder

    if out is None:
        return unique_run_folder(home / "evaluations")
    Path(out).mkdir(parents=True, exist_ok=True)
    return Path(out)


@dataclass
class Settings:
    """What ``foxhunt evaluate`` scores a model on, resolved from its target and the options (``foxhunt
    watch`` steps the same market with the same settings)."""

    target: Target  # the model and the settings it carries
    data: str  # "synthetic" or a LOBSTER folder
    split: str  # the held-out split (LOBSTER), or "validation" for a third synthetic market
    config_kwargs: dict[str, Any]  # EnvConfig fields
    market_kwargs: dict[str, Any]  # the market's options (synthetic: num_steps, the generator's knobs)
    market_seed: int  # the synthetic evaluation market's seed
    train_seed: int  # the synthetic training market's seed
    device: str  # device of the model and envs
    notes: list[str]  # said in the report

    @property
    def synthetic(self) -> bool:
        """Whether the evaluation market is the synthetic generator."""
        return self.data == "synthetic"

    @property
    def execute(self) -> bool:
        """Whether the model was trained on the execute task (scored by implementation shortfall)."""
        return self.config_kwargs.get("task", "trade") == "execute"


def resolve_settings(args: argparse.Namespace) -> Settings:
    """The held-out market and env settings of an evaluation: the target's (its run's config, or the settings
    its model file carries), with ``--data``, ``--split``, ``--env.market``, ``--market-seed``,
    ``--signal-strength``, ``--signal-horizon`` and ``--device`` over them; a LOBSTER market the model's
    observation cannot fit, or one it was trained on, is refused.

    :param args: parsed arguments holding those options (``None``: not given).
    :return: the settings.
    """
    from foxenv.config import split_env_kwargs
    from foxhunt.evaluation import model_file
    from foxhunt.evaluation.target import resolve

    target = resolve(args.target, args.data)
    data = args.data or target.data
    split = args.split or target.split
    synthetic = data == "synthetic"
    if not synthetic and not Path(data).is_dir():
        raise ValueError(f"--data={data!r} must be 'synthetic' or a folder of LOBSTER files")
    env_kwargs, notes = market_settings(target, synthetic, market_overrides(args.env_market, synthetic))
    config_kwargs, market_kwargs = split_env_kwargs(env_kwargs)
    train_seed = int(market_kwargs.pop("market_seed", 0) or 0)
    if synthetic:
        market_kwargs.setdefault("num_steps", target.market_steps)
        for name in ("signal_strength", "signal_horizon"):
            if getattr(args, name) is not None:
                market_kwargs[name] = getattr(args, name)
    else:  # a market the model's observation cannot fit, or the steps it was trained on
        model_file.check_levels(target.env_kwargs, data, target.source)
        trained_on = target.stamped.get("market") if target.stamped else None
        model_file.check_held_out(trained_on, data, split, market_kwargs)
    market_seed = args.market_seed
    if market_seed is None:  # as foxhunt.runs.eval_market_seed: the test market, or a third for validation
        market_seed = train_seed + (2 if split == "validation" else 1)
    elif synthetic and market_seed == train_seed:
        raise ValueError(f"--market-seed={market_seed} is the training market's seed: not held out (leave it "
                         f"out for the test market, seed {train_seed + 1})")
    return Settings(target=target, data=data, split=split, config_kwargs=config_kwargs,
                    market_kwargs=market_kwargs, market_seed=market_seed, train_seed=train_seed,
                    device=args.device or target.device, notes=notes)


def execution_markets(settings: Settings, held_out_only: bool = False) -> tuple[Any, Any]:
    """The execute task's fit and held-out markets, as ``foxhunt train``'s final evaluation of an execute run
    builds them (:func:`~foxhunt.evaluation.execution_report.evaluate_execution_run`): the training market
    (synthetic seed, or the LOBSTER split before the held-out one) and the evaluation market.

    :param settings: the evaluation's settings.
    :param held_out_only: build the held-out market only (the fit market is then ``None``).
    :return: ``(fit market or None, held-out market)``.
    """
    from foxenv.config import EnvConfig
    from foxhunt.evaluation.api import build_market

    options = {"levels": EnvConfig(**settings.config_kwargs).levels, **settings.market_kwargs}
    device = settings.device
    if settings.synthetic:
        held_out = build_market("synthetic", market_seed=settings.market_seed, device=device, **options)
        fit = None if held_out_only else build_market("synthetic", market_seed=settings.train_seed,
                                                      device=device, **options)
        return fit, held_out
    fit_split = "fit" if settings.split == "validation" else "train"  # foxhunt.runs.RunConfig.train_split
    held_out = build_market(settings.data, split=settings.split, device=device, **options)
    fit = None if held_out_only else build_market(settings.data, split=fit_split, device=device, **options)
    return fit, held_out


#: ``foxhunt evaluate`` options that do not apply to an execute model, and why.
_NOT_FOR_EXECUTION = {
    "baselines": "its baselines are the execution baselines (TWAP, Almgren-Chriss, VWAP, ...), all run",
    "steps": "it is scored on every disjoint window of episode_length steps of the held-out market",
    "n_envs": "it is scored on every disjoint window of episode_length steps of the held-out market",
    "seed": "its windows are the held-out market's disjoint windows, in order (no seed draws them)",
}


def run_execution(args: argparse.Namespace, settings: Settings) -> int:
    """``foxhunt evaluate`` of an execute-task model: the run's own execution report (the execution baselines
    fitted on the training market, every policy on the held-out market's disjoint windows, buys and sells,
    by implementation shortfall), written to a folder of its own.

    :param args: parsed ``evaluate`` arguments.
    :param settings: the evaluation's settings.
    :return: the exit status (0).
    """
    from foxenv.config import EnvConfig
    from foxhunt.evaluation.execution_report import evaluate_execution, load_execution_model

    for name, why in _NOT_FOR_EXECUTION.items():
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} does not apply to an execute-task model "
                             f"({settings.target.model}): {why}")
    if not args.plots:
        raise ValueError("--no-plots does not apply to an execute-task model: its report always holds "
                         "execution.png")
    config = EnvConfig(**settings.config_kwargs)
    policies = {"policy": load_execution_model(settings.target.model, config.grid, settings.device)}
    for path in args.models:
        name = Path(path).stem if Path(path).stem not in policies else str(path)
        policies[name] = load_execution_model(path, config.grid, settings.device)
    fit, held_out = execution_markets(settings)
    out = _report_folder(args.out, settings.target.home)
    payload = evaluate_execution(policies, fit, held_out, config, out=out, device=settings.device,
                                 title=f"Execution evaluation of {settings.target.model}")
    for note in [*settings.target.notes, *settings.notes]:
        print(f"note: {note}")
    print(payload["table"])
    print(f"\nreport: {out / 'execution.md'}")
    return 0


def run(args: argparse.Namespace) -> int:
    """``foxhunt evaluate``: evaluate, write the report into a folder of its own, print a summary (an
    execute-task model gets its execution report: :func:`run_execution`).

    :param args: parsed ``evaluate`` arguments.
    :return: the exit status (0).
    """
    from foxhunt.evaluation import model_file
    from foxhunt.evaluation.api import evaluate_policies
    from foxhunt.evaluation.report import held_out_line, print_evaluation, write_report

    _check(args)
    _check_out(args.out)
    settings = resolve_settings(args)
    if settings.execute:
        return run_execution(args, settings)
    target, device = settings.target, settings.device
    models = {"policy": model_file.load_model(target.model, device)}
    for path in args.models:
        name = Path(path).stem if Path(path).stem not in models else str(path)
        models[name] = model_file.load_model(path, device)
    evaluation = evaluate_policies(
        models, settings.data, baselines=args.baselines,
        n_envs=args.n_envs if args.n_envs is not None else target.n_envs,
        steps=args.steps if args.steps is not None else target.steps,
        seed=args.seed if args.seed is not None else target.seed, market_seed=settings.market_seed,
        train_market_seed=settings.train_seed if settings.synthetic else None, split=settings.split,
        env_kwargs=settings.config_kwargs, market_kwargs=settings.market_kwargs, device=device,
        progress=args.progress,
    )
    evaluation.setup["notes"] = [*target.notes, *settings.notes, *evaluation.setup.get("notes", [])]
    out = _report_folder(args.out, target.home)
    paths = write_report(evaluation, out, "policy", f"Evaluation of {target.model}", plots=args.plots)
    held_out = held_out_line(evaluation.setup)
    print_evaluation(evaluation, "policy", f"evaluation: deterministic policy, {held_out}")
    print(f"\nreport: {paths['report']}")
    return 0
