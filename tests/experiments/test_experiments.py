"""The experiments: agent recipes, criteria logic on hand-made numbers, and a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments import results
from experiments.agents import builtin_agent
from experiments.hindsight import compare_lq, injections, sign_flip_p
from experiments.runner import Setup


def test_agent_recipes_and_their_configs() -> None:
    lean = builtin_agent("iqn_lean")
    assert lean.model["hindsight"] is False
    assert lean.model["c51_alpha"] == 0.0 and lean.model["vaccine_interval"] == 0
    assert lean.model["boltzmann_branches"] == []
    assert set(lean.model["exploration_mults"].values()) == {1.0}
    assert lean.policy["n_ensemble"] == 1 and lean.policy["popart"] is False
    assert "per_alpha" not in lean.model  # prioritized replay stays in the lean configuration
    assert builtin_agent("iqn").model == {"hindsight": True}
    off = builtin_agent("iqn-no_popart")
    assert off.policy == {"popart": False} and off.model == {"hindsight": True}
    back = builtin_agent("iqn_lean+hindsight")
    assert back.model["hindsight"] is True and back.policy["popart"] is False
    assert builtin_agent("iqn_lean+popart").policy.get("popart", True) is True
    assert builtin_agent("dqn").algorithm == "dqn" and builtin_agent("nope") is None
    # an agent is a RunConfig: its settings over the shared ones
    setup = Setup(steps=400, n_envs=2, model_kwargs={"learning_rate": 1e-3})
    config = setup.config(lean, 3)
    assert config.seed == 3 and config.resolved_hindsight() is False
    assert config.resolved_model_kwargs()["c51_alpha"] == 0.0
    assert config.resolved_model_kwargs()["learning_rate"] == 1e-3
    assert config.resolved_policy_kwargs()["n_ensemble"] == 1
    assert setup.config(builtin_agent("iqn"), 0).resolved_hindsight() is True
    peer = setup.config(builtin_agent("dqn"), 0)
    assert peer.resolved_action_face() == "joint" and peer.resolved_device_loop() is False


def test_summary_shares_of_the_oracle() -> None:
    class R:
        def __init__(self, pnl: float) -> None:
            self.metrics = {"pnl": pnl, "sharpe": pnl / 100, "trades": 1}

    class E:
        results = {"a/seed0": R(50.0), "a/seed1": R(30.0), "flat": R(0.0), "oracle": R(100.0)}

    rows = results.summarise(E(), ["a"], [0, 1])
    assert rows["a"]["oracle_share"]["mean"] == pytest.approx(0.4)
    assert rows["a"]["pnl"]["std"] == pytest.approx(14.142, rel=1e-3)
    assert rows["oracle"]["baseline"] and rows["oracle"]["oracle_share"]["mean"] == 1.0
    table = results.markdown_table(rows)
    assert "| a | 2 | 40 ± 14 |" in table and "40.0 ± 14.1 %" in table
    assert "| – |" in table  # no maker share recorded


def test_sign_flip_p_values() -> None:
    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(1 / 8)  # exact: only the observed signs reach it
    assert sign_flip_p([-1.0, -2.0, -3.0]) == 1.0
    assert sign_flip_p([1.0, -1.0]) == pytest.approx(3 / 4)
    many = sign_flip_p([1.0] * 20)  # drawn patterns: only the observed one reaches the mean
    assert many == pytest.approx(1 / 4097)


def test_hindsight_criteria_numbers() -> None:
    lines = [{"step": 5_000, "hindsight": {"backward": 1, "forward": 2, "relabel": 3}},
             {"step": 12_000, "hindsight": {"backward": 5, "forward": 0, "relabel": 0}}]
    assert injections(lines) == 6
    same = [{1: 1.0, 2: 0.5, 3: 0.3}, {1: 2.0, 2: 1.0, 3: 0.4}, {1: 1.5, 2: 0.9, 3: 0.5}]
    worse = [{s: v * 2 for s, v in c.items()} for c in same]
    assert compare_lq(same, worse)["pass"]
    result = compare_lq(worse, same)
    assert not result["pass"] and result["mean_difference"] > 0
    assert result["intervals_p_on_higher"] == pytest.approx(1 / 512)


TINY = ["--agents", "iqn_lean,dqn", "--seeds", "1", "--steps", "300", "--n-envs", "4",
        "--market-steps", "2000", "--signal-strength", "0.5", "--signal-horizon", "3", "--eval-envs", "4",
        "--eval-steps", "60", "--episode-length", "60", "--no-progress"]


@pytest.mark.slow
def test_learning_end_to_end_tiny(tmp_path: Path) -> None:
    """A few hundred steps, one seed, two agents: every run folder is foxhunt.runs', every output file
    appears, the table has all rows, and --reuse loads the runs instead of training them."""
    from experiments.learning import main

    out = tmp_path / "tiny"
    threads = torch.get_num_threads()  # main() sets its own thread count; the session keeps its own
    try:
        payload = main(["--out", str(out), *TINY])
        again = main(["--out", str(out), *TINY, "--reuse"])
    finally:
        torch.set_num_threads(threads)
    for name in ("results.json", "results.md", "bars.png", "curves.png"):
        assert (out / name).is_file(), name
    for name in ("config.json", "model.zip", "diagnostics.jsonl", "evaluation.json", "training.png",
                 "run.json"):
        assert (out / "iqn_lean" / "seed0" / name).is_file(), name  # foxhunt.runs.train's run folder
    assert (out / "dqn" / "seed0" / "model.zip").is_file()
    assert json.loads((out / "dqn" / "seed0" / "config.json").read_text())["action_face"] == "joint"
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert {"iqn_lean", "dqn", "flat", "random", "oracle"} <= set(summary)
    assert summary["oracle"]["oracle_share"]["mean"] == 1.0
    assert payload["evaluation"]["setup"]["market_seed"] == 1
    assert payload["evaluation"]["setup"]["train_market_seed"] == 0
    assert "| iqn_lean | 1 |" in (out / "results.md").read_text()
    assert json.dumps(again["summary"]) == json.dumps(payload["summary"])  # NaN-safe equality
    assert again["train_seconds"] == payload["train_seconds"]
