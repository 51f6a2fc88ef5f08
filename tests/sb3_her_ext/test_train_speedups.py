"""The train step's fast paths against the plain computations they replace, on random inputs."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from torch import nn

from sb3_her_ext import BranchingIQN, losses
from sb3_her_ext import fused_iqn_head as fused_module
from sb3_her_ext.losses import quantile_huber_loss
from sb3_her_ext.policy import (
    BranchingIQNPolicy,
    BranchingQNetwork,
    BranchLinear,
    _taken_logits,
    _TakenQuantileHead,
    default_optimizer_kwargs,
)
from sb3_her_ext.popart import PopArt
from sb3_her_ext.vaccine import assign_flat_grad


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("action_dims", [[3, 3, 3, 3], [2, 4, 3]])
def test_taken_quantiles_match_gathering_all_quantiles(shared: bool, action_dims: list[int]) -> None:
    """Values and gradients of the selected-columns pass equal gathering from the full pass."""
    th.manual_seed(4)
    net = BranchingQNetwork(9, 6, action_dims, [3] * len(action_dims), net_arch=[16, 12], n_ensemble=3,
                            n_cos=8, n_atoms=7, shared_tau_embedding=shared).double()
    obs, taus = th.randn(5, 9, dtype=th.float64), th.rand(5, 4, dtype=th.float64)
    actions = th.stack([th.randint(0, n, (5,)) for n in action_dims], dim=1)
    upstream_q = th.randn(3, 5, len(action_dims), 4, dtype=th.float64)
    upstream_logits = th.randn(5, len(action_dims), 7, dtype=th.float64)

    def loss_and_grads(fast: bool) -> tuple[th.Tensor, th.Tensor, list[th.Tensor]]:
        net.zero_grad()
        if fast:
            quantiles, logits = net.taken_quantiles_and_logits(obs, taus, actions)
        else:
            z, all_logits = net.quantiles_and_logits(obs, taus)  # [E, B, NB, A, N], [B, NB, A, atoms]
            index = actions[None, :, :, None, None].expand(3, -1, -1, 1, 4)
            quantiles = z.gather(3, index).squeeze(3)
            logits = all_logits.gather(2, actions[:, :, None, None].expand(-1, -1, 1, 7)).squeeze(2)
        ((quantiles * upstream_q).sum() + (logits * upstream_logits).sum()).backward()
        return quantiles.detach(), logits.detach(), [p.grad.clone() for p in net.parameters()]

    fast, reference = loss_and_grads(True), loss_and_grads(False)
    assert fast[0].shape == (3, 5, len(action_dims), 4)
    assert th.allclose(fast[0], reference[0]) and th.allclose(fast[1], reference[1])
    for got, expected in zip(fast[2], reference[2], strict=True):
        assert th.allclose(got, expected)


def test_adam_is_fused_unless_the_user_chooses() -> None:
    assert default_optimizer_kwargs(th.optim.Adam, None) == {"fused": True}
    assert default_optimizer_kwargs(th.optim.AdamW, {"eps": 1e-5}) == {"eps": 1e-5, "fused": True}
    for chosen in ({"fused": False}, {"foreach": True}, {"differentiable": True}):
        assert default_optimizer_kwargs(th.optim.Adam, chosen) == chosen
    assert default_optimizer_kwargs(th.optim.SGD, {"momentum": 0.9}) == {"momentum": 0.9}
    user = {"eps": 1e-5}
    default_optimizer_kwargs(th.optim.Adam, user)
    assert user == {"eps": 1e-5}  # the caller's dict is not modified
    policy = BranchingIQNPolicy(spaces.Box(-1, 1, (5,), np.float32), spaces.MultiDiscrete([3, 2]),
                                lambda _: 1e-3, net_arch=[8])
    assert policy.optimizer.param_groups[0]["fused"] is True
    assert policy._get_constructor_parameters()["optimizer_kwargs"] == {"fused": True}


def test_fused_adam_steps_like_the_for_loop_adam() -> None:
    th.manual_seed(5)
    nets = [BranchingQNetwork(6, 6, [3, 3], [2, 2], net_arch=[8], n_ensemble=2, n_cos=4, n_atoms=5)
            for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    fused = default_optimizer_kwargs(th.optim.Adam, None)
    optimizers = [th.optim.Adam(nets[0].parameters(), lr=1e-2, foreach=False),
                  th.optim.Adam(nets[1].parameters(), lr=1e-2, **fused)]
    for _ in range(3):
        grads = [th.randn_like(p) for p in nets[0].parameters()]
        for net, optimizer in zip(nets, optimizers, strict=True):
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert th.allclose(a, b, atol=1e-6)


def test_popart_update_matches_the_textbook_rescaling() -> None:
    th.manual_seed(6)
    layers = [nn.Linear(4, 3), BranchLinear(2, 4, 5)]
    popart = PopArt(beta=0.3)
    popart.register(*layers)
    popart.mu.fill_(0.7)
    popart.nu.fill_(2.0)
    popart.sigma.fill_(1.2)
    targets = th.randn(50) * 4.0 + 2.0
    before = [(layer.weight.detach().clone(), layer.bias.detach().clone()) for layer in layers]
    mu = 0.7 * 0.7 + 0.3 * targets.mean()
    nu = 0.7 * 2.0 + 0.3 * (targets**2).mean()
    sigma = (nu - mu**2).clamp(min=popart.eps**2).sqrt()
    popart.update(targets)
    assert th.allclose(popart.mu, mu) and th.allclose(popart.nu, nu) and th.allclose(popart.sigma, sigma)
    for layer, (weight, bias) in zip(layers, before, strict=True):
        assert th.allclose(layer.weight, weight * 1.2 / sigma)
        assert th.allclose(layer.bias, (1.2 * bias + 0.7 - mu) / sigma, atol=1e-6)


def test_assign_flat_grad_with_and_without_existing_grads() -> None:
    params = [nn.Parameter(th.zeros(2, 3)), nn.Parameter(th.zeros(4)), nn.Parameter(th.zeros(1))]
    params[1].grad = th.full((4,), 9.0)
    flat = th.randn(11)
    assign_flat_grad(params, flat)
    assert th.equal(params[0].grad, flat[:6].view(2, 3))
    assert th.equal(params[1].grad, flat[6:10])
    assert th.equal(params[2].grad, flat[10:])
    flat[:] = 0.0  # the new grads are copies, not views of the flat vector
    assert not th.equal(params[0].grad, th.zeros(2, 3))


@pytest.mark.slow
def test_compiled_quantile_huber_matches_the_fused_loss() -> None:
    """torch.compile-d pairwise loss against the fused autograd function: values and both gradients, with
    broadcast targets, N != N', kappa != 1, ties and errors far outside kappa (one shape: one compile)."""
    gen = th.Generator().manual_seed(8)
    current = (th.randn(3, 4, 2, 6, generator=gen, dtype=th.float64) * 5.0).requires_grad_()
    target = th.randn(3, 4, 1, 9, generator=gen, dtype=th.float64) * 5.0
    target[..., 0, 0] = current.detach()[..., 0, 0]  # ties: delta = 0
    target.requires_grad_()
    taus = th.rand(4, 6, generator=gen, dtype=th.float64)[None, :, None, :].expand_as(current)
    upstream = th.randn(3, 4, 2, generator=gen, dtype=th.float64)
    results = []
    for compiled in (False, True):
        loss = quantile_huber_loss(current, target, taus, kappa=0.7, compiled=compiled)
        results.append((loss, *th.autograd.grad((loss * upstream).sum(), (current, target))))
    for fused, compiled in zip(*results, strict=True):
        assert th.allclose(fused, compiled)


