"""LOBSTER replay: parse a message + orderbook file pair, validate it, and aggregate it into steps.

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

import datetime
import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from foxenv.data.cache import cached_market
from foxenv.data.market import FLOW_WIDTH, MarketData

#: LOBSTER price units per unit of currency (prices are in 1e-4 currency units).
PRICE_SCALE = 10_000
#: Price of an empty ask level (bids carry its negative).
DUMMY_PRICE = 9_999_999_999
#: Message columns, in file order.
MESSAGE_COLUMNS = ("time", "type", "order_id", "size", "price", "direction")
#: Orderbook columns of one level, in file order.
BOOK_COLUMNS = ("ask_price", "ask_size", "bid_price", "bid_size")
#: Event types LOBSTER defines.
KNOWN_EVENT_TYPES = (1, 2, 3, 4, 5, 6, 7)
#: Event types whose price is a visible order's, so it must sit on the tick (hidden ones may not).
VISIBLE_EVENT_TYPES = (1, 2, 3, 4)
#: Messages per step when neither ``step_events`` nor ``step_seconds`` is given.
DEFAULT_STEP_EVENTS = 100

#: Time bucketing may make at most this many steps per message (beyond a floor of 1000 steps).
MAX_EMPTY_STEPS_PER_MESSAGE = 10

#: Largest magnitude of an integer field: cells are read as float64, which is exact up to here.
MAX_EXACT_INTEGER = 2**53
#: Latest time of a message: LOBSTER times are seconds after midnight of the file's day.
SECONDS_PER_DAY = 86_400.0
#: Default ``price_band``: 20 % of the mid, far beyond a listed stock's intraday book (GOOG: 1.7 %).
DEFAULT_PRICE_BAND = 0.2
#: Rows of the centred rolling median that gives each row its reference mid (robust to one bad row).
MID_WINDOW_ROWS = 101
#: Share of visible price occurrences that must sit on an inferred tick.
TICK_MAJORITY = 0.9

_HALF = FLOW_WIDTH // 2


#: A LOBSTER file name: ``TICKER_YYYY-MM-DD_START_END_message_LEVELS.csv`` (and ``_orderbook_``).
LOBSTER_NAME = re.compile(r"^(?P<ticker>.+?)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<start>\d+)_(?P<end>\d+)_message_"
                          r"(?P<levels>\d+)\.csv$")


@dataclass(frozen=True)
class LobsterDay:
    """One day of one ticker in a LOBSTER folder: its message / orderbook pair."""

    ticker: str
    date: datetime.date
    message_path: Path
    orderbook_path: Path


def find_lobster_days(folder: str | os.PathLike) -> list[LobsterDay]:
    """Every message / orderbook pair of ``folder`` (one per day and ticker), sorted by date, then ticker.

    :param folder: a folder of LOBSTER files named as LOBSTER names them (``TICKER_DATE_..._message_L.csv``).
    :return: the days, oldest first.
    :raises ValueError: when the folder is missing, holds no message file, a name without a date, or a
        message file without its orderbook file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"source={str(folder)!r} is not a folder")
    days = []
    for message_path in sorted(folder.glob("*_message_*.csv")):
        match = LOBSTER_NAME.match(message_path.name)
        if match is None:
            raise ValueError(f"{message_path}: the name is not "
                             "TICKER_YYYY-MM-DD_START_END_message_LEVELS.csv")
        orderbook_path = message_path.with_name(message_path.name.replace("_message_", "_orderbook_", 1))
        if not orderbook_path.is_file():
            raise ValueError(f"source={str(folder)!r}: no orderbook file {orderbook_path.name} for "
                             f"{message_path.name}")
        try:
            date = datetime.date.fromisoformat(match["date"])
        except ValueError:
            raise ValueError(f"{message_path}: date {match['date']!r} is not a calendar date") from None
        days.append(LobsterDay(match["ticker"], date, message_path, orderbook_path))
    if not days:
        raise ValueError(f"source={str(folder)!r} holds no *_message_*.csv file")
    return sorted(days, key=lambda day: (day.date, day.ticker))


