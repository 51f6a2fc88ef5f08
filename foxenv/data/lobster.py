"""LOBSTER replay: parse a message + orderbook file pair, validate it, and aggregate it into steps.

Format (LOBSTER_SampleFiles_ReadMe.txt): no header; the message file is ``N x 6`` (time, type,
order_id, size, price, direction); the orderbook file is ``N x 4L`` (ask_price, ask_size, bid_price,
bid_size per level); prices in 1e-4 currency units; empty levels carry ``+-9999999999`` with size 0;
row ``k`` of the book is the state after message ``k``.

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

import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from foxenv.data.cache import cache_key, cache_path, load_market_file, save_market
from foxenv.data.market import FLOW_WIDTH, MarketData

#: LOBSTER price units per unit of currency (prices are in 1e-4 currency units).
PRICE_SCALE = 10_000
#: Price of an empty ask level (bids carry its negative).
DUMMY_PRICE = 9_999_999_999
#: Message columns, in file order.
MESSAGE_COLUMNS = ("time", "type", "order_id", "size", "price", "direction")
#: Event types LOBSTER defines.
KNOWN_EVENT_TYPES = (1, 2, 3, 4, 5, 6, 7)
#: Messages per step when neither ``step_events`` nor ``step_seconds`` is given.
DEFAULT_STEP_EVENTS = 100

#: Time bucketing may make at most this many steps per message (beyond a floor of 1000 steps).
MAX_EMPTY_STEPS_PER_MESSAGE = 10

_HALF = FLOW_WIDTH // 2


def find_lobster_files(folder: str | os.PathLike) -> tuple[Path, Path]:
    """The single ``*_message_*.csv`` file in ``folder`` and its matching ``*_orderbook_*.csv``.

    :param folder: a folder holding exactly one LOBSTER pair.
    :return: ``(message_path, orderbook_path)``.
    :raises ValueError: when the folder is missing, holds no message file, several, or no matching book.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"source={str(folder)!r} is not a folder")
    messages = sorted(folder.glob("*_message_*.csv"))
    if not messages:
        raise ValueError(f"source={str(folder)!r} holds no *_message_*.csv file")
    if len(messages) > 1:
        names = [path.name for path in messages]
        raise ValueError(f"source={str(folder)!r} is ambiguous: several message files {names}")
    message_path = messages[0]
    orderbook_path = message_path.with_name(message_path.name.replace("_message_", "_orderbook_", 1))
    if not orderbook_path.is_file():
        raise ValueError(
            f"source={str(folder)!r}: no orderbook file {orderbook_path.name} for {message_path.name}"
        )
    return message_path, orderbook_path


