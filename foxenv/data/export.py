"""Write a market as LOBSTER message / orderbook CSV files, so that LOBSTER tooling (and foxenv's own reader,
walk-forward over a folder of days included) runs on data anyone may share: the synthetic market.

Quick start::

    from foxenv.data import generate_synthetic, load_market
    from foxenv.data.export import export_lobster, export_synthetic_days

    export_lobster(generate_synthetic(2_000, levels=5, seed=0), "days/")     # one day, one pair
    export_synthetic_days("days/", num_days=5, num_steps=2_000, levels=5)    # five days, one pair each
    market = load_market("days/", days=[0, 1, 2], step_seconds=15.8)

What is written, per step ``t`` of the market (steps of one fixed clock length ``dt``, the session starting at
the first multiple of ``dt`` at or after ``session_start``):

- one execution message (type 4) per non-empty cell of ``exec_bid`` (direction 1: a resting bid was hit) and
  ``exec_ask`` (direction -1), at the cell's price, size rounded to whole shares (LOBSTER sizes are
  integers; a cell under half a share is dropped);
- one deletion (type 3) per non-empty cell of ``cancel_bid`` / ``cancel_ask``, likewise;
- one submission (type 1) of one share at the best bid closing the step, so every step holds a message;
- every message's orderbook row is the book at the end of the step (levels with no size are written as
  LOBSTER's dummy levels, ``+-9999999999`` with size 0).

Message times lie strictly inside the step's clock bucket, so ``load_market(folder, step_seconds=dt)`` reads
back the same books, halts and flow grids (the flows rounded to whole shares) from step 1 on; step 0's flow
grid is referenced to the book after its first message (the reader cannot know the book before the file).
Halted steps are not written (the exporter refuses a market with halts).
"""

from __future__ import annotations

import datetime
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from foxenv.data.lobster import DUMMY_PRICE, PRICE_SCALE
from foxenv.data.market import FLOW_WIDTH, SECONDS_PER_DAY, MarketData

#: Default session start: 09:30, NASDAQ's open, in seconds after midnight.
SESSION_START = 34_200.0
#: Message types the exporter writes.
SUBMISSION, DELETION, EXECUTION = 1, 3, 4


def step_clock(market: MarketData) -> float:
    """The fixed clock length of ``market``'s steps (the exporter writes fixed time buckets).

    :param market: a timeline whose steps are equally spaced in time.
    :return: seconds per step.
    :raises ValueError: when the steps are not equally spaced.
    """
    if market.num_steps < 2:
        raise ValueError(f"market {market.name!r} has {market.num_steps} step(s); the export needs 2 or more")
    gaps = np.diff(market.time.detach().cpu().numpy())
    dt = float(np.median(gaps))
    if not dt > 0 or np.abs(gaps - dt).max() > 1e-6 * max(dt, 1.0):
        raise ValueError(f"market {market.name!r}: steps are not equally spaced in time (gaps "
                         f"{gaps.min():g}..{gaps.max():g} s); the export writes fixed clock steps")
    return dt


