"""A saved model for evaluation: loaded, and checked against what it is scored on before any step.

- :func:`load_model` loads a ``.zip`` with the first algorithm that takes it (BranchingIQN, DQN, QR-DQN); a
  model of the execute task is loaded by :func:`foxhunt.evaluation.execution_report.load_execution_model`
  (``foxhunt evaluate`` routes it there), and refused here saying so;
- :func:`check_action_space`: a model's actions must be one of foxenv's faces, ``Discrete(81)`` (joint
  codes) or ``MultiDiscrete([3, 3, 3, 3])`` (branches): an SB3 DQN over ``Discrete(9)`` is refused instead of
  having its codes played as joint actions;
- :func:`saved_env_kwargs`: the env settings a model was trained with, from the fingerprint in its file
  (:mod:`foxhunt.fingerprint`: levels, step clock, episode length, max_position, fees, reward, and every
  market option: ``split_times``, fractions, aggregation, the synthetic knobs), which ``foxhunt evaluate
  MODEL.zip`` uses for a file without its run's config;
- :func:`check_levels`: a LOBSTER folder with fewer book levels than the model's observation holds is refused
  in one line saying so and how to fix it (the observation layout depends on the levels: no fewer is sound);
- :func:`check_held_out`: scoring a model on LOBSTER steps it was trained on is refused (the same files and
  an overlapping clock range, whatever the market options), as a synthetic evaluation on the training
  market's seed is.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from foxenv import spec
from foxhunt import fingerprint

#: Algorithms tried, in order, to load a ``.zip`` (module, class).
MODEL_CLASSES = (
    ("sb3_her_ext.algorithm", "BranchingIQN"),
    ("stable_baselines3", "DQN"),
    ("sb3_contrib", "QRDQN"),
)
#: LOBSTER splits and the steps of the day each covers, as parts of ``all`` (train 0-0.8, fit its first 75 %).
_SPLIT_PARTS = {"all": {"fit", "validation", "test"}, "train": {"fit", "validation"}, "fit": {"fit"},
                "validation": {"validation"}, "test": {"test"}}


def load_saved_model(path: str | Path, device: str = "cpu") -> Any:
    """Load a saved SB3 model with the first of :data:`MODEL_CLASSES` that can (its action space unchecked).

    :param path: a ``.zip`` written by ``model.save``.
    :param device: device of the loaded network.
    :return: the model.
    :raises ValueError: one line, when ``path`` is not a file or no algorithm loads it (each one's error).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"model={str(path)!r} is not a file")
    errors = []
    for module_name, class_name in MODEL_CLASSES:
        try:
            return getattr(importlib.import_module(module_name), class_name).load(path, device=device)
        except Exception as error:  # noqa: BLE001 (try the next algorithm; all failures are reported)
            errors.append(f"{class_name}: {type(error).__name__}: {error}"[:200])
    raise ValueError(f"model={str(path)!r}: no known algorithm could load it ({'; '.join(errors)})")


def load_model(path: str | Path, device: str = "cpu") -> Any:
    """Load a saved SB3 model, trying BranchingIQN, SB3's DQN and sb3-contrib's QR-DQN, and check that its
    actions are one of foxenv's faces (:func:`check_action_space`).

    :param path: a ``.zip`` written by ``model.save``.
    :param device: device of the loaded network.
    :return: the model.
    :raises ValueError: one line, when no algorithm loads it or its action space is not foxenv's.
    """
    path = Path(path)
    model = load_saved_model(path, device)
    try:
        check_action_space(model, str(path), grid=None)  # the env's grid is checked when it is scored
    except ValueError as error:
        stamped = saved_fingerprint(path) or {}
        if dict(stamped.get("env") or {}).get("task") == "execute":
            raise ValueError(f"model={str(path)!r} was trained on the execute task (env.task='execute'): it "
                             "works a parent order, it does not trade; score it on its own (foxhunt "
                             "evaluate MODEL.zip or its run folder: the execution report)") from None
        raise error
    return model


def check_action_space(model: Any, name: str = "model", grid: spec.ActionGrid | None = spec.DEFAULT_GRID) -> (
    None
):
    """A ``ValueError`` unless ``model.action_space`` is one of foxenv's faces of ``grid``: ``Discrete(81)``
    (the joint codes ``27 d + 9 m + 3 o + u``) or ``MultiDiscrete([3, 3, 3, 3])`` on the default grid,
    ``Discrete(grid.joint_actions)`` or ``MultiDiscrete(grid.nvec)`` on another (a model without
    ``action_space`` is taken as it is).

    :param model: the model.
    :param name: how the message names it.
    :param grid: the env's action grid; ``None``: any of the named grids (:data:`foxenv.spec.ACTION_GRIDS`).
    """
    space = getattr(model, "action_space", None)
    if space is None:
        return
    grids = list(spec.ACTION_GRIDS.values()) if grid is None else [grid]
    nvec = getattr(space, "nvec", None)
    if nvec is not None and any(tuple(int(n) for n in nvec) == g.nvec for g in grids):
        return
    if nvec is None and int(getattr(space, "start", 0)) == 0 and any(
            getattr(space, "n", None) == g.joint_actions for g in grids):
        return
    faces = "; ".join(f"{g.name} grid: Discrete({g.joint_actions}) or MultiDiscrete({list(g.nvec)})"
                      for g in grids)
    raise ValueError(
        f"model={name!r} acts in {fingerprint.action_space_name(space)}, which is not one of foxenv's "
        f"action faces ({faces}): its actions cannot be scored as foxenv's; evaluate a model trained on "
        "foxenv (foxhunt train, or an SB3 algorithm on foxhunt.envs.FlatActionVecEnv) with the env's "
        "action_grid"
    )


def saved_fingerprint(path: str | Path) -> dict[str, Any] | None:
    """The fingerprint in a model file, or None (a file saved by another program, or before fingerprints)."""
    return fingerprint.read_model_file(path)


def saved_env_kwargs(stamped: Mapping[str, Any]) -> tuple[dict[str, Any], int | None, dict[str, Any]]:
    """The env settings a model was trained with, from its fingerprint.

    :param stamped: the fingerprint.
    :return: ``(env kwargs, synthetic market steps or None, training market options)``: EnvConfig fields and
        the step clock (``step_events`` / ``step_seconds``), as ``foxhunt evaluate`` passes them on; for a
        synthetic model also ``market_seed`` and its generator's parameters (the planted signal).
    """
    # JSON holds tuples (return_horizons) as lists
    env = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(stamped.get("env") or {}).items()}
    market = dict(stamped.get("market") or {})
    if market.get("source") == "synthetic":
        options = {**dict(market.get("params") or {}), "market_seed": market.get("seed", 0)}
        return {**env, **options}, market.get("num_steps"), options
    options = dict(market.get("options") or {})  # split_times, fractions, aggregation: every one is used
    return {**env, **options}, None, options


