"""BranchingQNetwork and BranchingIQNPolicy: shapes, padding, bottlenecks, stats, save/load, bad configs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th
from gymnasium import spaces

from foxhunt import presets
from sb3_her_ext.policy import BranchingIQNPolicy, BranchingQNetwork, MlpPolicy, resolve_bottleneck_dims
from tests.sb3_her_ext._op_count import ops_of

OBS_DIM = 14
N_MARKET = 10
OBS_SPACE = spaces.Box(-5.0, 5.0, (OBS_DIM,), np.float32)
TRADING = spaces.MultiDiscrete([3, 3, 3, 3])
#: The trading presets' policy arguments (foxhunt passes them; the env publishes the names).
TRADING_KWARGS = {"branch_names": presets.BRANCH_NAMES, **presets.trading_policy_kwargs()}


def make_policy(action_space: spaces.Space = TRADING, **kwargs) -> BranchingIQNPolicy:
    kwargs.setdefault("n_market_features", N_MARKET)
    kwargs.setdefault("net_arch", [32, 32])
    kwargs.setdefault("n_ensemble", 3)
    return BranchingIQNPolicy(OBS_SPACE, action_space, lambda _: 1e-3, **kwargs)


@pytest.fixture
def obs() -> th.Tensor:
    return th.randn(6, OBS_DIM, generator=th.Generator().manual_seed(7))


def test_output_shapes_multidiscrete(obs: th.Tensor) -> None:
    th.manual_seed(0)
    policy = make_policy(n_atoms=11)
    net = policy.q_net
    assert (net.n_branches, net.max_actions, net.action_dims) == (4, 3, [3, 3, 3, 3])
    assert net.quantiles(obs, th.rand(6, 5)).shape == (3, 6, 4, 3, 5)
    assert net.c51_logits(obs).shape == (6, 4, 3, 11)
    q, iqr, ens_std = policy.action_stats(obs)
    assert q.shape == iqr.shape == ens_std.shape == (6, 4, 3)
    assert policy.support.shape == (11,)
    assert policy.support[0].item() == -10.0 and policy.support[-1].item() == 10.0
    assert MlpPolicy is BranchingIQNPolicy


def test_output_shapes_discrete(obs: th.Tensor) -> None:
    policy = make_policy(spaces.Discrete(2))
    assert policy.q_net.quantiles(obs, th.rand(6, 4)).shape == (3, 6, 1, 2, 4)
    assert policy.q_net.c51_logits(obs).shape == (6, 1, 2, 51)
    actions = policy._predict(obs)
    assert actions.shape == (6, 1) and actions.dtype == th.long
    assert policy.predict(obs.numpy())[0].shape == (6,)  # SB3 reshapes to the Discrete action shape
    assert policy.bottleneck_dims == [8]


def test_padding_for_uneven_branches(obs: th.Tensor) -> None:
    th.manual_seed(1)
    policy = make_policy(spaces.MultiDiscrete([2, 3]))
    net = policy.q_net
    values = net.quantiles(obs, th.rand(6, 4))
    assert values.shape == (3, 6, 2, 3, 4)
    assert th.all(values[:, :, 0, 2] == 0)  # branch 0 has 2 actions: action 2 is padding
    assert th.all(values[:, :, 1].abs() > 0)
    assert th.all(net.c51_logits(obs)[:, 0, 2] == 0)
    policy.popart.mu.fill_(3.0)  # padded q must stay -inf even when de-normalised with a shift
    q, iqr, ens_std = policy.action_stats(obs)
    assert th.all(q[:, 0, 2] == -th.inf) and th.isfinite(q[:, 0, :2]).all() and th.isfinite(q[:, 1]).all()
    assert th.all(iqr[:, 0, 2] == 0) and th.all(ens_std[:, 0, 2] == 0)
    # padded action never chosen, even when its (masked) raw value would be the largest
    with th.no_grad():
        net.iqn_out.bias[0].fill_(100.0)
    assert (policy._predict(obs)[:, 0] < 2).all()


def test_bottleneck_default_widths_are_equal() -> None:
    assert make_policy().bottleneck_dims == [8, 8, 8, 8]
    assert make_policy(spaces.MultiDiscrete([3, 3, 2])).bottleneck_dims == [8, 8, 8]


def test_trading_presets_give_the_trading_widths() -> None:
    assert make_policy(**TRADING_KWARGS).bottleneck_dims == [4, 8, 6, 4]


def test_bottleneck_widths_by_name_index_and_sequence() -> None:
    names = presets.BRANCH_NAMES
    by_name = make_policy(branch_names=names, bottleneck_dims={"order": 10, 1: 3})
    assert by_name.bottleneck_dims == [8, 3, 10, 8]
    trading = {**TRADING_KWARGS["bottleneck_dims"], "order": 10, 1: 3}
    assert make_policy(branch_names=names, bottleneck_dims=trading).bottleneck_dims == [4, 3, 10, 4]
    assert make_policy(bottleneck_dims={"2": 10}).bottleneck_dims == [8, 8, 10, 8]  # default names "0".."3"
    assert make_policy(bottleneck_dims=[1, 2, 3, 5]).bottleneck_dims == [1, 2, 3, 5]
    assert resolve_bottleneck_dims(2, {0: 5}) == [5, 8]
    assert resolve_bottleneck_dims(2, {"b": 5}, ["a", "b"]) == [8, 5]


def test_bottleneck_output_width_and_values(obs: th.Tensor) -> None:
    th.manual_seed(2)
    policy = make_policy(bottleneck_dims=[2, 5, 3, 1])
    net = policy.q_net
    market = obs[:, :N_MARKET]
    out = net.bottleneck(market)
    assert out.shape == (4, 6, 5)
    for b, width in enumerate([2, 5, 3, 1]):
        expected = th.tanh(market @ net.bottleneck_weight[b, :, :width])
        assert th.allclose(out[b, :, :width], expected, atol=1e-6)
        assert th.all(out[b, :, width:] == 0)


def test_market_portfolio_split(obs: th.Tensor) -> None:
    th.manual_seed(3)
    net = make_policy().q_net
    taus = th.rand(6, 4)
    changed_portfolio = obs.clone()
    changed_portfolio[:, N_MARKET:] += 1.0
    assert th.equal(net.bottleneck(obs[:, :N_MARKET]), net.bottleneck(changed_portfolio[:, :N_MARKET]))
    # the portfolio features still reach every branch's MLP
    assert not th.allclose(net.branch_features(obs), net.branch_features(changed_portfolio))
    assert not th.allclose(net.quantiles(obs, taus), net.quantiles(changed_portfolio, taus))
    changed_market = obs.clone()
    changed_market[:, 0] += 1.0
    assert not th.allclose(net.bottleneck(obs[:, :N_MARKET]), net.bottleneck(changed_market[:, :N_MARKET]))


def test_action_stats_match_quantiles(obs: th.Tensor) -> None:
    th.manual_seed(4)
    policy = make_policy(popart=False, n_ensemble=4)
    taus = th.rand(6, 9)
    with th.no_grad():
        values = policy.q_net.quantiles(obs, taus)
        q, iqr, ens_std = policy.q_net.action_stats(obs, taus)
    head_means = values.mean(-1)
    assert th.allclose(q, head_means.mean(0), atol=1e-6)
    mean_quantiles = values.mean(0)
    expected_iqr = th.quantile(mean_quantiles, 0.75, dim=-1) - th.quantile(mean_quantiles, 0.25, dim=-1)
    assert th.allclose(iqr, expected_iqr, atol=1e-6)
    spread = ((head_means - head_means.mean(0)) ** 2).mean(0).sqrt()  # population std over 4 heads
    assert th.allclose(ens_std, spread, atol=1e-6)
    assert (ens_std > 0).all() and (iqr > 0).all()


def test_acting_quantiles_equal_the_training_ones_with_fewer_ops(obs: th.Tensor) -> None:
    """Acting (no grad) writes the folded output weights straight into one tensor, and an unpadded network
    masks nothing: the same values bit for bit, fewer kernels per vector step."""
    th.manual_seed(4)
    policy = make_policy(popart=False, n_ensemble=4)
    taus = th.rand(6, 9)
    trained = policy.q_net.quantiles(obs, taus)  # with autograd: the contiguous copies of both factors
    assert trained.requires_grad
    with th.no_grad():
        ops = ops_of(lambda: policy.q_net.action_stats(obs, taus))
        acting = policy.q_net.quantiles(obs, taus)
    assert th.equal(acting, trained.detach())
    # one clone left: the bottleneck weight's columns; none of the masks
    assert ops.count("clone") == 1 and "masked_fill" not in ops and "bitwise_not" not in ops, ops
    assert len(ops) <= 22, ops


def test_action_stats_denormalised_with_popart(obs: th.Tensor) -> None:
    th.manual_seed(5)
    policy = make_policy()
    taus = th.rand(6, 8)
    with th.no_grad():
        raw = policy.q_net.quantiles(obs, taus)
        policy.popart.mu.fill_(2.0)
        policy.popart.sigma.fill_(3.0)
        q, iqr, ens_std = policy.q_net.action_stats(obs, taus)
    head_means = raw.mean(-1)
    assert th.allclose(q, 3.0 * head_means.mean(0) + 2.0, atol=1e-5)
    mean_quantiles = raw.mean(0)
    expected_iqr = th.quantile(mean_quantiles, 0.75, dim=-1) - th.quantile(mean_quantiles, 0.25, dim=-1)
    assert th.allclose(iqr, 3.0 * expected_iqr, atol=1e-5)
    assert th.allclose(ens_std, 3.0 * head_means.std(0, correction=0), atol=1e-5)


def test_predict_shape_dtype_and_greedy(obs: th.Tensor) -> None:
    th.manual_seed(6)
    policy = make_policy()
    actions = policy._predict(obs)
    assert actions.shape == (6, 4) and actions.dtype == th.long
    assert th.equal(actions, policy._predict(obs))  # deterministic for fixed weights
    assert th.equal(policy(obs), actions)
    # greedy w.r.t. the midpoint fractions (k + 0.5) / K
    taus = ((th.arange(32) + 0.5) / 32).expand(6, -1)
    q, _, _ = policy.q_net.action_stats(obs, taus)
    assert th.equal(actions, q.argmax(-1))
    numpy_actions, _ = policy.predict(obs.numpy())
    assert numpy_actions.shape == (6, 4) and np.array_equal(numpy_actions, actions.numpy())


def test_same_seed_same_network() -> None:
    th.manual_seed(11)
    first = make_policy().state_dict()
    th.manual_seed(11)
    second = make_policy().state_dict()
    assert first.keys() == second.keys()
    assert all(th.equal(first[k], second[k]) for k in first)


def test_target_starts_equal_and_is_frozen(obs: th.Tensor) -> None:
    policy = make_policy()
    taus = th.rand(6, 4)
    assert th.equal(policy.q_net.quantiles(obs, taus), policy.q_net_target.quantiles(obs, taus))
    assert not any(p.requires_grad for p in policy.q_net_target.parameters())
    optimised = {id(p) for group in policy.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for p in policy.q_net.parameters()}


def test_gradients_reach_every_online_parameter(obs: th.Tensor) -> None:
    policy = make_policy()
    values, logits = policy.q_net.quantiles_and_logits(obs, th.rand(6, 4))
    (values.pow(2).mean() + logits.pow(2).mean()).backward()
    for name, param in policy.q_net.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_state_dict_save_load(tmp_path: Path, obs: th.Tensor) -> None:
    th.manual_seed(8)
    widths = {**TRADING_KWARGS["bottleneck_dims"], "urgency": 2}
    policy = make_policy(branch_names=presets.BRANCH_NAMES, bottleneck_dims=widths, n_quantiles_act=16)
    with th.no_grad():
        policy.popart.update(th.randn(32) * 4 + 1)
    taus = th.rand(6, 5)
    path = tmp_path / "policy.pt"
    policy.save(str(path))
    loaded = BranchingIQNPolicy.load(str(path))
    assert loaded.bottleneck_dims == [4, 8, 6, 2] and loaded.n_quantiles_act == 16
    assert loaded.branch_names == list(presets.BRANCH_NAMES)
    assert th.equal(loaded.popart.sigma, policy.popart.sigma)
    assert th.equal(loaded.q_net.quantiles(obs, taus), policy.q_net.quantiles(obs, taus))
    assert th.equal(loaded._predict(obs), policy._predict(obs))
    # plain state_dict round trip into a freshly initialised policy
    fresh = make_policy(bottleneck_dims=[4, 8, 6, 2], n_quantiles_act=16)
    assert not th.equal(fresh.q_net.c51_logits(obs), policy.q_net.c51_logits(obs))
    fresh.load_state_dict(policy.state_dict())
    assert th.equal(fresh.q_net.c51_logits(obs), policy.q_net.c51_logits(obs))
    assert th.equal(fresh.q_net_target.quantiles(obs, taus), policy.q_net_target.quantiles(obs, taus))


def test_set_training_mode() -> None:
    policy = make_policy()
    policy.set_training_mode(False)
    assert not policy.training and not policy.q_net.training
    policy.set_training_mode(True)
    assert policy.training and policy.q_net.training and not policy.q_net_target.training


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"bottleneck_dims": [4, 8, 6]}, "bottleneck_dims"),
        ({"bottleneck_dims": {"volume": 3}}, "'volume'"),
        ({"bottleneck_dims": {4: 3}}, "bottleneck_dims key 4"),
        ({"branch_names": presets.BRANCH_NAMES, "bottleneck_dims": {"order": 0}},
         "bottleneck_dims\\['order'\\]=0"),
        ({"bottleneck_dims": [4, -1, 6, 4]}, "bottleneck_dims\\[1\\]=-1"),
        ({"n_market_features": OBS_DIM + 1}, "n_market_features=15"),
        ({"n_market_features": 0}, "n_market_features=0"),
        ({"net_arch": [32, 0]}, "net_arch\\[1\\]=0"),
        ({"net_arch": []}, "net_arch"),
        ({"n_ensemble": 0}, "n_ensemble=0"),
        ({"n_cos": -2}, "n_cos=-2"),
        ({"n_quantiles": 0}, "n_quantiles=0"),
        ({"n_quantiles_act": 0}, "n_quantiles_act=0"),
        ({"n_atoms": 1}, "n_atoms=1"),
        ({"v_min": 1.0, "v_max": 1.0}, "v_min=1.0"),
    ],
)
def test_bad_configs_raise_value_error_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_policy(**kwargs)


def test_unknown_branch_names_raise() -> None:
    with pytest.raises(ValueError, match="'order'"):  # default names "0", "1"
        make_policy(spaces.MultiDiscrete([3, 3]), bottleneck_dims={"order": 4})
    with pytest.raises(ValueError, match="'order'"):
        make_policy(spaces.MultiDiscrete([3, 3]), branch_names=["a", "b"], bottleneck_dims={"order": 4})
    with pytest.raises(ValueError, match="branch_names"):
        make_policy(spaces.MultiDiscrete([3, 3]), branch_names=["a", "b", "c"])


@pytest.mark.parametrize(
    ("observation_space", "action_space", "field"),
    [
        (OBS_SPACE, spaces.Box(-1, 1, (2,)), "action_space"),
        (OBS_SPACE, spaces.MultiDiscrete([[2, 3], [3, 3]]), "action_space.nvec.shape"),
        (OBS_SPACE, spaces.Discrete(3, start=1), "action_space.start=1"),
        (spaces.Dict({"a": OBS_SPACE}), TRADING, "observation_space"),
    ],
)
def test_unsupported_spaces(observation_space: spaces.Space, action_space: spaces.Space, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BranchingIQNPolicy(observation_space, action_space, lambda _: 1e-3)


def test_network_checks_obs_and_taus_shapes(obs: th.Tensor) -> None:
    net = BranchingQNetwork(OBS_DIM, N_MARKET, [3, 2], [4, 4], net_arch=[16], n_ensemble=2)
    with pytest.raises(ValueError, match="obs.shape"):
        net.quantiles(obs[:, :5], th.rand(6, 4))
    with pytest.raises(ValueError, match="taus.shape"):
        net.quantiles(obs, th.rand(5, 4))
    with pytest.raises(ValueError, match="action_dims\\[1\\]=0"):
        BranchingQNetwork(OBS_DIM, N_MARKET, [3, 0], [4, 4])


@pytest.mark.parametrize("shared", [True, False])
def test_quantiles_match_per_branch_loop_reference(shared: bool) -> None:
    """The batched (folded-weight) head equals a plain per-branch IQN head written with a Python loop."""
    th.manual_seed(9)
    net = BranchingQNetwork(
        OBS_DIM, N_MARKET, [2, 3, 3], [3, 4, 5], net_arch=[16, 8], n_ensemble=2, shared_tau_embedding=shared
    )
    obs, taus = th.randn(5, OBS_DIM), th.rand(5, 7)
    features = net.branch_features(obs)  # [NB, B, H]
    cosines = th.cos(taus[..., None] * th.arange(64) * th.pi)
    embedding = th.relu(net.tau_embedding(cosines))  # [B, N, H] or [B, N, NB * H]
    per_branch = []
    for b in range(3):
        branch_embedding = embedding if shared else embedding[..., b * 8 : (b + 1) * 8]
        mixed = features[b][:, None, :] * branch_embedding  # [B, N, H]
        out = (mixed @ net.iqn_out.weight[b] + net.iqn_out.bias[b]).view(5, 7, 2, 3)  # [B, N, E, A]
        out[..., net.action_dims[b] :] = 0.0
        per_branch.append(out.permute(2, 0, 3, 1))  # [E, B, A, N]
    expected = th.stack(per_branch, dim=2)
    assert th.allclose(net.quantiles(obs, taus), expected, atol=1e-5)
    assert net.tau_embedding.out_features == (8 if shared else 24)
