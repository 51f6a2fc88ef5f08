"""Market data sources: the LOBSTER replay and the synthetic market, both producing :class:`MarketData`.

Quick start::

    from foxenv.data import load_market

    market = load_market()                                   # synthetic, 50,000 steps, no files needed
    real = load_market("/path/to/lobster", split="train")    # a folder with one LOBSTER pair
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch

from foxenv.data.cache import CacheWarning
from foxenv.data.lobster import (
    DEFAULT_PRICE_BAND,
    LobsterDay,
    find_lobster_days,
    find_lobster_files,
    load_lobster,
    walk_forward,
)
from foxenv.data.market import FLOW_WIDTH, SECONDS_PER_DAY, MarketData, concat_markets
from foxenv.data.synthetic import WAVE_KNOBS, SyntheticProfile, generate_synthetic

__all__ = [
    "DEFAULT_PRICE_BAND",
    "FLOW_WIDTH",
    "CacheWarning",
    "LobsterDay",
    "MarketData",
    "SPLITS",
    "SyntheticProfile",
    "concat_markets",
    "find_lobster_days",
    "find_lobster_files",
    "generate_synthetic",
    "load_lobster",
    "load_market",
    "parse_clock",
    "walk_forward",
]

#: Steps of the synthetic market when ``num_steps`` is not given.
DEFAULT_SYNTHETIC_STEPS = 50_000
#: ``load_market``'s splits: the whole timeline, train / test, and the train split's fit / validation parts
SPLITS = ("all", "train", "test", "fit", "validation")
#: Levels of the synthetic market when ``levels`` is not given.
DEFAULT_SYNTHETIC_LEVELS = 10


def parse_clock(value: str | float, field: str = "split_times") -> float:
    """Seconds after midnight of a clock time: ``"HH:MM"``, ``"HH:MM:SS"`` or a number of seconds.

    :param value: the clock time.
    :param field: the name used in the error.
    :return: seconds in ``[0, 86400]``.
    :raises ValueError: naming ``field`` and the value.
    """
    if isinstance(value, str):
        parts = value.split(":")
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            numbers = []
        if not 2 <= len(parts) <= 3 or len(numbers) != len(parts):
            raise ValueError(f"{field} holds {value!r}: a clock time is 'HH:MM', 'HH:MM:SS' or seconds")
        seconds = numbers[0] * 3600 + numbers[1] * 60 + (numbers[2] if len(numbers) == 3 else 0.0)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"{field} holds {value!r}: a clock time is 'HH:MM', 'HH:MM:SS' or seconds")
    if not (math.isfinite(seconds) and 0.0 <= seconds <= SECONDS_PER_DAY):
        raise ValueError(f"{field} holds {value!r}: not a time of day")
    return seconds


def _split_by_clock(data: MarketData, split: str, split_times: Sequence[str | float]) -> MarketData:
    """``split`` of a one-day market cut at two clock times: fit before the first, validation to the second,
    test after it (train = fit + validation); a step belongs where its end time lies."""
    if isinstance(split_times, str) or len(split_times) != 2:
        raise ValueError(f"split_times={split_times!r} must be two clock times (fit end, validation end)")
    fit_end, validation_end = (parse_clock(v) for v in split_times)
    if not fit_end < validation_end:
        raise ValueError(f"split_times={tuple(split_times)!r}: the fit end must come before the validation "
                         "end")
    span = float(data.time[-1] - data.time[0])
    if span >= SECONDS_PER_DAY:
        raise ValueError(f"split_times={tuple(split_times)!r} cuts one day, but {data.name} spans "
                         f"{span:,.0f} s; for several days use days= and walk_forward")
    clock = data.time % SECONDS_PER_DAY
    cuts = torch.searchsorted(clock.contiguous(), torch.tensor([fit_end, validation_end], dtype=clock.dtype,
                                                               device=clock.device), right=True).tolist()
    bounds = {"fit": (0, cuts[0]), "validation": (cuts[0], cuts[1]), "test": (cuts[1], data.num_steps),
              "train": (0, cuts[1])}
    start, stop = bounds[split]
    if stop - start < 2:
        raise ValueError(f"split_times={tuple(split_times)!r} leaves {stop - start} step(s) in the {split} "
                         f"split of {data.name} (clock {float(clock[0]):,.0f}-{float(clock[-1]):,.0f} s)")
    return data.slice(start, stop)


def load_market(
    source: str | os.PathLike | tuple | list = "synthetic",
    *,
    levels: int | None = None,
    step_events: int | None = None,
    step_seconds: float | None = None,
    price_band: float | None = DEFAULT_PRICE_BAND,
    tick_size: float | None = None,
    split: Literal["all", "train", "test", "fit", "validation"] = "all",
    train_fraction: float = 0.8,
    validation_fraction: float = 0.25,
    num_steps: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike | None = None,
    signal_strength: float = 0.0,
    signal_horizon: int = 1,
    split_times: Sequence[str | float] | None = None,
    days: Sequence[int] | None = None,
    **waves: float,
) -> MarketData:
    """Load a market timeline from the synthetic generator or LOBSTER files, on ``device``.

    :param source: ``"synthetic"``; a folder holding one ``*_message_*.csv`` / ``*_orderbook_*.csv``
        pair (or several days: pick them with ``days``); a ``(message_path, orderbook_path)`` tuple; or a
        list of folders / pairs (several tickers, say), joined in order by
        :func:`~foxenv.data.market.concat_markets` (give them the same ``levels``).
    :param levels: book levels per side; synthetic default 10, LOBSTER default all levels of the file.
    :param step_events: LOBSTER only: messages per step (default 100 unless ``step_seconds`` is set).
    :param step_seconds: LOBSTER: seconds per step (fixed time buckets). Synthetic: clock seconds per step.
    :param price_band: LOBSTER only: largest distance of a book or message price from the mid of the
        book around it, as a fraction of that mid (default 0.2; None switches the check off).
    :param tick_size: LOBSTER only: the tick in currency (a multiple of 0.0001), checked against the
        prices; None infers it (see :mod:`foxenv.data.lobster`).
    :param split: ``"all"``, or the first ``train_fraction`` of steps (``"train"``) or the rest (``"test"``);
        or the train split cut in two for model selection (tuning) that never sees the test split: its first
        ``1 - validation_fraction`` (``"fit"``) and the rest of it (``"validation"``). With ``split_times``
        the cuts are clock times instead.
    :param train_fraction: share of steps in the train split.
    :param validation_fraction: share of the train split's steps in the validation split.
    :param num_steps: synthetic: steps to generate (default 50,000). LOBSTER: keep only the first
        ``num_steps`` aggregated steps (None keeps all). Applied before ``split``.
    :param seed: synthetic only: the random seed (LOBSTER replay is deterministic).
    :param device: device of the returned tensors.
    :param cache_dir: LOBSTER only: cache folder (default ``$FOXHUNT_CACHE_DIR`` or
        ``~/.cache/foxhunt/lobster``). A cache that cannot be read or written costs time, not the load:
        one :class:`CacheWarning` says why.
    :param signal_strength: synthetic only: strength of a planted, observable signal of the next
        ``signal_horizon`` steps' mid move (0: none, the market is then the one without it, bit for bit;
        see :class:`~foxenv.data.synthetic.SyntheticProfile`).
    :param signal_horizon: synthetic only: steps over which a planted signal moves the mid; >= 1.
    :param waves: synthetic only: the planted waves' knobs (:data:`~foxenv.data.synthetic.WAVE_KNOBS`:
        ``wave_rate`` and the rest of :class:`~foxenv.data.synthetic.SyntheticProfile`'s ``wave_*``).
    :param split_times: a session split of one day: ``(fit end, validation end)`` clock times (``"12:30"``,
        ``"13:30:00"`` or seconds after midnight): ``"fit"`` before the first, ``"validation"`` to the second,
        ``"test"`` after it, ``"train"`` both first parts; replaces the fractions.
    :param days: a folder of several LOBSTER days (:func:`~foxenv.data.lobster.find_lobster_days`, date
        order): the indices of the days to load, joined in date order with their real gaps (walk-forward
        folds: :func:`~foxenv.data.lobster.walk_forward`).
    :return: the timeline.
    :raises ValueError: on a bad source, parameter or data file, naming the field and the value.
    """
    _check_load_options(split, train_fraction, validation_fraction, num_steps, waves)
    if isinstance(source, list):
        if not source:
            raise ValueError("source=[] names no market")
        parts = [load_market(part, levels=levels, step_events=step_events, step_seconds=step_seconds,
                             price_band=price_band, tick_size=tick_size, num_steps=num_steps, seed=seed,
                             cache_dir=cache_dir, signal_strength=signal_strength,
                             signal_horizon=signal_horizon, days=days, **waves) for part in source]
        data = concat_markets(parts)
    elif isinstance(source, str) and source == "synthetic":
        if step_events is not None:
            raise ValueError(f"step_events={step_events} applies to LOBSTER sources only, not 'synthetic'")
        if tick_size is not None:
            raise ValueError(f"tick_size={tick_size} applies to LOBSTER sources only, not 'synthetic'")
        profile = {} if step_seconds is None else {"step_seconds": step_seconds}
        profile.update(signal_strength=signal_strength, signal_horizon=signal_horizon, **waves)
        data = generate_synthetic(
            DEFAULT_SYNTHETIC_STEPS if num_steps is None else num_steps,
            levels=DEFAULT_SYNTHETIC_LEVELS if levels is None else levels,
            seed=seed,
            **profile,
        )
    else:
        if signal_strength != 0.0 or signal_horizon != 1:
            raise ValueError(f"signal_strength={signal_strength}, signal_horizon={signal_horizon}: a planted "
                             "signal applies to the synthetic market only, not to LOBSTER sources")
        if waves:
            given = ", ".join(f"{k}={v!r}" for k, v in waves.items())
            raise ValueError(f"{given}: planted waves apply to the synthetic market only, not to LOBSTER "
                             "sources")
        options = {"levels": levels, "step_events": step_events, "step_seconds": step_seconds,
                   "price_band": price_band, "tick_size": tick_size, "cache_dir": cache_dir}
        data = _load_lobster_source(source, days, num_steps, options)
    return _split(data, split, split_times, train_fraction, validation_fraction).to(device)


def _check_load_options(split: str, train_fraction: float, validation_fraction: float, num_steps: int | None,
                        waves: dict[str, float]) -> None:
    """Check :func:`load_market`'s source-independent options, naming the first bad one."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} must be one of {', '.join(map(repr, SPLITS))}")
    unknown = sorted(set(waves) - set(WAVE_KNOBS))
    if unknown:
        raise ValueError(f"load_market got unknown option(s) {unknown}; the wave knobs are "
                         f"{list(WAVE_KNOBS)}")
    for name, fraction in (("train_fraction", train_fraction), ("validation_fraction", validation_fraction)):
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValueError(f"{name}={fraction!r} must be a number strictly between 0 and 1")
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction={validation_fraction} must lie strictly between 0 and 1")
    bad_steps = isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1
    if num_steps is not None and bad_steps:
        raise ValueError(f"num_steps={num_steps!r} must be a positive int or None")