def check_run_settings(stamped: Mapping[str, Any] | None, config_fingerprint: Mapping[str, Any],
                       run_dir: str | Path) -> None:
    """A run folder's ``config.json`` must still describe what its ``model.zip`` was trained with.

    :param stamped: the model file's fingerprint (None: not checked).
    :param config_fingerprint: the fingerprint of the run's config now.
    :param run_dir: the run folder, for the message.
    :raises FingerprintMismatch: naming the env setting or action face that differs.
    """
    if stamped is None:
        return
    fingerprint.compare({k: stamped.get(k) for k in ("env", "action_face")},
                        {k: config_fingerprint.get(k) for k in ("env", "action_face")},
                        what=f"{Path(run_dir) / 'model.zip'}",
                        fix=f"put {Path(run_dir) / 'config.json'} back as it was when the model was trained")


def file_levels(folder: str | Path) -> int:
    """The book levels of a LOBSTER folder's orderbook file (its first line's columns / 4; no full read).

    :param folder: the LOBSTER folder.
    :return: the levels.
    """
    from foxenv.data.lobster import find_lobster_files

    _, book = find_lobster_files(folder)
    with book.open("rb") as handle:
        first = handle.readline()
    return (first.count(b",") + 1) // 4


def check_levels(env_kwargs: Mapping[str, Any], data: str | Path, source: str) -> None:
    """A LOBSTER folder must hold at least the levels the model's observation was built from.

    :param env_kwargs: the model's env settings (``levels``).
    :param data: the LOBSTER folder.
    :param source: where the settings come from, for the message.
    :raises ValueError: one line saying what differs and how to fix it.
    """
    levels = env_kwargs.get("levels")
    if levels is None:
        return
    available = file_levels(data)
    if available < int(levels):
        raise ValueError(
            f"the model was trained at levels={levels} ({source}): its observation holds {levels} book "
            f"levels per side, but the LOBSTER files in {str(data)!r} hold {available}; fewer levels change "
            f"the observation's layout, so it cannot be scored there: score it on data with >= {levels} "
            f"levels, or train a model at levels={available} on these files"
        )


def clock_range(data: str | Path, split: str, options: Mapping[str, Any]) -> tuple[float, float]:
    """The clock range ``(first, last)`` of a LOBSTER split's steps (seconds since the first day's midnight),
    loaded with ``options`` (``split_times``, ``train_fraction``, ``step_events``, ...) as evaluated.

    :param data: the LOBSTER folder.
    :param split: the split.
    :param options: ``load_market``'s options.
    :return: the first and last step's time.
    """
    from foxenv.data import load_market

    market = load_market(str(data), split=split, device="cpu", **dict(options))
    return float(market.time[0]), float(market.time[-1])


