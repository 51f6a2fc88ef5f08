"""LOBSTER replay: hand-worked tiny files (aggregation, flow grids, empty levels, halts, bad input)
and the real GOOG file."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import foxenv.data.lobster as lobster_module
from foxenv.data import FLOW_WIDTH, CacheWarning, find_lobster_files, load_lobster, load_market

DUMMY = 9_999_999_999



def book_row(
    ask1: tuple[int, int], ask2: tuple[int, int], bid1: tuple[int, int], bid2: tuple[int, int]
) -> list[int]:
    """One orderbook row in file order (ask_p1, ask_s1, bid_p1, bid_s1, ask_p2, ask_s2, bid_p2, bid_s2)."""
    return [ask1[0], ask1[1], bid1[0], bid1[1], ask2[0], ask2[1], bid2[0], bid2[1]]


# A 2-level book in 1e-4 USD: ask 10.05 x100, 10.06 x200; bid 10.00 x300, 9.99 x400 (tick $0.01).
BASE_BOOK = book_row((100500, 100), (100600, 200), (100000, 300), (99900, 400))


def write_pair(
    folder: Path, messages: list[list], books: list[list], stem: str = "TEST_2012-01-01_0_1"
) -> tuple[Path, Path]:
    """Write a LOBSTER pair (no header) into ``folder`` and return its paths."""
    folder.mkdir(parents=True, exist_ok=True)
    message_path = folder / f"{stem}_message_2.csv"
    book_path = folder / f"{stem}_orderbook_2.csv"
    message_path.write_text("\n".join(",".join(str(v) for v in row) for row in messages) + "\n")
    book_path.write_text("\n".join(",".join(str(v) for v in row) for row in books) + "\n")
    return message_path, book_path


def scenario() -> tuple[list[list], list[list]]:
    """Six messages touching both sides; the ask side ends with one occupied level.

    Per message (time, type, id, size, price, direction) and the book after it:
    0 t=1.0  add sell 50 @10.05             ask 10.05x150 10.06x200 | bid 10.00x300 9.99x400
    1 t=1.5  exec buy 100 @10.00 (visible)  bid 10.00x200
    2 t=1.9  delete sell 150 @10.05         ask 10.06x200, level 2 empty
    3 t=3.5  cancel buy 50 @9.99            bid 9.99x350
    4 t=4.0  hidden exec sell 10 @10.035    (book unchanged)
    5 t=4.2  exec sell 30 @10.06            ask 10.06x170
    """
    messages = [
        [1.0, 1, 11, 50, 100500, -1],
        [1.5, 4, 12, 100, 100000, 1],
        [1.9, 3, 13, 150, 100500, -1],
        [3.5, 2, 14, 50, 99900, 1],
        [4.0, 5, 0, 10, 100350, -1],
        [4.2, 4, 15, 30, 100600, -1],
    ]
    books = [
        book_row((100500, 150), (100600, 200), (100000, 300), (99900, 400)),
        book_row((100500, 150), (100600, 200), (100000, 200), (99900, 400)),
        book_row((100600, 200), (DUMMY, 0), (100000, 200), (99900, 400)),
        book_row((100600, 200), (DUMMY, 0), (100000, 200), (99900, 350)),
        book_row((100600, 200), (DUMMY, 0), (100000, 200), (99900, 350)),
        book_row((100600, 170), (DUMMY, 0), (100000, 200), (99900, 350)),
    ]
    return messages, books


def grid(cells: dict[tuple[int, int], float], steps: int) -> torch.Tensor:
    """A ``[steps, FLOW_WIDTH]`` float32 grid with the given (step, column) volumes."""
    out = torch.zeros(steps, FLOW_WIDTH, dtype=torch.float32)
    for (step, column), volume in cells.items():
        out[step, column] = volume
    return out


def test_aggregation_by_count(tmp_path: Path) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    data = load_lobster(*paths, step_events=2, cache_dir=tmp_path / "cache").validate()
    assert data.num_steps == 3 and data.num_levels == 2
    assert data.tick_size == pytest.approx(0.01)
    # Snapshots are the book after the last message of each step (rows 1, 3, 5).
    torch.testing.assert_close(data.ask_price, torch.tensor([[10.05, 10.06], [10.06, 10.07], [10.06, 10.07]],
                                                           dtype=torch.float64))
    torch.testing.assert_close(data.ask_size, torch.tensor([[150.0, 200.0], [200.0, 0.0], [170.0, 0.0]]))
    torch.testing.assert_close(data.bid_price, torch.tensor([[10.00, 9.99]] * 3, dtype=torch.float64))
    torch.testing.assert_close(data.bid_size, torch.tensor([[200.0, 400.0], [200.0, 350.0], [200.0, 350.0]]))
    torch.testing.assert_close(data.time, torch.tensor([1.5, 3.5, 4.2], dtype=torch.float64))
    # Start mids: row 0 (10.025), row 1 (10.025), row 3 (10.03) -> floor in ticks 1002, 1002, 1003.
    assert data.flow_ref_tick.tolist() == [1002, 1002, 1003]
    assert data.flow_ref_tick.dtype == torch.int64
    # Column = tick - ref + 32. Exec of a buy order at 10.00 -> exec_bid; hidden sell at 10.035 -> tick 1003.
    torch.testing.assert_close(data.exec_bid, grid({(0, 30): 100.0}, 3))
    torch.testing.assert_close(data.exec_ask, grid({(2, 32): 10.0, (2, 35): 30.0}, 3))
    torch.testing.assert_close(data.cancel_ask, grid({(1, 35): 150.0}, 3))
    torch.testing.assert_close(data.cancel_bid, grid({(1, 29): 50.0}, 3))
    assert not data.halted.any()


def test_aggregation_by_count_keeps_partial_last_step(tmp_path: Path) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    data = load_lobster(*paths, step_events=4, cache_dir=tmp_path / "cache")
    assert data.num_steps == 2
    torch.testing.assert_close(data.time, torch.tensor([3.5, 4.2], dtype=torch.float64))
    assert float(data.exec_ask.sum()) == 40.0 and float(data.exec_bid.sum()) == 100.0


def test_aggregation_by_seconds_repeats_snapshot_in_empty_bucket(tmp_path: Path) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    data = load_lobster(*paths, step_seconds=1.0, cache_dir=tmp_path / "cache").validate()
    # Buckets [1,2) msgs 0-2, [2,3) empty, [3,4) msg 3, [4,5) msgs 4-5.
    assert data.num_steps == 4
    torch.testing.assert_close(data.time, torch.tensor([2.0, 3.0, 4.0, 5.0], dtype=torch.float64))
    torch.testing.assert_close(data.ask_price[1], data.ask_price[0])
    torch.testing.assert_close(data.ask_size[1], data.ask_size[0])
    torch.testing.assert_close(data.bid_size[1], data.bid_size[0])
    assert data.bid_size[2].tolist() == [200.0, 350.0]
    assert data.flow_ref_tick.tolist() == [1002, 1003, 1003, 1003]
    for flows in (data.exec_bid, data.exec_ask, data.cancel_bid, data.cancel_ask):
        assert float(flows[1].abs().sum()) == 0.0
    torch.testing.assert_close(data.exec_bid, grid({(0, 30): 100.0}, 4))
    torch.testing.assert_close(data.cancel_ask, grid({(0, 35): 150.0}, 4))
    torch.testing.assert_close(data.cancel_bid, grid({(2, 28): 50.0}, 4))
    torch.testing.assert_close(data.exec_ask, grid({(3, 32): 10.0, (3, 35): 30.0}, 4))


def test_default_is_100_events_per_step(tmp_path: Path) -> None:
    rows = 250
    messages = [[1.0 + 0.01 * k, 1, k + 1, 10, 100000, 1] for k in range(rows)]
    books = [BASE_BOOK] * rows
    data = load_lobster(*write_pair(tmp_path / "data", messages, books), cache_dir=tmp_path / "cache")
    assert data.num_steps == 3
    torch.testing.assert_close(data.time, torch.tensor([1.99, 2.99, 3.49], dtype=torch.float64))


def test_flow_beyond_grid_goes_to_edge_columns(tmp_path: Path) -> None:
    messages = [
        [1.0, 3, 1, 5, 95000, 1],  # bid deleted at 9.50: tick 950, column 950 - 1002 + 32 < 0 -> 0
        [1.1, 3, 2, 7, 110000, -1],  # ask deleted at 11.00: tick 1100 -> column 63
        [1.2, 4, 3, 9, 100000 - 32 * 100, 1],  # exec at tick 968: column -2 -> 0
        [1.3, 4, 4, 4, 100000 + 100 * 100, -1],  # exec at tick 1100 -> column 63
        [1.4, 4, 5, 3, 100000 + 29 * 100, -1],  # exec at tick 1029: column 59, inside the grid
    ]
    data = load_lobster(*write_pair(tmp_path / "data", messages, [BASE_BOOK] * 5), step_events=5,
                        cache_dir=tmp_path / "cache")
    assert data.flow_ref_tick.tolist() == [1002]
    torch.testing.assert_close(data.cancel_bid, grid({(0, 0): 5.0}, 1))
    torch.testing.assert_close(data.cancel_ask, grid({(0, FLOW_WIDTH - 1): 7.0}, 1))
    torch.testing.assert_close(data.exec_bid, grid({(0, 0): 9.0}, 1))
    torch.testing.assert_close(data.exec_ask, grid({(0, FLOW_WIDTH - 1): 4.0, (0, 59): 3.0}, 1))


def test_off_tick_hidden_executions_round_towards_the_inside(tmp_path: Path) -> None:
    messages = [
        [1.0, 5, 0, 8, 100050, 1],  # hidden buy order hit at 10.005 -> tick 1001 (up), column 31
        [1.1, 5, 0, 6, 100450, -1],  # hidden sell order lifted at 10.045 -> tick 1004 (down), column 34
    ]
    data = load_lobster(*write_pair(tmp_path / "data", messages, [BASE_BOOK] * 2), step_events=2,
                        cache_dir=tmp_path / "cache")
    assert data.tick_size == pytest.approx(0.01)  # hidden prices do not shrink the detected tick
    torch.testing.assert_close(data.exec_bid, grid({(0, 31): 8.0}, 1))
    torch.testing.assert_close(data.exec_ask, grid({(0, 34): 6.0}, 1))


def test_empty_levels_continue_one_tick_per_level(tmp_path: Path) -> None:
    books = [
        book_row((100500, 100), (DUMMY, 0), (100000, 300), (-DUMMY, 0)),  # one level each side
        book_row((100500, 100), (100700, 5), (-DUMMY, 0), (-DUMMY, 0)),  # no bids at all
        book_row((DUMMY, 0), (DUMMY, 0), (99000, 10), (98000, 20)),  # no asks at all
    ]
    messages = [[1.0, 1, 1, 100, 100500, -1], [1.1, 3, 2, 300, 100000, 1], [1.2, 3, 3, 100, 100700, -1]]
    data = load_lobster(*write_pair(tmp_path / "data", messages, books), step_events=1,
                        cache_dir=tmp_path / "cache").validate()
    # Tick: gcd of visible prices {100500, 100000, 100700, 99000, 98000} = 100 units = $0.01.
    torch.testing.assert_close(data.ask_price, torch.tensor(
        [[10.05, 10.06], [10.05, 10.07], [9.91, 9.92]], dtype=torch.float64))
    torch.testing.assert_close(data.bid_price, torch.tensor(
        [[10.00, 9.99], [10.04, 10.03], [9.90, 9.80]], dtype=torch.float64))
    assert data.ask_size.tolist() == [[100.0, 0.0], [100.0, 5.0], [0.0, 0.0]]
    assert data.bid_size.tolist() == [[300.0, 0.0], [0.0, 0.0], [10.0, 20.0]]


def test_book_with_no_occupied_level_repeats_previous_prices(tmp_path: Path) -> None:
    books = [BASE_BOOK, book_row((DUMMY, 0), (DUMMY, 0), (-DUMMY, 0), (-DUMMY, 0))]
    messages = [[1.0, 1, 1, 100, 100500, -1], [1.1, 3, 2, 300, 100000, 1]]
    data = load_lobster(*write_pair(tmp_path / "data", messages, books), step_events=1,
                        cache_dir=tmp_path / "cache").validate()
    torch.testing.assert_close(data.ask_price[1], data.ask_price[0])
    torch.testing.assert_close(data.bid_price[1], data.bid_price[0])
    assert data.ask_size[1].tolist() == [0.0, 0.0] and data.bid_size[1].tolist() == [0.0, 0.0]


def halt_message(time_s: float, price: int) -> list:
    """A LOBSTER type-7 message: price -1 halt, 0 quoting resumes, 1 trading resumes."""
    return [time_s, 7, 0, 0, price, -1]


def test_halts_by_count(tmp_path: Path) -> None:
    messages = [
        [1.0, 1, 1, 10, 100000, 1],
        halt_message(1.1, -1),
        halt_message(1.2, 0),
        [1.3, 1, 2, 10, 100000, 1],
        halt_message(1.4, 1),
        [1.5, 1, 3, 10, 100000, 1],
        [1.6, 1, 4, 10, 100000, 1],
    ]
    paths = write_pair(tmp_path / "data", messages, [BASE_BOOK] * 7)
    data = load_lobster(*paths, step_events=1, cache_dir=tmp_path / "c1")
    assert data.halted.tolist() == [False, True, True, True, True, False, False]
    data = load_lobster(*paths, step_events=2, cache_dir=tmp_path / "c2")
    assert data.halted.tolist() == [True, True, True, False]


def test_halt_spanning_empty_buckets(tmp_path: Path) -> None:
    messages = [
        [0.5, 1, 1, 10, 100000, 1],
        halt_message(1.2, -1),
        halt_message(4.5, 1),
        [5.5, 1, 2, 10, 100000, 1],
    ]
    data = load_lobster(*write_pair(tmp_path / "data", messages, [BASE_BOOK] * 4), step_seconds=1.0,
                        cache_dir=tmp_path / "cache")
    # Buckets [0,1) .. [5,6): buckets 2 and 3 hold no message but lie inside the halt.
    assert data.halted.tolist() == [False, True, True, True, True, False]


def test_file_starting_inside_a_halt(tmp_path: Path) -> None:
    messages = [[1.0, 1, 1, 10, 100000, 1], halt_message(1.1, 1), [1.2, 1, 2, 10, 100000, 1]]
    data = load_lobster(*write_pair(tmp_path / "data", messages, [BASE_BOOK] * 3), step_events=1,
                        cache_dir=tmp_path / "cache")
    assert data.halted.tolist() == [True, True, False]


def test_cross_trade_adds_no_flow(tmp_path: Path) -> None:
    messages = [[1.0, 6, 0, 500, 100200, -1], [1.1, 1, 1, 10, 100000, 1]]
    data = load_lobster(*write_pair(tmp_path / "data", messages, [BASE_BOOK] * 2), step_events=2,
                        cache_dir=tmp_path / "cache")
    for flows in (data.exec_bid, data.exec_ask, data.cancel_bid, data.cancel_ask):
        assert float(flows.sum()) == 0.0
    assert data.num_steps == 1


def test_levels_keeps_the_first_levels(tmp_path: Path) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    one = load_lobster(*paths, levels=1, step_events=2, cache_dir=tmp_path / "cache")
    both = load_lobster(*paths, step_events=2, cache_dir=tmp_path / "cache")
    assert one.num_levels == 1 and both.num_levels == 2
    torch.testing.assert_close(one.ask_price, both.ask_price[:, :1])
    torch.testing.assert_close(one.bid_size, both.bid_size[:, :1])
    torch.testing.assert_close(one.exec_ask, both.exec_ask)
    with pytest.raises(ValueError, match="levels=3"):
        load_lobster(*paths, levels=3, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="levels=0"):
        load_lobster(*paths, levels=0, cache_dir=tmp_path / "cache")


def test_cache_is_used_and_keyed_by_content_and_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    cache = tmp_path / "cache"
    first = load_lobster(*paths, step_events=2, cache_dir=cache)
    assert len(list(cache.glob("*.pt"))) == 1

    def parse_must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed again although the cache holds the result")

    monkeypatch.setattr(lobster_module, "parse_lobster", parse_must_not_run)
    second = load_lobster(*paths, step_events=2, cache_dir=cache)
    for name in ("bid_price", "ask_size", "flow_ref_tick", "exec_bid", "cancel_ask", "time", "halted"):
        assert torch.equal(getattr(first, name), getattr(second, name))
    assert second.tick_size == first.tick_size and second.name == first.name
    # New parameters or new file contents miss the cache.
    with pytest.raises(AssertionError, match="parsed again"):
        load_lobster(*paths, step_events=3, cache_dir=cache)
    messages, books = scenario()
    messages[0][3] = 51
    write_pair(tmp_path / "data", messages, books)
    with pytest.raises(AssertionError, match="parsed again"):
        load_lobster(*paths, step_events=2, cache_dir=cache)


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    monkeypatch.setenv("FOXHUNT_CACHE_DIR", str(tmp_path / "env_cache"))
    load_lobster(*paths, step_events=2)
    assert len(list((tmp_path / "env_cache").glob("*.pt"))) == 1


def test_corrupt_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    cache = tmp_path / "cache"
    first = load_lobster(*paths, step_events=2, cache_dir=cache)
    (entry,) = cache.glob("*.pt")
    entry.write_bytes(b"not a torch file")
    with pytest.warns(CacheWarning, match="could not be read"):
        again = load_lobster(*paths, step_events=2, cache_dir=cache)
    assert torch.equal(again.exec_ask, first.exec_ask)


def test_folder_source_and_tuple_source(tmp_path: Path) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    assert find_lobster_files(tmp_path / "data") == paths
    from_folder = load_market(tmp_path / "data", step_events=2, cache_dir=tmp_path / "cache")
    from_tuple = load_market(paths, step_events=2, cache_dir=tmp_path / "cache")
    assert torch.equal(from_folder.exec_ask, from_tuple.exec_ask)
    assert from_folder.num_steps == 3
    head = load_market(paths, step_events=2, num_steps=2, cache_dir=tmp_path / "cache")
    assert head.num_steps == 2 and torch.equal(head.time, from_tuple.time[:2])
    with pytest.raises(ValueError, match="num_steps=4"):
        load_market(paths, step_events=2, num_steps=4, cache_dir=tmp_path / "cache")


def test_folder_source_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="source=.*no \\*_message_\\*.csv"):
        find_lobster_files(tmp_path / "empty")
    write_pair(tmp_path / "two", *scenario(), stem="A_1_2")
    write_pair(tmp_path / "two", *scenario(), stem="B_1_2")
    with pytest.raises(ValueError, match="source=.*ambiguous"):
        load_market(tmp_path / "two")
    message_path, book_path = write_pair(tmp_path / "lonely", *scenario())
    book_path.unlink()
    with pytest.raises(ValueError, match="source=.*no orderbook file"):
        find_lobster_files(tmp_path / "lonely")
    with pytest.raises(ValueError, match="source="):
        load_market(tmp_path / "does_not_exist")


def bad_messages(change: tuple[int, int, object]) -> list[list]:
    """The scenario's messages with one cell replaced: (row, column, value)."""
    messages, _ = scenario()
    row, column, value = change
    messages[row][column] = value
    return messages


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ((2, 0, 0.5), r"line 3: time=0.5"),
        ((1, 1, 8), r"line 2: type=8"),
        ((0, 5, 0), r"line 1: direction=0"),
        ((3, 4, 0), r"line 4: price=0 must be > 0"),
        ((3, 4, -100), r"line 4: price=-100"),
        ((3, 3, 0), r"line 4: size=0"),
        ((3, 3, 2.5), r"line 4: size=2.5 must be an integer"),
        ((3, 3, "abc"),
         r"message file TEST_2012-01-01_0_1_message_2.csv line 4, column 4 \(size\): "
         r"value='abc' is not numeric"),
        ((3, 3, ""), r"message file \S+ line 4, column 4 \(size\): value='' is missing or NaN"),
        ((3, 3, "nan"), r"message file \S+ line 4, column 4 \(size\): value='nan' is missing or NaN"),
    ],
)
def test_bad_messages_raise(tmp_path: Path, change: tuple[int, int, object], pattern: str) -> None:
    _, books = scenario()
    paths = write_pair(tmp_path / "data", bad_messages(change), books)
    with pytest.raises(ValueError, match=pattern):
        load_lobster(*paths, cache_dir=tmp_path / "cache")