def _messages(market: MarketData) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Messages of every step, in step order: ``(step, type, size, price in 1e-4 units, direction)``."""
    tick_units = int(round(market.tick_size * PRICE_SCALE))
    ref = market.flow_ref_tick.detach().cpu().numpy().astype(np.int64)
    offsets = np.arange(FLOW_WIDTH, dtype=np.int64) - FLOW_WIDTH // 2
    parts = []
    for kind, name, direction in ((EXECUTION, "exec_bid", 1), (EXECUTION, "exec_ask", -1),
                                  (DELETION, "cancel_bid", 1), (DELETION, "cancel_ask", -1)):
        size = np.rint(getattr(market, name).detach().cpu().double().numpy()).astype(np.int64)
        step, column = np.nonzero(size > 0)
        price = (ref[step] + offsets[column]) * tick_units
        flags = np.full(step.size, kind), np.full(step.size, direction)
        parts.append((step, flags[0], size[step, column], price, flags[1]))
    steps = np.arange(market.num_steps)
    best_bid = np.rint(market.bid_price[:, 0].detach().cpu().numpy() * PRICE_SCALE).astype(np.int64)
    parts.append((steps, np.full(steps.size, SUBMISSION), np.ones(steps.size, dtype=np.int64), best_bid,
                  np.ones(steps.size, dtype=np.int64)))
    columns = [np.concatenate([part[i] for part in parts]) for i in range(5)]
    order = np.argsort(columns[0], kind="stable")  # within a step: executions, deletions, the submission
    return tuple(column[order] for column in columns)  # type: ignore[return-value]


def _book_rows(market: MarketData, levels: int) -> np.ndarray:
    """``[T, 4 L]`` int64 orderbook rows of the steps (LOBSTER's column order, dummy empty levels)."""
    columns = []
    for price_name, size_name, dummy in (("ask_price", "ask_size", DUMMY_PRICE),
                                         ("bid_price", "bid_size", -DUMMY_PRICE)):
        price = np.rint(getattr(market, price_name)[:, :levels].detach().cpu().numpy() * PRICE_SCALE)
        size = np.rint(getattr(market, size_name)[:, :levels].detach().cpu().double().numpy())
        columns.append((np.where(size > 0, price, dummy).astype(np.int64), size.astype(np.int64)))
    (ask_price, ask_size), (bid_price, bid_size) = columns
    rows = np.stack([ask_price, ask_size, bid_price, bid_size], axis=2)  # [T, L, 4]: level-major, as LOBSTER
    return rows.reshape(market.num_steps, 4 * levels)


def export_lobster(market: MarketData, folder: str | os.PathLike, *, ticker: str = "SYN",
                   date: str | datetime.date = "2012-06-21", session_start: float = SESSION_START,
                   levels: int | None = None) -> tuple[Path, Path]:
    """Write ``market`` as one LOBSTER day: ``TICKER_DATE_START_END_message_L.csv`` and its orderbook file.

    :param market: a timeline of equally spaced steps without halts (the synthetic market).
    :param folder: where the pair is written (created if missing).
    :param ticker: the ticker in the file names (no underscore).
    :param date: the trading day in the file names (``YYYY-MM-DD``).
    :param session_start: seconds after midnight where the first step's bucket may start (rounded up to a
        multiple of the step's clock length).
    :param levels: book levels written (default all of the market's).
    :return: ``(message_path, orderbook_path)``.
    :raises ValueError: naming the field and the value when the market or an argument cannot be written.
    """
    if not ticker or "_" in ticker or "/" in ticker:
        raise ValueError(f"ticker={ticker!r} must be non-empty without '_' or '/'")
    day = date if isinstance(date, datetime.date) else datetime.date.fromisoformat(str(date))
    levels = market.num_levels if levels is None else int(levels)
    if not 1 <= levels <= market.num_levels:
        raise ValueError(f"levels={levels} must lie in [1, {market.num_levels}]")
    if bool(market.halted.any()):
        raise ValueError(f"market {market.name!r} has halted steps; the export does not write halts")
    dt = step_clock(market)
    start = math.ceil(session_start / dt - 1e-9) * dt
    end = start + dt * market.num_steps
    if end > SECONDS_PER_DAY:
        raise ValueError(f"{market.num_steps} steps of {dt:g} s from {start:g} s end after midnight "
                         f"({end:g} s); export fewer steps or a shorter clock")
    step, kind, size, price, direction = _messages(market)
    count = np.bincount(step, minlength=market.num_steps)
    first_of_step = np.concatenate([[0], np.cumsum(count)[:-1]])
    rank = np.arange(step.size) - first_of_step[step]
    time = start + dt * step + dt * (rank + 1) / (count[step] + 1)  # strictly inside the bucket
    messages = pd.DataFrame({"time": time, "type": kind, "order_id": np.arange(1, step.size + 1),
                             "size": size, "price": price, "direction": direction})
    book = pd.DataFrame(_book_rows(market, levels)[step])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{ticker}_{day.isoformat()}_{int(round(start * 1000))}_{int(round(end * 1000))}"
    message_path = folder / f"{stem}_message_{levels}.csv"
    orderbook_path = folder / f"{stem}_orderbook_{levels}.csv"
    messages.to_csv(message_path, header=False, index=False, float_format="%.9f")
    book.to_csv(orderbook_path, header=False, index=False)
    return message_path, orderbook_path


def export_synthetic_days(folder: str | os.PathLike, *, num_days: int, num_steps: int = 2_000,
                          levels: int = 10, seed: int = 0, ticker: str = "SYN",
                          first_date: str = "2012-06-21", **profile: float) -> list[tuple[Path, Path]]:
    """Write ``num_days`` synthetic days (seeds ``seed``, ``seed + 1``, ...) as LOBSTER pairs on consecutive
    dates: a multi-day folder for walk-forward tests without licensed data.

    :param folder: where the pairs are written.
    :param num_days: days (>= 1).
    :param num_steps: steps of each day.
    :param levels: book levels.
    :param seed: the first day's generator seed.
    :param ticker: the ticker in the file names.
    :param first_date: the first day's date; the next days follow one calendar day apart.
    :param profile: :class:`~foxenv.data.synthetic.SyntheticProfile` knobs.
    :return: the written ``(message_path, orderbook_path)`` pairs, in date order.
    """
    from foxenv.data.synthetic import generate_synthetic

    if isinstance(num_days, bool) or not isinstance(num_days, int) or num_days < 1:
        raise ValueError(f"num_days={num_days!r} must be an int >= 1")
    start = datetime.date.fromisoformat(first_date)
    return [
        export_lobster(generate_synthetic(num_steps, levels=levels, seed=seed + k, **profile), folder,
                       ticker=ticker, date=start + datetime.timedelta(days=k))
        for k in range(num_days)
    ]
