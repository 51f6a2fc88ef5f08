"""Paired statistics over independent windows (block bootstrap, Holm, power), the rule that no evaluation
scores copies of one window, and the baselines that read the agent's signal (imbalance rule, market maker)."""

from __future__ import annotations

import math

import pytest
import torch

from foxhunt.evaluation import evaluate_policies
from foxhunt.evaluation.api import fit_imbalance_rule, plan_windows
from foxhunt.evaluation.baselines import (
    IMBALANCE_THRESHOLDS,
    ImbalancePolicy,
    MarketMakerPolicy,
)
from foxhunt.evaluation.report import markdown
from foxhunt.evaluation.stats import (
    RESAMPLES,
    block_bootstrap_means,
    block_length,
    correct,
    holm,
    paired_windows,
    window_differences,
    windows_needed,
)
from tests.foxenv.fake_market import random_market


def test_block_bootstrap_of_whole_circular_blocks_is_the_sample_mean_and_block_one_is_iid() -> None:
    values = torch.tensor([1.0, -2.0, 5.0, 0.5, 3.0, -1.0])
    rotations = block_bootstrap_means(values, resamples=200, block=6, seed=1)  # every resample a rotation
    assert torch.allclose(rotations, values.double().mean().expand(200))
    iid = block_bootstrap_means(values, resamples=4000, block=1, seed=1)
    assert abs(float(iid.mean()) - float(values.mean())) < 0.1
    # the plain bootstrap's standard error: population std / sqrt(n)
    spread = float(values.double().std(unbiased=False))
    assert float(iid.std()) == pytest.approx(spread / math.sqrt(6), rel=0.1)
    assert block_length(5) == 1 and block_length(27) == 3 and block_length(1000) == 10
    with pytest.raises(ValueError, match="block=7"):
        block_bootstrap_means(values, block=7)


def test_windows_are_ordered_by_time_and_overlapping_ones_are_refused() -> None:
    policy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    base = torch.zeros(2, 2)
    starts = torch.tensor([[300, 0], [100, 200]])
    assert window_differences(policy, base, starts, 100).tolist() == [2.0, 3.0, 4.0, 1.0]
    with pytest.raises(ValueError, match="overlap"):
        window_differences(policy, base, torch.tensor([[0, 50], [100, 200]]), 100)


def test_one_window_gets_no_interval_and_a_constant_edge_is_significant() -> None:
    one = paired_windows(torch.tensor([[325.5]]), torch.zeros(1, 1), torch.tensor([[0]]), 295,
                         baseline="flat")
    assert one["ci_low"] is None and one["p_value"] is None and one["windows"] == 1
    rows = {"policy": [one]}
    correct(rows)
    assert one["verdict"].startswith("edge over flat: not testable (1 independent window")
    constant = paired_windows(torch.full((4, 3), 2.0), torch.zeros(4, 3), torch.arange(12).reshape(4, 3) * 10,
                              10, baseline="flat")
    assert constant["ci_low"] == constant["ci_high"] == 2.0 and constant["p_value"] == 2 / RESAMPLES
    correct({"p": [constant]})
    assert constant["verdict"].startswith("edge over flat: positive, significant at 95 %")
    noise = paired_windows(torch.tensor([[1.0, -1.0, 2.0, -2.0, 0.5, -0.5]]), torch.zeros(1, 6),
                           torch.arange(6)[None] * 10, 10, baseline="flat")
    correct({"p": [noise]})
    assert noise["ci_low"] < 0 < noise["ci_high"] and "not significant at 95 %" in noise["verdict"]


def test_holm_and_the_power_statement_by_hand() -> None:
    adjusted = holm([0.01, 0.04, 0.03, None])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06]) and adjusted[3] is None
    # d = 1, per-window spread se * sqrt(n) = 1: n = (1.95996 + 0.84162)^2 = 7.85 -> 8 windows
    assert windows_needed(1.0, 0.5, 4) == 8.0
    assert math.isinf(windows_needed(0.0, 0.5, 4))


