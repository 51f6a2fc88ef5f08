"""LOBSTER prices: the price band around the book's mid and the tick every visible price sits on."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from foxenv.data.lobster_csv import (
    DUMMY_PRICE,
    MESSAGE_COLUMNS,
    PRICE_SCALE,
    _first_book_cell,
    _first_line,
    _Source,
)

#: Event types whose price is a visible order's, so it must sit on the tick (hidden ones may not).
VISIBLE_EVENT_TYPES = (1, 2, 3, 4)
#: Rows of the centred rolling median that gives each row its reference mid (robust to one bad row).
MID_WINDOW_ROWS = 101
#: Share of visible price occurrences that must sit on an inferred tick.
TICK_MAJORITY = 0.9


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