def clock(seconds: float) -> str:
    """``HH:MM:SS`` of a time in seconds since midnight (``day N HH:MM:SS`` past the first day)."""
    day, rest = divmod(int(seconds), 86_400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"day {day} {text}" if day else text


def _clock_text(span: tuple[float, float] | None) -> str:
    return "" if span is None else f"{clock(span[0])}-{clock(span[1])}"


def check_held_out(trained_on: Mapping[str, Any] | None, data: str | Path, split: str,
                   options: Mapping[str, Any] | None = None) -> None:
    """Refuse to score a model on LOBSTER steps it was trained on (as a synthetic evaluation on the training
    market's seed is refused): the same files (SHA-256) and a scored clock range that overlaps the training
    one. With the model's own market options the splits' names decide (the cut is the same); with other
    options (``--env.market``: another ``split_times``, ``train_fraction``, aggregation) both splits are
    loaded and their clock ranges compared.

    :param trained_on: the model's training market (a fingerprint's ``market``: files, split, options;
        None: not checked).
    :param data: the LOBSTER folder scored on.
    :param split: the split scored on.
    :param options: the market options it is scored with (None: the training market's).
    :raises ValueError: one line naming both clock ranges, when the scored steps overlap the training ones.
    """
    if not trained_on or trained_on.get("source") != "lobster":
        return
    if trained_on.get("files") != fingerprint.lobster_files(data):
        return
    trained_split = str(trained_on.get("split", "all"))
    trained_options = dict(trained_on.get("options") or {})
    options = trained_options if options is None else dict(options)
    same_cut = options == trained_options
    trained_clock = scored_clock = None
    if same_cut:
        overlap = bool(_SPLIT_PARTS.get(split, {split}) & _SPLIT_PARTS.get(trained_split, {trained_split}))
    else:
        trained_clock = clock_range(data, trained_split, trained_options)
        scored_clock = clock_range(data, split, options)
        overlap = scored_clock[0] < trained_clock[1] and trained_clock[0] < scored_clock[1]
    if not overlap:
        return
    if same_cut:
        try:
            trained_clock = clock_range(data, trained_split, trained_options)
            scored_clock = clock_range(data, split, options)
        except ValueError:  # a split too short to load: the names say it
            pass
    held_out = "test" if trained_split in ("train", "fit", "validation") else None
    fix = f"use --split {held_out}" if held_out else "score it on other files"
    if trained_split == "fit":
        fix = "use --split validation or --split test"
    if not same_cut:
        changed = sorted(k for k in set(options) | set(trained_options)
                         if options.get(k) != trained_options.get(k))
        fix = f"score it with the model's own market options ({', '.join(changed)} differ), or on other files"
    spans = (f": the scored steps' clock {_clock_text(scored_clock)} overlaps the training clock "
             f"{_clock_text(trained_clock)}" if scored_clock and trained_clock else "")
    raise ValueError(
        f"--split {split}: the model was trained on the {trained_split!r} split of these LOBSTER files "
        f"(same SHA-256), so {split!r} is not held out{spans}; {fix}"
    )


def run_settings(config: Any, model_path: str | Path, run_dir: str | Path) -> (
    tuple[dict[str, Any] | None, str]
):
    """A run folder's model: its fingerprint, checked against the run's ``config.json``.

    :param config: the run's :class:`~foxhunt.runs.RunConfig`.
    :param model_path: its ``model.zip``.
    :param run_dir: the run folder.
    :return: ``(the model's fingerprint, or for a model without one the training market the config names;
        where the settings come from, for messages)``.
    """
    stamped = saved_fingerprint(model_path)
    now = {"env": fingerprint.env_settings(config.resolved_env_kwargs()),
           "action_face": config.resolved_action_face()}
    check_run_settings(stamped, now, run_dir)
    if stamped is None and config.data != "synthetic" and Path(config.data).is_dir():
        stamped = {"market": fingerprint.market_fingerprint(
            config.data, config.resolved_env_kwargs(), split=config.train_split(),
            synthetic_market_steps=config.synthetic_market_steps)}
    return stamped, f"its run's config.json, {Path(run_dir) / 'config.json'}"


def check_data_given(stamped: Mapping[str, Any], data: str | None) -> None:
    """A model trained on LOBSTER files is scored on LOBSTER data: without ``--data`` it would meet the
    synthetic market with a real day's settings.

    :param stamped: the model's fingerprint.
    :param data: ``--data`` (None: not given).
    :raises ValueError: naming the files it was trained on.
    """
    market = stamped.get("market") or {}
    if data is None and market.get("source") == "lobster":
        files = ", ".join(sorted(market.get("files") or {}))
        raise ValueError(f"the model was trained on LOBSTER files ({files}, {market.get('split')!r} split): "
                         "give --data with a LOBSTER folder (its --split test is held out when it holds "
                         "those files)")