def test_plan_windows_never_gives_more_books_than_disjoint_windows() -> None:
    assert plan_windows(296, 295, 8, 500, 16) == (1, 295, [
        "8 books asked for, but the market's 296 steps hold 1 disjoint window(s) of 295 steps: 1 book(s), "
        "no copies",
        "500 steps asked for x 1 books exceed the 1 disjoint window(s) of 295 steps: 1 episode(s) per book"])
    assert plan_windows(10_001, 100, 8, 300, 16) == (8, 300, [])
    books, steps, notes = plan_windows(1_001, 100, 4, 1000, 16)
    assert (books, steps) == (4, 200) and len(notes) == 1


def test_windows_are_whole() -> None:
    """A 500-step book cut into 200-step windows counted 3 windows, the last a half one (issue 39.8)."""
    assert plan_windows(10_001, 200, 8, 500, 16) == (8, 400, [
        "500 steps asked for are 2.5 windows of 200 steps: 400 steps per book, whole windows only"])
    assert plan_windows(10_001, 200, 8, 150, 16) == (8, 150, [])  # less than one episode: one window
    evaluation = evaluate_policies({"policy": "buy_and_hold"}, random_market(2_001, num_levels=5, seed=3),
                                   baselines=("flat",), n_envs=2, steps=500,
                                   env_kwargs={"episode_length": 200, "levels": 5})
    setup = evaluation.setup
    assert setup["windows"] == 4 and setup["vector_steps"] == 400 and setup["episodes_per_book"] == 2
    assert evaluation.comparisons["policy"][0]["windows"] == 4


def test_the_issue_25_confident_wrong_result_is_impossible() -> None:
    # `foxhunt train --data lobster` scored 8 books x 500 steps on a 296-step split and bootstrapped 16 copies
    # of one path into "+325.5 [+318.5, +332.5]" for a policy that made no trade: now one window, no interval
    market = random_market(296, num_levels=5, seed=3)
    evaluation = evaluate_policies({"policy": "buy_and_hold"}, market, baselines=("flat",), n_envs=8,
                                   steps=500, env_kwargs={"episode_length": 500, "levels": 5})
    setup, row = evaluation.setup, evaluation.comparisons["policy"][0]
    assert setup["books"] == 1 and setup["windows"] == 1 and len(setup["notes"]) == 2
    assert evaluation.results["policy"].metrics["trades"] == 0
    assert row["ci_low"] is None and row["ci_high"] is None and "not testable" in row["verdict"]
    text = markdown(evaluation, "policy", "t", {})
    assert "**1 independent window(s)**" in text and "none (fewer than 2 windows)" in text
    assert "not testable" in text and "8 books asked for" in text


def test_evaluation_rows_carry_windows_ci_holm_verdict_and_power() -> None:
    market = random_market(2_001, num_levels=5, seed=4)
    evaluation = evaluate_policies({"a": "buy_and_hold", "b": "random"}, market,
                                   baselines=("flat", "market_maker"), n_envs=4, steps=200,
                                   env_kwargs={"episode_length": 50, "levels": 5})
    rows = [row for group in evaluation.comparisons.values() for row in group]
    assert evaluation.setup["windows"] == 16 and evaluation.setup["comparison_family"] == 4
    for row in rows:
        assert row["windows"] == 16 and len(row["differences"]) == 16 and row["block"] == block_length(16)
        assert row["ci_low"] <= row["mean_difference"] <= row["ci_high"]
        assert row["p_holm"] >= row["p_value"] and "Holm over 4 comparisons" in row["verdict"]
        assert "independent windows" in row["power"] or "no difference" in row["power"]
    assert "imbalance" not in evaluation.setup["fitted_baselines"]


def obs_with(imbalance: list[float], position: list[float], levels: int = 2, width: int = 30) -> torch.Tensor:
    obs = torch.zeros(len(imbalance), width)
    obs[:, 4 * levels] = torch.tensor(imbalance)
    obs[:, -8] = torch.tensor(position)
    return obs


