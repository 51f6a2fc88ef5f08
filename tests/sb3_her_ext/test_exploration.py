"""Per-branch exploration: ε = min(1, ε·mult), schedules by hand, branch settings, branch_select calls."""

from __future__ import annotations

import pytest
import torch as th

from foxhunt import presets
from sb3_her_ext.exploration import (
    branch_epsilons,
    default_branch_names,
    linear_anneal,
    resolve_boltzmann_branches,
    resolve_exploration_mults,
    select_actions,
)

LOB = list(presets.BRANCH_NAMES)


def test_branch_epsilons_by_hand() -> None:
    mults = th.tensor([1.0, 2.0, 1.5, 1.5])
    assert branch_epsilons(0.3, mults).tolist() == pytest.approx([0.3, 0.6, 0.45, 0.45])
    # ε·mult above 1 is capped at 1, per branch
    assert branch_epsilons(0.6, mults).tolist() == pytest.approx([0.6, 1.0, 0.9, 0.9])
    assert branch_epsilons(0.0, mults).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_linear_anneal_by_hand() -> None:
    assert linear_anneal(0.3, 0.05, 1.0) == pytest.approx(0.3)
    assert linear_anneal(0.3, 0.05, 0.5) == pytest.approx(0.175)
    assert linear_anneal(0.3, 0.05, 0.0) == pytest.approx(0.05)
    assert linear_anneal(0.4, 1.0, 0.25) == pytest.approx(0.85)


def test_generic_defaults_multiplier_one_and_no_boltzmann_branch() -> None:
    assert default_branch_names(4) == ("0", "1", "2", "3")
    for names in (LOB, list(default_branch_names(4)), ["0", "1"], ["0"]):
        assert resolve_exploration_mults(None, names) == [1.0] * len(names)
        assert resolve_boltzmann_branches(None, names) == [False] * len(names)


def test_trading_presets_give_the_lob_mults_and_boltzmann_branches() -> None:
    kwargs = presets.trading_algorithm_kwargs()
    assert resolve_exploration_mults(kwargs["exploration_mults"], LOB) == [1.0, 2.0, 1.5, 1.5]
    assert resolve_boltzmann_branches(kwargs["boltzmann_branches"], LOB) == [False, False, True, True]


def test_mults_by_list_name_and_index() -> None:
    assert resolve_exploration_mults([1, 1, 1, 3], LOB) == [1.0, 1.0, 1.0, 3.0]
    assert resolve_exploration_mults({"order": 4.0, 0: 0.5}, LOB) == [0.5, 1.0, 4.0, 1.0]
    trading = {**presets.EXPLORATION_MULTS, "order": 4.0, 0: 0.5}
    assert resolve_exploration_mults(trading, LOB) == [0.5, 2.0, 4.0, 1.5]
    assert resolve_exploration_mults({"2": 3.0}, default_branch_names(3)) == [1.0, 1.0, 3.0]
    assert resolve_boltzmann_branches(["direction", 3], LOB) == [True, False, False, True]
    assert resolve_boltzmann_branches([], LOB) == [False] * 4


@pytest.mark.parametrize(
    ("mults", "match"),
    [
        ([1.0, 2.0], "exploration_mults has length 2"),
        ({"speed": 1.0}, "exploration_mults: unknown branch 'speed'"),
        ({7: 1.0}, "exploration_mults: branch index 7"),
        ([1.0, -1.0, 1.0, 1.0], r"exploration_mults\['magnitude'\]=-1.0"),
    ],
)
def test_bad_mults_raise_naming_the_field(mults, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_exploration_mults(mults, LOB)


def test_bad_boltzmann_branch_raises() -> None:
    with pytest.raises(ValueError, match="boltzmann_branches: unknown branch 'speed'"):
        resolve_boltzmann_branches(["speed"], LOB)


def _stats(batch: int) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
    """Two branches (3 and 2 actions, padded to 3): q prefers action 2 / action 0."""
    q = th.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, -th.inf]]).expand(batch, -1, -1).contiguous()
    zeros = th.zeros_like(q).masked_fill(q.isinf(), 0.0)
    return q, zeros, zeros.clone(), th.tensor([3, 2])


