"""Hand-worked cases for the action-selection references ``branch_select`` and ``quantile_iqr`` (CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cuda_ext

F32 = torch.float32


def _select(q: list, *, iqr: list | None = None, ens_std: list | None = None, n_actions: list[int],
            eps: list[float], boltzmann: list[bool], u_explore: list, u_action: list, alpha: float = 0.0,
            beta: float = 0.0) -> list:
    q_t = torch.tensor(q, dtype=F32)
    zeros = torch.zeros_like(q_t)
    return cuda_ext.branch_select(
        q_t,
        torch.tensor(iqr, dtype=F32) if iqr is not None else zeros,
        torch.tensor(ens_std, dtype=F32) if ens_std is not None else zeros,
        n_actions=torch.tensor(n_actions), eps=torch.tensor(eps, dtype=F32),
        boltzmann=torch.tensor(boltzmann), u_explore=torch.tensor(u_explore, dtype=F32),
        u_action=torch.tensor(u_action, dtype=F32), alpha=alpha, beta=beta,
    ).tolist()


def test_eps_one_draws_uniformly_by_u_action() -> None:
    q = [[[5.0, 0.0, 0.0], [5.0, 0.0, 0.0]]] * 4
    u_action = [[0.0, 0.0], [0.34, 0.49], [0.67, 0.5], [0.999, 0.999]]
    actions = _select(q, n_actions=[3, 2], eps=[1.0, 1.0], boltzmann=[False, True],
                      u_explore=[[0.5, 0.99]] * 4, u_action=u_action)
    # floor(u * 3) on branch 0, floor(u * 2) on branch 1
    assert actions == [[0, 0], [1, 0], [2, 1], [2, 1]]


def test_uniform_draw_is_capped_at_the_last_action() -> None:
    # u_action = 1 (a generator that includes the end): floor(1 * 3) = 3 -> min(3, 2) = 2
    below_one = float(np.nextafter(np.float32(1), np.float32(0)))
    actions = _select([[[0.0, 0.0, 0.0]]] * 2, n_actions=[3], eps=[1.0], boltzmann=[False],
                      u_explore=[[0.0]] * 2, u_action=[[1.0], [below_one]])
    assert actions == [[2], [2]]


def test_eps_zero_takes_argmax_of_bonus_score_lowest_on_ties() -> None:
    q = [[[1.0, 2.0, 2.0], [1.0, 2.0, 0.0], [1.0, 2.0, 0.0]]]
    iqr = [[[0.0, 0.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]
    ens_std = [[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 5.0]]]
    actions = _select(q, iqr=iqr, ens_std=ens_std, n_actions=[3, 3, 3], eps=[0.0] * 3, boltzmann=[False] * 3,
                      u_explore=[[0.0] * 3], u_action=[[0.5] * 3], alpha=1.0, beta=0.5)
    # branch 0: tie 2, 2 -> 1; branch 1: 1 + 3 = 4 beats 2 -> 0; branch 2: 0 + 0.5 * 5 = 2.5 beats 2 -> 2
    assert actions == [[1, 0, 2]]


def test_explore_is_strictly_below_eps() -> None:
    q = [[[0.0, 9.0, 0.0]]] * 2
    actions = _select(q, n_actions=[3], eps=[0.25], boltzmann=[False], u_explore=[[0.25], [0.2499]],
                      u_action=[[0.0], [0.0]])
    assert actions == [[1], [0]]  # u_explore == eps exploits (argmax 1); below eps draws floor(0 * 3) = 0


def test_boltzmann_inverse_cdf_by_hand() -> None:
    # scores 0, 1, 2: tau = 2, p = exp(-1), exp(-0.5), 1; cumulative 0.3679, 0.9744, 1.9744.
    p = [math.exp(-1.0), math.exp(-0.5), 1.0]
    total = sum(p)
    cumulative = [p[0], p[0] + p[1], total]
    u_values = [0.1, 0.45, 0.5, 0.9]
    expected = [next(a for a, c in enumerate(cumulative) if c > u * total) for u in u_values]
    assert expected == [0, 1, 2, 2]
    actions = _select([[[0.0, 1.0, 2.0]]] * 4, n_actions=[3], eps=[0.0], boltzmann=[True],
                      u_explore=[[0.5]] * 4, u_action=[[u] for u in u_values])
    assert [a[0] for a in actions] == expected


def test_boltzmann_temperature_floor_on_flat_scores() -> None:
    # equal scores: tau = max(0, 0.01) = 0.01, p = 1, 1, 1; u * 3 -> first cumulative above it
    actions = _select([[[4.0, 4.0, 4.0]]] * 3, n_actions=[3], eps=[0.0], boltzmann=[True],
                      u_explore=[[0.9]] * 3, u_action=[[0.0], [0.5], [0.7]])
    assert actions == [[0], [1], [2]]


def test_boltzmann_small_spread_uses_floor_temperature() -> None:
    # scores 0 and 0.005: spread 0.005 < 0.01 -> tau = 0.01, p = exp(-0.5), 1
    p0 = math.exp(-0.5)
    boundary = p0 / (p0 + 1.0)  # 0.3775
    actions = _select([[[0.0, 0.005]]] * 2, n_actions=[2], eps=[0.0], boltzmann=[True],
                      u_explore=[[0.5]] * 2, u_action=[[boundary - 0.01], [boundary + 0.01]])
    assert actions == [[0], [1]]


def test_n_actions_masks_the_tail_of_short_branches() -> None:
    # branch 1 has 2 actions of 3: its third q (99) must never win, in argmax, Boltzmann or exploration
    q = [[[0.0, 1.0, 2.0], [0.0, 1.0, 99.0]]] * 3
    greedy = _select(q[:1], n_actions=[3, 2], eps=[0.0, 0.0], boltzmann=[False, False],
                     u_explore=[[0.5, 0.5]], u_action=[[0.99, 0.99]])
    assert greedy == [[2, 1]]
    sampled = _select(q, n_actions=[3, 2], eps=[0.0, 0.0], boltzmann=[False, True],
                      u_explore=[[0.5, 0.5]] * 3, u_action=[[0.0, 0.0], [0.0, 0.5], [0.0, 0.999]])
    # branch 1 Boltzmann over scores 0, 1: tau 1, p = exp(-1), 1; boundary exp(-1) / (1 + exp(-1)) = 0.269
    assert [a[1] for a in sampled] == [0, 1, 1]
    explored = _select(q[:1], n_actions=[3, 2], eps=[1.0, 1.0], boltzmann=[False, False],
                       u_explore=[[0.0, 0.0]], u_action=[[0.99, 0.99]])
    assert explored == [[2, 1]]


def test_branch_select_rejects_bad_n_actions_and_shapes() -> None:
    with pytest.raises(ValueError, match=r"n_actions\[1\]=4"):
        _select([[[0.0, 0.0, 0.0]] * 2], n_actions=[3, 4], eps=[0.0, 0.0], boltzmann=[False, False],
                u_explore=[[0.0, 0.0]], u_action=[[0.0, 0.0]])
    with pytest.raises(ValueError, match="u_action.shape"):
        _select([[[0.0, 0.0]]], n_actions=[2], eps=[0.0], boltzmann=[False], u_explore=[[0.0]],
                u_action=[[0.0, 0.0]])


def test_branch_select_deterministic_and_in_range_on_random_input() -> None:
    gen = torch.Generator().manual_seed(0)
    n_books, n_branches, max_actions = 257, 4, 5
    q = torch.randn(n_books, n_branches, max_actions, generator=gen)
    n_actions = torch.tensor([5, 3, 2, 1])
    args = (q, torch.rand(q.shape, generator=gen), torch.rand(q.shape, generator=gen))
    kwargs = {
        "n_actions": n_actions, "eps": torch.tensor([0.1, 0.0, 0.5, 1.0]),
        "boltzmann": torch.tensor([True, True, False, False]),
        "u_explore": torch.rand(n_books, n_branches, generator=gen),
        "u_action": torch.rand(n_books, n_branches, generator=gen), "alpha": 0.3, "beta": 0.2,
    }
    first = cuda_ext.branch_select(*args, **kwargs)
    assert torch.equal(first, cuda_ext.branch_select(*args, **kwargs))
    assert (first >= 0).all() and (first < n_actions).all()
    assert (first[:, 3] == 0).all()


# --------------------------------------------------------------------------- quantile_iqr


def test_quantile_iqr_by_hand() -> None:
    samples = torch.tensor([[5.0, 1.0, 4.0, 2.0, 3.0], [10.0, 0.0, 0.0, 0.0, 0.0]])
    # row 0 sorted 1..5: pos 1 and 3 -> 4 - 2 = 2. row 1 sorted 0,0,0,0,10: Q75 = 0, Q25 = 0.
    assert cuda_ext.quantile_iqr(samples).tolist() == [2.0, 0.0]
    # two samples 0, 10: pos 0.25 -> 2.5, pos 0.75 -> 7.5
    assert cuda_ext.quantile_iqr(torch.tensor([10.0, 0.0])).tolist() == 5.0
    assert cuda_ext.quantile_iqr(torch.tensor([[3.0]])).tolist() == [0.0]


@pytest.mark.parametrize("n_samples", [1, 2, 3, 4, 7, 8, 31, 32, 33, 64, 65, 100])
def test_quantile_iqr_equals_torch_quantile(n_samples: int) -> None:
    gen = torch.Generator().manual_seed(n_samples)
    samples = torch.randn(6, 5, n_samples, generator=gen) * 3.0
    expected = torch.quantile(samples, 0.75, dim=-1) - torch.quantile(samples, 0.25, dim=-1)
    got = cuda_ext.quantile_iqr(samples)
    assert got.shape == (6, 5)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_quantile_iqr_nan_row_gives_nan() -> None:
    samples = torch.tensor([[1.0, float("nan"), 3.0], [1.0, 2.0, 3.0]])
    got = cuda_ext.quantile_iqr(samples)
    assert math.isnan(got[0].item()) and got[1].item() == 1.0


def test_quantile_iqr_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="samples.dtype"):
        cuda_ext.quantile_iqr(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="samples.shape"):
        cuda_ext.quantile_iqr(torch.zeros(3, 0))


@pytest.mark.slow
def test_quantile_iqr_has_no_size_limit() -> None:
    # 2 rows of 2^23 + 1 (more than the 2^24 elements older torch.quantile accepts), each a shuffled
    # 0..n-1: sorted v[i] = i, so Q25 = 2^21 and Q75 = 3 * 2^21 exactly, IQR = 2^22.
    n_samples = (1 << 23) + 1
    gen = torch.Generator().manual_seed(1)
    samples = torch.stack([torch.randperm(n_samples, generator=gen) for _ in range(2)]).to(F32)
    assert cuda_ext.quantile_iqr(samples).tolist() == [float(1 << 22)] * 2
