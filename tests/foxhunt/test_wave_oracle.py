"""The wave oracle: perfect foresight of a wave market's timing, at the rows the recorder steps; the
evaluation adds it on a wave market."""

from __future__ import annotations

import pytest
import torch

from foxenv.data import generate_synthetic
from foxenv.data.synthetic import wave_schedule
from foxhunt.evaluation import evaluate_policies
from foxhunt.evaluation.api import _oracle_for
from foxhunt.evaluation.baselines import WaveOraclePolicy
from foxhunt.evaluation.metrics import compute_metrics
from foxhunt.evaluation.recorder import record

WAVES = {"wave_rate": 0.02, "wave_length_mean": 20.0}
STEPS = 6_000


def test_the_wave_oracle_earns_and_its_timing_is_the_market_rows() -> None:
    quiet = {**WAVES, "vol_ticks": 2.0}  # little noise: a row's mistiming shows
    market = generate_synthetic(STEPS, seed=5, **quiet)
    hold = wave_schedule(STEPS, 5, **quiet).hold
    settings = {"num_books": 8, "num_steps": 600, "seed": 0, "env_kwargs": {"episode_length": 300}}
    pnl = {}
    for shift in (-1, 0, 1):  # a row early, on time, a row late
        rec = record(WaveOraclePolicy(torch.roll(hold, shift)), market, **settings)
        pnl[shift] = compute_metrics(rec)["pnl"]
        if shift == 0:
            metrics = compute_metrics(rec)
            held = rec.series["position"] != 0
    assert metrics["pnl"] > 0.5 * (metrics["fees"] + metrics["spread_cost"]) > 0
    assert pnl[0] > pnl[-1] and pnl[0] > pnl[1]
    assert 0.1 < float(held.double().mean()) < 0.5  # it holds the waves, not the market


def test_the_wave_oracle_needs_the_start_rows() -> None:
    oracle = WaveOraclePolicy(torch.zeros(10, dtype=torch.int64))
    oracle.reset(2, torch.device("cpu"))
    with pytest.raises(ValueError, match="start rows"):
        oracle.act(torch.zeros(2, 5), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"hold has shape \(2, 2\)"):
        WaveOraclePolicy(torch.zeros(2, 2))


def test_evaluation_adds_the_wave_oracle_on_a_wave_market() -> None:
    assert isinstance(_oracle_for(WAVES, {}, market_seed=3, num_steps=1_000), WaveOraclePolicy)
    assert _oracle_for({"wave_rate": 0.0}, {}) is None
    with pytest.raises(ValueError, match="market_seed"):
        _oracle_for(WAVES, {})
    evaluation = evaluate_policies({}, "synthetic", baselines=("flat",), n_envs=4, steps=200, market_seed=3,
                                   market_kwargs={**WAVES, "num_steps": 3_000},
                                   env_kwargs={"episode_length": 200})
    assert set(evaluation.results) == {"flat", "oracle"}
    assert float(evaluation.results["oracle"].series["step_pnl"].sum()) > 0