def _load_lobster_source(source: str | os.PathLike | tuple, days: Sequence[int] | None, num_steps: int | None,
                         options: dict) -> MarketData:
    """A LOBSTER source of :func:`load_market` (a pair, a one-pair folder or chosen days of a folder),
    cut to its first ``num_steps`` steps."""
    if isinstance(source, tuple):
        if len(source) != 2:
            raise ValueError(f"source={source!r} must be a (message_path, orderbook_path) pair")
        message_path, orderbook_path = source
    elif isinstance(source, str | os.PathLike) and Path(source).is_dir() and days is not None:
        message_path = orderbook_path = None
    elif isinstance(source, str | os.PathLike) and Path(source).is_dir():
        message_path, orderbook_path = find_lobster_files(source)
    else:
        raise ValueError(
            f"source={source!r} is neither 'synthetic', an existing folder, nor a pair of files"
        )
    if message_path is None:
        data = _load_days(source, days, options)
    else:
        data = load_lobster(message_path, orderbook_path, **options)
    if num_steps is not None:
        if num_steps > data.num_steps:
            raise ValueError(f"num_steps={num_steps} exceeds the {data.num_steps} steps of {data.name}")
        data = data.slice(0, num_steps)
    return data


def _split(data: MarketData, split: str, split_times: Sequence[str | float] | None, train_fraction: float,
           validation_fraction: float) -> MarketData:
    """``split`` of a loaded timeline: by clock times when ``split_times`` is given, else by fractions."""
    if split_times is not None:
        if split != "all":
            data = _split_by_clock(data, split, split_times)
    elif split != "all":
        train, test = data.split(train_fraction)
        data = train if split == "train" else test
        if split in ("fit", "validation"):
            try:
                fit, validation = train.split(1.0 - validation_fraction)
            except ValueError:
                raise ValueError(f"validation_fraction={validation_fraction} leaves an empty fit or "
                                 f"validation split of the {train.num_steps} train steps") from None
            data = fit if split == "fit" else validation
    elif not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction={train_fraction} must lie strictly between 0 and 1")
    return data


def _load_days(folder: str | os.PathLike, days: Sequence[int], options: dict) -> MarketData:
    """The chosen days of a multi-day LOBSTER folder, joined in date order, each shifted by its date."""
    found = find_lobster_days(folder)
    if isinstance(days, str | bytes) or not isinstance(days, Sequence) or not days:
        raise ValueError(f"days={days!r} must be a non-empty list of day indices")
    for day in days:
        if isinstance(day, bool) or not isinstance(day, int) or not 0 <= day < len(found):
            raise ValueError(f"days holds {day!r}; {folder} has days 0..{len(found) - 1} "
                             f"({found[0].date} .. {found[-1].date})")
    if list(days) != sorted(set(days)):
        raise ValueError(f"days={list(days)!r} must be increasing without repeats (date order)")
    first = found[days[0]].date
    parts = []
    for index in days:
        day = found[index]
        market = load_lobster(day.message_path, day.orderbook_path, **options)
        shift = (day.date - first).days * SECONDS_PER_DAY
        parts.append(market if shift == 0 else dataclasses.replace(market, time=market.time + shift))
    return concat_markets(parts, name=f"{Path(folder).name} days {list(days)} "
                                      f"({found[days[0]].date} .. {found[days[-1]].date})")