def test_compile_loss_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="compile_loss=1"):
        BranchingIQN("MlpPolicy", "CartPole-v1", compile_loss=1)


@pytest.mark.gpu
@pytest.mark.slow
def test_compiled_quantile_huber_and_fused_adam_on_cuda() -> None:
    """On CUDA: the compiled loss (Triton) equals the fused one, and a train step with compile_loss and the
    default (fused) Adam runs and changes the parameters."""
    gen = th.Generator(device="cuda").manual_seed(3)
    current = th.randn(5, 64, 4, 32, device="cuda", generator=gen).requires_grad_()
    target = th.randn(5, 64, 1, 32, device="cuda", generator=gen)
    taus = th.rand(64, 32, device="cuda", generator=gen)[None, :, None, :].expand_as(current)
    results = []
    for compiled in (False, True):
        loss = quantile_huber_loss(current, target, taus, compiled=compiled)
        results.append((loss, *th.autograd.grad(loss.sum(), current)))
    for fused, compiled in zip(*results, strict=True):
        assert th.allclose(fused, compiled, atol=1e-5, rtol=1e-4)
    env = spaces.MultiDiscrete([3, 3, 3, 3])
    model = BranchingIQN("MlpPolicy", _RandomEnv(env), learning_starts=64, batch_size=32, buffer_size=1000,
                         compile_loss=True, seed=0, device="cuda", policy_kwargs=dict(net_arch=[32]))
    model.learn(64)
    assert model.policy.optimizer.param_groups[0]["fused"] is True
    before = [p.detach().clone() for p in model.policy.q_net.parameters()]
    model.train(gradient_steps=6, batch_size=32)
    assert any(not th.equal(a, b) for a, b in zip(before, model.policy.q_net.parameters(), strict=True))


