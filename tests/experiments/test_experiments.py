"""The experiment harness: agent recipes, criteria logic on hand-made numbers, and a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import harness
from experiments.exploration import judge
from experiments.hindsight import compare_lq, injections


def test_agent_recipes() -> None:
    lean = harness.agent_spec("iqn_lean")
    assert lean.model_kwargs["hindsight"] is False
    assert lean.model_kwargs["c51_alpha"] == 0.0 and lean.model_kwargs["vaccine_interval"] == 0
    assert lean.model_kwargs["boltzmann_branches"] == []
    assert set(lean.model_kwargs["exploration_mults"].values()) == {1.0}
    assert lean.policy_kwargs["n_ensemble"] == 1 and lean.policy_kwargs["popart"] is False
    assert "per_alpha" not in lean.model_kwargs  # prioritized replay stays in the lean configuration
    assert harness.agent_spec("iqn").model_kwargs == {"hindsight": True}
    off = harness.agent_spec("iqn-no_popart")
    assert off.policy_kwargs == {"popart": False} and off.model_kwargs == {"hindsight": True}
    back = harness.agent_spec("iqn_lean+hindsight")
    assert back.model_kwargs["hindsight"] is True and back.policy_kwargs["popart"] is False
    assert harness.agent_spec("iqn_lean+popart").policy_kwargs.get("popart", True) is True
    assert harness.agent_spec("dqn").kind == "dqn"
    with pytest.raises(ValueError, match="nope"):
        harness.agent_spec("nope")


def test_summary_shares_of_the_oracle() -> None:
    class R:
        def __init__(self, pnl: float) -> None:
            self.metrics = {"pnl": pnl, "sharpe": pnl / 100, "trades": 1}

    class E:
        results = {"a/seed0": R(50.0), "a/seed1": R(30.0), "flat": R(0.0), "oracle": R(100.0)}

    rows = harness.summarise(E(), ["a"], [0, 1])
    assert rows["a"]["oracle_share"]["mean"] == pytest.approx(0.4)
    assert rows["a"]["pnl"]["std"] == pytest.approx(14.142, rel=1e-3)
    assert rows["oracle"]["baseline"] and rows["oracle"]["oracle_share"]["mean"] == 1.0
    table = harness.markdown_table(rows)
    assert "| a | 2 | 40 ± 14 |" in table and "40.0 ± 14.1 %" in table
    assert "| – |" in table  # no maker share recorded


def test_hindsight_criteria_numbers() -> None:
    lines = [{"step": 5_000, "hindsight": {"backward": 1, "forward": 2, "relabel": 3}},
             {"step": 12_000, "hindsight": {"backward": 5, "forward": 0, "relabel": 0}}]
    assert injections(lines) == 6
    same = [{1: 1.0, 2: 0.5, 3: 0.3}, {1: 2.0, 2: 1.0, 3: 0.4}, {1: 1.5, 2: 0.9, 3: 0.5}]
    worse = [{s: v * 2 for s, v in c.items()} for c in same]
    assert compare_lq(same, worse)["pass"]
    result = compare_lq(worse, same)
    assert not result["pass"] and result["mean_difference"] > 0


def test_exploration_criteria_numbers() -> None:
    good = {"sharpe": 0.1, "action_mix": {"magnitude": [0.5, 0.3, 0.2], "order": [0.8, 0.1, 0.1]}}
    drift = {**good, "sharpe": 0.5}
    no_ioc = {**good, "action_mix": {"magnitude": [0.5, 0.3, 0.2], "order": [0.9, 0.1, 0.0]}}
    verdicts = judge([[good] * 5], [2], cuda=True)
    assert [v[1] for v in verdicts] == [True, True, True, True]
    verdicts = judge([[good, good, drift, good, no_ioc]], [3], cuda=True)
    assert [v[1] for v in verdicts] == [True, False, False, False]
    assert judge([[good] * 5], [0], cuda=False)[-1][1] is None


TINY = ["--agents", "iqn_lean,dqn", "--seeds", "1", "--steps", "300", "--n-envs", "4",
        "--market-steps", "2000", "--signal-strength", "0.5", "--signal-horizon", "3", "--eval-envs", "4",
        "--eval-steps", "60", "--no-progress"]


@pytest.mark.slow
def test_learning_end_to_end_tiny(tmp_path: Path) -> None:
    """A few hundred steps, one seed, two agents: every output file appears and the table has all rows."""
    import torch

    from experiments.learning import main

    out = tmp_path / "tiny"
    threads = torch.get_num_threads()  # main() sets its own thread count; the session keeps its own
    try:
        payload = main(["--out", str(out), *TINY])
        again = main(["--out", str(out), *TINY, "--reuse"])  # loads the two runs instead of training
    finally:
        torch.set_num_threads(threads)
    for name in ("results.json", "results.md", "bars.png", "curves.png"):
        assert (out / name).is_file(), name
    assert (out / "dqn" / "seed0" / "model.zip").is_file()
    assert (out / "iqn_lean" / "seed0" / "diagnostics.jsonl").is_file()
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert set(summary) == {"iqn_lean", "dqn", "flat", "random", "buy_and_hold", "oracle"}
    assert summary["oracle"]["oracle_share"]["mean"] == 1.0
    assert payload["evaluation"]["setup"]["market_seed"] == 1
    assert payload["evaluation"]["setup"]["train_market_seed"] == 0
    assert "| iqn_lean | 1 |" in (out / "results.md").read_text()
    assert json.dumps(again["summary"]) == json.dumps(payload["summary"])  # NaN-safe equality
    assert again["train_seconds"] == payload["train_seconds"]
