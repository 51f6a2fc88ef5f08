"""Issue 39.2: on the synthetic market with no signal, quoting that reads nothing of the market earns nothing.

Before the fix the default maker fee was a rebate of 0.2 bps (1.2 ticks a share on this market) and every
level the price moved past was executed, so a LimitMaker order one tick inside the touch filled in 56 % of
steps with little of the move against it: the flip maker beat flat on every held-out seed (Holm).
"""

from __future__ import annotations

import json

import torch

from experiments import free_edge
from foxenv.config import EnvConfig
from foxhunt.evaluation.api import evaluate_policies


def test_the_default_maker_fee_is_no_rebate() -> None:
    assert EnvConfig().maker_fee_bps >= 0.0


def test_no_information_makers_do_not_beat_flat_on_a_held_out_no_signal_market() -> None:
    policies = {"flip_maker": free_edge.FlipMakerPolicy(), "market_maker": "market_maker"}
    evaluation = evaluate_policies(policies, baselines=("flat",), seed=0, market_seed=2, train_market_seed=0)
    assert evaluation.setup["windows"] == 16
    for name in policies:
        row = evaluation.comparisons[name][0]
        assert not (row["mean_difference"] > 0 and row["p_value"] < 0.05), (name, row["mean_difference"],
                                                                            row["ci_low"], row["ci_high"])
        series = evaluation.results[name].recording.series
        assert float(series["maker_lots"].sum()) == float(series["traded_lots"].sum()) > 0  # they did quote
        assert float(series["fees"].abs().sum()) == 0.0  # no rebate to live on


def test_flip_maker_alternates_and_restarts_long() -> None:
    policy = free_edge.FlipMakerPolicy()
    policy.reset(2, torch.device("cpu"))
    obs = torch.zeros(2, 3)
    first = policy.act(obs, torch.tensor([True, True]))
    second = policy.act(obs, torch.tensor([False, True]))
    assert first[:, 0].tolist() == [2, 2] and second[:, 0].tolist() == [0, 2]
    assert first[0, 1:].tolist() == [2, 1, 2]


def test_free_edge_command_writes_its_table(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    def tiny(seeds: tuple[int, ...], signal_strength: float, seed: int = 0) -> dict:
        row = {"mean_difference": 1.0, "ci_low": -1.0, "ci_high": 3.0, "p_holm": 0.5}
        parts = {"pnl": 1.0, "capture": 2.0, "fees": 0.0, "moves": -1.0, "sharpe_per_step": 0.0,
                 "maker_share": 1.0, "lots": 5.0}
        names = free_edge.POLICIES
        return {"per_seed": {n: [row] for n in names}, "pooled": {n: row for n in names},
                "decomposition": {n: [parts] for n in (*free_edge.POLICIES, "flat")}, "oracle": [row],
                "oracle_pooled": row}

    monkeypatch.setattr(free_edge, "run", tiny)
    free_edge.main(["--out", str(tmp_path), "--seeds", "7"])
    written = json.loads((tmp_path / "free_edge.json").read_text())
    assert written["meta"]["seeds"] == [7] and set(written["pooled"]) == set(free_edge.POLICIES)
