"""Hand-worked GradVac corrections, EMA updates and the flat-gradient helpers."""

from __future__ import annotations

import math

import pytest
import torch as th
from torch import nn

from sb3_her_ext.vaccine import GradVac, assign_flat_grad, flat_grad


def test_correction_by_hand_from_zero_target() -> None:
    # phi = cos([1, 0], [-1, 1]) = -1/sqrt(2) < phi_hat = 0:
    # coef = |g_main| (0 * sin - phi * 1) / (|g_aux| * 1) = (1/sqrt(2)) / sqrt(2) = 0.5
    vac = GradVac(beta=0.01)
    g_new, cos, corrected = vac.correct(th.tensor([1.0, 0.0]), th.tensor([-1.0, 1.0]))
    assert th.allclose(g_new, th.tensor([0.5, 0.5]))
    assert cos.shape == () and cos.item() == pytest.approx(-1 / math.sqrt(2))
    assert corrected.shape == () and bool(corrected)
    assert vac.target_cos.item() == pytest.approx(0.01 * -1 / math.sqrt(2))
    # the corrected gradient reaches the target similarity (0)
    assert th.dot(g_new, th.tensor([-1.0, 1.0])).item() == pytest.approx(0.0, abs=1e-7)


def test_correction_by_hand_with_positive_target() -> None:
    # phi = 0, phi_hat = 0.5: coef = 1 * (0.5 * 1 - 0) / (2 * sqrt(0.75)) = 1 / (2 sqrt 3)
    vac = GradVac(beta=0.5)
    vac.target_cos.fill_(0.5)
    g_new, cos, corrected = vac.correct(th.tensor([1.0, 0.0]), th.tensor([0.0, 2.0]))
    assert th.allclose(g_new, th.tensor([1.0, 1.0 / math.sqrt(3.0)]))
    assert bool(corrected) and cos.item() == pytest.approx(0.0)
    new_cos = th.nn.functional.cosine_similarity(g_new, th.tensor([0.0, 2.0]), dim=0)
    assert new_cos.item() == pytest.approx(0.5, abs=1e-6)
    assert vac.target_cos.item() == pytest.approx(0.25)  # 0.5 * 0.5 + 0.5 * 0


def test_no_correction_when_cos_at_or_above_target() -> None:
    vac = GradVac(beta=0.5)
    g_main = th.tensor([1.0, 1.0])
    g_new, cos, corrected = vac.correct(g_main, th.tensor([1.0, 0.0]))
    assert th.equal(g_new, g_main)
    assert not bool(corrected)
    assert cos.item() == pytest.approx(1 / math.sqrt(2))
    assert vac.target_cos.item() == pytest.approx(0.5 / math.sqrt(2))
    # equal to the target: still no correction
    vac.target_cos.fill_(0.0)
    g_new, _, corrected = vac.correct(th.tensor([1.0, 0.0]), th.tensor([0.0, 3.0]))
    assert th.equal(g_new, th.tensor([1.0, 0.0])) and not bool(corrected)


def test_ema_tracks_repeated_cos() -> None:
    vac = GradVac(beta=0.1)
    for _ in range(3):
        vac.correct(th.tensor([1.0, 1.0]), th.tensor([1.0, 0.0]))
    phi = 1 / math.sqrt(2)
    assert vac.target_cos.item() == pytest.approx(phi * (1 - 0.9**3), rel=1e-6)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="beta=0"):
        GradVac(beta=0.0)
    with pytest.raises(ValueError, match="g_aux.shape"):
        GradVac().correct(th.zeros(3), th.zeros(4))


def test_flat_grad_round_trip() -> None:
    layer = nn.Linear(3, 2)
    (layer(th.ones(1, 3)).sum()).backward()
    flat = flat_grad(layer.parameters())
    assert flat.shape == (8,)
    assert th.allclose(flat, th.cat([th.ones(6), th.ones(2)]))  # d sum / dW = x = 1, d / db = 1
    assign_flat_grad(layer.parameters(), th.arange(8.0))
    assert th.equal(layer.weight.grad, th.arange(6.0).view(2, 3))
    assert th.equal(layer.bias.grad, th.tensor([6.0, 7.0]))
    fresh = nn.Linear(3, 2)
    assert th.equal(flat_grad(fresh.parameters()), th.zeros(8))  # no grads yet -> zeros
    with pytest.raises(ValueError, match="flat.shape"):
        assign_flat_grad(fresh.parameters(), th.zeros(7))
