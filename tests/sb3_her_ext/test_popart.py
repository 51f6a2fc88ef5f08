"""PopArt: normalise/denormalise, hand-worked moment update, output preservation of registered layers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from torch import nn

from sb3_her_ext.policy import BranchingIQNPolicy, BranchLinear
from sb3_her_ext.popart import PopArt


def test_normalize_denormalize_are_inverse() -> None:
    popart = PopArt()
    popart.mu.fill_(2.5)
    popart.sigma.fill_(4.0)
    x = th.tensor([-3.0, 0.0, 6.5])
    assert th.allclose(popart.normalize(x), th.tensor([-1.375, -0.625, 1.0]))
    assert th.allclose(popart.denormalize(popart.normalize(x)), x)
    assert th.allclose(popart.normalize(popart.denormalize(x)), x)


def test_update_moments_by_hand() -> None:
    # targets [1, 3]: mean 2, mean square 5; beta 0.5 from mu 0, nu 1:
    # mu = 1, nu = 0.5 + 2.5 = 3, sigma = sqrt(3 - 1) = sqrt(2)
    popart = PopArt(beta=0.5)
    popart.update(th.tensor([1.0, 3.0]))
    assert popart.mu.item() == pytest.approx(1.0)
    assert popart.nu.item() == pytest.approx(3.0)
    assert popart.sigma.item() == pytest.approx(math.sqrt(2.0))


def test_sigma_floor_for_constant_targets() -> None:
    popart = PopArt(beta=1.0, eps=1e-3)
    popart.update(th.full((4,), 7.0))
    assert popart.mu.item() == pytest.approx(7.0)
    assert popart.sigma.item() == pytest.approx(1e-3)


def test_update_preserves_registered_outputs() -> None:
    th.manual_seed(0)
    linear = nn.Linear(6, 3)
    stacked = BranchLinear(4, 6, 5)
    popart = PopArt(beta=0.3)
    popart.register(linear, stacked)
    x = th.randn(10, 6)
    xb = th.randn(4, 10, 6)
    before = (popart.denormalize(linear(x)).detach(), popart.denormalize(stacked(xb)).detach())
    for scale, shift in ((10.0, 5.0), (0.1, -3.0), (100.0, 40.0)):
        popart.update(th.randn(64) * scale + shift)
        assert not th.allclose(popart.sigma, th.ones(()))
        assert th.allclose(popart.denormalize(linear(x)), before[0], atol=1e-5, rtol=1e-5)
        assert th.allclose(popart.denormalize(stacked(xb)), before[1], atol=1e-5, rtol=1e-5)


def test_policy_quantiles_preserved_for_online_and_target() -> None:
    th.manual_seed(3)
    policy = BranchingIQNPolicy(
        spaces.Box(-1, 1, (12,), np.float32),
        spaces.MultiDiscrete([3, 3, 3, 3]),
        lambda _: 1e-3,
        n_market_features=9,
        net_arch=[32],
        n_ensemble=3,
        popart_beta=0.2,
    )
    obs, taus = th.randn(5, 12), th.rand(5, 8)
    with th.no_grad():
        online = policy.popart.denormalize(policy.q_net.quantiles(obs, taus))
        target = policy.popart.denormalize(policy.q_net_target.quantiles(obs, taus))
        q_before = policy.q_net.action_stats(obs, taus)[0]
        policy.popart.update(th.randn(256) * 20.0 + 7.0)
        assert policy.popart.sigma.item() > 1.5
        assert th.allclose(policy.popart.denormalize(policy.q_net.quantiles(obs, taus)), online, atol=1e-5)
        assert th.allclose(
            policy.popart.denormalize(policy.q_net_target.quantiles(obs, taus)), target, atol=1e-5
        )
        assert th.allclose(policy.q_net.action_stats(obs, taus)[0], q_before, atol=1e-5)


def test_normalize_bellman_reward_matches_denormalised_backup() -> None:
    popart = PopArt()
    popart.mu.fill_(1.5)
    popart.sigma.fill_(3.0)
    rewards = th.tensor([0.5, -2.0])
    discounts = th.tensor([0.99, 0.0])  # gamma * (1 - done)
    z = th.tensor([0.3, -1.2])
    expected = popart.normalize(rewards + discounts * popart.denormalize(z))
    assert th.allclose(popart.normalize_bellman_reward(rewards, discounts) + discounts * z, expected)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="beta=1.5"):
        PopArt(beta=1.5)
    with pytest.raises(ValueError, match="eps=0"):
        PopArt(eps=0.0)
    with pytest.raises(ValueError, match="weight and bias"):
        PopArt().register(nn.ReLU())
    with pytest.raises(ValueError, match="targets.shape"):
        PopArt().update(th.zeros(0))
