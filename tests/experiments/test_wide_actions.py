"""``python -m experiments.wide_actions``: branched against joint agents on the wide action grid, its CPU
smoke mode end to end, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import wide_actions
from tests.experiments.test_device_loop import _keep_threads  # noqa: F401 (autouse fixture)


@pytest.mark.slow
def test_smoke_mode_trains_scores_and_writes_the_table_and_figure(tmp_path: Path) -> None:
    out = tmp_path / "wide"
    payload = wide_actions.main(["--smoke", "--out", str(out), "--agents", "iqn,iqn_joint,dqn", "--seeds",
                                 "2", "--peer-seeds", "1", "--concurrent-seeds", "2", "--no-progress"])
    assert payload["action_grid"]["name"] == "wide" and len(payload["action_grid"]["magnitudes"]) == 10
    rows = payload["per_seed"]
    assert [len(rows[a]) for a in ("iqn", "iqn_joint", "dqn")] == [2, 2, 1]
    for agent, seeds in rows.items():
        for row in seeds:
            assert row["train_seconds"] > 0 and row["train_seconds"] <= row["run_seconds"]
            assert [len(v) for v in row["action_mix"].values()] == [3, 10, 3, 12], agent
            oracle = payload["baselines"]["oracle"]
            assert row["oracle_share"] == pytest.approx(row["pnl"] / oracle)
    summary = payload["summary"]["iqn"]["oracle_share"]
    shares = [row["oracle_share"] for row in rows["iqn"]]
    assert summary["mean"] == pytest.approx(sum(shares) / 2)
    assert set(payload["baselines"]) >= {"flat", "random", "oracle"}
    saved = json.loads((out / "wide_actions.json").read_text())
    assert saved["per_seed"]["iqn_joint"][0]["seed"] == 0
    table = (out / "wide_actions.md").read_text()
    assert "| iqn_joint | 2 |" in table and "| oracle (baseline) | – | 100.0 %" in table
    assert (out / "wide_actions.png").stat().st_size > 0
    # the models acted on the wide grid: the joint one on 1,080 codes
    config = json.loads((out / "iqn_joint" / "seed0" / "config.json").read_text())
    assert config["env"]["action_grid"] == "wide"
    # --reuse scores the finished runs again with their learn() seconds, training nothing
    again = wide_actions.main(["--smoke", "--out", str(out), "--agents", "iqn_joint", "--seeds", "2",
                               "--reuse", "--no-progress"])
    assert [r["train_seconds"] for r in again["per_seed"]["iqn_joint"]] == [
        r["train_seconds"] for r in rows["iqn_joint"]]


@pytest.mark.parametrize(("argv", "message"), [
    (["--action-grid", "huge"], "action_grid='huge' must be one of"),
    (["--env-kwargs", '{"action_grid": "default"}'], "contradicts --action-grid"),
    (["--signal-strength", "0"], "give --signal-strength > 0"),
    (["--agents", "nope"], "agents holds 'nope'"),
])
def test_bad_options_are_refused_before_training(tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wide_actions.main(["--smoke", "--out", str(tmp_path), "--no-progress", *argv])
    assert not list(tmp_path.iterdir())  # nothing trained


def test_peer_seeds_must_fit_the_seeds() -> None:
    with pytest.raises(SystemExit):
        wide_actions.parse_args(["--seeds", "2", "--peer-seeds", "3"])


def test_smoke_keeps_the_options_given() -> None:
    args = wide_actions.parse_args(["--smoke", "--seeds=3", "--steps", "500"])
    assert (args.seeds, args.steps, args.n_envs) == (3, 500, wide_actions.SMOKE["n_envs"])
    assert (args.signal_strength, args.signal_horizon) == (2.0, 5)  # the planted market by default