def walk_forward(num_days: int, min_fit_days: int = 1, max_fit_days: int | None = None) -> list[
        tuple[list[int], int]]:
    """Walk-forward folds over ``num_days`` days in date order: fit on days ``..k-1``, test on day ``k``.

    :param num_days: days in the folder (:func:`find_lobster_days`).
    :param min_fit_days: days of the first fold's fit part (>= 1).
    :param max_fit_days: a rolling window of at most this many fit days (None: expanding, all before ``k``).
    :return: ``[(fit day indices, test day index), ...]``, one fold per test day.
    :raises ValueError: when there are too few days for one fold.
    """
    if isinstance(min_fit_days, bool) or not isinstance(min_fit_days, int) or min_fit_days < 1:
        raise ValueError(f"min_fit_days={min_fit_days!r} must be an int >= 1")
    if max_fit_days is not None and (not isinstance(max_fit_days, int) or max_fit_days < min_fit_days):
        raise ValueError(f"max_fit_days={max_fit_days!r} must be None or an int >= "
                         f"min_fit_days={min_fit_days}")
    if num_days <= min_fit_days:
        raise ValueError(f"{num_days} day(s) leave no test day after min_fit_days={min_fit_days}")
    folds = []
    for test in range(min_fit_days, num_days):
        first = 0 if max_fit_days is None else max(0, test - max_fit_days)
        folds.append((list(range(first, test)), test))
    return folds


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
        raise ValueError(f"source={str(folder)!r} is ambiguous: several message files {names}; pick days= "
                         "(load_market(folder, days=[...]), walk_forward for folds)")
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


def _column_name(label: str, column: int) -> str:
    """Name of a column of a message or orderbook file, e.g. ``price`` or ``ask_size_3``.

    :param label: ``"message"`` or ``"orderbook"``.
    :param column: 0-based column index.
    :return: the field name.
    """
    if label == "orderbook":
        return f"{BOOK_COLUMNS[column % 4]}_{column // 4 + 1}"
    return MESSAGE_COLUMNS[column] if column < len(MESSAGE_COLUMNS) else f"column_{column + 1}"


class _Source:
    """One input file, able to quote any of its cells as written, for error messages.

    :param path: the CSV file.
    :param label: ``"message"`` or ``"orderbook"``.
    """

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label

    def text(self, row: int, column: int) -> str:
        """The cell as written in the file (read again: only error paths call this).

        :param row: 0-based row.
        :param column: 0-based column.
        :return: the cell's text, stripped of surrounding blanks.
        """
        with open(self.path, newline="") as handle:
            line = next(itertools.islice(handle, row, None), "")
        cells = line.rstrip("\r\n").split(",")
        return cells[column].strip() if column < len(cells) else ""

    def cell(self, row: int, column: int) -> str:
        """``field=value`` of a cell, the value as written.

        :param row: 0-based row.
        :param column: 0-based column.
        :return: e.g. ``price=9999999999``.
        """
        return f"{_column_name(self.label, column)}={self.text(row, column)}"

    def error(self, row: int, column: int, rule: str) -> ValueError:
        """A ValueError naming the file, the line, the field and the value as written.

        :param row: 0-based row.
        :param column: 0-based column.
        :param rule: what is wrong, e.g. ``must be > 0``.
        :return: the error (to raise).
        """
        return ValueError(f"{self.where(row)}: {self.cell(row, column)} {rule}")

    def where(self, row: int) -> str:
        """``<label> file <name> line <row + 1>``."""
        return f"{self.label} file {self.path.name} line {row + 1}"


def _undecodable(path: Path) -> tuple[int, int, int]:
    """``(line, character, byte)`` of the first byte of ``path`` that is not UTF-8 (0-based line)."""
    with path.open("rb") as handle:
        for row, line in enumerate(handle):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return row, error.start, line[error.start]
    return 0, 0, 0


def _read_numeric(source: _Source) -> np.ndarray:
    """Read a header-less numeric CSV into a float64 array, naming the first bad cell on failure.

    :param source: the file.
    :return: ``[N, C]`` float64, every value finite.
    :raises ValueError: on an unreadable or empty file, ragged rows, non-numeric, missing or infinite cells.
    """
    path, label = source.path, source.label
    try:
        frame = pd.read_csv(path, header=None, engine="c", dtype=np.float64)
    except OSError as error:
        raise ValueError(f"{label} file {str(path)!r} cannot be read: {error.strerror or error}") from error
    except pd.errors.EmptyDataError as error:
        raise ValueError(f"{label} file {path.name} is empty") from error
    except pd.errors.ParserError as error:
        raise ValueError(f"{label} file {path.name}: rows of unequal length ({error})") from error
    except UnicodeDecodeError:
        row, column, byte = _undecodable(path)
        raise ValueError(f"{source.where(row)}, character {column + 1}: byte 0x{byte:02x} is not UTF-8 text "
                         "(a LOBSTER file holds ASCII numbers)") from None
    except ValueError:
        # A non-numeric cell: parse as text to name it.
        text = pd.read_csv(path, header=None, engine="c", dtype=str, keep_default_na=False)
        numeric = text.apply(pd.to_numeric, errors="coerce")
        bad = numeric.isna().to_numpy() & (text.to_numpy() != "")
        row, column = np.argwhere(bad)[0]
        raise ValueError(
            f"{source.where(row)}, column {column + 1} ({_column_name(label, column)}): "
            f"value={text.iat[row, column]!r} is not numeric"
        ) from None
    values = frame.to_numpy()
    for bad, rule in ((np.isnan(values), "is missing or NaN"), (np.isinf(values), "is not finite")):
        if bad.any():
            row, column = np.argwhere(bad)[0]
            raise ValueError(
                f"{source.where(row)}, column {column + 1} ({_column_name(label, column)}): "
                f"value={source.text(row, column)!r} {rule}"
            )
    return values