class _RandomEnv(gym.Env):
    """Random 6-feature observations and rewards; the action space is given."""

    def __init__(self, action_space: spaces.Space) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (6,), np.float32)
        self.action_space = action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self.observation_space.sample(), float(self.np_random.standard_normal()), False, False, {}


def _old_quantile_huber_row_sums(
    current: th.Tensor, target: th.Tensor, taus: th.Tensor, kappa: float
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """The ``[rows, N, N']``-layout forward of the fused loss before the ``[N', rows, N]`` layout (a frozen
    copy of the previous implementation, one block): ``(loss [rows], grad_current [rows, N], grad_target
    [rows, N'])`` for unit upstream gradients."""
    delta = target[:, None, :] - current[:, :, None]
    clipped = delta.clamp(-kappa, kappa)
    negative = clipped.clamp(max=0.0)
    neg_weight = 1.0 - 2.0 * taus
    grad_target = th.bmm(taus[:, None, :], clipped) + th.bmm(neg_weight[:, None, :], negative)
    half = delta - 0.5 * clipped
    loss_sums = (clipped * half).sum(-1), (negative * half).sum(-1)
    grad_sums = clipped.sum(-1), negative.sum(-1)
    scale = 1.0 / (kappa * target.shape[-1])
    loss = (taus * loss_sums[0] + neg_weight * loss_sums[1]).sum(-1) * scale
    grad_current = -(taus * grad_sums[0] + neg_weight * grad_sums[1]) * scale
    return loss, grad_current, grad_target.squeeze(1) * scale


@pytest.mark.parametrize("pairs_per_chunk", [1 << 16, 150, 1])
@pytest.mark.parametrize("dtype", [th.float32, th.float64])
def test_quantile_huber_blocks_match_the_formula_and_the_old_layout(
    monkeypatch: pytest.MonkeyPatch, pairs_per_chunk: int, dtype: th.dtype
) -> None:
    """The ``[N', rows, N]``-layout loss in one block, in several blocks with a partial last one, and one row
    per block: values and both gradients against the textbook formula under autograd and against the old
    ``[rows, N, N']`` layout, with ties, errors far outside kappa and a broadcast (expanded) target."""
    monkeypatch.setattr(losses, "CPU_PAIRS_PER_CHUNK", pairs_per_chunk)
    gen = th.Generator().manual_seed(11)
    current = th.randn(3, 7, 4, 6, generator=gen, dtype=dtype) * 3.0
    target = th.randn(3, 7, 1, 5, generator=gen, dtype=dtype) * 3.0
    target[:, :, 0, 0] = current[:, :, 0, 0]  # ties: delta = 0
    taus = th.rand(7, 6, generator=gen, dtype=dtype)[None, :, None, :]
    upstream = th.randn(3, 7, 4, generator=gen, dtype=dtype)
    kappa = 0.8
    current.requires_grad_()
    target.requires_grad_()
    fused = quantile_huber_loss(current, target.expand(-1, -1, 4, -1), taus.expand_as(current), kappa)
    grads = th.autograd.grad((fused * upstream).sum(), (current, target))
    delta = target.unsqueeze(-2) - current.unsqueeze(-1)
    huber = th.where(delta.abs() <= kappa, 0.5 * delta**2, kappa * (delta.abs() - 0.5 * kappa))
    weight = (taus.unsqueeze(-1) - (delta < 0).to(dtype)).abs()
    naive = (weight * huber / kappa).mean(-1).sum(-1)
    expected = th.autograd.grad((naive * upstream).sum(), (current, target))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == th.float32 else {}
    assert th.allclose(fused, naive, **tol)
    assert th.allclose(grads[0], expected[0], **tol) and th.allclose(grads[1], expected[1], **tol)
    rows = [
        x.detach().broadcast_to(3, 7, 4, x.shape[-1]).reshape(-1, x.shape[-1])
        for x in (current, target, taus)
    ]
    old_loss, old_grad_current, old_grad_target = _old_quantile_huber_row_sums(*rows, kappa)
    flat_upstream = upstream.reshape(-1, 1)
    assert th.allclose(fused.detach().reshape(-1), old_loss, **tol)
    assert th.allclose(grads[0].reshape(-1, 6), old_grad_current * flat_upstream, **tol)
    old_target_grad = (old_grad_target * flat_upstream).view(3, 7, 4, 5).sum(2, keepdim=True)
    assert th.allclose(grads[1], old_target_grad, **tol)
    if dtype == th.float64:  # without a target gradient (training's detached target) too
        assert th.autograd.gradcheck(
            lambda c: quantile_huber_loss(c, target.detach(), taus.expand_as(c), kappa), (current,)
        )
        assert th.autograd.gradcheck(
            lambda c, t: quantile_huber_loss(c, t.expand(-1, -1, 4, -1), taus.expand_as(c), kappa),
            (current, target),
        )


@pytest.mark.parametrize("pairs_per_chunk", [1 << 16, 150])
def test_quantile_huber_of_a_permuted_current_equals_the_contiguous_one_exactly(
    monkeypatch: pytest.MonkeyPatch, pairs_per_chunk: int
) -> None:
    """The training step's quantiles are a permuted view ``[E, B, NB, N]`` of a ``[B, NB * E, N]`` output; the
    loss takes its rows in that memory order (no copy). Loss, its layout and both gradients are bit for bit
    those of the same values passed contiguous (float32, in one chunk and in several), and the gradient
    reaches the output with its layout (no copy in the view's backward)."""
    monkeypatch.setattr(losses, "CPU_PAIRS_PER_CHUNK", pairs_per_chunk)
    gen = th.Generator().manual_seed(21)
    n_ensemble, batch, n_branches, n = 5, 16, 4, 8
    out = (th.randn(batch, n_branches * n_ensemble, n, generator=gen) * 2.0).requires_grad_()
    target = (th.randn(n_ensemble, batch, 1, 6, generator=gen) * 2.0).requires_grad_()
    taus = th.rand(batch, n, generator=gen)[None, :, None, :]
    upstream = th.randn(n_ensemble, batch, n_branches, generator=gen)
    permuted = out.view(batch, n_branches, n_ensemble, n).permute(2, 0, 1, 3)
    contiguous = permuted.detach().contiguous().requires_grad_()
    results = []
    for current in (permuted, contiguous):
        loss = quantile_huber_loss(
            current, target.expand(-1, -1, n_branches, -1), taus.expand_as(current), kappa=0.9
        )
        assert loss.is_contiguous()
        grads = th.autograd.grad((loss * upstream).sum(), (current, target))
        results.append((loss, *grads))
    for from_permuted, from_contiguous in zip(*results, strict=True):
        assert th.equal(from_permuted, from_contiguous)
    assert results[0][1].stride() == permuted.stride()


@pytest.mark.parametrize("pairs_per_chunk", [1 << 16, 150])
def test_quantile_huber_without_values_has_the_same_gradients_exactly(
    monkeypatch: pytest.MonkeyPatch, pairs_per_chunk: int
) -> None:
    """``values=False`` (the vaccine batch, backpropagated only): zeros, and both gradients bit for bit those
    of the full loss (float32, one chunk and several)."""
    monkeypatch.setattr(losses, "CPU_PAIRS_PER_CHUNK", pairs_per_chunk)
    gen = th.Generator().manual_seed(23)
    out = (th.randn(16, 4 * 5, 8, generator=gen) * 2.0).requires_grad_()
    target = (th.randn(5, 16, 1, 6, generator=gen) * 2.0).requires_grad_()
    taus = th.rand(16, 8, generator=gen)[None, :, None, :]
    upstream = th.randn(5, 16, 4, generator=gen)
    current = out.view(16, 4, 5, 8).permute(2, 0, 1, 3)
    results = []
    for values in (True, False):
        loss = quantile_huber_loss(
            current, target.expand(-1, -1, 4, -1), taus.expand_as(current), kappa=0.9, values=values
        )
        results.append((loss, *th.autograd.grad((loss * upstream).sum(), (out, target))))
    assert results[0][0].abs().sum() > 0 and th.equal(results[1][0], th.zeros_like(results[0][0]))
    assert th.equal(results[0][1], results[1][1]) and th.equal(results[0][2], results[1][2])


def test_vaccine_loss_without_values_has_the_same_gradient_exactly() -> None:
    """The vaccine batch's loss (``values=False``: no IQN loss values, no TD errors) gives the online network
    the same gradient bit for bit as the full loss, from the same draws."""
    model = BranchingIQN(
        "MlpPolicy", _RandomEnv(spaces.MultiDiscrete([3, 3, 3, 3])), learning_starts=64, batch_size=32,
        buffer_size=500, seed=3, device="cpu",
        policy_kwargs=dict(net_arch=[16, 16], n_quantiles=8, n_quantiles_target=8, n_quantiles_act=8),
    )
    model.learn(80)
    batch = model.replay_buffer.sample(32)
    params = list(model.q_net.parameters())
    grads = []
    for values in (True, False):
        model._generator.manual_seed(5)
        result = model._distributional_loss(batch, update_popart=False, values=values)
        assert (result.td_abs is None) == (not values)
        grads.append(th.autograd.grad(result.per_sample.mean(), params, allow_unused=True))
    for full, gradient_only in zip(*grads, strict=True):
        assert (full is None and gradient_only is None) or th.equal(full, gradient_only)


@pytest.mark.parametrize("rows_per_block", [8, 12, 1 << 20])
@pytest.mark.parametrize("activation", [nn.ReLU, nn.Tanh])
def test_taken_quantiles_in_blocks_and_without_autograd_match_gathering(
    monkeypatch: pytest.MonkeyPatch, rows_per_block: int, activation: type[nn.Module]
) -> None:
    """The taken-action pass in CPU blocks of 2 and 3 samples (5 samples: a partial last block) and in one
    block, with the fused ReLU head and the plain ops of another activation: values and gradients equal
    gathering from the full pass, and the same values under ``no_grad`` (where nothing is kept)."""
    monkeypatch.setattr(fused_module, "CPU_EMBEDDING_ROWS_PER_BLOCK", rows_per_block)
    th.manual_seed(14)
    net = BranchingQNetwork(
        9,
        6,
        [3, 2, 3],
        [3, 2, 3],
        net_arch=[16, 12],
        n_ensemble=3,
        n_cos=8,
        n_atoms=7,
        activation_fn=activation,
    ).double()
    obs, taus = th.randn(5, 9, dtype=th.float64), th.rand(5, 4, dtype=th.float64)
    actions = th.stack([th.randint(0, n, (5,)) for n in (3, 2, 3)], dim=1)
    upstream = th.randn(3, 5, 3, 4, dtype=th.float64)
    quantiles, _ = net.taken_quantiles_and_logits(obs, taus, actions)
    grads = th.autograd.grad((quantiles * upstream).sum(), list(net.parameters()), allow_unused=True)
    z, _ = net.quantiles_and_logits(obs, taus)
    expected = z.gather(3, actions[None, :, :, None, None].expand(3, -1, -1, 1, 4)).squeeze(3)
    expected_grads = th.autograd.grad((expected * upstream).sum(), list(net.parameters()), allow_unused=True)
    assert th.allclose(quantiles, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        assert (got is None) == (want is None)
        assert got is None or th.allclose(got, want)
    with th.no_grad():
        assert th.allclose(net.taken_quantiles_and_logits(obs, taus, actions)[0], expected)


@pytest.mark.parametrize("block", [1, 2, 3, 10])
@pytest.mark.parametrize(
    "needs",
    [
        (True, True, True, True),
        (True, False, False, False),
        (False, True, False, False),
        (False, False, True, False),
        (False, False, False, True),
    ],
)
def test_taken_quantile_head_matches_autograd_of_the_plain_ops(block: int, needs: tuple[bool, ...]) -> None:
    """The fused taken-action IQN head (tau embedding, ReLU, one-hot selected and folded weights) in blocks of
    1, 2 and 3 samples and in one block: values and its custom backward against autograd through the plain
    ops, and gradcheck, for every subset of inputs that need a gradient; the same values without autograd."""
    gen = th.Generator().manual_seed(12)
    batch, n_taus, n_branches, n_actions, n_ensemble, hidden_dim, n_cos = 3, 5, 2, 3, 3, 4, 6
    taus = th.rand(batch, n_taus, generator=gen, dtype=th.float64)
    frequencies = th.arange(n_cos, dtype=th.float64) * math.pi
    tau_weight = th.randn(hidden_dim, n_cos, generator=gen, dtype=th.float64)
    features = th.randn(n_branches, batch, hidden_dim, generator=gen, dtype=th.float64).relu().transpose(0, 1)
    actions = th.randint(0, n_actions, (batch, n_branches), generator=gen)
    rows = (actions + th.arange(n_branches) * n_actions).view(-1)
    selector = th.nn.functional.one_hot(rows, n_branches * n_actions).to(th.float64)
    weight_rows = th.randn(n_branches * n_actions, n_ensemble * hidden_dim, generator=gen, dtype=th.float64)
    bias = th.randn(batch, n_branches * n_ensemble, generator=gen, dtype=th.float64)
    inputs = [
        x.clone().requires_grad_(need)
        for x, need in zip((tau_weight, features.unsqueeze(2), weight_rows, bias), needs, strict=True)
    ]
    upstream = th.randn(batch, n_branches * n_ensemble, n_taus, generator=gen, dtype=th.float64)

    def fused(tau_w: th.Tensor, feats: th.Tensor, weights: th.Tensor, b: th.Tensor) -> th.Tensor:
        return _TakenQuantileHead.apply(taus, frequencies, tau_w, feats, selector, rows, weights, b, block)

    out = fused(*inputs)
    embedding = th.matmul(th.cos(taus[..., None] * frequencies), inputs[0].t()).relu()
    taken = th.mm(selector, inputs[2]).view(batch, n_branches, n_ensemble, hidden_dim)
    folded = (taken * inputs[1]).view(batch, n_branches * n_ensemble, hidden_dim)
    plain = th.baddbmm(inputs[3].unsqueeze(-1), folded, embedding.transpose(1, 2))
    assert out.shape == (batch, n_branches * n_ensemble, n_taus)
    assert th.allclose(out, plain)
    wanted = [x for x in inputs if x.requires_grad]
    got = th.autograd.grad((out * upstream).sum(), wanted)
    expected = th.autograd.grad((plain * upstream).sum(), wanted)
    for g, e, x in zip(got, expected, wanted, strict=True):
        assert g.shape == x.shape and th.allclose(g, e)
    assert th.autograd.gradcheck(fused, tuple(inputs))
    with th.no_grad():
        assert th.allclose(fused(*inputs), plain)


@pytest.mark.gpu
def test_taken_quantiles_and_quantile_huber_on_cuda_match_the_cpu() -> None:
    """On CUDA (one block, one pair chunk): the taken-action pass and its gradients equal gathering from the
    full pass there and the CPU's blocked pass, and the quantile-Huber loss and gradient equal the CPU's."""
    th.manual_seed(15)
    cpu_net = BranchingQNetwork(
        9, 6, [3, 2, 3], [3, 2, 3], net_arch=[16, 12], n_ensemble=3, n_cos=8, n_atoms=7
    ).double()
    cuda_net = (
        BranchingQNetwork(9, 6, [3, 2, 3], [3, 2, 3], net_arch=[16, 12], n_ensemble=3, n_cos=8, n_atoms=7)
        .double()
        .cuda()
    )
    cuda_net.load_state_dict(cpu_net.state_dict())
    obs, taus = th.randn(70, 9, dtype=th.float64), th.rand(70, 32, dtype=th.float64)  # 3 CPU blocks
    actions = th.stack([th.randint(0, n, (70,)) for n in (3, 2, 3)], dim=1)
    upstream = th.randn(3, 70, 3, 32, dtype=th.float64)
    results = []
    for net, device in ((cpu_net, "cpu"), (cuda_net, "cuda"), (cuda_net, "gather")):
        args = [x.to("cpu" if device == "cpu" else "cuda") for x in (obs, taus, actions, upstream)]
        if device == "gather":
            z, _ = net.quantiles_and_logits(args[0], args[1])
            quantiles = z.gather(3, args[2][None, :, :, None, None].expand(3, -1, -1, 1, 32)).squeeze(3)
        else:
            quantiles, _ = net.taken_quantiles_and_logits(*args[:3])
        grads = th.autograd.grad((quantiles * args[3]).sum(), list(net.parameters()), allow_unused=True)
        results.append([quantiles.cpu()] + [g.cpu() if g is not None else None for g in grads])
    for cpu_value, cuda_value, gathered in zip(*results, strict=True):
        assert (cpu_value is None) == (cuda_value is None) == (gathered is None)
        if cpu_value is not None:
            assert th.allclose(cuda_value, cpu_value) and th.allclose(cuda_value, gathered)
    current = th.randn(5, 64, 4, 32, dtype=th.float64, requires_grad=True)
    target = th.randn(5, 64, 1, 32, dtype=th.float64)
    pair_taus = th.rand(64, 32, dtype=th.float64)[None, :, None, :]
    losses_and_grads = []
    for device in ("cpu", "cuda"):
        c = current.detach().to(device).requires_grad_()
        loss = quantile_huber_loss(
            c, target.to(device).expand(-1, -1, 4, -1), pair_taus.to(device).expand_as(c)
        )
        losses_and_grads.append((loss.cpu(), th.autograd.grad(loss.sum(), c)[0].cpu()))
    assert th.allclose(losses_and_grads[0][0], losses_and_grads[1][0])
    assert th.allclose(losses_and_grads[0][1], losses_and_grads[1][1])


@pytest.mark.gpu
def test_quantile_huber_of_a_permuted_current_on_cuda_matches_the_cpu() -> None:
    """On CUDA the loss also takes a permuted current's rows in memory order: loss and gradient equal the
    CPU's (float64), the gradient with the current's layout."""
    gen = th.Generator().manual_seed(22)
    out = th.randn(64, 4 * 5, 32, generator=gen, dtype=th.float64)
    target = th.randn(5, 64, 1, 32, generator=gen, dtype=th.float64)
    taus = th.rand(64, 32, generator=gen, dtype=th.float64)[None, :, None, :]
    results = []
    for device in ("cpu", "cuda"):
        leaf = out.to(device).requires_grad_()
        current = leaf.view(64, 4, 5, 32).permute(2, 0, 1, 3)
        loss = quantile_huber_loss(
            current, target.to(device).expand(-1, -1, 4, -1), taus.to(device).expand_as(current)
        )
        (grad,) = th.autograd.grad(loss.sum(), current)
        assert grad.stride() == current.stride()
        results.append((loss.cpu(), grad.cpu()))
    assert th.allclose(results[0][0], results[1][0]) and th.allclose(results[0][1], results[1][1])


def test_taken_weight_rows_gathered_by_index_equal_the_one_hot_product_in_float32() -> None:
    """The taken-action head gathers its weight rows by index: in float32 that is exactly the one-hot product
    it replaced (each output a sum of one weight times 1 and zeros), so the pass computes the same values."""
    gen = th.Generator().manual_seed(16)
    n_rows, width, batch = 12, 1280, 1024
    weight_rows = th.randn(n_rows, width, generator=gen) * th.logspace(-30, 30, width)  # wide magnitudes
    rows = th.randint(0, n_rows, (batch,), generator=gen)
    selector = th.nn.functional.one_hot(rows, n_rows).float()
    assert th.equal(th.index_select(weight_rows, 0, rows), th.mm(selector, weight_rows))
    net = BranchingQNetwork(9, 6, [3, 3, 3, 3], [3] * 4, net_arch=[16, 12], n_ensemble=3, n_cos=8, n_atoms=7)
    obs, taus = th.randn(70, 9, generator=gen), th.rand(70, 32, generator=gen)  # 3 CPU blocks
    actions = th.randint(0, 3, (70, 4), generator=gen)
    weight, bias = net._iqn_output_layer()
    features = net.branch_features(obs).transpose(0, 1)  # [B, NB, H]
    taken = th.mm(
        th.nn.functional.one_hot((actions + th.arange(4) * 3).view(-1), 12).float(),
        weight.permute(0, 3, 2, 1).reshape(12, -1),
    ).view(70, 4, 3, 12)
    embedding = net._tau_embedding(taus, 70).squeeze(2)  # [B, N, H]
    taken_bias = bias.transpose(1, 2)[th.arange(4), actions]  # [B, NB, E]
    plain = th.einsum("bkeh,bnh->ebkn", taken * features[:, :, None, :], embedding)
    plain = plain + taken_bias.permute(2, 0, 1)[..., None]
    quantiles, _ = net.taken_quantiles_and_logits(obs, taus, actions)
    assert th.allclose(quantiles, plain, rtol=1e-5, atol=1e-6)


def _default_size_head_inputs(gen: th.Generator, batch: int) -> tuple[th.Tensor, ...]:
    """``_TakenQuantileHead``'s inputs at the default sizes (4 branches of 3 actions, 5 heads, ``H = 256``,
    ``N = 32``, ``n_cos = 64``) in float32, the tau weight's bias column included."""
    n_taus, n_branches, n_actions, n_ensemble, hidden_dim, n_cos = 32, 4, 3, 5, 256, 64
    taus = th.rand(batch, n_taus, generator=gen)
    frequencies = th.arange(n_cos, dtype=th.float32) * math.pi
    tau_weight = th.randn(hidden_dim, n_cos, generator=gen) / 8.0
    features = th.randn(batch, n_branches, 1, hidden_dim, generator=gen).relu()
    actions = th.randint(0, n_actions, (batch, n_branches), generator=gen)
    rows = (actions + th.arange(n_branches) * n_actions).view(-1)
    selector = th.nn.functional.one_hot(rows, n_branches * n_actions).float()
    weight_rows = th.randn(n_branches * n_actions, n_ensemble * hidden_dim, generator=gen) / 16.0
    bias = th.randn(batch, n_branches * n_ensemble, generator=gen)
    return taus, frequencies, tau_weight, features, selector, rows, weight_rows, bias


def test_taken_quantile_head_without_autograd_matches_the_kept_layout_in_float32() -> None:
    """Without autograd on the CPU the head forms its embedding transposed (``[H, N]`` per sample); with it,
    ``[N, H]`` (kept for backward). At the default sizes in float32, in blocks of 32 samples with a partial
    last one, both equal the plain ops in float64 and each other within float32 rounding."""
    gen = th.Generator().manual_seed(17)
    inputs = _default_size_head_inputs(gen, 70)
    taus, frequencies, tau_weight, features, selector, rows, weight_rows, bias = inputs
    batch, n_taus = taus.shape

    def head(tau_w: th.Tensor) -> th.Tensor:
        return _TakenQuantileHead.apply(taus, frequencies, tau_w, *inputs[3:], 32)

    kept = head(tau_weight.clone().requires_grad_()).detach()  # the autograd pass's layout
    with th.no_grad():
        transposed = head(tau_weight)
    cosines = th.cos(taus[..., None].double() * frequencies.double())
    embedding = th.matmul(cosines, tau_weight.double().t()).relu()
    taken = weight_rows.double()[rows].view(batch, 4, 5, -1) * features.double()
    plain = th.baddbmm(bias.double().unsqueeze(-1), taken.view(batch, 20, -1), embedding.transpose(1, 2))
    assert transposed.shape == kept.shape == (batch, 20, n_taus)
    assert th.allclose(kept.double(), plain, rtol=1e-5, atol=1e-5)
    assert th.allclose(transposed.double(), plain, rtol=1e-5, atol=1e-5)
    assert th.allclose(transposed, kept, rtol=1e-6, atol=1e-6)


def test_taken_quantile_head_gradients_in_float32_match_float64_autograd() -> None:
    """The head's backward (block buffers reused, the tau weight's gradient summed transposed) at the default
    sizes in float32, in blocks of 32 samples with a partial last one: every gradient equals autograd through
    the plain ops in float64 within float32 rounding."""
    gen = th.Generator().manual_seed(18)
    inputs = _default_size_head_inputs(gen, 70)
    taus, frequencies, tau_weight, features, selector, rows, weight_rows, bias = inputs
    batch = taus.shape[0]
    upstream = th.randn(batch, 20, taus.shape[1], generator=gen)
    leaves = [x.clone().requires_grad_() for x in (tau_weight, features, weight_rows, bias)]
    tau_w, feats, weights, b = leaves
    out = _TakenQuantileHead.apply(taus, frequencies, tau_w, feats, selector, rows, weights, b, 32)
    got = th.autograd.grad((out * upstream).sum(), leaves)
    exact = [x.detach().double().requires_grad_() for x in leaves]
    cosines = th.cos(taus[..., None].double() * frequencies.double())
    embedding = th.matmul(cosines, exact[0].t()).relu()
    taken = th.mm(selector.double(), exact[2]).view(batch, 4, 5, -1) * exact[1]
    plain = th.baddbmm(exact[3].unsqueeze(-1), taken.view(batch, 20, -1), embedding.transpose(1, 2))
    expected = th.autograd.grad((plain * upstream.double()).sum(), exact)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == th.float32 and g.shape == e.shape
        assert th.allclose(g.double(), e, rtol=1e-5, atol=2e-5 * e.abs().max().item())  # measured: 2.5e-6


@pytest.mark.parametrize("by_mask", [True, False])
def test_taken_c51_logits_and_their_gradients_equal_the_gather_exactly(by_mask: bool) -> None:
    """The taken actions' C51 logits, by a mask and a sum (the GPU path) or by a gather (the CPU's): the same
    logits and the same parameter gradients as gathering from ``c51_logits``, bit for bit (float32)."""
    th.manual_seed(5)
    net = BranchingQNetwork(9, 6, [3, 2, 3], [3, 3, 3], net_arch=[16, 12], n_ensemble=2, n_cos=8, n_atoms=7)
    obs = th.randn(6, 9)
    actions = th.tensor([[0, 1, 2], [2, 0, 1], [1, 1, 0], [0, 0, 0], [2, 1, 2], [1, 0, 1]])
    upstream = th.randn(6, 3, 7)

    def logits_and_grads(taken: bool) -> tuple[th.Tensor, list[th.Tensor]]:
        net.zero_grad()
        all_logits = net.c51_logits(obs)
        if taken:
            logits = _taken_logits(all_logits, actions, by_mask=by_mask)
        else:
            logits = all_logits.gather(2, actions[:, :, None, None].expand(-1, -1, 1, 7)).squeeze(2)
        (logits * upstream).sum().backward()
        return logits.detach(), [net.c51_out.weight.grad.clone(), net.c51_out.bias.grad.clone()]

    (taken, taken_grads), (gathered, gathered_grads) = logits_and_grads(True), logits_and_grads(False)
    assert th.equal(taken, gathered)
    for got, expected in zip(taken_grads, gathered_grads, strict=True):
        assert th.equal(got, expected)



def test_blocked_mean_tau_embedding_equals_the_mean_in_float32() -> None:
    """At the default sizes in float32 (256 samples, 32 fractions: 8 blocks) the blocked mean of the tau
    embedding equals the mean of the whole ``[B, N, H]`` embedding within float32 rounding (the same
    products, and the mean is the sum divided by ``N``, as ``torch.mean`` computes it: bit for bit with MKL
    here)."""
    th.manual_seed(20)
    net = BranchingQNetwork(64, 64, [3, 3, 3, 3], [4, 8, 6, 4], net_arch=[256, 256], n_ensemble=5, n_cos=64)
    taus = th.rand(256, 32)
    with th.no_grad():
        blocked = net._mean_tau_embedding(taus, 256)
        whole = net._tau_embedding(taus, 256).mean(dim=1)
    assert blocked.shape == whole.shape == (256, 1, 256)
    assert th.allclose(blocked, whole, rtol=1e-6, atol=1e-7)
