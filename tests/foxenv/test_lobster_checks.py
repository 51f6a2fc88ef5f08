"""LOBSTER data sanity: prices against the book around them, the dummy price, the tick, integer range and
timestamps; each bad input is a ValueError naming the file, the line, the field and the value as written."""

from __future__ import annotations

import hashlib
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

import foxenv.data.lobster as lobster_module
from foxenv.data import DEFAULT_PRICE_BAND, find_lobster_files, load_lobster, load_market
from foxenv.data.lobster import infer_tick
from tests.foxenv.test_lobster import (
    BASE_BOOK,
    DUMMY,
    bad_books,
    bad_messages,
    book_row,
    scenario,
    write_pair,
)

MESSAGE_FILE = "message file TEST_2012-01-01_0_1_message_2.csv"
BOOK_FILE = "orderbook file TEST_2012-01-01_0_1_orderbook_2.csv"


def load(tmp_path, messages, books, **kwargs):
    """Write a pair under ``tmp_path`` and load it with a private cache."""
    paths = write_pair(tmp_path / "data", messages, books)
    return load_lobster(*paths, cache_dir=tmp_path / "cache", **kwargs)


def long_file(rows: int = 300) -> tuple[list[list], list[list]]:
    """``rows`` add orders at the best bid over the base book: a file where one row is a small share."""
    messages = [[1.0 + 0.01 * k, 1, k + 1, 10, 100000, 1] for k in range(rows)]
    return messages, [list(BASE_BOOK) for _ in range(rows)]


