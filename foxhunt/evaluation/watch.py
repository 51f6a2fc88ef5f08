"""``foxhunt watch``: step a saved model greedily over held-out data and write an animation of one book.

``foxhunt watch RUN_DIR|MODEL.zip`` takes the held-out market and settings ``foxhunt evaluate`` would score
the model on (:func:`foxhunt.evaluation.cli.resolve_settings`: the run's config or the model file's, with the
same ``--data``, ``--split``, ``--market-seed``, ``--env.market`` ... over them) and the same episode windows:

- a trading model: book ``--book K`` of ``foxhunt evaluate``'s books (its windows, planned with the run's
  books, evaluation steps and seed), its first ``--steps`` steps;
- an execute-task model: window ``K`` of the held-out market's disjoint windows (those of the execution
  report), the parent's side as the model's config draws it.

Every book of the evaluation is stepped (as the evaluation steps them), book ``K`` is drawn: each frame is
:func:`foxenv.render.render_book` of the book after the step (depth, the agent's resting order, position
and equity, the episode's mid path) under a caption with the action and the step's fill. The animation is
written with matplotlib's ``PillowWriter`` (``.gif``) or, where ffmpeg is installed, ``FFMpegWriter``
(``.mp4``), by default to ``RUN_DIR/watch/<stamp>.gif`` (beside the model for a ``.zip``), with a JSON of
the setup and the book's series beside it (``<stamp>.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.evaluation.cli import add_target_parser, check_market_options  # light: no torch

#: Animation formats by suffix: the matplotlib writer's name.
WRITERS = {".gif": "pillow", ".mp4": "ffmpeg"}
#: Frames drawn when ``--steps`` is not given, at most (one episode otherwise; a frame takes ~0.3 s on a CPU).
DEFAULT_MAX_FRAMES = 200
#: Branch names in the captions (the execute task's first branch is the child's size, its second is unused).
BRANCHES = ("direction", "magnitude", "order", "urgency")
EXECUTION_BRANCHES = ("size", "-", "order", "urgency")
#: Per-step values of the watched book taken from the env's info.
INFO_KEYS = ("mid", "position", "equity", "cash", "fees", "order_active", "order_price", "order_remaining")


def add_parser(subparsers: Any) -> None:
    """Add the ``watch`` subcommand to ``foxhunt``'s subparsers.

    :param subparsers: the object ``ArgumentParser.add_subparsers`` returned.
    """
    p = add_target_parser(
        subparsers, "watch", "animate a saved model's greedy play of one book on held-out data",
        "Step the greedy policy of a run folder's model.zip (or a saved model) over the held-out market "
        "foxhunt evaluate would score it on, on the same episode windows, and write an animation of one "
        "book: its depth, the agent's resting order, fills, position and equity, and the mid path.",
    )
    p.add_argument("--steps", type=int, default=None,
                   help="frames: steps of the book, at most the evaluation's steps per book (default: one "
                   f"episode, at most {DEFAULT_MAX_FRAMES})")
    p.add_argument("--book", type=int, default=0,
                   help="which of the evaluation's books (an execute model: which held-out window) to draw "
                   "(default: 0)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="the animation, .gif or .mp4 (mp4 needs ffmpeg; default: a new "
                   "RUN_DIR/watch/<stamp>.gif, or watch/<stamp>.gif beside the model)")
    p.add_argument("--fps", type=float, default=5.0, help="frames per second (default: 5)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar while rendering (default: on at a terminal)")


def check_args(args: argparse.Namespace) -> None:
    """The options' values, before any model is loaded.

    :raises ValueError: one line naming the option and its value.
    """
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps={args.steps} must be >= 1")
    if args.book < 0:
        raise ValueError(f"--book={args.book} must be >= 0")
    if not args.fps > 0 or args.fps > 100:
        raise ValueError(f"--fps={args.fps:g} must lie in (0, 100]")
    check_market_options(args)
    if args.out is None:
        return
    out = Path(args.out)
    if out.suffix.lower() not in WRITERS:
        raise ValueError(f"--out={args.out!r} must end in .gif or .mp4")
    if out.exists():
        raise ValueError(f"--out={args.out!r} exists: name a new file (watch never overwrites one)")
    if out.suffix.lower() == ".mp4":
        from matplotlib import animation

        if not animation.writers.is_available("ffmpeg"):
            raise ValueError(f"--out={args.out!r}: writing .mp4 needs ffmpeg, which is not installed here; "
                             "write a .gif instead (--out FILE.gif)")


@dataclass
class Plan:
    """What is stepped: the market, the env settings, every book's windows and the book drawn."""

    market: Any  # the held-out MarketData
    config: Any  # the EnvConfig
    offsets: Any  # [E, B] int64 start rows of each book's episodes (the evaluation's)
    steps: int  # vector steps (frames)
    book: int  # the book drawn
    seed: int  # the env's seed (the evaluation's)
    held_out: str  # the held-out market in words
    notes: list[str] = field(default_factory=list)

    @property
    def books(self) -> int:
        """Books stepped."""
        return int(self.offsets.shape[1])