def _as_int(values: np.ndarray, source: _Source, first_column: int = 0) -> np.ndarray:
    """Convert float64 columns that must hold integers to int64.

    :param values: ``[N, C]`` float64, finite.
    :param source: the file, for error messages.
    :param first_column: file column of ``values[:, 0]``.
    :return: ``[N, C]`` int64.
    :raises ValueError: on a value beyond ``+-2**53`` or a fractional value, quoting it as written.
    """
    too_large = np.abs(values) > MAX_EXACT_INTEGER
    if too_large.any():
        row, column = np.argwhere(too_large)[0]
        raise source.error(row, column + first_column, "is out of range: integers must lie within +-2**53")
    fractional = values != np.round(values)
    if fractional.any():
        row, column = np.argwhere(fractional)[0]
        raise source.error(row, column + first_column, "must be an integer")
    return values.astype(np.int64)


def _first_line(mask: np.ndarray) -> int:
    """Index of the first True row of a 1-D mask."""
    return int(np.flatnonzero(mask)[0])


def _first_book_cell(mask: np.ndarray) -> tuple[int, int] | None:
    """First True cell of a ``[N, 4, L]`` book mask in file order, as ``(row, file column)``.

    :param mask: ``[N, 4, L]`` bool, axis 1 in :data:`BOOK_COLUMNS` order.
    :return: 0-based row and column of the first True cell, or None when there is none.
    """
    flat = mask.transpose(0, 2, 1).reshape(mask.shape[0], -1)
    if not flat.any():
        return None
    row, column = np.argwhere(flat)[0]
    return int(row), int(column)


def _book_column(kind: int, level: np.ndarray | int) -> np.ndarray | int:
    """File column of book field ``kind`` (index in :data:`BOOK_COLUMNS`) at 0-based ``level``."""
    return level * 4 + kind


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


def _validate_time(time: np.ndarray, source: _Source) -> None:
    """Check that message times lie within the day and never go back.

    :param time: ``[N]`` float64 seconds after midnight, finite.
    :param source: the message file.
    :raises ValueError: naming the line and the time as written.
    """
    outside = (time < 0) | (time > SECONDS_PER_DAY)
    if outside.any():
        row = _first_line(outside)
        raise source.error(row, 0, f"must lie within the day: 0 <= time <= {SECONDS_PER_DAY:.0f} "
                                   "(seconds after midnight)")
    backwards = np.diff(time) < 0
    if backwards.any():
        row = _first_line(backwards) + 1
        raise source.error(row, 0, f"is before the previous {source.text(row - 1, 0)}")


def _validate_messages(messages: dict[str, np.ndarray], source: _Source) -> None:
    """Check event types, directions, prices (dummy included) and sizes of the messages.

    :param messages: parsed message columns.
    :param source: the message file.
    :raises ValueError: naming the line, the field and the value as written.
    """
    kind, size = messages["type"], messages["size"]
    price, direction = messages["price"], messages["direction"]
    column = {name: index for index, name in enumerate(MESSAGE_COLUMNS)}
    unknown = ~np.isin(kind, KNOWN_EVENT_TYPES)
    if unknown.any():
        raise source.error(_first_line(unknown), column["type"], "is not a known event type (1-7)")
    bad_direction = (direction != 1) & (direction != -1)
    if bad_direction.any():
        raise source.error(_first_line(bad_direction), column["direction"], "must be -1 or +1")
    for name, values in (("price", price), ("size", size)):
        dummy = np.abs(values) == DUMMY_PRICE
        if dummy.any():
            raise source.error(_first_line(dummy), column[name],
                               "is LOBSTER's dummy price, allowed only on empty levels of the orderbook file")
    is_halt = kind == 7
    bad_price = np.where(is_halt, ~np.isin(price, (-1, 0, 1)), price <= 0)
    if bad_price.any():
        row = _first_line(bad_price)
        rule = "must be -1, 0 or 1 for a halt message" if is_halt[row] else "must be > 0"
        raise source.error(row, column["price"], rule)
    bad_size = np.where(is_halt, size < 0, size <= 0)
    if bad_size.any():
        raise source.error(_first_line(bad_size), column["size"], "must be > 0")