# ----------------------------------------------------------------------------------------------
# The dummy price outside empty book levels, and prices outside the band around the mid.


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ((2, 4, DUMMY), rf"{MESSAGE_FILE} line 3: price=9999999999 is LOBSTER's dummy price, allowed only on "
                        "empty levels of the orderbook file"),
        ((2, 4, -DUMMY), r"line 3: price=-9999999999 is LOBSTER's dummy price"),
        ((2, 4, "9999999999.0"), r"line 3: price=9999999999.0 is LOBSTER's dummy price"),
        ((1, 3, DUMMY), r"line 2: size=9999999999 is LOBSTER's dummy price"),
        ((2, 4, 200000), rf"{MESSAGE_FILE} line 3: price=200000 lies 99.4 % from the mid of the book around "
                         r"it \(100300.0\); price_band=0.2 allows 20 %"),
        ((2, 4, "2.0e5"), r"line 3: price=2.0e5 lies 99.4 % from the mid"),
        ((0, 4, 5000), r"line 1: price=5000 lies 95.0 % from the mid of the book around it \(100300.0\)"),
        ((4, 4, 300000), r"line 5: price=300000 lies"),  # hidden executions are checked too
    ],
)
def test_bad_message_prices_raise(tmp_path, change, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        load(tmp_path, bad_messages(change), scenario()[1])


@pytest.mark.parametrize(
    ("cell", "pattern"),
    [
        ((0, 4, 150000), rf"{BOOK_FILE} line 1: ask_price_2=150000 lies 49.6 % from the mid of the book "
                         r"around it \(100300.0\); price_band=0.2 allows 20 %"),
        ((3, 6, 1000), r"line 4: bid_price_2=1000 lies 99.0 % from the mid"),
        ((2, 4, -DUMMY), rf"{BOOK_FILE} line 3: ask_price_2=-9999999999 is the bid side's dummy price; an "
                         "empty ask level carries 9999999999"),
        ((0, 6, DUMMY), r"line 1: bid_price_2=9999999999 is the ask side's dummy price; an empty bid level "
                        "carries -9999999999"),
        ((1, 3, DUMMY), r"line 2: bid_size_1=9999999999 is LOBSTER's dummy price, allowed only as the price "
                        "of an empty level"),
        ((2, 5, -DUMMY), r"line 3: ask_size_2=-9999999999 is LOBSTER's dummy price"),
    ],
)
def test_bad_book_prices_raise(tmp_path, cell, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        load(tmp_path, scenario()[0], bad_books(*cell))


def test_one_dummy_price_in_a_long_file_is_an_error_not_a_new_tick(tmp_path) -> None:
    messages, books = long_file()
    messages[150][4] = DUMMY
    with pytest.raises(ValueError, match=r"line 151: price=9999999999 is LOBSTER's dummy price"):
        load(tmp_path, messages, books)
    messages[150][4] = 990000  # ten times the book: a shifted digit
    with pytest.raises(ValueError, match=r"line 151: price=990000 lies 887.5 % from the mid"):
        load(tmp_path, messages, books)


def test_price_band_is_configurable(tmp_path) -> None:
    messages = bad_messages((2, 4, 130000))  # a delete 29.6 % above the mid
    with pytest.raises(ValueError, match="price=130000 lies 29.6 % from the mid"):
        load(tmp_path, messages, scenario()[1])
    wide = load(tmp_path, messages, scenario()[1], price_band=0.5, step_events=2)
    unchecked = load(tmp_path, messages, scenario()[1], price_band=None, step_events=2)
    assert torch.equal(wide.cancel_ask, unchecked.cancel_ask) and wide.tick_size == pytest.approx(0.01)
    with pytest.raises(ValueError, match="price_band=0.001 allows 0.1 %"):
        load(tmp_path, *scenario(), price_band=0.001)  # 10.00 lies 0.25 % below the mid 10.025
    assert DEFAULT_PRICE_BAND == 0.2


def test_band_follows_the_book_around_each_row(tmp_path) -> None:
    # The market rises 15 % between rows 2 and 3: each price is near the book around it.
    high = book_row((115500, 100), (115600, 200), (115000, 300), (114900, 400))
    books = [BASE_BOOK] * 3 + [high] * 3
    messages = [[1.0 + 0.1 * k, 1, k + 1, 10, 100000 if k < 3 else 115000, 1] for k in range(6)]
    data = load(tmp_path, messages, books, step_events=1).validate()
    assert data.bid_price[:, 0].tolist() == pytest.approx([10.0] * 3 + [11.5] * 3)
    # One bad row cannot move the reference: its own mid is far, the median of its neighbours is not.
    books[4] = book_row((200500, 100), (200600, 200), (200000, 300), (199900, 400))
    with pytest.raises(ValueError, match=rf"{BOOK_FILE} line 5: ask_price_1=200500 lies 86.1 % from the mid"):
        load(tmp_path, messages, books)


@pytest.mark.parametrize("band", [0, -0.1, float("nan"), float("inf"), "0.2", True])
def test_bad_price_band_raises(tmp_path, band) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    with pytest.raises(ValueError, match=r"price_band=.* must be a finite number > 0"):
        load_lobster(*paths, price_band=band, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"price_band=.* must be a finite number > 0"):
        load_market(paths, price_band=band, cache_dir=tmp_path / "cache")


# ----------------------------------------------------------------------------------------------
# The tick: inferred robustly, settable, checked.


def test_infer_tick_ignores_a_few_off_tick_prices() -> None:
    prices = np.array([100000, 100100, 100200, 99900, 100500] * 20, dtype=np.int64)
    assert infer_tick(prices) == (100, 1.0)
    tick, share = infer_tick(np.concatenate([prices, [100001]]))
    assert tick == 100 and share == pytest.approx(100 / 101)
    rng = np.random.default_rng(0)
    assert infer_tick(rng.integers(5_000, 9_000, size=1000))[0] == 1  # a sub-penny market
    assert infer_tick(np.array([100500, 100000] * 5, dtype=np.int64)) == (500, 1.0)  # as the gcd would


@pytest.mark.parametrize(
    ("messages", "books", "pattern"),
    [
        (bad_messages((3, 4, 99901)), scenario()[1],
         rf"{MESSAGE_FILE} line 4: price=99901 is not a multiple of the tick 100 on which 9\d.\d % of the "
         r"visible prices sit \(tick_size=0.01\); pass tick_size= if the tick really is finer"),
        (scenario()[0], bad_books(3, 6, 99850),
         rf"{BOOK_FILE} line 4: bid_price_2=99850 is not a multiple of the tick 100"),
    ],
)
def test_off_tick_visible_price_raises(tmp_path, messages, books, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        load(tmp_path, messages, books)
    # A finer tick that the prices do sit on accepts the file.
    data = load(tmp_path, messages, books, tick_size=0.0001, step_events=2).validate()
    assert data.tick_size == pytest.approx(0.0001)


def test_one_off_tick_row_in_a_long_file_does_not_rescale_the_market(tmp_path) -> None:
    messages, books = long_file()
    messages[200][4] = 100001
    with pytest.raises(ValueError, match=r"line 201: price=100001 is not a multiple of the tick 100 on which "
                                         r"99.9 % of the visible prices sit"):
        load(tmp_path, messages, books)


def test_tick_size_can_be_set_and_is_checked(tmp_path) -> None:
    inferred = load(tmp_path, *scenario(), step_events=2)
    given = load(tmp_path, *scenario(), step_events=2, tick_size=0.01)
    assert given.tick_size == inferred.tick_size == pytest.approx(0.01)
    for name in ("bid_price", "ask_price", "flow_ref_tick", "exec_bid", "exec_ask", "cancel_ask"):
        assert torch.equal(getattr(given, name), getattr(inferred, name))
    half = load(tmp_path, *scenario(), step_events=2, tick_size=0.005).validate()  # not the 0.01 entry
    assert half.tick_size == pytest.approx(0.005)
    assert half.flow_ref_tick.tolist() == [2005, 2005, 2006]  # start mids 10.025, 10.025, 10.03 in half-cents
    with pytest.raises(ValueError, match=rf"{MESSAGE_FILE} line 1: price=100500 is not a multiple of "
                                         r"tick_size=0.02 \(200 in the file's 1e-4 units\)"):
        load(tmp_path, *scenario(), tick_size=0.02)
    books = [row[:4] + [DUMMY, 0, -DUMMY, 0] for row in scenario()[1]]  # the book's first level only
    messages = [[1.0 + 0.1 * k, 1, k + 1, 10, 100000, 1] for k in range(6)]
    with pytest.raises(ValueError, match=rf"{BOOK_FILE} line 1: ask_price_1=100500 is not a multiple of "
                                         "tick_size=0.02"):
        load(tmp_path, messages, books, tick_size=0.02)


@pytest.mark.parametrize("tick", [0, -0.01, float("nan"), float("inf"), "0.01", True])
def test_bad_tick_size_raises(tmp_path, tick) -> None:
    with pytest.raises(ValueError, match=r"tick_size=.* must be a finite number > 0"):
        load(tmp_path, *scenario(), tick_size=tick)


def test_tick_size_must_be_a_multiple_of_the_price_unit(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"tick_size=0.00015 must be a multiple of 0.0001"):
        load(tmp_path, *scenario(), tick_size=0.00015)
    with pytest.raises(ValueError, match=r"tick_size=1e-05 must be a multiple of 0.0001"):
        load(tmp_path, *scenario(), tick_size=1e-5)
    with pytest.raises(ValueError, match="tick_size=0.01 applies to LOBSTER sources only"):
        load_market(num_steps=100, tick_size=0.01)


# ----------------------------------------------------------------------------------------------
# Integers beyond int64 (or float64's exact range) quoted as written.


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ((3, 3, "99999999999999999999"),
         rf"{MESSAGE_FILE} line 4: size=99999999999999999999 is out of range: integers must lie within "
         r"\+-2\*\*53"),
        ((3, 4, "-9223372036854775809"), r"line 4: price=-9223372036854775809 is out of range"),
        ((3, 4, "9223372036854775808"), r"line 4: price=9223372036854775808 is out of range"),
        ((2, 2, "1e30"), r"line 3: order_id=1e30 is out of range"),
        ((3, 3, "1e400"), r"line 4, column 4 \(size\): value='1e400' is not finite"),
    ],
)
def test_huge_message_integers_are_quoted_as_written(tmp_path, change, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        load(tmp_path, bad_messages(change), scenario()[1])


def test_huge_book_integers_are_quoted_as_written(tmp_path) -> None:
    with pytest.raises(ValueError, match=rf"{BOOK_FILE} line 2: bid_size_2=18446744073709551616 is out of "
                                         "range"):
        load(tmp_path, scenario()[0], bad_books(1, 7, "18446744073709551616"))


# ----------------------------------------------------------------------------------------------
# Timestamps: finite, within the day, non-decreasing.


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ((5, 0, "1e20"), rf"{MESSAGE_FILE} line 6: time=1e20 must lie within the day: 0 <= time <= 86400 "
                         r"\(seconds after midnight\)"),
        ((5, 0, 86400.5), r"line 6: time=86400.5 must lie within the day"),
        ((0, 0, -1), r"line 1: time=-1 must lie within the day"),
        ((0, 0, "-0.001"), r"line 1: time=-0.001 must lie within the day"),
        ((5, 0, "inf"), rf"{MESSAGE_FILE} line 6, column 1 \(time\): value='inf' is not finite"),
        ((2, 0, "-inf"), r"line 3, column 1 \(time\): value='-inf' is not finite"),
        ((2, 0, "nan"), r"line 3, column 1 \(time\): value='nan' is missing or NaN"),
        ((2, 0, "1.2"), rf"{MESSAGE_FILE} line 3: time=1.2 is before the previous 1.5"),
    ],
)
@pytest.mark.parametrize("step", [{"step_events": 2}, {"step_seconds": 1.0}])
def test_bad_times_raise(tmp_path, change, pattern, step) -> None:
    with pytest.raises(ValueError, match=pattern):
        load(tmp_path, bad_messages(change), scenario()[1], **step)


