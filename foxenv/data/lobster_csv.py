"""LOBSTER CSV cells: read a message or orderbook file as numbers and validate its fields.

Each failure is a ``ValueError`` naming the file, the line, the field and the value as written (the
checks are listed in :mod:`foxenv.data.lobster`).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

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
#: Largest magnitude of an integer field: cells are read as float64, which is exact up to here.
MAX_EXACT_INTEGER = 2**53
#: Latest time of a message: LOBSTER times are seconds after midnight of the file's day.
SECONDS_PER_DAY = 86_400.0


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
