"""LOBSTER replay: parse a message + orderbook file pair, validate it, and aggregate it into steps.

Finding the files is in :mod:`foxenv.data.lobster_files`, reading and validating the cells in
:mod:`foxenv.data.lobster_csv`, the price band and tick checks in :mod:`foxenv.data.lobster_prices`;
this module re-exports their public names.

Format (LOBSTER_SampleFiles_ReadMe.txt): no header; the message file is ``N x 6`` (time, type,
order_id, size, price, direction); the orderbook file is ``N x 4L`` (ask_price, ask_size, bid_price,
bid_size per level); prices in 1e-4 currency units; empty levels carry ``+-9999999999`` with size 0;
row ``k`` of the book is the state after message ``k``.

Checks (each failure is a ``ValueError`` naming the file, the line, the field and the value as written):

- Every cell numeric and finite; integer fields integral and within ``+-2**53`` (read as float64, which
  holds every such integer exactly).
- Times in seconds after midnight: within ``[0, 86400]`` and non-decreasing.
- The dummy price ``+-9999999999`` only on empty levels of the orderbook file (ask side ``+``, bid ``-``).
- Prices of the book and of messages of types 1-6 within ``price_band`` (a fraction) of the mid of the
  book around them: a centred rolling median of the mids of ``MID_WINDOW_ROWS`` rows, so that one bad
  row cannot move it.
- Visible prices (occupied book levels, messages of types 1-4) on the tick: ``tick_size`` when given,
  else inferred as the largest divisor of the most frequent visible price on which at least
  ``TICK_MAJORITY`` of the visible prices sit; a price off that tick is reported, not allowed to shrink
  it (pass ``tick_size`` to accept a finer tick).

Choices this module makes (the contract leaves them open):

- Executions: both type 4 (visible) and type 5 (hidden) executions go to the flow grids. A hidden
  order trades behind visible ones at its price, so a hidden execution at price ``p`` means any
  visible order at ``p`` (or better) would have traded. Hidden executions may sit between ticks
  (GOOG has 50 half-penny ones); such a price goes to the grid tick towards the inside of the book:
  rounded *up* for bids, *down* for asks (a resting order at that tick would have been reached).
- Type 6 (cross / auction trade) is accepted but touches no visible queue, so it adds no flow.
- Type 7 (halt): price -1 halts, 0 resumes quoting (trading still halted), 1 resumes trading. A step
  is halted when any of its messages lies in ``[halt, trading resumes]`` or, for an empty time bucket,
  when trading was halted when it began. A file whose first type-7 message is a resume was halted
  since its start.
- Step boundaries: by count, step ``t`` holds messages ``[t E, (t+1) E)``; the last step may hold
  fewer. By seconds, buckets are ``[t0 + t dt, t0 + (t+1) dt)`` with ``t0`` the first message's time
  rounded down to a multiple of ``dt``; ``time`` is the bucket's end. By count, ``time`` is the last
  message's time.
- The book before the first message is unknown; step 0's flow grid is referenced to the book after
  the first message.
- A side with no occupied level is anchored one tick beyond the other side's best price; a row with
  no occupied level at all repeats the previous row's prices (with zero sizes).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from foxenv.data.cache import cached_market
from foxenv.data.lobster_csv import (
    BOOK_COLUMNS,
    DUMMY_PRICE,
    KNOWN_EVENT_TYPES,
    MAX_EXACT_INTEGER,
    MESSAGE_COLUMNS,
    PRICE_SCALE,
    SECONDS_PER_DAY,
    _as_int,
    _read_numeric,
    _Source,
    _validate_book,
    _validate_messages,
    _validate_time,
)
from foxenv.data.lobster_files import (
    LOBSTER_NAME,
    LobsterDay,
    find_lobster_days,
    find_lobster_files,
    walk_forward,
)
from foxenv.data.lobster_prices import (
    MID_WINDOW_ROWS,
    TICK_MAJORITY,
    VISIBLE_EVENT_TYPES,
    _check_price_band_of,
    _check_tick,
    infer_tick,
)
from foxenv.data.market import FLOW_WIDTH, MarketData

__all__ = [
    "BOOK_COLUMNS", "DEFAULT_PRICE_BAND", "DEFAULT_STEP_EVENTS", "DUMMY_PRICE", "KNOWN_EVENT_TYPES",
    "LOBSTER_NAME", "MAX_EMPTY_STEPS_PER_MESSAGE", "MAX_EXACT_INTEGER", "MESSAGE_COLUMNS", "MID_WINDOW_ROWS",
    "PRICE_SCALE", "SECONDS_PER_DAY", "TICK_MAJORITY", "VISIBLE_EVENT_TYPES", "LobsterDay",
    "aggregate_lobster", "find_lobster_days", "find_lobster_files", "infer_tick", "load_lobster",
    "parse_lobster", "walk_forward",
]

#: Messages per step when neither ``step_events`` nor ``step_seconds`` is given.
DEFAULT_STEP_EVENTS = 100

#: Time bucketing may make at most this many steps per message (beyond a floor of 1000 steps).
MAX_EMPTY_STEPS_PER_MESSAGE = 10

#: Default ``price_band``: 20 % of the mid, far beyond a listed stock's intraday book (GOOG: 1.7 %).
DEFAULT_PRICE_BAND = 0.2

_HALF = FLOW_WIDTH // 2


def load_lobster(
    message_path: str | os.PathLike,
    orderbook_path: str | os.PathLike,
    *,
    levels: int | None = None,
    step_events: int | None = None,
    step_seconds: float | None = None,
    price_band: float | None = DEFAULT_PRICE_BAND,
    tick_size: float | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> MarketData:
    """Load a LOBSTER pair as a :class:`MarketData` on CPU, from the cache when it holds it.

    The cache only saves time: when it cannot be read or written the pair is parsed anyway and one
    :class:`~foxenv.data.cache.CacheWarning` says why.

    :param message_path: the ``*_message_*.csv`` file.
    :param orderbook_path: the matching ``*_orderbook_*.csv`` file.
    :param levels: book levels to keep (the first ``levels``); None keeps all levels of the file.
    :param step_events: messages per step (default 100 when ``step_seconds`` is not given).
    :param step_seconds: seconds per step (fixed time buckets); excludes ``step_events``.
    :param price_band: largest distance of a price from the mid of the book around it, as a fraction of
        that mid (default 0.2); None switches the check off.
    :param tick_size: the price increment in currency (a multiple of 0.0001), checked against the prices;
        None infers it from them.
    :param cache_dir: cache folder; default ``$FOXHUNT_CACHE_DIR`` or ``~/.cache/foxhunt/lobster``.
    :return: the aggregated timeline, on CPU.
    :raises ValueError: on bad parameters, a missing or unreadable file (naming it), or a malformed file
        (naming the file, the line, the field and the value as written).
    """
    step_events, step_seconds = _check_step_params(step_events, step_seconds)
    if levels is not None and (isinstance(levels, bool) or not isinstance(levels, int) or levels < 1):
        raise ValueError(f"levels={levels!r} must be a positive int or None")
    price_band = _check_price_band(price_band)
    tick_units = _check_tick_size(tick_size)
    paths = [Path(message_path), Path(orderbook_path)]
    for field, path in zip(("message_path", "orderbook_path"), paths, strict=True):
        if not path.is_file():
            raise ValueError(f"{field}={str(path)!r} does not exist or is not a file")
        _check_readable(path, field)
    params = {"levels": levels, "step_events": step_events, "step_seconds": step_seconds,
              "price_band": price_band, "tick_units": tick_units}

    def build() -> MarketData:
        parsed = parse_lobster(paths[0], paths[1], levels=levels, price_band=price_band, tick_size=tick_size)
        return aggregate_lobster(*parsed, step_events=step_events, step_seconds=step_seconds,
                                 name=f"LOBSTER {paths[0].stem}")

    return cached_market(paths, params, cache_dir, build)


def _check_readable(path: Path, field: str) -> None:
    """Open ``path`` for reading, so that a permission problem names the file.

    :param path: an existing file.
    :param field: the parameter that named it, for the message.
    :raises ValueError: when the file cannot be opened or read.
    """
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as error:
        raise ValueError(f"{field}={str(path)!r} cannot be read: {error.strerror or error}") from error


def _check_step_params(
    step_events: int | None, step_seconds: float | None
) -> tuple[int | None, float | None]:
    """Validate the step parameters and apply the default (100 messages per step).

    :param step_events: messages per step, or None.
    :param step_seconds: seconds per step, or None.
    :return: ``(step_events, step_seconds)`` with exactly one of them set.
    :raises ValueError: when both are set or either is not positive.
    """
    if step_events is not None and step_seconds is not None:
        raise ValueError(
            f"step_events={step_events} and step_seconds={step_seconds}: set at most one of them"
        )
    if step_seconds is not None:
        if not np.isfinite(step_seconds) or step_seconds <= 0:
            raise ValueError(f"step_seconds={step_seconds} must be > 0")
        return None, float(step_seconds)
    if step_events is None:
        return DEFAULT_STEP_EVENTS, None
    if isinstance(step_events, bool) or not isinstance(step_events, int | np.integer) or step_events < 1:
        raise ValueError(f"step_events={step_events!r} must be a positive int")
    return int(step_events), None


def _is_real(value: object) -> bool:
    """True for an int or float (numpy's included), False for bools and anything else."""
    real = isinstance(value, int | float | np.integer | np.floating)
    return real and not isinstance(value, bool | np.bool_)


def _check_price_band(price_band: float | None) -> float | None:
    """Validate ``price_band``.

    :param price_band: a fraction of the mid, or None (no band check).
    :return: the band as a float, or None.
    :raises ValueError: unless it is None or a finite number > 0.
    """
    if price_band is None:
        return None
    if not _is_real(price_band) or not math.isfinite(price_band) or price_band <= 0:
        raise ValueError(f"price_band={price_band!r} must be a finite number > 0 (a fraction of the mid) "
                         "or None")
    return float(price_band)


def _check_tick_size(tick_size: float | None) -> int | None:
    """Validate ``tick_size`` and convert it to LOBSTER price units.

    :param tick_size: the tick in currency, or None (inferred from the prices).
    :return: the tick in 1e-4 units, or None.
    :raises ValueError: unless it is None or a positive multiple of 0.0001.
    """
    if tick_size is None:
        return None
    if not _is_real(tick_size) or not math.isfinite(tick_size) or tick_size <= 0:
        raise ValueError(f"tick_size={tick_size!r} must be a finite number > 0 or None")
    units = round(tick_size * PRICE_SCALE)
    if units < 1 or abs(units - tick_size * PRICE_SCALE) > 1e-6 * max(units, 1):
        raise ValueError(f"tick_size={tick_size!r} must be a multiple of 0.0001 (LOBSTER's price unit)")
    return int(units)


def parse_lobster(
    message_path: str | os.PathLike,
    orderbook_path: str | os.PathLike,
    *,
    levels: int | None = None,
    price_band: float | None = DEFAULT_PRICE_BAND,
    tick_size: float | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """Read and validate a LOBSTER pair (see the module docstring for the checks).

    :param message_path: the message file.
    :param orderbook_path: the orderbook file.
    :param levels: levels to keep; None keeps all. All levels of the file are validated.
    :param price_band: largest distance of a price from the mid around it, as a fraction of the mid;
        None switches the check off.
    :param tick_size: the tick in currency, checked against the visible prices; None infers it.
    :return: ``(messages, book, tick_units)``: messages as a dict of 1-D arrays (``time`` float64, the
        other columns int64), the book as ``[N, 4, L]`` int64 (ask price, ask size, bid price, bid size)
        in 1e-4 units, and the tick size in 1e-4 units.
    :raises ValueError: naming the file, the line, the field and the value (as written) of the first
        problem found.
    """
    price_band = _check_price_band(price_band)
    given_tick = _check_tick_size(tick_size)
    message_source = _Source(Path(message_path), "message")
    book_source = _Source(Path(orderbook_path), "orderbook")
    message_name, book_name = message_source.path.name, book_source.path.name
    raw_messages = _read_numeric(message_source)
    if raw_messages.shape[1] != len(MESSAGE_COLUMNS):
        raise ValueError(f"message file {message_name} has {raw_messages.shape[1]} columns, must be 6")
    raw_book = _read_numeric(book_source)
    if raw_book.shape[1] % 4 != 0:
        raise ValueError(
            f"orderbook file {book_name} has {raw_book.shape[1]} columns, must be a multiple of 4"
        )
    if raw_book.shape[0] != raw_messages.shape[0]:
        raise ValueError(
            f"row counts differ: message file has {raw_messages.shape[0]} rows, "
            f"orderbook file has {raw_book.shape[0]}"
        )
    file_levels = raw_book.shape[1] // 4
    if levels is not None and levels > file_levels:
        raise ValueError(f"levels={levels} exceeds the {file_levels} levels in {book_name}")
    levels = file_levels if levels is None else levels

    messages = {"time": raw_messages[:, 0]}
    _validate_time(messages["time"], message_source)
    integer_columns = _as_int(raw_messages[:, 1:], message_source, first_column=1)
    for index, name in enumerate(MESSAGE_COLUMNS[1:]):
        messages[name] = integer_columns[:, index]
    _validate_messages(messages, message_source)

    book = _as_int(raw_book, book_source).reshape(-1, file_levels, 4).transpose(0, 2, 1)
    _validate_book(book, book_source)
    if price_band is not None:
        _check_price_band_of(book, messages, price_band, book_source, message_source)
    tick_units = _check_tick(book, messages, given_tick, book_source, message_source)
    return messages, np.ascontiguousarray(book[:, :, :levels]), tick_units


def _fill_book(book: np.ndarray, tick_units: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Replace dummy levels by prices continued one tick per level beyond the last occupied one.

    :param book: ``[N, 4, L]`` validated book in 1e-4 units.
    :param tick_units: tick in 1e-4 units.
    :return: ``(ask_price, ask_size, bid_price, bid_size)``, each ``[N, L]`` int64, prices strictly ordered.
    :raises ValueError: when no row of the book has any occupied level.
    """
    ask_price, ask_size, bid_price, bid_size = book[:, 0], book[:, 1], book[:, 2], book[:, 3]
    rows, levels = ask_price.shape
    ask_count = (ask_price != DUMMY_PRICE).sum(axis=1)
    bid_count = (bid_price != -DUMMY_PRICE).sum(axis=1)
    row_index = np.arange(rows)
    last_ask = np.where(ask_count > 0, ask_price[row_index, np.maximum(ask_count - 1, 0)], 0)
    last_bid = np.where(bid_count > 0, bid_price[row_index, np.maximum(bid_count - 1, 0)], 0)
    # Best prices with an empty side anchored one tick beyond the other side; NaN when both are empty.
    best_ask = np.where(ask_count > 0, ask_price[:, 0], bid_price[:, 0] + tick_units).astype(np.float64)
    best_bid = np.where(bid_count > 0, bid_price[:, 0], ask_price[:, 0] - tick_units).astype(np.float64)
    nothing = (ask_count == 0) & (bid_count == 0)
    if nothing.all():
        raise ValueError("orderbook: no row has an occupied level")
    best_ask[nothing] = np.nan
    best_bid[nothing] = np.nan
    filled = pd.DataFrame({"ask": best_ask, "bid": best_bid}).ffill().bfill().to_numpy().astype(np.int64)
    best_ask, best_bid = filled[:, 0], filled[:, 1]
    # Level i of an empty side: anchor + (i + 1) ticks, where the anchor is the level before index 0.
    anchor_ask = np.where(ask_count > 0, last_ask, best_ask - tick_units)
    anchor_bid = np.where(bid_count > 0, last_bid, best_bid + tick_units)
    depth = np.arange(levels)[None, :]
    ask_beyond = depth - ask_count[:, None] + 1
    bid_beyond = depth - bid_count[:, None] + 1
    ask_filled = np.where(ask_beyond > 0, anchor_ask[:, None] + ask_beyond * tick_units, ask_price)
    bid_filled = np.where(bid_beyond > 0, anchor_bid[:, None] - bid_beyond * tick_units, bid_price)
    return ask_filled, ask_size, bid_filled, bid_size


def _halt_state(messages: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-message halt flags.

    :param messages: validated messages.
    :return: ``(touches_halt, halted_after)``: ``touches_halt[k]`` is True when message ``k`` lies in a
        halt (from the halt message through the trading-resumes message, both included);
        ``halted_after[k]`` is True when trading is halted after message ``k``.
    """
    kind, price = messages["type"], messages["price"]
    marker = kind == 7
    if not marker.any():
        none = np.zeros(kind.shape, dtype=bool)
        return none, none
    first_marker = int(np.flatnonzero(marker)[0])
    initially_halted = bool(price[first_marker] != -1)
    # State after each type-7 message: halted unless it says trading resumes (price 1).
    state_at_marker = marker & (price != 1)
    last_marker = np.maximum.accumulate(np.where(marker, np.arange(kind.size), -1))
    halted_after = np.where(last_marker >= 0, state_at_marker[last_marker.clip(0)], initially_halted)
    halted_before = np.concatenate([[initially_halted], halted_after[:-1]])
    return halted_after | halted_before, halted_after


def aggregate_lobster(
    messages: dict[str, np.ndarray],
    book: np.ndarray,
    tick_units: int,
    *,
    step_events: int | None = DEFAULT_STEP_EVENTS,
    step_seconds: float | None = None,
    name: str = "LOBSTER",
) -> MarketData:
    """Aggregate validated messages and book rows into steps (vectorised, no loop over messages).

    :param messages: from :func:`parse_lobster`.
    :param book: ``[N, 4, L]`` from :func:`parse_lobster`.
    :param tick_units: tick in 1e-4 units.
    :param step_events: messages per step (excludes ``step_seconds``).
    :param step_seconds: seconds per step (fixed buckets; an empty bucket repeats the previous book).
    :param name: description stored in the result.
    :return: the timeline on CPU.
    """
    step_events, step_seconds = _check_step_params(step_events, step_seconds)
    time = messages["time"]
    count = time.size
    if step_seconds is not None:
        origin = np.floor(time[0] / step_seconds) * step_seconds
        step_of = np.floor((time - origin) / step_seconds).astype(np.int64)
        num_steps = int(step_of[-1]) + 1
        if num_steps > MAX_EMPTY_STEPS_PER_MESSAGE * count + 1000:
            raise ValueError(
                f"step_seconds={step_seconds} gives {num_steps} steps for {count} messages, nearly all "
                "empty; choose a larger step_seconds"
            )
        step_time = origin + step_seconds * np.arange(1, num_steps + 1)
        description = f"{name} step_seconds={step_seconds:g}"
    else:
        step_of = np.arange(count, dtype=np.int64) // step_events
        num_steps = int(step_of[-1]) + 1
        description = f"{name} step_events={step_events}"
    # Last message at or before the end of each step (an empty bucket gets the previous step's).
    last_message = np.searchsorted(step_of, np.arange(num_steps), side="right") - 1
    if step_seconds is None:
        step_time = time[last_message]

    ask_price, ask_size, bid_price, bid_size = _fill_book(book, tick_units)
    start_row = np.concatenate([[0], last_message[:-1]])
    doubled_mid = ask_price[start_row, 0] + bid_price[start_row, 0]
    flow_ref_tick = np.floor_divide(doubled_mid, 2 * tick_units)

    kind, size = messages["type"], messages["size"]
    price, direction = messages["price"], messages["direction"]
    is_bid = direction == 1
    # Grid tick of each message price, rounded towards the inside of the book (see module docstring).
    tick = np.where(is_bid, -np.floor_divide(-price, tick_units), np.floor_divide(price, tick_units))
    column = np.clip(tick - flow_ref_tick[step_of] + _HALF, 0, FLOW_WIDTH - 1)
    cell = step_of * FLOW_WIDTH + column
    executed = np.isin(kind, (4, 5))
    cancelled = np.isin(kind, (2, 3))

    def grid(mask: np.ndarray) -> torch.Tensor:
        volume = np.bincount(cell[mask], weights=size[mask], minlength=num_steps * FLOW_WIDTH)
        return torch.from_numpy(volume.reshape(num_steps, FLOW_WIDTH).astype(np.float32))

    touches_halt, halted_after = _halt_state(messages)
    messages_per_step = np.bincount(step_of, minlength=num_steps)
    halted = (np.bincount(step_of, weights=touches_halt, minlength=num_steps) > 0) | (
        (messages_per_step == 0) & halted_after[last_message]
    )
    unit = float(PRICE_SCALE)
    return MarketData(
        bid_price=torch.from_numpy(bid_price[last_message] / unit),
        bid_size=torch.from_numpy(bid_size[last_message].astype(np.float32)),
        ask_price=torch.from_numpy(ask_price[last_message] / unit),
        ask_size=torch.from_numpy(ask_size[last_message].astype(np.float32)),
        flow_ref_tick=torch.from_numpy(flow_ref_tick.astype(np.int64)),
        exec_bid=grid(executed & is_bid),
        exec_ask=grid(executed & ~is_bid),
        cancel_bid=grid(cancelled & is_bid),
        cancel_ask=grid(cancelled & ~is_bid),
        time=torch.from_numpy(np.ascontiguousarray(step_time, dtype=np.float64)),
        halted=torch.from_numpy(halted),
        tick_size=tick_units / unit,
        name=description,
    )