def load_lobster(
    message_path: str | os.PathLike,
    orderbook_path: str | os.PathLike,
    *,
    levels: int | None = None,
    step_events: int | None = None,
    step_seconds: float | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> MarketData:
    """Load a LOBSTER pair as a :class:`MarketData` on CPU, from the cache when it holds it.

    :param message_path: the ``*_message_*.csv`` file.
    :param orderbook_path: the matching ``*_orderbook_*.csv`` file.
    :param levels: book levels to keep (the first ``levels``); None keeps all levels of the file.
    :param step_events: messages per step (default 100 when ``step_seconds`` is not given).
    :param step_seconds: seconds per step (fixed time buckets); excludes ``step_events``.
    :param cache_dir: cache folder; default ``$FOXHUNT_CACHE_DIR`` or ``~/.cache/foxhunt/lobster``.
    :return: the aggregated timeline, on CPU.
    :raises ValueError: on bad parameters or a malformed file (naming the field, the line and the value).
    """
    step_events, step_seconds = _check_step_params(step_events, step_seconds)
    if levels is not None and (isinstance(levels, bool) or not isinstance(levels, int) or levels < 1):
        raise ValueError(f"levels={levels!r} must be a positive int or None")
    paths = [Path(message_path), Path(orderbook_path)]
    for field, path in zip(("message_path", "orderbook_path"), paths, strict=True):
        if not path.is_file():
            raise ValueError(f"{field}={str(path)!r} does not exist or is not a file")
    params = {"levels": levels, "step_events": step_events, "step_seconds": step_seconds}
    entry = cache_path(cache_dir, cache_key(paths, params))
    cached = load_market_file(entry)
    if cached is not None:
        return cached
    data = aggregate_lobster(*parse_lobster(paths[0], paths[1], levels=levels), step_events=step_events,
                             step_seconds=step_seconds, name=f"LOBSTER {paths[0].stem}")
    save_market(entry, data)
    return data


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


def _read_numeric(path: Path, label: str) -> np.ndarray:
    """Read a header-less numeric CSV into a float64 array, naming the first bad cell on failure.

    :param path: the CSV file.
    :param label: ``"message"`` or ``"orderbook"``, for error messages.
    :return: ``[N, C]`` float64.
    :raises ValueError: on an empty file, ragged rows, non-numeric or missing cells.
    """
    try:
        frame = pd.read_csv(path, header=None, engine="c", dtype=np.float64)
    except pd.errors.EmptyDataError as error:
        raise ValueError(f"{label} file {path.name} is empty") from error
    except pd.errors.ParserError as error:
        raise ValueError(f"{label} file {path.name}: rows of unequal length ({error})") from error
    except ValueError:
        # A non-numeric cell: parse as text to name it.
        text = pd.read_csv(path, header=None, engine="c", dtype=str, keep_default_na=False)
        numeric = text.apply(pd.to_numeric, errors="coerce")
        bad = numeric.isna().to_numpy() & (text.to_numpy() != "")
        row, column = np.argwhere(bad)[0]
        raise ValueError(
            f"{label} file line {row + 1}, column {column + 1}: "
            f"value={text.iat[row, column]!r} is not numeric"
        ) from None
    values = frame.to_numpy()
    missing = np.isnan(values)
    if missing.any():
        row, column = np.argwhere(missing)[0]
        raise ValueError(f"{label} file line {row + 1}, column {column + 1}: value is missing or NaN")
    return values


def _as_int(values: np.ndarray, label: str, names: list[str]) -> np.ndarray:
    """Convert float64 columns that must hold integers to int64.

    :param values: ``[N, C]`` float64.
    :param label: file label for error messages.
    :param names: a name per column.
    :return: ``[N, C]`` int64.
    :raises ValueError: on a fractional value.
    """
    fractional = values != np.round(values)
    if fractional.any():
        row, column = np.argwhere(fractional)[0]
        raise ValueError(
            f"{label} file line {row + 1}: {names[column]}={values[row, column]} must be an integer"
        )
    return values.astype(np.int64)


def _first_line(mask: np.ndarray) -> int:
    """Index of the first True row of a 1-D mask."""
    return int(np.flatnonzero(mask)[0])


def parse_lobster(
    message_path: str | os.PathLike, orderbook_path: str | os.PathLike, *, levels: int | None = None
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """Read and validate a LOBSTER pair.

    :param message_path: the message file.
    :param orderbook_path: the orderbook file.
    :param levels: levels to keep; None keeps all.
    :return: ``(messages, book, tick_units)``: messages as a dict of 1-D arrays (``time`` float64, the
        other columns int64), the book as ``[N, 4, L]`` int64 (ask price, ask size, bid price, bid size)
        in 1e-4 units, and the detected tick size in 1e-4 units.
    :raises ValueError: naming the field, the line and the value of the first problem found.
    """
    message_path, orderbook_path = Path(message_path), Path(orderbook_path)
    raw_messages = _read_numeric(message_path, "message")
    if raw_messages.shape[1] != len(MESSAGE_COLUMNS):
        raise ValueError(f"message file {message_path.name} has {raw_messages.shape[1]} columns, must be 6")
    raw_book = _read_numeric(orderbook_path, "orderbook")
    if raw_book.shape[1] % 4 != 0:
        raise ValueError(
            f"orderbook file {orderbook_path.name} has {raw_book.shape[1]} columns, must be a multiple of 4"
        )
    if raw_book.shape[0] != raw_messages.shape[0]:
        raise ValueError(
            f"row counts differ: message file has {raw_messages.shape[0]} rows, "
            f"orderbook file has {raw_book.shape[0]}"
        )
    file_levels = raw_book.shape[1] // 4
    if levels is not None and levels > file_levels:
        raise ValueError(f"levels={levels} exceeds the {file_levels} levels in {orderbook_path.name}")
    levels = file_levels if levels is None else levels

    messages = {"time": raw_messages[:, 0]}
    integer_columns = _as_int(raw_messages[:, 1:], "message", list(MESSAGE_COLUMNS[1:]))
    for index, name in enumerate(MESSAGE_COLUMNS[1:]):
        messages[name] = integer_columns[:, index]
    _validate_messages(messages)

    names = [f"{kind}_{level + 1}" for level in range(file_levels)
             for kind in ("ask_price", "ask_size", "bid_price", "bid_size")]
    book = _as_int(raw_book, "orderbook", names).reshape(-1, file_levels, 4).transpose(0, 2, 1)
    book = np.ascontiguousarray(book[:, :, :levels])
    _validate_book(book)
    tick_units = _detect_tick(book, messages)
    return messages, book, tick_units


def _validate_messages(messages: dict[str, np.ndarray]) -> None:
    """Check time order, event types, directions, prices and sizes of the messages.

    :param messages: parsed message columns.
    :raises ValueError: naming the field, the line and the value.
    """
    time, kind, size = messages["time"], messages["type"], messages["size"]
    price, direction = messages["price"], messages["direction"]
    backwards = np.diff(time) < 0
    if backwards.any():
        row = _first_line(backwards) + 1
        raise ValueError(
            f"message file line {row + 1}: time={time[row]} is before the previous {time[row - 1]}"
        )
    unknown = ~np.isin(kind, KNOWN_EVENT_TYPES)
    if unknown.any():
        row = _first_line(unknown)
        raise ValueError(f"message file line {row + 1}: type={kind[row]} is not a known event type (1-7)")
    bad_direction = (direction != 1) & (direction != -1)
    if bad_direction.any():
        row = _first_line(bad_direction)
        raise ValueError(f"message file line {row + 1}: direction={direction[row]} must be -1 or +1")
    is_halt = kind == 7
    bad_price = np.where(is_halt, ~np.isin(price, (-1, 0, 1)), price <= 0)
    if bad_price.any():
        row = _first_line(bad_price)
        rule = "must be -1, 0 or 1 for a halt message" if is_halt[row] else "must be > 0"
        raise ValueError(f"message file line {row + 1}: price={price[row]} {rule}")
    bad_size = np.where(is_halt, size < 0, size <= 0)
    if bad_size.any():
        row = _first_line(bad_size)
        raise ValueError(f"message file line {row + 1}: size={size[row]} must be > 0")


def _validate_book(book: np.ndarray) -> None:
    """Check the orderbook rows: dummy levels, positive prices and sizes, level order, no crossing.

    :param book: ``[N, 4, L]`` int64 (ask price, ask size, bid price, bid size).
    :raises ValueError: naming the field (1-based level), the line and the value.
    """
    ask_price, ask_size, bid_price, bid_size = book[:, 0], book[:, 1], book[:, 2], book[:, 3]
    for side, price, size, dummy in (("ask", ask_price, ask_size, DUMMY_PRICE),
                                     ("bid", bid_price, bid_size, -DUMMY_PRICE)):
        empty = price == dummy
        for name, bad, rule in (
            (f"{side}_price", empty[:, :-1] & ~empty[:, 1:], "is empty but a deeper level is occupied"),
            (f"{side}_price", ~empty & (price <= 0), "must be > 0"),
            (f"{side}_size", empty & (size != 0), "must be 0 on an empty level"),
            (f"{side}_size", ~empty & (size <= 0), "must be > 0 on an occupied level"),
        ):
            if bad.any():
                row, level = np.argwhere(bad)[0]
                value = (price if name.endswith("price") else size)[row, level]
                raise ValueError(f"orderbook file line {row + 1}: {name}_{level + 1}={value} {rule}")
        step = np.diff(price, axis=1) if side == "ask" else -np.diff(price, axis=1)
        unordered = ~empty[:, 1:] & (step <= 0)
        if unordered.any():
            row, level = np.argwhere(unordered)[0]
            raise ValueError(
                f"orderbook file line {row + 1}: {side}_price_{level + 2}={price[row, level + 1]} is not "
                f"strictly {'above' if side == 'ask' else 'below'} "
                f"{side}_price_{level + 1}={price[row, level]}"
            )
    both = (ask_price[:, 0] != DUMMY_PRICE) & (bid_price[:, 0] != -DUMMY_PRICE)
    crossed = both & (bid_price[:, 0] >= ask_price[:, 0])
    if crossed.any():
        row = _first_line(crossed)
        raise ValueError(
            f"orderbook file line {row + 1}: crossed book, bid_price_1={bid_price[row, 0]} >= "
            f"ask_price_1={ask_price[row, 0]}"
        )


def _detect_tick(book: np.ndarray, messages: dict[str, np.ndarray]) -> int:
    """Tick size in 1e-4 units: the gcd of all visible prices (book levels, messages of types 1-4).

    Hidden executions (type 5) and cross trades (type 6) may print between ticks, so they are left out.

    :param book: ``[N, 4, L]`` validated book.
    :param messages: validated messages.
    :return: the tick in 1e-4 units.
    :raises ValueError: when the file holds no visible price at all.
    """
    prices = np.concatenate([
        book[:, 0][book[:, 0] != DUMMY_PRICE],
        book[:, 2][book[:, 2] != -DUMMY_PRICE],
        messages["price"][np.isin(messages["type"], (1, 2, 3, 4))],
    ])
    if prices.size == 0:
        raise ValueError("orderbook: no occupied level and no visible order price, cannot detect tick_size")
    return int(np.gcd.reduce(np.unique(prices)))


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
