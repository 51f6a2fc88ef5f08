"""``foxhunt evaluate``: score a run's model (or a saved model) beside baselines on held-out data.

``foxhunt evaluate RUN_DIR`` reads the run's ``config.json`` and ``model.zip`` and, unless told otherwise,
evaluates as the run's own final evaluation did: its env settings, data, held-out split or market, books,
evaluation steps and seed, so with no options it reproduces the run's ``evaluation.json``. ``foxhunt evaluate
MODEL.zip`` takes the presets' env settings. Each evaluation gets a folder of its own,
``RUN_DIR/evaluations/<stamp>/`` (beside the model for a ``.zip``; ``--out`` names another), so the run's own
report is never overwritten.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from foxenv.config import split_env_kwargs
from foxenv.data import SPLITS
from foxhunt.evaluation import model_file
from foxhunt.evaluation.baselines import BASELINES

# loading and checking a model file: foxhunt.evaluation.model_file (re-exported for existing callers)
from foxhunt.evaluation.model_file import MODEL_CLASSES, load_model  # noqa: E402,F401


def add_parser(subparsers: Any) -> None:
    """Add the ``evaluate`` subcommand to ``foxhunt``'s subparsers.

    :param subparsers: the object ``ArgumentParser.add_subparsers`` returned.
    """
    p = subparsers.add_parser(
        "evaluate", help="evaluate a saved model beside baselines on held-out data",
        description="Run the greedy policy of a run folder's model.zip (or a saved model) and, on the same "
        "books and episode windows, the baselines and any other models; write report.md, evaluation.json "
        "and eval_*.png. Synthetic data is held out by a market seed other than the training one; a "
        "LOBSTER split is walked in disjoint episode windows.",
    )
    p.add_argument("target", help="a run folder (with config.json and model.zip) or a model .zip")
    p.add_argument("--data", default=None,
                   help="'synthetic' or a LOBSTER folder (default: the run's data, else synthetic)")
    p.add_argument("--split", default=None, choices=SPLITS,
                   help="held-out data: a LOBSTER split, or on synthetic data 'validation' for the third "
                   "market (default: the run's eval_split, else test)")
    p.add_argument("--baselines", nargs="*", default=["flat", "random", "buy_and_hold"],
                   choices=BASELINES, help="baselines run beside the model (default: flat random "
                   "buy_and_hold; the oracle joins on a planted-signal market)")
    p.add_argument("--models", nargs="*", default=[], help="other saved models to compare (.zip)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per book (default: the run's eval_steps, else one episode)")
    p.add_argument("--n-envs", type=int, default=None,
                   help="books (default: the run's n_envs; for a model .zip synthetic 16, LOBSTER the "
                   "split's disjoint episode windows)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the episode windows and the random baseline (default: the run's evaluation "
                   "seed, its seed + 1000; for a model .zip 0)")
    p.add_argument("--market-seed", type=int, default=None,
                   help="synthetic evaluation market's seed (default: the training market's seed + 1, + 2 "
                   "for --split validation)")
    p.add_argument("--signal-strength", type=float, default=None,
                   help="synthetic: planted-signal strength (default: the run's, else 0)")
    p.add_argument("--signal-horizon", type=int, default=None,
                   help="synthetic: planted-signal horizon in steps (default: the run's, else 1)")
    p.add_argument("--device", default=None,
                   help="cpu or cuda (default: the run's device where it exists here, else cpu)")
    p.add_argument("--out", default=None,
                   help="report folder, new or empty (default: a new RUN_DIR/evaluations/<stamp>/, or "
                   "evaluations/<stamp>/ beside the model)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="write the PNGs")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False,
                   help="show progress bars (default: off)")


def _check(args: argparse.Namespace) -> None:
    for name in ("steps", "n_envs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')}={value} must be >= 1")
    if args.seed is not None and not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed={args.seed} must lie in [0, 2**32)")
    if args.signal_strength is not None and args.signal_strength < 0:
        raise ValueError(f"--signal-strength={args.signal_strength} must be >= 0")
    if args.signal_horizon is not None and args.signal_horizon < 1:
        raise ValueError(f"--signal-horizon={args.signal_horizon} must be >= 1")
    from foxenv.checks import check_device
    from foxhunt.preflight import check_evaluation_size

    if args.device is not None:
        check_device(args.device, "--device")  # before any model is loaded
    check_evaluation_size(args.steps, args.n_envs, args.device or "cpu")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """What to evaluate and how: the options given, else the run's own evaluation settings (a run folder)
    or the presets' (a model ``.zip``)."""
    import torch

    from foxhunt import presets
    from foxhunt.runs import RunConfig, eval_seed

    target = Path(args.target)
    if target.is_dir():
        config_path = target / "config.json"
        if not config_path.is_file() or not (target / "model.zip").is_file():
            raise ValueError(f"{str(target)!r} is a folder without config.json and model.zip "
                             "(not a run folder)")
        config = RunConfig.load(config_path)
        usable = config.device == "cpu" or torch.cuda.is_available()
        stamped, source = model_file.run_settings(config, target / "model.zip", target)
        return dict(
            model=target / "model.zip", home=target, env_kwargs=config.resolved_env_kwargs(),
            data=config.data, market_steps=config.synthetic_market_steps, split=config.eval_split,
            n_envs=config.n_envs, steps=config.eval_steps, seed=eval_seed(config),
            device=config.device if usable else "cpu", stamped=stamped, source=source,
        )
    if target.suffix == ".zip" and target.is_file():
        env_kwargs, market_steps = presets.CPU.resolved_env_kwargs(), presets.CPU.synthetic_market_steps
        stamped = model_file.saved_fingerprint(target)
        if stamped is not None:  # a model carries its settings (issue 25)
            env_kwargs, steps, _ = model_file.saved_env_kwargs(stamped)
            market_steps = steps or market_steps
            model_file.check_data_given(stamped, args.data)
        return dict(
            model=target, home=target.parent, env_kwargs=env_kwargs, data="synthetic",
            market_steps=market_steps, split="test", n_envs=None, steps=None, seed=0,
            device="cpu", stamped=stamped, source="the settings saved in the model file",
        )
    raise ValueError(f"target={str(target)!r} must be a run folder or a model .zip")


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


