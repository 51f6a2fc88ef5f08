"""The LOBSTER exporter (synthetic days in LOBSTER format, read back by foxenv's own reader), session splits
by clock time, several days of a folder joined for walk-forward folds, and several sources joined."""

from __future__ import annotations

import pytest
import torch

from foxenv.data import (
    concat_markets,
    find_lobster_days,
    generate_synthetic,
    load_market,
    parse_clock,
    walk_forward,
)
from foxenv.data.export import export_lobster, export_synthetic_days

DT = 15.8  # the synthetic profile's clock seconds per step


def test_an_exported_synthetic_day_reads_back_as_the_same_market(tmp_path) -> None:  # noqa: ANN001
    market = generate_synthetic(300, levels=3, seed=4)
    message_path, orderbook_path = export_lobster(market, tmp_path / "day", ticker="SYN", date="2020-01-02")
    assert message_path.name.startswith("SYN_2020-01-02_") and message_path.name.endswith("_message_3.csv")
    assert orderbook_path.is_file()
    back = load_market(tmp_path / "day", step_seconds=DT, cache_dir=tmp_path / "cache")
    assert back.num_steps == market.num_steps and back.num_levels == 3 and back.tick_size == market.tick_size
    for name in ("bid_price", "ask_price"):  # equal in ticks (the reader divides 1e-4 units)
        assert torch.equal(torch.round(getattr(back, name) / back.tick_size),
                           torch.round(getattr(market, name) / market.tick_size))
    assert torch.equal(back.bid_size, market.bid_size) and torch.equal(back.ask_size, market.ask_size)
    for name in ("exec_bid", "exec_ask", "cancel_bid", "cancel_ask"):  # flows rounded to whole shares
        assert torch.equal(getattr(back, name)[1:], getattr(market, name)[1:].round())
    assert torch.equal(back.flow_ref_tick[1:], market.flow_ref_tick[1:]) and not bool(back.halted.any())
    # the session starts at the first multiple of the clock step at or after 09:30
    assert 34_200.0 <= float(back.time[0]) - DT < 34_200.0 + DT
    with pytest.raises(ValueError, match="ticker='A_B'"):
        export_lobster(market, tmp_path, ticker="A_B")


def test_session_split_by_clock_partitions_one_day(tmp_path) -> None:  # noqa: ANN001
    export_lobster(generate_synthetic(1_000, levels=2, seed=1), tmp_path / "day")
    kwargs = {"step_seconds": DT, "cache_dir": tmp_path / "cache", "split_times": ("10:30", "11:00")}
    whole = load_market(tmp_path / "day", step_seconds=DT, cache_dir=tmp_path / "cache")
    parts = {split: load_market(tmp_path / "day", split=split, **kwargs)
             for split in ("fit", "validation", "test", "train")}
    clock = {split: (float(m.time[0]), float(m.time[-1])) for split, m in parts.items()}
    assert clock["fit"][1] <= parse_clock("10:30") < clock["validation"][0]
    assert clock["validation"][1] <= parse_clock("11:00") < clock["test"][0]
    assert sum(parts[s].num_steps for s in ("fit", "validation", "test")) == whole.num_steps
    assert parts["train"].num_steps == parts["fit"].num_steps + parts["validation"].num_steps
    assert torch.equal(parts["test"].bid_price, whole.bid_price[-parts["test"].num_steps:])
    for bad, match in ((("11:00", "10:30"), "must come before"), (("10:30",), "two clock times"),
                       (("9h", "10:00"), "'9h'"), (("09:00", "09:10"), "leaves 0 step")):
        with pytest.raises(ValueError, match=match):
            load_market(tmp_path / "day", split="fit", **{**kwargs, "split_times": bad})
    assert parse_clock("12:30") == 45_000.0 and parse_clock("13:30:30") == 48_630.0
    assert parse_clock(60) == 60.0
    with pytest.raises(ValueError, match="not a time of day"):
        parse_clock("25:00")


def test_a_folder_of_days_loads_by_index_and_walks_forward(tmp_path) -> None:  # noqa: ANN001
    export_synthetic_days(tmp_path / "days", num_days=3, num_steps=200, levels=2, seed=7)
    days = find_lobster_days(tmp_path / "days")
    assert [str(d.date) for d in days] == ["2012-06-21", "2012-06-22", "2012-06-23"]
    assert {d.ticker for d in days} == {"SYN"}
    cache = tmp_path / "cache"
    one = load_market(tmp_path / "days", days=[1], step_seconds=DT, cache_dir=cache)
    two = load_market(tmp_path / "days", days=[0, 1], step_seconds=DT, cache_dir=cache)
    assert two.num_steps == 400 and torch.equal(two.bid_price[200:], one.bid_price)
    assert float(two.time[200] - one.time[0]) == 86_400.0  # the real overnight gap, clock of day kept
    assert bool(two.halted[200]) and int(two.halted.sum()) == 1  # nothing executes across the join
    assert walk_forward(3) == [([0], 1), ([0, 1], 2)]
    assert walk_forward(4, min_fit_days=1, max_fit_days=1) == [([0], 1), ([1], 2), ([2], 3)]
    with pytest.raises(ValueError, match="ambiguous"):
        load_market(tmp_path / "days", step_seconds=DT, cache_dir=cache)
    with pytest.raises(ValueError, match="days holds 3"):
        load_market(tmp_path / "days", days=[3], step_seconds=DT, cache_dir=cache)
    with pytest.raises(ValueError, match="increasing"):
        load_market(tmp_path / "days", days=[1, 0], step_seconds=DT, cache_dir=cache)
    with pytest.raises(ValueError, match="leave no test day"):
        walk_forward(1)
    with pytest.raises(ValueError, match="cuts one day"):
        load_market(tmp_path / "days", days=[0, 1], split="fit", split_times=("10:00", "10:30"),
                    step_seconds=DT, cache_dir=cache)


def test_several_sources_join_with_the_same_levels_only(tmp_path) -> None:  # noqa: ANN001
    export_lobster(generate_synthetic(200, levels=3, seed=1), tmp_path / "a", ticker="AAA")
    export_lobster(generate_synthetic(150, levels=2, seed=2), tmp_path / "b", ticker="BBB")
    cache = tmp_path / "cache"
    joined = load_market([tmp_path / "a", tmp_path / "b"], levels=2, step_seconds=DT, cache_dir=cache)
    assert joined.num_steps == 350 and joined.num_levels == 2 and bool(joined.halted[200])
    assert bool((torch.diff(joined.time) > 0).all())
    with pytest.raises(ValueError, match=r"markets\[1\].*has 2 levels, markets\[0\] 3"):
        load_market([tmp_path / "a", tmp_path / "b"], step_seconds=DT, cache_dir=cache)
    with pytest.raises(ValueError, match="markets is empty"):
        concat_markets([])
