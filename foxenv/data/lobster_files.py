"""LOBSTER folders: find the message / orderbook pair of each day and split days into walk-forward folds."""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path

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