def run(args: argparse.Namespace) -> int:
    """``foxhunt evaluate``: evaluate, write the report into a folder of its own, print a summary.

    :param args: parsed ``evaluate`` arguments.
    :return: the exit status (0).
    """
    from foxhunt.evaluation.api import evaluate_policies
    from foxhunt.evaluation.report import held_out_line, print_evaluation, write_report

    _check(args)
    _check_out(args.out)
    settings = _settings(args)
    data = args.data or settings["data"]
    split = args.split or settings["split"]
    synthetic = data == "synthetic"
    if not synthetic and not Path(data).is_dir():
        raise ValueError(f"--data={data!r} must be 'synthetic' or a folder of LOBSTER files")
    if not synthetic:  # a market the model's observation cannot fit, or the data it was trained on
        model_file.check_levels(settings["env_kwargs"], data, settings["source"])
        stamped = settings["stamped"]
        model_file.check_held_out(stamped.get("market") if stamped else None, data, split)
    config_kwargs, market_kwargs = split_env_kwargs(settings["env_kwargs"])
    train_seed = int(market_kwargs.pop("market_seed", 0) or 0)
    if synthetic:
        market_kwargs.setdefault("num_steps", settings["market_steps"])
        for name in ("signal_strength", "signal_horizon"):
            if getattr(args, name) is not None:
                market_kwargs[name] = getattr(args, name)
    else:
        for name in ("signal_strength", "signal_horizon", "num_steps"):
            market_kwargs.pop(name, None)
    market_seed = args.market_seed
    if market_seed is None:  # as foxhunt.runs.eval_market_seed: the test market, or a third for validation
        market_seed = train_seed + (2 if split == "validation" else 1)
    device = args.device or settings["device"]

    model_path = settings["model"]
    models = {"policy": load_model(model_path, device)}
    for path in args.models:
        name = Path(path).stem if Path(path).stem not in models else str(path)
        models[name] = load_model(path, device)
    steps = args.steps if args.steps is not None else settings["steps"]
    evaluation = evaluate_policies(
        models, data, baselines=args.baselines,
        n_envs=args.n_envs if args.n_envs is not None else settings["n_envs"],
        steps=steps, seed=args.seed if args.seed is not None else settings["seed"], market_seed=market_seed,
        train_market_seed=train_seed if synthetic else None, split=split, env_kwargs=config_kwargs,
        market_kwargs=market_kwargs, device=device, progress=args.progress,
    )
    out = _report_folder(args.out, settings["home"])
    paths = write_report(evaluation, out, "policy", f"Evaluation of {model_path}", plots=args.plots)
    held_out = held_out_line(evaluation.setup)
    print_evaluation(evaluation, "policy", f"evaluation: deterministic policy, {held_out}")
    print(f"\nreport: {paths['report']}")
    return 0
