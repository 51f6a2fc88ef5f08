"""Diagnostics: hand-worked accumulators, JSONL keys, logger scalars."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.logger import Logger

from sb3_her_ext.diagnostics import (
    DIAGNOSTICS_KEYS,
    HINDSIGHT_KEYS,
    TrainingDiagnostics,
    flatten_scalars,
    read_diagnostics,
)


def _diag(tmp_path: Path) -> TrainingDiagnostics:
    return TrainingDiagnostics(tmp_path / "sub" / "diag.jsonl", [3, 2], ["direction", "magnitude"])


def test_flush_means_counts_and_keys_by_hand(tmp_path: Path) -> None:
    diag = _diag(tmp_path)
    diag.add_train_step(th.tensor(1.0), th.tensor(4.0), th.tensor(2.5), th.tensor(0.5))
    diag.add_train_step(th.tensor(3.0), th.tensor(2.0), th.tensor(2.5), th.tensor(1.0))
    diag.add_vaccine(th.tensor(0.2), th.tensor(True))
    diag.add_vaccine(th.tensor(-0.4), th.tensor(False))
    diag.add_actions(np.array([[0, 1], [2, 1], [2, 0], [2, 1]]))
    iqr = th.tensor([[[1.0, 3.0, 0.0], [2.0, 2.0, 99.0]]])  # padded action (branch 1, action 2) ignored
    valid = th.tensor([[True, True, True], [True, True, False]])
    diag.add_selection(iqr, th.ones_like(iqr), valid)
    record = diag.flush(
        100,
        eps=[0.1, 0.2],
        popart_mu=0.5,
        popart_sigma=2.0,
        per={"size": 10, "max_priority": 3.0, "beta": 0.4},
        hindsight_totals={"backward": th.tensor(5), "forward": th.tensor(1), "relabel": th.tensor(8)},
        threshold=1.5,
        priority_boost=3.0,
        iqr_bonus=0.3,
        ep_rew_mean=None,
        n_updates=2,
    )
    assert tuple(record) == DIAGNOSTICS_KEYS
    assert record["l_q"] == pytest.approx(2.0)
    assert record["l_c51"] == pytest.approx(3.0)
    assert record["per"]["mean_weight"] == pytest.approx(0.75)
    assert record["vaccine"] == {"cos": pytest.approx(-0.1), "corrections": 1}
    assert record["action_mix"] == {"direction": [0.25, 0.0, 0.75], "magnitude": [0.25, 0.75]}
    assert record["iqr_mean"] == pytest.approx((1 + 3 + 0 + 2 + 2) / 5)
    assert record["eps"] == {"direction": 0.1, "magnitude": 0.2}
    expected_hindsight = {"backward": 5, "forward": 1, "relabel": 8, "threshold": 1.5, "priority_boost": 3.0}
    assert record["hindsight"] == expected_hindsight

    # the second interval reports the increase of the cumulative hindsight counters, and resets the sums
    second = diag.flush(200, hindsight_totals={"backward": 7, "forward": 1, "relabel": 20})
    assert [second["hindsight"][k] for k in HINDSIGHT_KEYS[:3]] == [2, 0, 12]
    assert math.isnan(second["l_q"]) and second["vaccine"]["corrections"] == 0
    assert second["action_mix"]["direction"] == [0.0, 0.0, 0.0]

    lines = read_diagnostics(tmp_path / "sub" / "diag.jsonl")
    assert len(lines) == 2
    assert all(tuple(line) == DIAGNOSTICS_KEYS for line in lines)
    assert lines[1]["l_q"] is None  # NaN is written as null: strict JSON
    json.loads((tmp_path / "sub" / "diag.jsonl").read_text().splitlines()[0])


def test_flush_records_scalars_in_the_logger(tmp_path: Path) -> None:
    logger = Logger(folder=None, output_formats=[])
    diag = _diag(tmp_path)
    diag.add_train_step(th.tensor(1.0), th.tensor(2.0), th.tensor(1.5), th.tensor(1.0))
    diag.flush(10, logger, eps=[0.5, 1.0], hindsight_totals={"backward": 3})
    values = logger.name_to_value
    assert values["diagnostics/l_q"] == pytest.approx(1.0)
    assert values["diagnostics/eps/magnitude"] == pytest.approx(1.0)
    assert values["diagnostics/hindsight/backward"] == pytest.approx(3.0)
    assert values["diagnostics/action_mix/direction/0"] == 0.0
    assert "diagnostics/step" not in values


def test_flatten_scalars_by_hand() -> None:
    flat = flatten_scalars({"a": 1, "b": {"c": [2.0, float("nan")], "d": None}, "e": True, "f": "x"})
    assert flat == {"a": 1.0, "b/c/0": 2.0}


def test_branch_names_must_match_branches(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="branch_names has 1 names for 2 branches"):
        TrainingDiagnostics(None, [3, 3], ["direction"])


def test_restart_starts_a_new_interval(tmp_path: Path) -> None:
    diag = _diag(tmp_path)
    diag.flush(100, hindsight_totals={"backward": th.tensor(3)})
    # a new run from step 0 (reset_num_timesteps) with a replay that already counted 5 backward rows
    diag.restart(0, {"backward": th.tensor(5), "forward": th.tensor(1)})
    record = diag.flush(40, hindsight_totals={"backward": th.tensor(7), "forward": th.tensor(1)})
    assert record["fps"] > 0  # 40 steps since the restart, not 40 - 100
    assert record["hindsight"]["backward"] == 2
    assert record["hindsight"]["forward"] == 0


def test_a_non_finite_value_is_written_as_a_string_and_a_missing_mean_as_null(tmp_path: Path) -> None:
    path = tmp_path / "diag.jsonl"
    diag = TrainingDiagnostics(path, [3, 2], ["direction", "magnitude"])
    nan, inf = th.tensor(float("nan")), th.tensor(float("inf"))
    diag.add_train_step(nan, th.tensor(1.0), nan, th.tensor(1.0))
    record = diag.flush(100, popart_mu=-math.inf)
    assert math.isnan(record["loss"]) and math.isnan(record["l_q"]) and record["l_c51"] == 1.0
    diag.add_train_step(th.tensor(2.0), inf, inf, th.tensor(1.0))
    diag.flush(200)
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    assert raw[0]["loss"] == "nan" and raw[0]["l_q"] == "nan" and raw[0]["popart_mu"] == "-inf"
    assert raw[0]["vaccine"]["cos"] is None and raw[0]["iqr_mean"] is None  # nothing to average: null
    assert raw[1]["l_c51"] == "inf" and raw[1]["l_q"] == 2.0
    lines = read_diagnostics(path)
    assert math.isnan(lines[0]["loss"]) and lines[0]["popart_mu"] == -math.inf
    assert lines[1]["loss"] == math.inf and lines[0]["vaccine"]["cos"] is None


def test_add_action_counts() -> None:
    diag = TrainingDiagnostics(None, [3, 2], ["direction", "magnitude"])
    diag.add_action_counts([np.array([1, 0, 3]), [2, 2]])
    diag.add_actions(np.array([[0, 1]]))
    record = diag.flush(10)
    assert record["action_mix"] == {"direction": [0.4, 0.0, 0.6], "magnitude": [0.4, 0.6]}
    with pytest.raises(ValueError, match="counts has 1 branches: expected 2"):
        diag.add_action_counts([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"counts\[1\] has 3 actions: expected 2"):
        diag.add_action_counts([[1, 2, 3], [1, 2, 3]])


def test_selection_sums_saved_apart_are_put_back_into_their_tensor() -> None:
    """A diagnostics state saved while the two selection sums were separate tensors (a checkpoint's) is put
    back into the one tensor a selection adds to."""
    diagnostics = TrainingDiagnostics(None, [3, 3], ["a", "b"], "cpu")
    diagnostics._select_sums = {"iqr_mean": th.tensor(1.5, dtype=th.float64), "ens_std": th.tensor(2.0)}
    assert diagnostics._select_pair.tolist() == [1.5, 2.0]
    diagnostics.add_selection(th.ones(2, 2, 3), th.zeros(2, 2, 3), th.ones(2, 3, dtype=th.bool))
    assert {k: float(v) for k, v in diagnostics._select_sums.items()} == {"iqr_mean": 2.5, "ens_std": 2.0}
