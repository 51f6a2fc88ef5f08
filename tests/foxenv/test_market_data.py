"""MarketData contract: validate(), mid/spread helpers, slice/split/to, and load_market's arguments."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch

from foxenv.data import DEFAULT_PRICE_BAND, FLOW_WIDTH, MarketData, load_market


def tiny_market(steps: int = 4, levels: int = 2) -> MarketData:
    """A hand-made valid timeline: bid 10.00, 9.99; ask 10.02, 10.03 (+1 tick per step)."""
    step = torch.arange(steps, dtype=torch.float64)[:, None] * 0.01
    depth = torch.arange(levels, dtype=torch.float64)[None, :] * 0.01
    return MarketData(
        bid_price=10.00 + step - depth,
        bid_size=torch.full((steps, levels), 100.0),
        ask_price=10.02 + step + depth,
        ask_size=torch.full((steps, levels), 200.0),
        flow_ref_tick=1000 + torch.arange(steps, dtype=torch.int64),
        exec_bid=torch.zeros(steps, FLOW_WIDTH),
        exec_ask=torch.zeros(steps, FLOW_WIDTH),
        cancel_bid=torch.zeros(steps, FLOW_WIDTH),
        cancel_ask=torch.zeros(steps, FLOW_WIDTH),
        time=torch.arange(1, steps + 1, dtype=torch.float64),
        halted=torch.zeros(steps, dtype=torch.bool),
        tick_size=0.01,
        name="tiny",
    )


def test_valid_market_passes_and_helpers_are_hand_checked() -> None:
    market = tiny_market()
    assert market.validate() is market
    assert market.num_steps == 4 and market.num_levels == 2 and market.device.type == "cpu"
    expected_mid = torch.tensor([10.01, 10.02, 10.03, 10.04], dtype=torch.float64)
    torch.testing.assert_close(market.mid_price(), expected_mid)
    assert market.spread_ticks().tolist() == [2, 2, 2, 2]


def with_value(market: MarketData, name: str, index: tuple, value: float) -> MarketData:
    """A copy of ``market`` with one element of field ``name`` replaced."""
    tensor = getattr(market, name).clone()
    tensor[index] = value
    return replace(market, **{name: tensor})


@pytest.mark.parametrize(
    ("name", "index", "value", "pattern"),
    [
        ("bid_price", (1, 0), float("nan"), r"bid_price\(1, 0\)=nan is not finite"),
        ("ask_size", (0, 1), float("inf"), r"ask_size\(0, 1\)=inf is not finite"),
        ("bid_size", (2, 0), -1.0, r"bid_size\(2, 0\)=-1.0 must be >= 0"),
        ("exec_ask", (3, 5), -2.0, r"exec_ask\(3, 5\)=-2.0 must be >= 0"),
        ("cancel_bid", (0, 0), -0.5, r"cancel_bid\(0, 0\)=-0.5 must be >= 0"),
        ("bid_price", (0, 1), -0.01, r"bid_price\(0, 1\)=-0.01 must be > 0"),
        ("ask_price", (2, 1), 10.035, r"ask_price\(2, 1\)=10.035 is not a multiple of tick_size"),
        ("bid_price", (1, 1), 10.01, r"bid_price\[1\] is not strictly decreasing between levels 0 and 1"),
        ("ask_price", (0, 1), 10.02, r"ask_price\[0\] is not strictly increasing between levels 0 and 1"),
        ("bid_price", (2, 0), 10.04, r"crossed book at step 2: bid_price=10.04 >= ask_price=10.04"),
        ("time", (2,), 1.5, r"time\[2\]=1.5 < time\[1\]=2.0"),
    ],
)
def test_validate_names_the_bad_field(name: str, index: tuple, value: float, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        with_value(tiny_market(), name, index, value).validate()


def test_validate_checks_shape_dtype_and_tick() -> None:
    market = tiny_market()
    with pytest.raises(ValueError, match=r"exec_bid has shape \(4, 63\), must be \(4, 64\)"):
        replace(market, exec_bid=torch.zeros(4, FLOW_WIDTH - 1)).validate()
    with pytest.raises(ValueError, match="bid_size has dtype torch.float64, must be torch.float32"):
        replace(market, bid_size=market.bid_size.double()).validate()
    with pytest.raises(ValueError, match="halted has dtype torch.int64, must be torch.bool"):
        replace(market, halted=torch.zeros(4, dtype=torch.int64)).validate()
    with pytest.raises(ValueError, match=r"flow_ref_tick has shape \(3,\), must be \(4,\)"):
        replace(market, flow_ref_tick=market.flow_ref_tick[:3]).validate()
    with pytest.raises(ValueError, match="tick_size=0.0 must be > 0"):
        replace(market, tick_size=0.0).validate()


def test_slice_split_and_to() -> None:
    market = tiny_market(steps=10)
    part = market.slice(2, 5)
    assert part.num_steps == 3 and torch.equal(part.time, market.time[2:5])
    train, test = market.split(0.7)
    assert (train.num_steps, test.num_steps) == (7, 3)
    assert float(train.time[-1]) < float(test.time[0])
    assert torch.equal(torch.cat([train.exec_bid, test.exec_bid]), market.exec_bid)
    moved = market.to("cpu")
    assert moved.tick_size == market.tick_size and torch.equal(moved.bid_price, market.bid_price)
    with pytest.raises(ValueError, match="train_fraction=1.0"):
        market.split(1.0)
    with pytest.raises(ValueError, match="start=5, stop=5"):
        market.slice(5, 5)


def test_load_market_split_and_argument_errors() -> None:
    full = load_market(num_steps=500, seed=2)
    train = load_market(num_steps=500, seed=2, split="train")
    test = load_market(num_steps=500, seed=2, split="test", train_fraction=0.8)
    assert (train.num_steps, test.num_steps) == (400, 100)
    assert torch.equal(torch.cat([train.ask_price, test.ask_price]), full.ask_price)
    assert float(train.time[-1]) < float(test.time[0])
    with pytest.raises(ValueError, match="split='holdout' must be one of 'all', 'train', 'test', 'fit', "):
        load_market(num_steps=100, split="holdout")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="train_fraction=0.0"):
        load_market(num_steps=100, split="train", train_fraction=0.0)
    with pytest.raises(ValueError, match="train_fraction=1.5"):
        load_market(num_steps=100, train_fraction=1.5)
    with pytest.raises(ValueError, match="num_steps=0"):
        load_market(num_steps=0)
    with pytest.raises(ValueError, match="source='nowhere'"):
        load_market("nowhere")
    with pytest.raises(ValueError, match="source=.*pair"):
        load_market(("only_one.csv",))


def test_fit_and_validation_cut_the_train_split_and_never_touch_the_test_split() -> None:
    train = load_market(num_steps=500, seed=2, split="train")
    fit = load_market(num_steps=500, seed=2, split="fit")
    validation = load_market(num_steps=500, seed=2, split="validation")
    assert (fit.num_steps, validation.num_steps) == (300, 100)  # 400 train steps: 75 % / 25 %
    assert torch.equal(torch.cat([fit.ask_price, validation.ask_price]), train.ask_price)
    test = load_market(num_steps=500, seed=2, split="test")
    assert float(validation.time[-1]) < float(test.time[0])  # model selection ends before the test split
    other = load_market(num_steps=500, seed=2, split="validation", validation_fraction=0.5)
    assert other.num_steps == 200
    with pytest.raises(ValueError, match="validation_fraction=1.0 must lie strictly between 0 and 1"):
        load_market(num_steps=500, split="fit", validation_fraction=1.0)
    with pytest.raises(ValueError, match="validation_fraction=0.001 leaves an empty fit or validation split"):
        load_market(num_steps=500, split="validation", validation_fraction=0.001)


@pytest.mark.gpu
def test_load_market_on_cuda() -> None:
    market = load_market(num_steps=1000, device="cuda")
    assert market.device.type == "cuda" and market.flow_ref_tick.device.type == "cuda"
    market.validate()


def test_load_market_takes_the_lobster_checks_as_keywords() -> None:
    parameters = inspect.signature(load_market).parameters
    for name, default in (("price_band", DEFAULT_PRICE_BAND), ("tick_size", None)):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY and parameters[name].default == default
    with pytest.raises(ValueError, match="tick_size=0.01 applies to LOBSTER sources only"):
        load_market(num_steps=100, tick_size=0.01)


def test_load_market_passes_a_planted_signal_to_the_synthetic_generator() -> None:
    from foxenv.data import load_market

    plain = load_market("synthetic", num_steps=300, seed=4)
    off = load_market("synthetic", num_steps=300, seed=4, signal_strength=0.0, signal_horizon=5)
    planted = load_market("synthetic", num_steps=300, seed=4, signal_strength=1.0, signal_horizon=5)
    assert torch.equal(plain.bid_price, off.bid_price) and torch.equal(plain.ask_size, off.ask_size)
    assert not torch.equal(plain.bid_price, planted.bid_price)


def test_load_market_refuses_a_planted_signal_on_lobster_files(tmp_path) -> None:
    from foxenv.data import load_market

    with pytest.raises(ValueError, match="signal_strength=0.5.*synthetic market only"):
        load_market(tmp_path, signal_strength=0.5)
