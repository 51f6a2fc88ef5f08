"""A seeded synthetic limit-order-book market: the built-in data source that needs no files.

The mid follows regime-switching drift (trends of both signs and varied length, plus flat regimes)
on top of volatility-clustered noise, with a weak pull back to the start price over very long
horizons. The spread, the gaps between levels and the level sizes follow the statistics of the real
GOOG LOBSTER file (2012-06-21, 10 levels, aggregated at 100 messages per step), measured on this
project's development machine (CPU) from ``/work/shared/data/lobster``:

=========================================  ==========================================
statistic (GOOG, per 100-message step)      value
=========================================  ==========================================
mid price                                   563.73 to 579.82 USD (start 579.815)
L1 spread, ticks: 1/5/10/25/50 %            5 / 11 / 14 / 20 / 28
L1 spread, ticks: 75/90/95/99 %, mean       36 / 46 / 52 / 75, 29.6
gap between adjacent levels, ticks          10/25/50/75/90 % = 1 / 1 / 2-3 / 5 / 8-9, mean 3.9 (bid) 4.5 (ask)
level size, shares: 10/25/50/75/90/99 %     8 / 12 / 100 / 100 / 200 / 1000 (round lots dominate)
mid change per step, ticks                  std 14.2, mean abs 10.6
autocorrelation of abs change, lags 1-50    0.10 to 0.12 (volatility clustering)
executed volume per step (types 4 + 5)      mean 477 shares (333 visible + 144 hidden)
visible executions (type 4) by level        100 % at the touch of the book before the message
cancelled volume by level 1..10 (2 + 3)     27 / 19 / 11 / 9 / 8 / 7 / 6 / 5 / 4 / 4 % (bid, ask alike)
seconds per step                            mean 15.8, median 13.3
=========================================  ==========================================

The default profile (seed 0, 50,000 steps, same machine) gives: L1 spread percentiles
1/5/10/25/50/75/90/95/99 % = 10 / 13 / 16 / 21 / 27 / 36 / 47 / 55 / 72 ticks (mean 29.9); level gaps
10/25/50/75/90 % = 1 / 2 / 3 / 5 / 9 ticks (mean 4.0); level sizes 10/25/50/75/90/99 % = 2 / 25 / 100 /
100 / 200 / 1100; mid change per step std 14.0 ticks, mean abs 10.6; autocorrelation of the abs change
0.13 / 0.12 / 0.08 at lags 1 / 10 / 50; executed volume 379 shares per step (437 before the sweep gate
below, 342 without the metaorders, 361 before the simulator audit); cancelled volume at the previous
book's levels 1..10, relative to levels 1-3 (before the sweep gate), 44 / 33 / 23 / 17 / 13 / 11 / 9 /
6-9 / 5-6 / 4 % (GOOG: 46 / 35 / 19 / 16 / 13 / 11 / 10 / 8 / 7 / 7 %); the mid ranged over 556.16 to
635.19 USD.

Everything is drawn on CPU from one ``torch.Generator`` seeded with ``seed`` and moved to
``device`` at the end, so a seed gives the same timeline on every device. The generator is
vectorised: smoothing is a ``conv1d``/FFT, regimes come from a ``searchsorted`` over cumulative
regime lengths, flows are placed with ``scatter_add_``; there is no Python loop over steps.

Order flow in step ``t`` is derived from the book at the end of step ``t - 1`` (the step's start) and
the book at its end: ask levels the new best ask has moved past were taken out, mostly by
buyer-initiated executions (the rest cancelled), and symmetrically for bids when the price falls;
the touch that survives is partly executed, more so on the side the price moved towards;
cancellations hit the levels near the touch most.

Since the simulator audit (``experiments/simulator_audit.py``, ``experiments/README.md``) the flow is
informative as on GOOG: the aggressive flow of a step leans toward the mid move of the next step
(``adverse_selection``), and a touch trades only in some steps, mostly on the side the price is moving
toward (``trade_probability``; GOOG trades a side in 63 % of its 100-message steps). In the audit's
market a resting order one tick inside the spread fills within a step in 57 % of steps (GOOG 34 %),
mostly before the mid moves against it, instead of in 98 % whatever the move: its mark-out 20 steps after
the fill falls from +13.5 ticks to +1.5 (GOOG +1.0; the audit's table).
``generate_synthetic(..., **LEGACY_FLOW)`` gives the market before the audit bit for bit.

The audit's flow still predicted the next move far less than GOOG's (correlation of a step's signed flow
with the next step's mid move 0.03, GOOG 0.15) and had no memory (flow autocorrelation 0.03, GOOG 0.12),
because most of it executes the levels the price moves past within its own step. So the market carries
persistent metaorders: a latent order-flow imbalance ``z_t``, a stationary AR(1) series
(``flow_persistence``), trades ``flow_volume * |z_t|`` shares at the touch on its side and pushes the mid
of the next step by ``flow_impact`` of its noise (the mid change keeps its variance; as ``z`` persists, a
metaorder keeps pushing, less and less, over the following steps; the price does not revert). The
metaorders trade only in the steps where that touch trades at all, which the price moving their way makes
likely: trading whatever the move, their fills gave resting orders at and inside the spread the half
spread back (mark-outs +3 to +5 ticks). With them (seed 0, 50,000 steps, before the sweep gate below;
``experiments/simulator_audit.py``) the flow predicts the next move with correlation 0.156 and its
autocorrelation is 0.118 (GOOG 0.148 / 0.121; the audit's market 0.031 / 0.026); the mid change's own
autocorrelation is 0.065 (GOOG 0.061, audit 0.017). A resting order one tick inside the spread, filled
within one / five steps, marks out at +0.9 / +0.9 ticks (GOOG +1.0 / -0.5, audit +1.5 / +1.6), one at the
touch at -0.5 / -0.6 (GOOG +0.6 / -0.7); orders 1-3 ticks behind the touch filled within a step pay more
than on GOOG (-2.1 / -1.9 ticks against +0.8 / +2.3, audit -1.0 / -1.1): on GOOG the large moves that
reach them partly revert, here they do not.
``generate_synthetic(..., **AUDIT_FLOW)`` gives the audit's market, without metaorders, bit for bit.

That market still gave a maker without information an edge (issue 39): every level the price moved past was
executed, however small the move (GOOG cancels 30 % of them, mostly in small moves), and a surviving touch
traded in 17 % of the steps the price moved away from it (GOOG 8 %), so a bid one tick above the touch
filled in 56 % of steps (GOOG 35 %) and marked out +6.0 ticks at the next step (GOOG +0.6). With the
0.2 bps rebate (1.2 ticks a share) a maker flipping long and short every step beat flat on every held-out
seed (``experiments/free_edge.py``). Now the levels the price moves past trade with a probability that
grows with the move (``sweep_trade_probability``), the surviving touch trades half as often
(``trade_probability`` 0.15), the metaorders also trade where they swept the touch, and the default maker
fee is 0 (:class:`foxenv.config.EnvConfig`): that maker loses 0.5 ticks a share (GOOG, without the rebate,
1.2). At the defaults (seed 0, 50,000 steps) the flow predicts the next move with correlation 0.134 and its
autocorrelation is 0.108 (GOOG 0.148 / 0.121). The book and the mid path are those of before;
``generate_synthetic(..., **METAORDER_FLOW)`` gives that market's flow bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import torch

from foxenv.checks import check_seed
from foxenv.data.market import MarketData
from foxenv.data.synthetic_flow import book_flows


@dataclass(frozen=True)
class SyntheticProfile:
    """Knobs of the synthetic market; defaults follow the GOOG file (see the module docstring).

    :param start_price: mid price of the first step, in currency.
    :param step_seconds: clock seconds per step (``time`` is ``step_seconds * (t + 1)``).
    :param regime_steps: mean length of a drift regime, in steps (lengths are exponential, >= 1).
    :param flat_fraction: share of regimes with no drift.
    :param drift_ticks: standard deviation of a trending regime's drift, in ticks per step.
    :param vol_ticks: median standard deviation of the per-step noise, in ticks.
    :param vol_of_vol: standard deviation of the log-volatility.
    :param vol_memory: e-folding time of the log-volatility, in steps.
    :param reversion_steps: e-folding time of the pull of the (log) mid back to ``start_price``.
    :param spread_median_ticks: median L1 spread, in ticks.
    :param spread_log_std: standard deviation of the log spread.
    :param spread_memory: e-folding time of the spread's own noise, in steps.
    :param spread_vol_corr: correlation of the log spread with the log-volatility.
    :param gap_scale_ticks: a level gap is ``1 + floor(Exponential * gap_scale_ticks)`` ticks.
    :param odd_lot_fraction: share of levels holding an odd lot (1 to 99 shares).
    :param round_lot: shares per round lot.
    :param lot_tail_alpha: a level holds ``floor(Pareto(lot_tail_alpha))`` round lots: ``P(lots >= k) =
        k ** -lot_tail_alpha``.
    :param max_lots: most round lots on one level (bounds the Pareto tail).
    :param exec_fraction: mean share of the surviving touch executed per step.
    :param consumed_exec_min: a level the price moved past was at least this share executed.
    :param cancel_fraction: mean share of the touch cancelled per step.
    :param cancel_power: the cancelled share of level ``k`` (0 = touch) scales as
        ``(k + 1) ** -cancel_power``.
    :param signal_strength: planted signal (0 = none, the market is then bit for bit the one without these
        two knobs): a standard normal ``s_t`` shown in the top-of-book imbalance ``tanh(s_t / 2)`` of row
        ``t`` moves the mid by ``signal_strength * vol_ticks / sqrt(signal_horizon) * s_t`` ticks in each of
        the next ``signal_horizon`` steps, so the predictable part of the ``signal_horizon``-step move has
        ``signal_strength`` times the standard deviation of its median noise (:func:`signal_drift_ticks`).
    :param signal_horizon: steps ``k`` over which a planted signal moves the mid; >= 1.
    :param adverse_selection: how much the trade flow of a step leans toward the mid move of the *next*
        step: the aggressive flow's buy pressure is ``sigmoid(2 (move_t + adverse_selection * move_{t+1})
        / vol_t)``, so executions against resting bids come before falls and those against asks before
        rises, as on GOOG (``experiments/simulator_audit.py``); 0 = flow tied to the step's own move only.
    :param trade_probability: mean probability that the surviving touch of a side trades in a step; it
        trades with probability ``min(1, 2 * trade_probability * pressure)`` (its side's pressure), so
        resting orders on the side the price moves away from are rarely hit: a surviving bid trades in 9 %
        of the steps where the best bid does not fall (GOOG 8 %; 0.3 before the sweep gate: 17 %). With the
        levels the price moves past, a side trades at or beyond its starting touch in about 40 % of steps,
        and a bid one tick above the touch fills in 39 % (GOOG 35 %; 63 % with the trades at levels formed
        inside the spread during the step, which this market lacks and which no order resting at or behind
        the touch could meet). 1 with ``adverse_selection=0`` gives the market before the simulator audit
        bit for bit (:data:`LEGACY_FLOW`), where both touches trade every step.
    :param sweep_trade_probability: mean probability that the levels the price moves past in a step were
        executed (swept by marketable orders) rather than cancelled: they trade with probability ``min(1, 2
        * sweep_trade_probability * sigmoid(+-2 move_t / vol_t))`` (this step's move, toward the side), so
        a bid the price fell past was executed mostly in large falls, as on GOOG (100 messages a step: 70 %
        of the steps where the best bid falls, the mid falling 13.7 ticks where it was executed against 7.5
        where it was cancelled; here, seed 1: 74 %, 12.7 against 7.2). 1 = always executed, whatever the
        move (the market before issue 39, :data:`METAORDER_FLOW`, where a buy one tick above the bid filled
        in 56 % of steps and a no-information maker earned the spread).
    :param flow_persistence: AR(1) coefficient per step of the latent order-flow imbalance ``z_t``, a
        stationary unit-variance series: metaorders that keep buying (``z_t > 0``) or selling over several
        steps; in ``[0, 1)``.
    :param flow_volume: shares a step the metaorders trade per unit of imbalance: ``flow_volume * |z_t|``
        shares are bought at the step's starting best ask (``z_t > 0``) or sold at its best bid, on top of
        the visible book (hidden and replenished liquidity: GOOG executes 144 of its 477 shares a step
        against hidden orders), in the steps where that touch trades at all (``trade_probability``; every
        step at 1) or was swept away (``sweep_trade_probability``); >= 0, 0 = none.
    :param flow_impact: price impact of the imbalance, as a share of the mid's noise: the noise of step
        ``t + 1`` becomes ``vol_{t+1} * (sqrt(1 - flow_impact**2) * noise + flow_impact * z_t)`` ticks (its
        variance is kept), so the imbalance that trades in step ``t`` pushes the price in step ``t + 1``
        and, through its persistence, in the steps after (``flow_persistence ** k``); in ``[0, 1]``, 0 =
        none. ``flow_volume = flow_impact = 0`` gives the market of the simulator audit, without
        metaorders, bit for bit (:data:`AUDIT_FLOW`).
    :param wave_rate: planted trends ("waves", :func:`wave_schedule`): the chance per quiet step that a wave
        starts (the quiet gap between waves is ``1 / wave_rate`` steps on average); in ``[0, 1]``, 0 = none
        (the market is then bit for bit the one without the ``wave_*`` knobs). A wave shows its side in the
        top-of-book imbalance of its onset row (``wave_onset_signal``), then moves the mid by
        ``wave_drift_ticks`` a step its way for its length, then gives back ``wave_reversal`` of that move
        over as many steps; only a weak mark (``wave_end_signal``) shows its end. Exiting early forgoes the
        rest of the wave, holding on pays the reversal: exit timing is the skill.
    :param wave_length_mean: mean steps of a wave's drift (lengths ``1 +`` an Erlang-4 draw, rounded: the
        time in a trade says something about the end); >= 1.
    :param wave_drift_ticks: a wave's drift, in ticks per step; >= 0.
    :param wave_onset_signal: the onset row's imbalance shows ``tanh((noise + side * wave_onset_signal) / 2)``
        (``noise`` is the planted signal where there is one, else a standard normal): in standard deviations
        of the imbalance's noise; >= 0.
    :param wave_end_signal: the end row (the wave's peak) shows ``-side * wave_end_signal`` over the same
        noise: a weak hint at the default; >= 0.
    :param wave_reversal: share of a wave's move given back after its end, over as many steps as the wave
        lasted; in ``[0, 1]``.
    """

    start_price: float = 580.0
    step_seconds: float = 15.8
    regime_steps: float = 400.0
    flat_fraction: float = 0.25
    drift_ticks: float = 1.5
    vol_ticks: float = 12.5
    vol_of_vol: float = 0.3
    vol_memory: float = 100.0
    reversion_steps: float = 20_000.0
    spread_median_ticks: float = 28.0
    spread_log_std: float = 0.42
    spread_memory: float = 10.0
    spread_vol_corr: float = 0.5
    gap_scale_ticks: float = 3.5
    odd_lot_fraction: float = 0.4
    round_lot: int = 100
    lot_tail_alpha: float = 1.7
    max_lots: int = 100
    exec_fraction: float = 0.5
    consumed_exec_min: float = 0.5
    cancel_fraction: float = 0.6
    cancel_power: float = 1.5
    signal_strength: float = 0.0
    signal_horizon: int = 1
    adverse_selection: float = 1.0
    trade_probability: float = 0.15
    sweep_trade_probability: float = 0.45
    flow_persistence: float = 0.4
    flow_volume: float = 300.0
    flow_impact: float = 0.35
    wave_rate: float = 0.0
    wave_length_mean: float = 20.0
    wave_drift_ticks: float = 10.0
    wave_onset_signal: float = 4.0
    wave_end_signal: float = 1.0
    wave_reversal: float = 1.0

    def validate(self) -> SyntheticProfile:
        """Check every knob's range.

        :return: ``self``.
        :raises ValueError: naming the knob and its value.
        """
        for name, value in asdict(self).items():
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name}={value!r} must be a finite number")
        positive = ("start_price", "step_seconds", "regime_steps", "vol_ticks", "vol_memory",
                    "reversion_steps", "spread_median_ticks", "spread_memory", "round_lot",
                    "lot_tail_alpha", "max_lots")
        non_negative = ("drift_ticks", "vol_of_vol", "spread_log_std", "gap_scale_ticks",
                        "exec_fraction", "cancel_fraction", "cancel_power", "signal_strength",
                        "adverse_selection", "flow_volume", "wave_drift_ticks", "wave_onset_signal",
                        "wave_end_signal")
        unit_interval = ("flat_fraction", "odd_lot_fraction", "consumed_exec_min", "trade_probability",
                         "sweep_trade_probability",
                         "flow_impact", "wave_rate", "wave_reversal")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        for name in unit_interval:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1]")
        if not 0.0 <= self.flow_persistence < 1.0:
            raise ValueError(f"flow_persistence={self.flow_persistence} must lie in [0, 1)")
        if not -1.0 <= self.spread_vol_corr <= 1.0:
            raise ValueError(f"spread_vol_corr={self.spread_vol_corr} must lie in [-1, 1]")
        if float(self.signal_horizon) != int(self.signal_horizon) or self.signal_horizon < 1:
            raise ValueError(f"signal_horizon={self.signal_horizon} must be an integer >= 1")
        if self.wave_length_mean < 1:
            raise ValueError(f"wave_length_mean={self.wave_length_mean} must be >= 1")
        return self


#: The knobs of the planted waves (``load_market`` and the envs take them by name for a synthetic market).
WAVE_KNOBS: tuple[str, ...] = tuple(name for name in SyntheticProfile.__dataclass_fields__
                                    if name.startswith("wave_"))
#: Salt of the planted signal's own random stream (the market's stream stays untouched by the signal).
_SIGNAL_SALT = 0x5167_4E41
#: Salt of the latent order-flow imbalance's own random stream (the market's stream stays untouched by it).
_FLOW_SALT = 0x0F10_3A11
#: Salt of the waves' own random stream (the market's stream stays untouched by them).
_WAVE_SALT = 0x3A7E_5EED
#: Profile overrides that give the market with metaorders of before the sweep gate (issue 39) bit for bit:
#: every level the price moved past was executed, and a surviving touch traded at twice today's rate.
METAORDER_FLOW: dict[str, float] = {"trade_probability": 0.3, "sweep_trade_probability": 1.0}
#: Profile overrides that give the market of the simulator audit, before metaorders, bit for bit: its flow
#: leans toward the next move, but carries no persistent imbalance and does not move the price.
AUDIT_FLOW: dict[str, float] = {**METAORDER_FLOW, "flow_volume": 0.0, "flow_impact": 0.0}
#: Profile overrides that give the synthetic flow of before the simulator audit, bit for bit: both touches
#: trade every step, and the flow says nothing about the next move.
LEGACY_FLOW: dict[str, float] = {**AUDIT_FLOW, "adverse_selection": 0.0, "trade_probability": 1.0}


def signal_drift_ticks(profile: SyntheticProfile) -> float:
    """Mid move, in ticks per step over the next ``signal_horizon`` steps, of a unit planted signal.

    :param profile: the knobs.
    :return: ``signal_strength * vol_ticks / sqrt(signal_horizon)``.
    """
    return profile.signal_strength * profile.vol_ticks / math.sqrt(int(profile.signal_horizon))


def signal_from_imbalance(imbalance: torch.Tensor) -> torch.Tensor:
    """Invert the planted signal's encoding: ``s = 2 atanh(imbalance)`` (clamped away from +-1).

    :param imbalance: top-of-book imbalance ``(bid - ask) / (bid + ask)``.
    :return: the signal it shows, same shape.
    """
    return 2.0 * torch.atanh(imbalance.clamp(-0.999999, 0.999999))


def _planted_signal(length: int, seed: int, profile: SyntheticProfile) -> tuple[torch.Tensor, torch.Tensor]:
    """The planted signal of each row and the mid increments it causes.

    :param length: rows.
    :param seed: the market's seed (the signal draws from its own stream, salted).
    :param profile: the knobs.
    :return: ``(signal [length], extra increments [length])``, float64; increment ``t`` holds
        ``signal_drift_ticks * sum_{j=1..k} signal[t - j]``.
    """
    generator = torch.Generator(device="cpu").manual_seed((int(seed) + _SIGNAL_SALT) % 2**63)
    signal = torch.randn(length, generator=generator, dtype=torch.float64)
    horizon = int(profile.signal_horizon)
    cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(signal, 0)])
    rows = torch.arange(length)
    # sum of signal[t - k .. t - 1] = cumulative[t] - cumulative[max(t - k, 0)]
    window = cumulative[rows] - cumulative[(rows - horizon).clamp(min=0)]
    return signal, signal_drift_ticks(profile) * window


class WaveSchedule(NamedTuple):
    """The planted waves of a market (:func:`wave_schedule`), row by row.

    :param drift: ``[n]`` float64 ticks the waves add to the mid's move into each row.
    :param marks: ``[n]`` float64 what the waves show in each row's imbalance, in standard deviations of its
        noise (``+side * wave_onset_signal`` at an onset, ``-side * wave_end_signal`` at an end).
    :param hold: ``[n]`` int64 the side a trader who knows the waves holds after seeing each row: the wave's
        side from its onset row up to the row before its end, 0 elsewhere.
    :param onset: ``[n]`` bool rows that show a wave's onset.
    :param end: ``[n]`` bool rows at a wave's end (its peak: the reversal's first move comes next).
    :param noise: ``[n]`` float64 the imbalance's noise where there is no planted signal.
    """

    drift: torch.Tensor
    marks: torch.Tensor
    hold: torch.Tensor
    onset: torch.Tensor
    end: torch.Tensor
    noise: torch.Tensor

    def rows(self, start: int) -> WaveSchedule:
        """The schedule from row ``start`` on."""
        return WaveSchedule(*(values[start:] for values in self))


def _waves(length: int, seed: int, profile: SyntheticProfile) -> WaveSchedule:
    """The waves of a generated timeline of ``length`` rows (row 0 is the book before the first step).

    Cycles of a quiet gap (``1 + floor(Exponential * (1 / wave_rate - 1))`` rows), the onset row ``o``, the
    wave's ``L`` drifting moves (into rows ``o + 1 .. o + L``; its end row ``o + L`` is the peak) and ``L``
    reversal moves, laid end to end; every draw comes from the waves' own stream (no loop over rows).

    :param length: rows.
    :param seed: the market's seed (salted).
    :param profile: the knobs (``wave_rate > 0``).
    :return: the schedule, rows of the generator.
    """
    generator = torch.Generator(device="cpu").manual_seed((int(seed) + _WAVE_SALT) % 2**63)
    count = length // 3 + 2  # a cycle spans >= 3 rows: enough waves to cover the timeline
    f64 = torch.float64
    gaps = 1 + torch.floor(torch.empty(count, dtype=f64).exponential_(generator=generator)
                           * (1.0 / profile.wave_rate - 1.0)).to(torch.int64)
    erlang = torch.empty((count, 4), dtype=f64).exponential_(generator=generator).sum(1) / 4.0
    lengths = 1 + torch.round(erlang * (profile.wave_length_mean - 1.0)).to(torch.int64)
    sides = torch.where(torch.rand(count, generator=generator, dtype=f64) < 0.5, -1, 1)
    noise = torch.randn(length, generator=generator, dtype=f64)
    cycles = gaps + 2 * lengths
    onsets = torch.cumsum(cycles, 0) - 2 * lengths  # cycle k starts where cycle k - 1's reversal ended
    rows = torch.arange(length)
    wave = (torch.searchsorted(onsets, rows, right=True) - 1).clamp(min=0)  # the last onset <= row
    since = rows - onsets[wave]  # rows before the first onset get since < 0: no wave
    side, span = sides[wave], lengths[wave]
    drifting = (since >= 1) & (since <= span)
    reverting = (since > span) & (since <= 2 * span)
    drift = side * profile.wave_drift_ticks * (drifting.to(f64) - profile.wave_reversal * reverting.to(f64))
    onset = since == 0
    end = since == span
    marks = side * (profile.wave_onset_signal * onset.to(f64) - profile.wave_end_signal * end.to(f64))
    hold = torch.where((since >= 0) & (since < span), side, torch.zeros_like(side))
    return WaveSchedule(drift, marks, hold, onset, end, noise)


def wave_schedule(num_steps: int, seed: int = 0, **profile: float) -> WaveSchedule:
    """The planted waves of ``generate_synthetic(num_steps, seed=seed, **profile)``, on its market rows
    (row ``i`` is the market's row ``i``, the snapshot an agent observes before its step ``i + 1``).

    :param num_steps: the market's steps ``T``.
    :param seed: the market's seed.
    :param profile: the market's :class:`SyntheticProfile` knobs (``wave_rate > 0``; ``levels`` and
        ``tick_size`` are ignored).
    :return: ``[T]`` rows of each series.
    :raises ValueError: naming a bad knob, or ``wave_rate`` when it is 0 (no waves).
    """
    knobs = {k: v for k, v in profile.items() if k not in ("levels", "tick_size")}
    unknown = sorted(set(knobs) - set(asdict(SyntheticProfile())))
    if unknown:
        raise ValueError(f"unknown synthetic profile knob(s) {unknown}")
    profile_ = replace(SyntheticProfile(), **knobs).validate()
    if not profile_.wave_rate > 0:
        raise ValueError(f"wave_rate={profile_.wave_rate}: the market has no waves")
    return _waves(int(num_steps) + 1, check_seed(seed, "seed", optional=False), profile_).rows(1)


def _flow_imbalance(length: int, seed: int, persistence: float) -> torch.Tensor:
    """The latent order-flow imbalance: a stationary unit-variance AR(1) series (by FFT, no loop).

    :param length: rows.
    :param seed: the market's seed (the imbalance draws from its own stream, salted).
    :param persistence: AR(1) coefficient in ``[0, 1)``.
    :return: ``[length]`` float64.
    """
    generator = torch.Generator(device="cpu").manual_seed((int(seed) + _FLOW_SALT) % 2**63)
    white = torch.randn(length, generator=generator, dtype=torch.float64)
    if persistence == 0:
        return white
    innovations = white * math.sqrt(1.0 - persistence**2)
    innovations[0] = white[0]  # start in the stationary distribution
    return _decaying_sum(innovations, persistence)


def _smoothed_noise(length: int, memory: float, generator: torch.Generator) -> torch.Tensor:
    """Stationary unit-variance AR(1) noise with e-folding time ``memory`` (by FFT, no loop).

    :param length: number of samples.
    :param memory: e-folding time, in samples.
    :param generator: the random source.
    :return: ``[length]`` float64.
    """
    decay = math.exp(-1.0 / memory)
    innovation_scale = math.sqrt(1.0 - decay**2)
    white = torch.randn(length, generator=generator, dtype=torch.float64) * innovation_scale
    white[0] = white[0] / innovation_scale  # start in the stationary distribution
    return _decaying_sum(white, decay)


def _decaying_sum(values: torch.Tensor, decay: float) -> torch.Tensor:
    """``out[t] = sum_{k <= t} decay**(t - k) * values[k]``, by FFT convolution.

    :param values: ``[n]`` float64.
    :param decay: factor in ``(0, 1]``.
    :return: ``[n]`` float64.
    """
    length = values.numel()
    kernel = decay ** torch.arange(length, dtype=torch.float64)
    size = 1 << (2 * length - 1).bit_length()  # a power of two: FFT sizes with large primes are slow
    product = torch.fft.rfft(values, n=size) * torch.fft.rfft(kernel, n=size)
    return torch.fft.irfft(product, n=size)[:length]


def _regime_drift(length: int, profile: SyntheticProfile, generator: torch.Generator) -> torch.Tensor:
    """Per-step drift, piecewise constant over regimes of exponential length.

    :param length: number of steps.
    :param profile: the knobs.
    :param generator: the random source.
    :return: ``[length]`` float64 drift in ticks per step.
    """
    count = int(2 * length / profile.regime_steps) + 16
    durations = 1.0 + torch.empty(count, dtype=torch.float64).exponential_(generator=generator) * (
        profile.regime_steps - 1.0
    )
    ends = torch.cumsum(durations, 0)
    while ends[-1] < length:  # rare: draw more regimes (a handful of iterations at most)
        more = 1.0 + torch.empty(count, dtype=torch.float64).exponential_(generator=generator) * (
            profile.regime_steps - 1.0
        )
        ends = torch.cat([ends, ends[-1] + torch.cumsum(more, 0)])
    regimes = ends.numel()
    drift = torch.randn(regimes, generator=generator, dtype=torch.float64) * profile.drift_ticks
    flat = torch.rand(regimes, generator=generator, dtype=torch.float64) < profile.flat_fraction
    drift = torch.where(flat, torch.zeros_like(drift), drift)
    regime_of_step = torch.searchsorted(ends, torch.arange(length, dtype=torch.float64), right=True)
    return drift[regime_of_step]


def _level_sizes(
    shape: tuple[int, ...], profile: SyntheticProfile, generator: torch.Generator
) -> torch.Tensor:
    """Visible sizes: round lots (a Pareto number of them) mostly, odd lots (skewed small) sometimes.

    :param shape: output shape.
    :param profile: the knobs.
    :param generator: the random source.
    :return: float64 sizes >= 1.
    """
    odd = torch.rand(shape, generator=generator, dtype=torch.float64) < profile.odd_lot_fraction
    odd_size = 1.0 + torch.floor((profile.round_lot - 1) * torch.rand(shape, generator=generator,
                                                                      dtype=torch.float64) ** 3)
    uniform = 1.0 - torch.rand(shape, generator=generator, dtype=torch.float64)  # in (0, 1]
    lots = torch.floor(uniform ** (-1.0 / profile.lot_tail_alpha)).clamp(max=profile.max_lots)
    return torch.where(odd, odd_size, profile.round_lot * lots)


class _MidPath(NamedTuple):
    """The mid path in ticks and what the book and the flows read off it (``[T + 1]`` each; None where the
    profile has no metaorders, no planted signal or no waves)."""

    mid: torch.Tensor
    increments: torch.Tensor
    volatility: torch.Tensor
    log_vol: torch.Tensor
    metaorder: torch.Tensor | None
    signal: torch.Tensor | None
    waves: WaveSchedule | None


def _check_profile(
    num_steps: int, levels: int, tick_size: float, profile: dict[str, float]
) -> SyntheticProfile:
    """:func:`generate_synthetic`'s arguments checked; the profile with the overrides ``profile``."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps={num_steps!r} must be a positive int")
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
        raise ValueError(f"levels={levels!r} must be a positive int")
    if not isinstance(tick_size, int | float) or not math.isfinite(tick_size) or tick_size <= 0:
        raise ValueError(f"tick_size={tick_size!r} must be > 0")
    known = set(asdict(SyntheticProfile()))
    unknown = sorted(set(profile) - known)
    if unknown:
        raise ValueError(f"unknown synthetic profile knob(s) {unknown}; known: {sorted(known)}")
    return replace(SyntheticProfile(), **profile).validate()


def _mid_path(
    length: int, seed: int, tick_size: float, knobs: SyntheticProfile, generator: torch.Generator
) -> _MidPath:
    """Mid: regime drift + clustered noise, accumulated with a weak pull back, in log space."""
    log_vol = _smoothed_noise(length, knobs.vol_memory, generator)
    volatility = knobs.vol_ticks * torch.exp(knobs.vol_of_vol * log_vol)
    noise = torch.randn(length, generator=generator, dtype=torch.float64)
    informed = knobs.flow_volume > 0 or knobs.flow_impact > 0
    metaorder = None
    if informed:  # metaorders: the imbalance z_t trades in step t and pushes the mid in step t + 1
        metaorder = _flow_imbalance(length, seed, knobs.flow_persistence)
        noise = math.sqrt(1.0 - knobs.flow_impact**2) * noise  # the push takes this share of the variance
    increments = _regime_drift(length, knobs, generator) + volatility * noise
    if metaorder is not None and knobs.flow_impact > 0:
        increments[1:] = increments[1:] + knobs.flow_impact * volatility[1:] * metaorder[:-1]
    signal = None
    if knobs.signal_strength > 0:
        signal, signal_moves = _planted_signal(length, seed, knobs)
        increments = increments + signal_moves
    waves = _waves(length, seed, knobs) if knobs.wave_rate > 0 else None
    if waves is not None:
        increments = increments + waves.drift
    increments[0] = 0.0
    start_ticks = knobs.start_price / tick_size
    deviation = _decaying_sum(increments, 1.0 - 1.0 / knobs.reversion_steps)
    mid = start_ticks * torch.exp(deviation / start_ticks)
    return _MidPath(mid, increments, volatility, log_vol, metaorder, signal, waves)


def _book(
    path: _MidPath, levels: int, tick_size: float, knobs: SyntheticProfile, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Spread, correlated with volatility; levels at random gaps; sizes; a planted signal or the waves
    shown in the top-of-book imbalance.

    :return: ``(bid_ticks, ask_ticks, bid_size, ask_size)``, each ``[T + 1, L]`` (ticks int64, sizes float64).
    """
    length = path.mid.shape[0]
    own_noise = _smoothed_noise(length, knobs.spread_memory, generator)
    corr = knobs.spread_vol_corr
    spread_noise = corr * path.log_vol + math.sqrt(1.0 - corr**2) * own_noise
    spread = torch.round(knobs.spread_median_ticks * torch.exp(knobs.spread_log_std * spread_noise))
    spread = spread.clamp(min=1)  # a spread below one tick would cross the book
    best_bid = torch.floor(path.mid - spread / 2.0)
    best_ask = best_bid + spread

    def side_prices() -> torch.Tensor:
        gaps = 1.0 + torch.floor(
            torch.empty((length, levels - 1), dtype=torch.float64).exponential_(generator=generator)
            * knobs.gap_scale_ticks
        )
        return torch.cat([torch.zeros((length, 1), dtype=torch.float64), torch.cumsum(gaps, 1)], dim=1)

    bid_ticks = (best_bid[:, None] - side_prices()).to(torch.int64)
    ask_ticks = (best_ask[:, None] + side_prices()).to(torch.int64)
    bid_size = _level_sizes((length, levels), knobs, generator)
    ask_size = _level_sizes((length, levels), knobs, generator)
    shown = path.signal
    if path.waves is not None:  # the waves' marks over the planted signal, or over noise of the same spread
        shown = (path.signal if path.signal is not None else path.waves.noise) + path.waves.marks
    if shown is not None:  # show it in the top-of-book imbalance, keeping the touch's total size
        imbalance = torch.tanh(shown / 2.0)
        total = bid_size[:, 0] + ask_size[:, 0]
        bid_size[:, 0] = total * (1.0 + imbalance) / 2.0
        ask_size[:, 0] = total * (1.0 - imbalance) / 2.0
    if int(bid_ticks[:, -1].min()) <= 0:
        raise ValueError(
            f"the profile drives bid prices to <= 0 (start_price={knobs.start_price}, "
            f"tick_size={tick_size}); "
            "raise start_price or lower drift_ticks / vol_ticks"
        )
    return bid_ticks, ask_ticks, bid_size, ask_size


def _name(seed: int, num_steps: int, levels: int, knobs: SyntheticProfile, path: _MidPath) -> str:
    """The market's name: its seed, size, and planted signal and waves if any."""
    planted = path.signal is not None
    signal = f" signal={knobs.signal_strength:g}x{int(knobs.signal_horizon)}" if planted else ""
    waves = f" waves={knobs.wave_rate:g}x{knobs.wave_length_mean:g}" if path.waves is not None else ""
    return f"synthetic seed={seed} steps={num_steps} levels={levels}{signal}{waves}"


def generate_synthetic(
    num_steps: int = 50_000,
    *,
    levels: int = 10,
    seed: int = 0,
    tick_size: float = 0.01,
    device: str | torch.device = "cpu",
    **profile: float,
) -> MarketData:
    """Generate a synthetic market timeline: the mid path, the book around it, the flows between books.

    :param num_steps: number of steps ``T``.
    :param levels: book levels per side ``L``.
    :param seed: random seed; the same seed gives the same tensors on every device.
    :param tick_size: price increment in currency.
    :param device: device of the returned tensors.
    :param profile: overrides of :class:`SyntheticProfile` fields (e.g. ``drift_ticks=0.0``).
    :return: the timeline, validated, on ``device``.
    :raises ValueError: on a bad argument or profile knob, naming it and its value.
    """
    seed = check_seed(seed, "seed", optional=False)
    knobs = _check_profile(num_steps, levels, tick_size, profile)
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    path = _mid_path(num_steps + 1, seed, tick_size, knobs, generator)  # row 0: the book before step 1
    book = _book(path, levels, tick_size, knobs, generator)
    ref_tick, exec_bid, exec_ask, cancel_bid, cancel_ask = book_flows(
        book, path.increments, path.volatility, path.metaorder, seed, knobs, generator
    )
    bid_ticks, ask_ticks, bid_size, ask_size = book
    data = MarketData(
        bid_price=bid_ticks[1:].to(torch.float64) * tick_size,
        bid_size=bid_size[1:].float(),
        ask_price=ask_ticks[1:].to(torch.float64) * tick_size,
        ask_size=ask_size[1:].float(),
        flow_ref_tick=ref_tick,
        exec_bid=exec_bid,
        exec_ask=exec_ask,
        cancel_bid=cancel_bid,
        cancel_ask=cancel_ask,
        time=knobs.step_seconds * torch.arange(1, num_steps + 1, dtype=torch.float64),
        halted=torch.zeros(num_steps, dtype=torch.bool),
        tick_size=float(tick_size),
        name=_name(seed, num_steps, levels, knobs, path),
    )
    return data.validate().to(device)