def test_bad_halt_price_raises(tmp_path: Path) -> None:
    messages = [[1.0, 1, 1, 10, 100000, 1], halt_message(1.1, 2)]
    paths = write_pair(tmp_path / "data", messages, [BASE_BOOK] * 2)
    with pytest.raises(ValueError, match="line 2: price=2 must be -1, 0 or 1"):
        load_lobster(*paths, cache_dir=tmp_path / "cache")


def bad_books(row: int, column: int, value: object) -> list[list]:
    """The scenario's book rows with one cell replaced."""
    _, books = scenario()
    books[row][column] = value
    return books


@pytest.mark.parametrize(
    ("cell", "pattern"),
    [
        ((0, 2, 0), r"line 1: bid_price_1=0 must be > 0"),
        ((1, 0, -100), r"line 2: ask_price_1=-100 must be > 0"),
        ((0, 2, 100500), r"line 1: crossed book, bid_price_1=100500 >= ask_price_1=100500"),
        ((0, 2, 100700), r"line 1: crossed book, bid_price_1=100700 >= ask_price_1=100500"),
        ((0, 4, 100400), r"line 1: ask_price_2=100400 is not strictly above ask_price_1=100500"),
        ((0, 5, 0), r"line 1: ask_size_2=0 must be > 0 on an occupied level"),
        ((2, 5, 7), r"line 3: ask_size_2=7 must be 0 on an empty level"),
        ((0, 0, DUMMY), r"line 1: ask_price_1=9999999999 is empty but a deeper level is occupied"),
        ((4, 1, "x"), r"orderbook file \S+ line 5, column 2 \(ask_size_1\): value='x' is not numeric"),
        ((4, 1, ""), r"orderbook file \S+ line 5, column 2 \(ask_size_1\): value='' is missing or NaN"),
    ],
)
def test_bad_books_raise(tmp_path: Path, cell: tuple[int, int, object], pattern: str) -> None:
    messages, _ = scenario()
    paths = write_pair(tmp_path / "data", messages, bad_books(*cell))
    with pytest.raises(ValueError, match=pattern):
        load_lobster(*paths, cache_dir=tmp_path / "cache")