def _validate_book(book: np.ndarray, source: _Source) -> None:
    """Check the orderbook rows: dummy levels, positive prices and sizes, level order, no crossing.

    :param book: ``[N, 4, L]`` int64 (ask price, ask size, bid price, bid size), all levels of the file.
    :param source: the orderbook file.
    :raises ValueError: naming the line, the field (1-based level) and the value as written.
    """
    ask_price, bid_price = book[:, 0], book[:, 2]
    other = {"ask": "bid", "bid": "ask"}
    dummy_size = np.zeros(book.shape, dtype=bool)
    dummy_size[:, (1, 3)] = np.abs(book[:, (1, 3)]) == DUMMY_PRICE
    cell = _first_book_cell(dummy_size)
    if cell is not None:
        raise source.error(*cell, "is LOBSTER's dummy price, allowed only as the price of an empty level")
    for kind, side, dummy in ((0, "ask", DUMMY_PRICE), (2, "bid", -DUMMY_PRICE)):
        price, size = book[:, kind], book[:, kind + 1]
        wrong_dummy = price == -dummy
        if wrong_dummy.any():
            row, level = np.argwhere(wrong_dummy)[0]
            raise source.error(row, _book_column(kind, level),
                               f"is the {other[side]} side's dummy price; an empty {side} level carries "
                               f"{dummy}")
        empty = price == dummy
        for offset, bad, rule in (
            (0, empty[:, :-1] & ~empty[:, 1:], "is empty but a deeper level is occupied"),
            (0, ~empty & (price <= 0), "must be > 0"),
            (1, empty & (size != 0), "must be 0 on an empty level"),
            (1, ~empty & (size <= 0), "must be > 0 on an occupied level"),
        ):
            if bad.any():
                row, level = np.argwhere(bad)[0]
                raise source.error(row, _book_column(kind + offset, level), rule)
        step = np.diff(price, axis=1) if side == "ask" else -np.diff(price, axis=1)
        unordered = ~empty[:, 1:] & (step <= 0)
        if unordered.any():
            row, level = np.argwhere(unordered)[0]
            deeper = source.cell(row, _book_column(kind, level + 1))
            raise ValueError(
                f"{source.where(row)}: {deeper} is not strictly {'above' if side == 'ask' else 'below'} "
                f"{source.cell(row, _book_column(kind, level))}"
            )
    both = (ask_price[:, 0] != DUMMY_PRICE) & (bid_price[:, 0] != -DUMMY_PRICE)
    crossed = both & (bid_price[:, 0] >= ask_price[:, 0])
    if crossed.any():
        row = _first_line(crossed)
        raise ValueError(
            f"{source.where(row)}: crossed book, {source.cell(row, 2)} >= {source.cell(row, 0)}"
        )


def _reference_mid(book: np.ndarray) -> np.ndarray:
    """Mid of the book around each row: a centred rolling median of the rows' mids.

    A row's mid is ``(best ask + best bid) / 2``, or its one occupied best price; rows with no occupied
    level take the nearest row's reference.

    :param book: ``[N, 4, L]`` validated book.
    :return: ``[N]`` float64 in 1e-4 units; NaN everywhere when no row has an occupied level.
    """
    best_ask, best_bid = book[:, 0, 0].astype(np.float64), book[:, 2, 0].astype(np.float64)
    has_ask, has_bid = book[:, 0, 0] != DUMMY_PRICE, book[:, 2, 0] != -DUMMY_PRICE
    mid = np.where(has_ask & has_bid, 0.5 * (best_ask + best_bid),
                   np.where(has_ask, best_ask, np.where(has_bid, best_bid, np.nan)))
    rolling = pd.Series(mid).rolling(MID_WINDOW_ROWS, center=True, min_periods=1).median()
    return rolling.ffill().bfill().to_numpy()


