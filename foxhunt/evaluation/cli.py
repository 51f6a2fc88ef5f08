"""``foxhunt evaluate``: score a run's model (or a saved model) beside baselines on held-out data.

``foxhunt evaluate RUN_DIR`` reads the run's ``config.json`` (env settings, training data and market seed)
and ``model.zip``; ``foxhunt evaluate MODEL.zip`` takes the presets' env settings. The report
(``report.md``, ``evaluation.json``, ``eval_*.png``) goes into the run folder, or ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from foxenv.data import SPLITS
from foxhunt.evaluation.baselines import BASELINES

#: Algorithms tried, in order, to load a ``.zip`` (module, class).
MODEL_CLASSES = (
    ("sb3_her_ext.algorithm", "BranchingIQN"),
    ("stable_baselines3", "DQN"),
    ("sb3_contrib", "QRDQN"),
)


def load_model(path: str | Path, device: str = "cpu") -> Any:
    """Load a saved SB3 model, trying BranchingIQN, SB3's DQN and sb3-contrib's QR-DQN.

    :param path: a ``.zip`` written by ``model.save``.
    :param device: device of the loaded network.
    :return: the model.
    """
    import importlib

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"model={str(path)!r} is not a file")
    errors = []
    for module_name, class_name in MODEL_CLASSES:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
            return cls.load(path, device=device)
        except Exception as error:  # noqa: BLE001 (try the next algorithm; all failures are reported)
            errors.append(f"{class_name}: {type(error).__name__}: {error}"[:200])
    raise ValueError(f"model={str(path)!r}: no known algorithm could load it ({'; '.join(errors)})")


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
    p.add_argument("--split", default="test", choices=SPLITS,
                   help="LOBSTER split (default: test)")
    p.add_argument("--baselines", nargs="*", default=["flat", "random", "buy_and_hold"],
                   choices=BASELINES, help="baselines run beside the model (default: flat random "
                   "buy_and_hold; the oracle joins on a planted-signal market)")
    p.add_argument("--models", nargs="*", default=[], help="other saved models to compare (.zip)")
    p.add_argument("--steps", type=int, default=None, help="steps per book (default: one episode)")
    p.add_argument("--n-envs", type=int, default=None,
                   help="books (default: synthetic 16; LOBSTER: the split's disjoint episode windows)")
    p.add_argument("--seed", type=int, default=0, help="seed of the episode windows and the random baseline")
    p.add_argument("--market-seed", type=int, default=None,
                   help="synthetic evaluation market's seed (default: the training market's seed + 1)")
    p.add_argument("--signal-strength", type=float, default=None,
                   help="synthetic: planted-signal strength (default: the run's, else 0)")
    p.add_argument("--signal-horizon", type=int, default=None,
                   help="synthetic: planted-signal horizon in steps (default: the run's, else 1)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--out", default=None, help="report folder (default: the run folder, or beside the model)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="write the PNGs")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False,
                   help="show progress bars (default: off)")


def _check(args: argparse.Namespace) -> None:
    for name in ("steps", "n_envs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')}={value} must be >= 1")
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed={args.seed} must lie in [0, 2**32)")
    if args.signal_strength is not None and args.signal_strength < 0:
        raise ValueError(f"--signal-strength={args.signal_strength} must be >= 0")
    if args.signal_horizon is not None and args.signal_horizon < 1:
        raise ValueError(f"--signal-horizon={args.signal_horizon} must be >= 1")


def run(args: argparse.Namespace) -> int:
    """``foxhunt evaluate``: evaluate, write the report, print a summary.

    :param args: parsed ``evaluate`` arguments.
    :return: the exit status (0).
    """
    from foxhunt import presets
    from foxhunt.evaluation.api import evaluate_policies, split_env_kwargs
    from foxhunt.evaluation.report import held_out_line, print_evaluation, write_report
    from foxhunt.runs import RunConfig

    _check(args)
    target = Path(args.target)
    if target.is_dir():
        config_path = target / "config.json"
        if not config_path.is_file() or not (target / "model.zip").is_file():
            raise ValueError(f"{str(target)!r} is a folder without config.json and model.zip "
                             "(not a run folder)")
        config = RunConfig.load(config_path)
        model_path, out = target / "model.zip", Path(args.out) if args.out else target
        env_kwargs, data = config.resolved_env_kwargs(), args.data or config.data
        market_steps = config.synthetic_market_steps
    elif target.suffix == ".zip" and target.is_file():
        model_path, out = target, Path(args.out) if args.out else target.with_suffix("")
        env_kwargs, data = RunConfig().resolved_env_kwargs(), args.data or "synthetic"
        market_steps = presets.SYNTHETIC_MARKET_STEPS
    else:
        raise ValueError(f"target={str(target)!r} must be a run folder or a model .zip")
    synthetic = data == "synthetic"
    if not synthetic and not Path(data).is_dir():
        raise ValueError(f"--data={data!r} must be 'synthetic' or a folder of LOBSTER files")
    config_kwargs, market_kwargs = split_env_kwargs(env_kwargs)
    train_seed = int(market_kwargs.pop("market_seed", 0) or 0)
    if synthetic:
        market_kwargs.setdefault("num_steps", market_steps)
        for name in ("signal_strength", "signal_horizon"):
            if getattr(args, name) is not None:
                market_kwargs[name] = getattr(args, name)
    else:
        for name in ("signal_strength", "signal_horizon", "num_steps"):
            market_kwargs.pop(name, None)
    market_seed = train_seed + 1 if args.market_seed is None else args.market_seed

    models = {"policy": load_model(model_path, args.device)}
    for path in args.models:
        name = Path(path).stem if Path(path).stem not in models else str(path)
        models[name] = load_model(path, args.device)
    evaluation = evaluate_policies(
        models, data, baselines=args.baselines, n_envs=args.n_envs,
        steps=args.steps, seed=args.seed, market_seed=market_seed,
        train_market_seed=train_seed if synthetic else None, split=args.split, env_kwargs=config_kwargs,
        market_kwargs=market_kwargs, device=args.device, progress=args.progress,
    )
    title = f"Evaluation of {model_path}"
    paths = write_report(evaluation, out, "policy", title, plots=args.plots)
    held_out = held_out_line(evaluation.setup)
    print_evaluation(evaluation, "policy", f"evaluation: deterministic policy, {held_out}")
    print(f"\nreport: {paths['report']}")
    return 0
