"""Planted waves of the synthetic market: off is the same market bit for bit, the knobs are checked, the onset
shows in the observation and the end only weakly, the mid drifts for the wave and gives part of it back."""

from __future__ import annotations

import pytest
import torch

from foxenv.config import EnvConfig
from foxenv.data import generate_synthetic
from foxenv.data.synthetic import SyntheticProfile, signal_from_imbalance, wave_schedule
from foxenv.features import market_features
from tests.foxenv.test_synthetic import TENSOR_FIELDS

STEPS = 8_000
WAVES = {"wave_rate": 0.02, "wave_length_mean": 20.0, "wave_drift_ticks": 5.0, "wave_end_signal": 0.5,
         "wave_reversal": 0.5}


def shown_signal(market) -> torch.Tensor:
    """The signal each row's observation shows in its top-of-book imbalance feature (``2 atanh``)."""
    config = EnvConfig()
    imbalance = market_features(market, config)[:, 4 * config.levels].double()  # what the agent sees
    return signal_from_imbalance(imbalance)


@pytest.fixture(scope="module")
def waves():
    """A wave market and its schedule."""
    return generate_synthetic(STEPS, seed=4, **WAVES), wave_schedule(STEPS, 4, **WAVES)


@pytest.mark.parametrize("planted", [{}, {"signal_strength": 1.0, "signal_horizon": 3}])
def test_waves_off_is_the_market_bit_for_bit(planted: dict) -> None:
    plain = generate_synthetic(2_000, seed=2, **planted)
    off = generate_synthetic(2_000, seed=2, wave_rate=0.0, wave_length_mean=7.0, wave_drift_ticks=9.0,
                             wave_onset_signal=1.0, wave_end_signal=3.0, wave_reversal=1.0, **planted)
    for name in TENSOR_FIELDS:
        assert torch.equal(getattr(plain, name), getattr(off, name)), name
    assert off.name == plain.name


@pytest.mark.parametrize(("knob", "value", "message"), [
    ("wave_rate", -0.1, "wave_rate=-0.1 must lie in [0, 1]"),
    ("wave_rate", 1.5, "wave_rate=1.5 must lie in [0, 1]"),
    ("wave_length_mean", 0.5, "wave_length_mean=0.5 must be >= 1"),
    ("wave_drift_ticks", -1.0, "wave_drift_ticks=-1.0 must be >= 0"),
    ("wave_onset_signal", -2.0, "wave_onset_signal=-2.0 must be >= 0"),
    ("wave_end_signal", -0.5, "wave_end_signal=-0.5 must be >= 0"),
    ("wave_reversal", 1.2, "wave_reversal=1.2 must lie in [0, 1]"),
    ("wave_rate", float("nan"), "wave_rate=nan must be a finite number"),
])
def test_wave_knobs_are_checked_with_one_line_errors(knob: str, value: float, message: str) -> None:
    for make in (lambda: generate_synthetic(100, **{**WAVES, knob: value}),
                 lambda: wave_schedule(100, 0, **{**WAVES, knob: value})):
        with pytest.raises(ValueError) as error:
            make()
        assert str(error.value) == message
    with pytest.raises(ValueError, match="wave_rate=0.0: the market has no waves"):
        wave_schedule(100, 0)


def test_the_onset_shows_in_the_imbalance_and_the_end_only_weakly(waves) -> None:
    market, schedule = waves
    assert "waves=0.02x20" in market.name
    shown = shown_signal(market)
    onset, end = schedule.onset.nonzero().squeeze(1), schedule.end.nonzero().squeeze(1)
    assert 50 < onset.numel() < 150  # a wave every ~50 quiet + 2 x 20 wave rows
    side_at_onset, side_at_end = schedule.hold[onset], schedule.hold[end - 1]
    assert bool((side_at_onset != 0).all()) and bool((side_at_end != 0).all())
    # the mark, in standard deviations of the imbalance's noise, at its sign
    assert float((shown[onset] * side_at_onset).mean()) == pytest.approx(4.0, abs=0.3)
    assert float((-shown[end] * side_at_end).mean()) == pytest.approx(0.5, abs=0.3)
    # a threshold rule on the observation finds nearly every onset and its side, and few other rows ...
    quiet = ~(schedule.onset | schedule.end)
    rule = 2.5
    assert float(((shown[onset] * side_at_onset) > rule).double().mean()) > 0.9
    assert float((shown[quiet].abs() > rule).double().mean()) < 0.03
    # ... but the end hides in the noise: the same rule finds few ends, and the best rule few more
    assert float(((-shown[end] * side_at_end) > rule).double().mean()) < 0.1
    assert float(((-shown[end] * side_at_end) > 0.5).double().mean()) < 0.6


def test_the_mid_drifts_for_the_wave_and_gives_back_its_reversal(waves) -> None:
    market, schedule = waves
    mid = (market.bid_price[:, 0] + market.ask_price[:, 0]) / 2 / market.tick_size
    onset, end = schedule.onset.nonzero().squeeze(1), schedule.end.nonzero().squeeze(1)
    onset = onset[: end.numel()]
    length = end - onset
    assert float(length.double().mean()) == pytest.approx(20.0, rel=0.15)
    assert int(length.min()) >= 1
    side = schedule.hold[onset]
    run = (mid[end] - mid[onset]) * side
    assert float(run.sum() / length.sum()) == pytest.approx(5.0, rel=0.25)  # ticks a step of the wave
    back = end + length < mid.numel()
    reversal = (mid[(end + length)[back]] - mid[end[back]]) * side[back]
    assert float(reversal.sum() / length[back].sum()) == pytest.approx(-2.5, rel=0.5)  # half given back
    # the schedule holds the wave's side from its onset to the row before its end, and is flat there
    assert bool((schedule.hold[end - 1] == side).all()) and bool((schedule.hold[end] == 0).all())
    assert int((schedule.hold != 0).sum()) >= int(length.sum())

def test_the_default_profile_has_no_waves() -> None:
    assert SyntheticProfile().wave_rate == 0.0