def _held_out_words(settings: Any) -> str:
    if settings.synthetic:
        return f"synthetic, market seed {settings.market_seed}, training market seed {settings.train_seed}"
    return f"{settings.data}, split {settings.split!r}"


def trading_plan(settings: Any, steps: int | None, book: int) -> Plan:
    """Book ``book`` of ``foxhunt evaluate``'s evaluation of a trading model: its market (built as
    :func:`~foxhunt.evaluation.api.evaluate_policies` builds it) and its windows (the target's books,
    evaluation steps and seed: :func:`~foxhunt.evaluation.api.plan_windows`,
    :func:`~foxhunt.evaluation.recorder.plan_offsets`).

    :param settings: the evaluation's settings.
    :param steps: ``--steps`` (None: one episode, at most :data:`DEFAULT_MAX_FRAMES`).
    :param book: ``--book``.
    """
    from foxenv.config import EnvConfig
    from foxhunt.evaluation.api import DEFAULT_SYNTHETIC_BOOKS, build_market, plan_windows
    from foxhunt.evaluation.recorder import plan_offsets

    config_kwargs, options = dict(settings.config_kwargs), dict(settings.market_kwargs)
    if settings.synthetic and "levels" in config_kwargs:
        options.setdefault("levels", config_kwargs["levels"])
    market = build_market(settings.data, split=settings.split, market_seed=settings.market_seed,
                          device=settings.device, **options)
    length = int(config_kwargs.get("episode_length", EnvConfig().episode_length))
    if market.num_steps < length + 1:
        length = config_kwargs["episode_length"] = max(market.num_steps - 1, 1)
    capacity = max(1, (market.num_steps - 1) // length)
    target = settings.target
    books, evaluated, notes = plan_windows(market.num_steps, length, target.n_envs, target.steps,
                                           DEFAULT_SYNTHETIC_BOOKS if settings.synthetic else capacity)
    if book >= books:
        raise ValueError(f"--book={book}: the evaluation has {books} book(s), 0 to {books - 1}")
    steps = min(length, evaluated, DEFAULT_MAX_FRAMES) if steps is None else steps
    if steps > evaluated:
        raise ValueError(f"--steps={steps}: the evaluation steps each book {evaluated} times (its windows "
                         f"end there); ask for at most {evaluated}")
    offsets = plan_offsets(market.num_steps, length, books, -(-evaluated // length), target.seed)
    return Plan(market, EnvConfig(**config_kwargs), offsets, steps, book, target.seed,
                _held_out_words(settings), notes)


def execution_plan(settings: Any, steps: int | None, book: int) -> Plan:
    """Window ``book`` of an execute model's execution report: the held-out market's disjoint windows of
    ``episode_length`` steps (:func:`~foxhunt.evaluation.execution_baselines.disjoint_offsets`), one book
    each, as :func:`~foxhunt.evaluation.execution_baselines.score_windows` steps them.

    :param settings: the evaluation's settings.
    :param steps: ``--steps`` (None: the whole window, at most :data:`DEFAULT_MAX_FRAMES`).
    :param book: ``--book``.
    """
    from foxenv.config import EnvConfig
    from foxhunt.evaluation.cli import execution_markets
    from foxhunt.evaluation.execution_baselines import disjoint_offsets

    config = EnvConfig(**settings.config_kwargs)
    _, market = execution_markets(settings, held_out_only=True)
    horizon = config.episode_length
    offsets = disjoint_offsets(market.num_steps, horizon)
    if book >= offsets.numel():
        raise ValueError(f"--book={book}: the held-out market holds {offsets.numel()} window(s) of "
                         f"{horizon} steps, 0 to {offsets.numel() - 1}")
    steps = min(horizon, DEFAULT_MAX_FRAMES) if steps is None else steps
    if steps > horizon:
        raise ValueError(f"--steps={steps}: an execute model works one parent order of {horizon} steps per "
                         f"window; ask for at most {horizon}")
    return Plan(market, config, offsets.reshape(1, -1), steps, book, 0, _held_out_words(settings))


def step_book(model: Any, plan: Plan, device: str) -> dict[str, Any]:
    """Step every book of ``plan`` with the model's greedy actions; return book ``plan.book``'s series.

    :param model: the loaded model.
    :param plan: what to step.
    :param device: device of the env.
    :return: name -> ``[N]`` numpy array (:data:`INFO_KEYS`, ``reward``, ``alive``, ``row`` the market row
        after the step, ``step`` the episode step after it, ``start_mid``) and ``actions`` ``[N, 4]``.
    """
    import torch

    from foxenv.core import BatchedLOB
    from foxhunt.evaluation.baselines import ModelPolicy

    books, length, k = plan.books, plan.config.episode_length, plan.book
    lob = BatchedLOB(plan.market, books, plan.config, device, plan.seed)
    space = getattr(model, "observation_space", None)
    if space is not None and tuple(space.shape) != (int(lob.observation_dim),):
        raise ValueError(f"the model's observation_space has shape {tuple(space.shape)}, the env's "
                         f"observation ({int(lob.observation_dim)},): the settings differ from the model's")
    policy = ModelPolicy(model, name="policy", grid=plan.config.grid)
    dev = lob.device
    offsets = torch.as_tensor(plan.offsets, dtype=torch.int64).to(dev)
    market_mid = (lob.market.bid_price[:, 0] + lob.market.ask_price[:, 0]) / 2
    kept: dict[str, list[Any]] = {name: [] for name in (*INFO_KEYS, "reward", "alive", "actions", "row",
                                                          "step", "start_mid")}
    policy.reset(books, dev)
    for t in range(plan.steps):
        if t % length == 0:  # every book starts its next window, as the evaluation starts it
            lob.reset()
            state = lob.state_dict()
            state["offset"] = offsets[t // length].clone()
            lob.load_state_dict(state)
            obs = lob.reset(mask=torch.zeros(books, dtype=torch.bool, device=dev))  # observes only
            alive = torch.ones(books, dtype=torch.bool, device=dev)
            start = torch.ones(books, dtype=torch.bool, device=dev)
            start_mid = market_mid[offsets[t // length, k]]
        action = policy.act(obs, start)
        obs, reward, terminated, _, info = lob.step(action)
        for name in INFO_KEYS:
            kept[name].append(info[name][k])
        kept["reward"].append(reward[k])
        kept["alive"].append(alive[k])
        kept["actions"].append(action[k])
        kept["step"].append(info["step"][k])
        kept["row"].append(offsets[t // length, k] + info["step"][k])
        kept["start_mid"].append(start_mid)
        alive = alive & ~terminated
        start = torch.zeros_like(start)
    series = {name: torch.stack(values).cpu().numpy() for name, values in kept.items()}
    if plan.config.task == "execute":
        side, quantity, _ = lob._execution.parent(offsets[0])
        series["side"], series["quantity"] = float(side[k]), float(quantity[k])
    return series


def book_view(series: dict[str, Any], length: int) -> dict[str, Any]:
    """What the frames show of the book: position and equity held once its episode ended early (as the
    recorder holds them), each step's fill (lots and average price, fees aside) and the return so far.

    :param series: :func:`step_book`'s series.
    :param length: steps of an episode.
    :return: name -> ``[N]`` numpy array: ``position``, ``equity``, ``fill_lots``, ``fill_price`` (NaN
        without a fill), ``return`` (the rewards of the episode so far), ``alive``.
    """
    import numpy as np

    steps = series["mid"].shape[0]
    view = {name: np.zeros(steps) for name in ("position", "equity", "fill_lots", "fill_price", "return")}
    alive = series["alive"].astype(bool)
    for t in range(steps):  # N host values, once, after stepping
        first = t % length == 0
        prev = (0.0, 0.0, 0.0, 0.0) if first else (view["position"][t - 1], view["equity"][t - 1],
                                                    series["cash"][t - 1], view["return"][t - 1])
        position = series["position"][t] if alive[t] else prev[0]
        lots = (position - prev[0]) if alive[t] else 0.0
        notional = prev[2] - series["cash"][t] - series["fees"][t]
        view["position"][t] = position
        view["equity"][t] = series["equity"][t] if alive[t] else prev[1]
        view["fill_lots"][t] = lots
        view["fill_price"][t] = notional / lots if lots else np.nan
        view["return"][t] = prev[3] + (series["reward"][t] if alive[t] else 0.0)
    view["alive"] = alive
    return view


def _caption(plan: Plan, series: dict[str, Any], view: dict[str, Any], t: int) -> str:
    """Two lines under frame ``t``: the step, the action and its fill; the episode so far."""
    labels = list(plan.config.grid.labels().values())
    names = EXECUTION_BRANCHES if plan.config.task == "execute" else BRANCHES
    chosen = zip(names, labels, series["actions"][t], strict=True)
    action = " ".join(f"{name}={values[int(a)]}" for name, values, a in chosen if len(values) > 1)
    lots = view["fill_lots"][t]
    fill = f"fill {lots:+g} @ {view['fill_price'][t]:.4f}" if lots else "no fill"
    head = f"book {plan.book}, step {t + 1}/{plan.steps} | {action} | {fill}"
    if not view["alive"][t]:
        head = f"book {plan.book}, step {t + 1}/{plan.steps} | episode over"
    if plan.config.task == "execute":
        side = "buy" if series["side"] > 0 else "sell"
        done = view["position"][t] * series["side"]
        scale = plan.config.reward_scale or 1.0
        tail = (f"{side} {series['quantity']:g}: {done:g} done | shortfall so far "
                f"{-view['return'][t] / scale:+.2f} bps")
    else:
        tail = f"episode return so far {view['return'][t]:+.4g} | equity {view['equity'][t]:+.2f}"
    return f"{head}\n{plan.held_out} | {tail}"


def frame(plan: Plan, series: dict[str, Any], view: dict[str, Any], t: int) -> Any:
    """Frame ``t``: :func:`foxenv.render.render_book` of the book after step ``t``.

    :return: ``[H, W, 3]`` uint8.
    """
    from foxenv.render import render_book

    market, levels, length = plan.market, plan.config.levels, plan.config.episode_length
    row = int(series["row"][t])
    first = t - t % length
    mids = [float(series["start_mid"][t]), *series["mid"][first:t + 1].tolist()]
    execute = plan.config.task == "execute"
    return render_book(
        market.bid_price[row, :levels].cpu().numpy(), market.bid_size[row, :levels].cpu().numpy(),
        market.ask_price[row, :levels].cpu().numpy(), market.ask_size[row, :levels].cpu().numpy(),
        mids=mids, position=float(view["position"][t]),
        max_position=series["quantity"] if execute else plan.config.max_position,
        order_price=float(series["order_price"][t]) if series["order_active"][t] else None,
        order_remaining=float(series["order_remaining"][t]), equity=float(view["equity"][t]),
        step=int(series["step"][t]),
    )


def write_animation(plan: Plan, series: dict[str, Any], view: dict[str, Any], path: Path, fps: float,
                    progress: bool) -> int:
    """Render every frame into an animation at ``path`` (``.gif``: PillowWriter, ``.mp4``: FFMpegWriter).

    :param plan: what was stepped.
    :param series: :func:`step_book`'s series.
    :param view: :func:`book_view` of them.
    :param path: the file.
    :param fps: frames per second.
    :param progress: show a progress bar.

    :return: the frames written.
    """
    import warnings

    from matplotlib import animation
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from tqdm import TqdmExperimentalWarning
    from tqdm.rich import tqdm

    first = frame(plan, series, view, 0)
    height, width = first.shape[:2]
    dpi = 100
    figure = Figure(figsize=(width / dpi, height / dpi + 0.45), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.0, 0.45 / (height / dpi + 0.45), 1.0, 1 - 0.45 / (height / dpi + 0.45)))
    axes.set_axis_off()
    image = axes.imshow(first, interpolation="nearest")
    text = figure.text(0.01, 0.01, _caption(plan, series, view, 0), fontsize=6.5, family="monospace",
                       va="bottom")

    def draw(t: int) -> tuple[Any, ...]:
        image.set_data(first if t == 0 else frame(plan, series, view, t))
        text.set_text(_caption(plan, series, view, t))
        return image, text

    movie = animation.FuncAnimation(figure, draw, frames=plan.steps, init_func=lambda: (), blit=False,
                                    repeat=False, cache_frame_data=False)
    name = WRITERS[path.suffix.lower()]
    writer = animation.PillowWriter(fps=fps) if name == "pillow" else animation.FFMpegWriter(fps=fps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmExperimentalWarning)
        bar = tqdm(total=plan.steps, desc="watch: rendering", disable=not progress)
    try:
        movie.save(str(path), writer=writer, dpi=dpi, progress_callback=lambda i, n: bar.update(1))
    finally:
        bar.close()
    return plan.steps


def _output(out: str | None, home: Path) -> Path:
    """``--out``, else a new ``home/watch/<YYYYmmdd-HHMMSS>-<6 hex>.gif``."""
    import secrets
    import time

    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        return Path(out)
    folder = home / "watch"
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.gif"
        if not path.exists():
            return path


def _setup(settings: Any, plan: Plan, path: Path, fps: float) -> dict[str, Any]:
    """The watch's setup, written beside the animation."""
    return {
        "model": str(settings.target.model), "task": plan.config.task, "data": settings.data,
        "market": plan.market.name, "split": None if settings.synthetic else settings.split,
        "market_seed": settings.market_seed if settings.synthetic else None,
        "train_market_seed": settings.train_seed if settings.synthetic else None,
        "held_out": plan.held_out, "book": plan.book, "books": plan.books, "steps": plan.steps,
        "episode_length": plan.config.episode_length, "offsets": plan.offsets[:, plan.book].tolist(),
        "seed": plan.seed, "device": settings.device, "animation": str(path), "fps": fps,
        "notes": [*settings.target.notes, *settings.notes, *plan.notes],
    }


def run(args: argparse.Namespace) -> int:
    """``foxhunt watch``: step the model over its held-out market, write the animation and its setup.

    :param args: parsed ``watch`` arguments.
    :return: the exit status (0).
    """
    from foxhunt.evaluation import model_file
    from foxhunt.evaluation.cli import resolve_settings

    check_args(args)
    settings = resolve_settings(args)
    if settings.execute:
        from foxhunt.evaluation.execution_report import load_execution_model

        plan = execution_plan(settings, args.steps, args.book)
        model = load_execution_model(settings.target.model, plan.config.grid, settings.device)
    else:
        plan = trading_plan(settings, args.steps, args.book)
        model = model_file.load_model(settings.target.model, settings.device)
    series = step_book(model, plan, settings.device)
    path = _output(args.out, settings.target.home)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    view = book_view(series, plan.config.episode_length)
    frames = write_animation(plan, series, view, path, args.fps, progress)
    record = {"setup": _setup(settings, plan, path, args.fps),
              "series": {"mid": series["mid"].tolist(), "position": view["position"].tolist(),
                         "equity": view["equity"].tolist(), "reward": series["reward"].tolist(),
                         "actions": series["actions"].tolist(), "row": series["row"].tolist()}}
    path.with_suffix(".json").write_text(json.dumps(record, indent=1))
    for note in record["setup"]["notes"]:
        print(f"note: {note}")
    print(f"watch: {settings.target.model}, greedy, book {plan.book} of {plan.books} on {plan.held_out}: "
          f"{frames} frames at {args.fps:g} fps")
    print(f"animation: {path}")
    return 0