def test_imbalance_rule_trades_the_imbalance_side_and_holds_while_it_points_its_way() -> None:
    rule = ImbalancePolicy(0.5, levels=2)
    rule.reset(4, torch.device("cpu"))
    obs = obs_with([0.8, -0.9, 0.2, 0.2], [0.0, 0.0, 1.0, -1.0])
    actions = rule.act(obs, torch.zeros(4, dtype=torch.bool))
    # long, short, keep the long (weak imbalance its way), flat (weak imbalance against the short)
    assert actions[:, 0].tolist() == [2, 0, 2, 1] and actions[:, 1].tolist() == [2] * 4
    assert actions[:, 2].tolist() == [0] * 4
    with pytest.raises(ValueError, match="threshold=1.0"):
        ImbalancePolicy(1.0)
    maker = ImbalancePolicy(0.5, levels=2, order=1)
    maker.reset(4, torch.device("cpu"))
    posted = maker.act(obs, torch.zeros(4, dtype=torch.bool))
    assert posted[:, 0].tolist() == [2, 0, 2, 1] and posted[:, 2].tolist() == [1] * 4  # LimitMaker
    assert posted[:, 3].tolist() == [1] * 4  # at the own touch


def test_market_maker_quotes_the_side_that_closes_and_alternates_from_flat() -> None:
    maker = MarketMakerPolicy()
    maker.reset(1, torch.device("cpu"))
    start, later = torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)
    directions = []
    for position, episode_start in ((0.0, start), (1.0, later), (0.0, later), (-1.0, later), (0.0, later)):
        action = maker.act(obs_with([0.0], [position]), episode_start)
        assert action[0, 2] == 1 and action[0, 3] == 1  # LimitMaker at the touch
        directions.append(int(action[0, 0]))
    # flat: bid; long: ask to flat; flat after a long: ask (short); short: bid to flat; flat: bid again
    assert directions == [2, 1, 0, 1, 2]


def test_the_imbalance_rule_is_fitted_on_fit_data_and_earns_a_planted_signal() -> None:
    from foxenv.data import generate_synthetic

    planted = {"signal_strength": 2.0, "signal_horizon": 5}
    fit = generate_synthetic(3_000, levels=2, seed=0, **planted)
    env = {"episode_length": 200, "levels": 2}
    rule, scores = fit_imbalance_rule(fit, env)
    assert len(scores) == 2 * len(IMBALANCE_THRESHOLDS)
    assert scores[f"{('market', 'limit_maker')[rule.order]}@{rule.threshold:g}"] == max(scores.values())
    evaluation = evaluate_policies({"flat_model": "flat"}, "synthetic", baselines=("imbalance",), n_envs=4,
                                   steps=400, market_seed=1, train_market_seed=0, env_kwargs=env,
                                   market_kwargs={"num_steps": 3_000, **planted})
    fitted = evaluation.setup["fitted_baselines"]["imbalance"]
    assert "seed=0" in fitted["fit_market"] and evaluation.results["imbalance"].metrics["pnl"] > 0
    with pytest.raises(ValueError, match="fit_data"):
        evaluate_policies({"f": "flat"}, random_market(500, num_levels=2), baselines=("imbalance",),
                          env_kwargs=env)


def test_the_headline_states_shares_of_each_reference() -> None:
    """Issue 39.8: the report states the policy's share of the oracle's PnL (and of a bound that is no
    policy, given in ``setup["reference_pnl"]``, such as the clairvoyant bound)."""
    from foxhunt.evaluation import report

    evaluation = evaluate_policies({"policy": "buy_and_hold"}, random_market(801, num_levels=5, seed=3),
                                   baselines=("flat",), n_envs=2, steps=100,
                                   env_kwargs={"episode_length": 100, "levels": 5})
    pnl = evaluation.results["policy"].metrics["pnl"]
    assert report.headline_lines(evaluation, "policy") == []  # no oracle on this market
    evaluation.setup["reference_pnl"] = {"bound": 4 * abs(pnl) + 1.0}
    original = report.HEADLINE_REFERENCES
    try:
        report.HEADLINE_REFERENCES = (*original, ("bound", "the bound"))
        (line,) = report.headline_lines(evaluation, "policy")
        share = 100 * pnl / (4 * abs(pnl) + 1.0)
        assert line.startswith(f"share of the bound: {share:.1f} %")
        assert f"**{line}**" in markdown(evaluation, "policy", "t", {})
    finally:
        report.HEADLINE_REFERENCES = original