def test_times_at_the_ends_of_the_day_are_accepted(tmp_path) -> None:
    messages, books = scenario()
    messages[0][0] = 0
    for row in messages[1:]:
        row[0] = 86400
    data = load(tmp_path, messages, books, step_seconds=3600.0)
    assert data.num_steps == 25 and float(data.time[-1]) == 86400.0 + 3600.0


# ----------------------------------------------------------------------------------------------
# The real GOOG sample passes every check with the defaults and loads exactly as before them.

#: sha256 over each tensor field (name, then bytes) of the GOOG sample, as loaded before the checks existed.
GOOG_DIGESTS = {
    "default": "7c0a9f9611143e0956966beb4c224a8f547f82be60eecbebffb6d72ede475193",
    "minutes_5_levels": "a0aebfd66291ce697a8b86aa9e769417847efc3b0654f5dce4da57d99be97011",
}
GOOG_KWARGS = {"default": {}, "minutes_5_levels": {"step_seconds": 60.0, "levels": 5}}


def market_digest(data) -> str:
    """sha256 over every tensor field of ``data``, in field order."""
    digest = hashlib.sha256()
    for field in fields(data):
        value = getattr(data, field.name)
        if isinstance(value, torch.Tensor):
            digest.update(field.name.encode())
            digest.update(value.contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(GOOG_DIGESTS))