def test_bid_levels_out_of_order_raise(tmp_path: Path) -> None:
    books = bad_books(0, 6, 100000)  # bid_price_2 equal to bid_price_1
    paths = write_pair(tmp_path / "data", scenario()[0], books)
    expected = "line 1: bid_price_2=100000 is not strictly below bid_price_1=100000"
    with pytest.raises(ValueError, match=expected):
        load_lobster(*paths, cache_dir=tmp_path / "cache")


def test_shape_errors_raise(tmp_path: Path) -> None:
    messages, books = scenario()
    paths = write_pair(tmp_path / "a", [row + [0] for row in messages], books)
    with pytest.raises(ValueError, match="7 columns, must be 6"):
        load_lobster(*paths, cache_dir=tmp_path / "cache")
    paths = write_pair(tmp_path / "b", messages, [row[:7] for row in books])
    with pytest.raises(ValueError, match="7 columns, must be a multiple of 4"):
        load_lobster(*paths, cache_dir=tmp_path / "cache")
    paths = write_pair(tmp_path / "c", messages, books[:5])
    with pytest.raises(ValueError, match="row counts differ: message file has 6 rows, orderbook file has 5"):
        load_lobster(*paths, cache_dir=tmp_path / "cache")
    paths = write_pair(tmp_path / "d", messages, books)
    paths[0].write_text("")
    with pytest.raises(ValueError, match="message file .* is empty"):
        load_lobster(*paths, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="message_path=.*does not exist"):
        load_lobster(tmp_path / "missing.csv", paths[1], cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="orderbook_path=.*does not exist"):
        load_lobster(paths[0], tmp_path / "missing.csv", cache_dir=tmp_path / "cache")


