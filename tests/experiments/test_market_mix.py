"""experiments.market_mix: the rule family (its all-in Market member is the oracle, bit for bit; sizing and
order by the edge), the probe's fit on the training market and its held-out scores, the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from experiments import market_mix
from experiments.market_mix import ORACLE_RULE, RulePolicy, probe, rule_family
from foxhunt.evaluation.api import build_market
from foxhunt.evaluation.baselines import POSITION_FROM_END, OraclePolicy
from foxhunt.evaluation.recorder import record

MARKET = {"signal_strength": 2.0, "signal_horizon": 5, "num_steps": 1200}
ENV = {"episode_length": 50}


def test_all_in_market_rule_is_the_oracle_bit_for_bit() -> None:
    market = build_market("synthetic", market_seed=1, **MARKET)
    oracle = record(OraclePolicy(2.0, 5), market, num_books=4, num_steps=100, seed=3, env_kwargs=ENV)
    rule = record(rule_family(2.0, 5)[ORACLE_RULE], market, num_books=4, num_steps=100, seed=3,
                  env_kwargs=ENV)
    assert int(oracle.series["trade_closed"].sum()) > 0  # it traded, so the comparison says something
    for name in ("actions", "step_pnl", "position"):
        assert torch.equal(oracle.series[name], rule.series[name]), name


def _obs(moves_over_cost: list[float], held: list[float], levels: int = 1) -> tuple[RulePolicy, torch.Tensor]:
    """A horizon-1 rule and observations whose expected move is ``ratio`` times the round trip's cost."""
    policy = RulePolicy(2.0, 1, sizing=(1.5, 2.5), entry=market_mix.BY_EDGE, exit=(1, 1), levels=levels)
    policy.reset(len(held), torch.device("cpu"))
    cost = 4.2 + policy.fee_ticks
    obs = torch.zeros(len(held), 4 * levels + 2 + 8, dtype=torch.float32)
    signal = torch.tensor(moves_over_cost, dtype=torch.float64) * cost / policy.drift
    obs[:, policy.imbalance_column] = torch.tanh(signal / 2).float()  # s = 2 atanh(imbalance)
    obs[:, policy.spread_column] = 4.2
    obs[:, POSITION_FROM_END] = torch.tensor(held)
    return policy, obs


def test_rule_sizes_and_orders_by_the_edge() -> None:
    #        thin edge  medium   large   large, held Full  no edge, held long  no edge, held short
    policy, obs = _obs([1.2, 2.0, 3.0, 1.2, 0.5, 0.5], [0.0, 0.0, 0.0, 1.0, 0.5, -0.5])
    actions = policy.act(obs, torch.ones(6, dtype=torch.bool))
    assert actions[:, 0].tolist() == [2, 2, 2, 2, 2, 1]  # long; held long kept; short closed (flat)
    assert actions[:, 1].tolist()[:5] == [0, 1, 2, 2, 1]  # Quarter, Half, Full; never below the held size
    # LimitMaker, IoC, Market by the edge (a hold repeats the entry's band: no order); the exit: maker
    assert actions[:, 2].tolist() == [1, 2, 0, 1, 1, 1]
    assert actions[:, 3].tolist() == [1, 0, 2, 1, 1, 1]
    with pytest.raises(ValueError, match="sizing"):
        RulePolicy(2.0, 1, sizing=(3.0, 2.0))
    with pytest.raises(ValueError, match="exit"):
        RulePolicy(2.0, 1, exit=(3, 0))


def test_probe_fits_on_the_training_market_and_scores_held_out() -> None:
    rules = ["graded_2_4/market/maker_touch", "all_in/ioc_touch/market"]
    found = probe(MARKET, ENV, books=2, steps=50, rules=rules)
    assert set(found["fit"]) == {ORACLE_RULE, *rules}
    assert found["best"] == max(found["fit"], key=lambda r: found["fit"][r]["pnl"])
    held = found["held_out"]
    assert held["oracle"]["rule"] == ORACLE_RULE and held["best"]["rule"] == found["best"]
    assert held["oracle"]["mix"]["all"]["order"] == [1.0, 0.0, 0.0]
    assert not held["oracle"]["clears"]["all"]["LimitMaker"]
    assert math.isfinite(held["best"]["sharpe"])
    with pytest.raises(ValueError, match="rules holds 'nope'"):
        probe(MARKET, ENV, rules=["nope"])
    with pytest.raises(ValueError, match="signal_strength"):
        probe({**MARKET, "signal_strength": 0.0}, ENV)


def test_market_mix_command_line(tmp_path: Path) -> None:
    out = tmp_path / "mm"
    payload = market_mix.main(["--out", str(out), "--market-steps", "1200", "--eval-envs", "2",
                               "--max-positions", "100,400", "--env-kwargs", json.dumps(ENV),
                               "--rules", "graded_1.5_2.5/by_edge/maker_touch"])
    assert set(payload["probes"]) == {"max_position 100", "max_position 400"}
    text = (out / "market_mix.md").read_text()
    assert text.count("| max_position 400 |") == 2 and (out / "market_mix.json").is_file()
    with pytest.raises(SystemExit):
        market_mix.main(["--signal-strength", "0"])
    with pytest.raises(SystemExit):
        market_mix.main(["--max-positions", "0"])