def test_goog_loads_exactly_as_before_the_checks(lobster_dir: Path, tmp_path: Path, case: str) -> None:
    data = load_market(lobster_dir, cache_dir=tmp_path / "inferred", **GOOG_KWARGS[case])
    assert data.tick_size == 0.01
    assert market_digest(data) == GOOG_DIGESTS[case]
    given = load_market(lobster_dir, cache_dir=tmp_path / "given", tick_size=0.01, **GOOG_KWARGS[case])
    assert market_digest(given) == GOOG_DIGESTS[case]


@pytest.mark.slow
def test_goog_band_and_tick_checks_are_live(lobster_dir: Path) -> None:
    paths = find_lobster_files(lobster_dir)
    _, book, tick_units = lobster_module.parse_lobster(*paths, price_band=0.02)  # deepest level: 1.7 %
    assert tick_units == 100
    prices = np.concatenate([book[:, 0].ravel(), book[:, 2].ravel()])
    assert infer_tick(prices) == (100, 1.0)
    with pytest.raises(ValueError, match=r"orderbook file GOOG_2012-06-21_34200000_57600000_orderbook_10.csv "
                                         r"line \d+: (ask|bid)_price_\d+=\d+ lies 1.\d % from the mid"):
        lobster_module.parse_lobster(*paths, price_band=0.01)
    with pytest.raises(ValueError, match=r"orderbook file GOOG\S+ line 1: ask_price_1=5802300 is not a "
                                         "multiple of tick_size=0.02"):
        lobster_module.parse_lobster(*paths, tick_size=0.02)