def test_greedy_without_exploration() -> None:
    q, iqr, ens, n_actions = _stats(64)
    gen = th.Generator().manual_seed(0)
    actions = select_actions(q, iqr, ens, n_actions, th.zeros(2), th.zeros(2, dtype=th.bool), 0.3, 0.2, gen)
    assert actions.shape == (64, 2) and actions.dtype == th.int64
    assert (actions[:, 0] == 2).all() and (actions[:, 1] == 0).all()


def test_iqr_bonus_changes_the_greedy_action() -> None:
    q, iqr, ens, n_actions = _stats(8)
    iqr = iqr.clone()
    iqr[:, 0, 0] = 10.0  # score of action 0 in branch 0: 0 + 0.3 * 10 = 3 > 2
    gen = th.Generator().manual_seed(0)
    eps, flags = th.zeros(2), th.zeros(2, dtype=th.bool)
    assert (select_actions(q, iqr, ens, n_actions, eps, flags, 0.3, 0.0, gen)[:, 0] == 0).all()
    assert (select_actions(q, iqr, ens, n_actions, eps, flags, 0.0, 0.0, gen)[:, 0] == 2).all()


def test_full_exploration_is_uniform_over_valid_actions() -> None:
    q, iqr, ens, n_actions = _stats(6000)
    gen = th.Generator().manual_seed(1)
    actions = select_actions(q, iqr, ens, n_actions, th.ones(2), th.zeros(2, dtype=th.bool), 0.0, 0.0, gen)
    counts0 = th.bincount(actions[:, 0], minlength=3).float() / 6000
    counts1 = th.bincount(actions[:, 1], minlength=3).float() / 6000
    assert th.allclose(counts0, th.full((3,), 1 / 3), atol=0.03)
    assert th.allclose(counts1, th.tensor([0.5, 0.5, 0.0]), atol=0.03)  # padded action 2 never chosen


def test_per_branch_eps_explores_only_that_branch() -> None:
    q, iqr, ens, n_actions = _stats(4000)
    gen = th.Generator().manual_seed(2)
    actions = select_actions(
        q, iqr, ens, n_actions, th.tensor([0.0, 0.5]), th.zeros(2, dtype=th.bool), 0.0, 0.0, gen
    )
    assert (actions[:, 0] == 2).all()
    # branch 1 explores half the time, uniformly over 2 actions: the greedy action 0 is taken 75%
    assert (actions[:, 1] == 0).float().mean().item() == pytest.approx(0.75, abs=0.03)


def test_boltzmann_flag_samples_by_score() -> None:
    q, iqr, ens, n_actions = _stats(6000)
    gen = th.Generator().manual_seed(3)
    flags = th.tensor([True, False])
    actions = select_actions(q, iqr, ens, n_actions, th.zeros(2), flags, 0.0, 0.0, gen)
    # branch 0: tau = 2 - 0 = 2, p ∝ exp([-1, -0.5, 0])
    expected = th.softmax(th.tensor([-1.0, -0.5, 0.0]), dim=0)
    freq = th.bincount(actions[:, 0], minlength=3).float() / 6000
    assert th.allclose(freq, expected, atol=0.03)
    assert (actions[:, 1] == 0).all()  # the non-Boltzmann branch stays greedy


def test_same_generator_seed_same_actions() -> None:
    q, iqr, ens, n_actions = _stats(256)
    eps, flags = th.tensor([0.5, 0.5]), th.tensor([True, False])

    def draw(seed: int) -> th.Tensor:
        return select_actions(q, iqr, ens, n_actions, eps, flags, 0.1, 0.1, th.Generator().manual_seed(seed))

    assert th.equal(draw(5), draw(5))
    assert not th.equal(draw(5), draw(6))