def _check_price_band_of(
    book: np.ndarray,
    messages: dict[str, np.ndarray],
    price_band: float,
    book_source: _Source,
    message_source: _Source,
) -> None:
    """Check that every book and message price lies within ``price_band`` of the mid around it.

    :param book: ``[N, 4, L]`` validated book.
    :param messages: validated messages; type 7 (halt markers) carry no price and are skipped.
    :param price_band: fraction of the mid.
    :param book_source: the orderbook file.
    :param message_source: the message file.
    :raises ValueError: for the earliest line holding a price outside the band (the message on a tie).
    """
    reference = _reference_mid(book)
    limit = price_band * reference
    bad_book = np.zeros(book.shape, dtype=bool)
    for kind, dummy in ((0, DUMMY_PRICE), (2, -DUMMY_PRICE)):
        far = np.abs(book[:, kind] - reference[:, None]) > limit[:, None]
        bad_book[:, kind] = (book[:, kind] != dummy) & far
    price = messages["price"]
    bad_message = (messages["type"] != 7) & (np.abs(price - reference) > limit)
    book_cell = _first_book_cell(bad_book)
    message_row = _first_line(bad_message) if bad_message.any() else None
    if book_cell is None and message_row is None:
        return
    if message_row is not None and (book_cell is None or message_row <= book_cell[0]):
        source, row, column = message_source, message_row, MESSAGE_COLUMNS.index("price")
        value = price[row]
    else:
        source, (row, column) = book_source, book_cell
        value = book[row, column % 4, column // 4]
    distance = abs(value - reference[row]) / reference[row]
    raise source.error(
        row, column,
        f"lies {100 * distance:.1f} % from the mid of the book around it ({reference[row]:.1f}); "
        f"price_band={price_band:g} allows {100 * price_band:g} %",
    )


def _divisors(value: int) -> np.ndarray:
    """All positive divisors of ``value`` (> 0), ascending.

    :param value: a positive integer up to about 1e12.
    :return: int64 divisors.
    """
    small = np.arange(1, math.isqrt(value) + 1, dtype=np.int64)
    small = small[value % small == 0]
    return np.unique(np.concatenate([small, value // small]))


def infer_tick(prices: np.ndarray) -> tuple[int, float]:
    """The largest tick on which at least :data:`TICK_MAJORITY` of ``prices`` sit.

    Candidates are the divisors of the most frequent price, so a few off-tick prices cannot shrink the
    tick (as a plain gcd would); the caller reports them.

    :param prices: 1-D positive int64 visible prices (repeats count).
    :return: ``(tick, share)``: the tick in the prices' units and the share of ``prices`` on it.
    """
    values, counts = np.unique(prices, return_counts=True)
    total = float(counts.sum())
    for tick in _divisors(int(values[np.argmax(counts)]))[::-1]:
        share = float(counts[values % tick == 0].sum()) / total
        if share >= TICK_MAJORITY:
            return int(tick), share
    return 1, 1.0  # never reached: every price is a multiple of 1


def _check_tick(
    book: np.ndarray,
    messages: dict[str, np.ndarray],
    given: int | None,
    book_source: _Source,
    message_source: _Source,
) -> int:
    """The tick in 1e-4 units (``given``, else inferred), checked against every visible price.

    Visible prices are the occupied book levels and the prices of messages of types 1-4; hidden (5) and
    cross (6) executions may print between ticks.

    :param book: ``[N, 4, L]`` validated book.
    :param messages: validated messages.
    :param given: the tick the caller set, in 1e-4 units, or None to infer it.
    :param book_source: the orderbook file.
    :param message_source: the message file.
    :return: the tick in 1e-4 units.
    :raises ValueError: when there is no visible price, or for the earliest line with a price off the tick.
    """
    occupied = np.zeros(book.shape, dtype=bool)
    occupied[:, 0] = book[:, 0] != DUMMY_PRICE
    occupied[:, 2] = book[:, 2] != -DUMMY_PRICE
    visible = np.isin(messages["type"], VISIBLE_EVENT_TYPES)
    price = messages["price"]
    if given is None:
        prices = np.concatenate([book[occupied], price[visible]])
        if prices.size == 0:
            raise ValueError(
                "orderbook: no occupied level and no visible order price, cannot detect tick_size"
            )
        tick, share = infer_tick(prices)
        rule = (f"is not a multiple of the tick {tick} on which {100 * share:.1f} % of the visible prices "
                f"sit (tick_size={tick / PRICE_SCALE:g}); pass tick_size= if the tick really is finer")
    else:
        tick = given
        rule = f"is not a multiple of tick_size={tick / PRICE_SCALE:g} ({tick} in the file's 1e-4 units)"
    book_cell = _first_book_cell(occupied & (book % tick != 0))
    off_message = visible & (price % tick != 0)
    message_row = _first_line(off_message) if off_message.any() else None
    if message_row is not None and (book_cell is None or message_row <= book_cell[0]):
        raise message_source.error(message_row, MESSAGE_COLUMNS.index("price"), rule)
    if book_cell is not None:
        raise book_source.error(*book_cell, rule)
    return tick


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