def test_step_parameter_errors(tmp_path: Path) -> None:
    paths = write_pair(tmp_path / "data", *scenario())
    with pytest.raises(ValueError, match="step_events=10 and step_seconds=1.0"):
        load_lobster(*paths, step_events=10, step_seconds=1.0, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="step_events=0"):
        load_lobster(*paths, step_events=0, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="step_seconds=-1"):
        load_lobster(*paths, step_seconds=-1.0, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"step_seconds=1e-06 gives 3\d{6} steps for 6 messages"):
        load_lobster(*paths, step_seconds=1e-6, cache_dir=tmp_path / "cache")


# ----------------------------------------------------------------------------------------------
# The real GOOG file (2012-06-21, 10 levels, 147,916 messages).


@pytest.fixture(scope="module")
def goog_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh cache folder shared by the GOOG tests of this module."""
    return tmp_path_factory.mktemp("goog_cache")


@pytest.fixture(scope="module")
def goog_messages(lobster_dir: Path) -> pd.DataFrame:
    """The GOOG message file read independently of the loader, for cross-checks."""
    message_path, _ = find_lobster_files(lobster_dir)
    return pd.read_csv(message_path, header=None, names=["time", "type", "id", "size", "price", "direction"])


@pytest.mark.slow
def test_goog_loads_with_plausible_statistics(lobster_dir: Path, goog_cache: Path,
                                               goog_messages: pd.DataFrame) -> None:
    data = load_market(lobster_dir, cache_dir=goog_cache).validate()
    assert data.num_levels == 10
    assert data.tick_size == pytest.approx(0.01)
    assert data.num_steps == -(-len(goog_messages) // 100) == 1480
    mid = data.mid_price()
    assert 560.0 < float(mid.min()) and float(mid.max()) < 590.0
    spread = data.spread_ticks()
    assert bool((spread > 0).all())
    assert 15 <= float(spread.float().median()) <= 40
    assert bool((data.bid_price[:, 0] < data.ask_price[:, 0]).all())
    for flows in (data.exec_bid, data.exec_ask, data.cancel_bid, data.cancel_ask):
        assert bool((flows >= 0).all())
        assert float((flows.sum(dim=1) > 0).float().mean()) > 0.5  # most steps see flow on each grid
    # Nothing lost: every executed / cancelled share of the file is on a grid, on the right side.
    kind, size, direction = goog_messages["type"], goog_messages["size"], goog_messages["direction"]
    for flows, types, side in ((data.exec_bid, (4, 5), 1), (data.exec_ask, (4, 5), -1),
                               (data.cancel_bid, (2, 3), 1), (data.cancel_ask, (2, 3), -1)):
        expected = float(size[kind.isin(types) & (direction == side)].sum())
        assert float(flows.double().sum()) == pytest.approx(expected, rel=1e-9)
    assert bool((data.time[1:] > data.time[:-1]).all())
    assert 34200.0 < float(data.time[0]) and float(data.time[-1]) < 57600.0
    assert not data.halted.any()  # the sample has no type-7 message


@pytest.mark.slow
def test_goog_second_load_comes_from_cache(lobster_dir: Path, goog_cache: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_market(lobster_dir, cache_dir=goog_cache)  # parsed above or here
    monkeypatch.setattr(lobster_module, "parse_lobster", lambda *a, **k: pytest.fail("parsed again"))
    start = time.perf_counter()
    second = load_market(lobster_dir, cache_dir=goog_cache)
    elapsed = time.perf_counter() - start
    assert torch.equal(first.ask_price, second.ask_price) and torch.equal(first.exec_bid, second.exec_bid)
    assert elapsed < 1.0


@pytest.mark.slow
def test_goog_split_is_by_time(lobster_dir: Path, goog_cache: Path) -> None:
    full = load_market(lobster_dir, cache_dir=goog_cache)
    train = load_market(lobster_dir, cache_dir=goog_cache, split="train", train_fraction=0.75)
    test = load_market(lobster_dir, cache_dir=goog_cache, split="test", train_fraction=0.75)
    assert train.num_steps == 1110 and test.num_steps == 370
    assert float(train.time[-1]) < float(test.time[0])
    assert torch.equal(torch.cat([train.time, test.time]), full.time)


@pytest.mark.slow
def test_goog_by_seconds_and_fewer_levels(lobster_dir: Path, goog_cache: Path,
                                          goog_messages: pd.DataFrame) -> None:
    data = load_market(lobster_dir, step_seconds=60.0, levels=5, cache_dir=goog_cache).validate()
    assert data.num_levels == 5
    assert data.num_steps == 390  # 09:30 to 16:00 in minutes
    torch.testing.assert_close(data.time, 34200.0 + 60.0 * torch.arange(1, 391, dtype=torch.float64))
    executed = float(goog_messages["size"][goog_messages["type"].isin((4, 5))].sum())
    assert float((data.exec_bid.double() + data.exec_ask.double()).sum()) == pytest.approx(executed, rel=1e-9)
    full = load_market(lobster_dir, levels=None, cache_dir=goog_cache)
    five = load_market(lobster_dir, levels=5, cache_dir=goog_cache)
    torch.testing.assert_close(five.bid_price, full.bid_price[:, :5])
    with pytest.raises(ValueError, match="levels=11"):
        load_market(lobster_dir, levels=11, cache_dir=goog_cache)


@pytest.mark.slow
def test_goog_parses_fast(lobster_dir: Path) -> None:
    start = time.perf_counter()
    messages, book, tick_units = lobster_module.parse_lobster(*find_lobster_files(lobster_dir))
    elapsed = time.perf_counter() - start
    assert book.shape == (147_916, 4, 10) and tick_units == 100
    assert np.array_equal(np.unique(messages["type"]), [1, 2, 3, 4, 5])
    assert elapsed < 10.0  # a regression guard against a per-row Python loop, loose for loaded runners
