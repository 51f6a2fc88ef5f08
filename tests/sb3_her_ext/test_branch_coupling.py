"""Autoregressive branch coupling (``branch_coupling="autoregressive"``): the prefix each branch sees, greedy
decoding, the within-step targets, save/load, the device loop and the fused block bit for bit, and a
coordination game that independent branches lose and coupled ones win."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv

from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.networks import BranchingQNetwork
from tests.sb3_her_ext import test_device_loop, test_graphed_loop

AR = {"branch_coupling": "autoregressive"}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny networks run faster on one thread, above all on a shared 2-core CI machine."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def make_net(coupling: str = "autoregressive", action_dims=(3, 2, 4), seed: int = 0) -> BranchingQNetwork:
    th.manual_seed(seed)
    net = BranchingQNetwork(6, 4, list(action_dims), [3] * len(action_dims), net_arch=[8, 8], n_ensemble=2,
                            n_cos=4, n_atoms=5, branch_coupling=coupling)
    if coupling == "autoregressive":
        with th.no_grad():
            net.prefix_weight.normal_()  # zero at initialisation: give the prefix an effect
    return net


def test_an_unknown_coupling_names_field_and_value() -> None:
    with pytest.raises(ValueError, match="branch_coupling='joint'"):
        BranchingQNetwork(6, 4, [3, 2], [3, 3], branch_coupling="joint")


def test_at_initialisation_the_coupled_network_is_the_independent_one() -> None:
    independent, coupled = make_net("independent"), make_net("autoregressive")
    with th.no_grad():
        coupled.prefix_weight.zero_()
    state = {k: v for k, v in coupled.state_dict().items() if k != "prefix_weight"}
    assert state.keys() == independent.state_dict().keys()
    for key, value in independent.state_dict().items():  # the same initialisation, parameter by parameter
        assert th.equal(value, state[key]), key
    obs, taus = th.randn(5, 6), th.rand(5, 7)
    actions = th.tensor([[0, 1, 3], [2, 0, 0], [1, 1, 1], [0, 0, 2], [2, 1, 3]])
    assert th.allclose(coupled.quantiles(obs, taus, actions), independent.quantiles(obs, taus))
    assert th.allclose(coupled.mean_values(obs, taus), independent.mean_values(obs, taus), atol=1e-6)


def test_branch_b_sees_only_the_sub_actions_before_it() -> None:
    net = make_net()
    obs = th.randn(4, 6)
    base = th.zeros(4, 3, dtype=th.int64)
    ref = net.branch_features(obs, base)
    for j, value in ((0, 2), (1, 1), (2, 3)):
        changed = base.clone()
        changed[:, j] = value
        out = net.branch_features(obs, changed)
        for b in range(3):
            same = th.equal(out[b], ref[b])
            assert same == (b <= j), (j, b)  # branch b changes exactly when an earlier branch's action does


def test_padded_actions_of_earlier_branches_carry_no_weight() -> None:
    net = make_net(action_dims=(2, 4, 3))
    mask = net.prefix_mask.squeeze(-1)  # [NB, NB * A]
    # branch 2 sees branch 0's two actions and branch 1's four, nothing of its own or of padding
    assert mask[2].tolist() == [1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]
    assert mask[0].sum() == 0


def test_greedy_decoding_is_the_branch_by_branch_argmax() -> None:
    net = make_net()
    obs, taus = th.randn(16, 6), th.rand(16, 5)
    _, actions, values = net.decode(obs, taus)
    # brute force: branch b's argmax given the decoded a_{<b}, each from a teacher-forced pass
    expected = th.zeros_like(actions)
    for b in range(3):
        given = net.mean_values(obs, taus, prefix_actions=expected)
        given = given.masked_fill(~net.action_mask, -th.inf)
        expected[:, b] = given[:, b].argmax(dim=-1)
    assert th.equal(actions, expected)
    assert th.allclose(net.mean_values(obs, taus), net.mean_values(obs, taus, prefix_actions=actions))
    assert th.equal(values.argmax(dim=-1), actions)
    # the policy's statistics: their per-branch argmax is the decoded joint action
    q, _, _ = net.action_stats(obs, taus)
    assert th.equal(q.argmax(dim=-1), actions)
    # and the prefix matters: the decoded action differs from the independent argmax of a zero prefix
    zero_prefix = net.mean_values(obs, taus, prefix_actions=th.zeros_like(actions))
    assert not th.equal(zero_prefix.masked_fill(~net.action_mask, -th.inf).argmax(-1), actions)


def test_taken_quantiles_are_the_teacher_forced_ones() -> None:
    net = make_net()
    obs, taus = th.randn(5, 6), th.rand(5, 7)
    actions = th.tensor([[0, 1, 3], [2, 0, 0], [1, 1, 1], [0, 0, 2], [2, 1, 3]])
    z, logits = net.taken_quantiles_and_logits(obs, taus, actions)
    z_all, logits_all = net.quantiles_and_logits(obs, taus, prefix_actions=actions)
    index = actions[None, :, :, None, None].expand(2, -1, -1, 1, 7)
    assert th.allclose(z, z_all.gather(3, index).squeeze(3), atol=1e-6)
    atom_index = actions[:, :, None, None].expand(-1, -1, 1, 5)
    assert th.allclose(logits, logits_all.gather(2, atom_index).squeeze(2))
    with pytest.raises(ValueError, match="prefix actions"):
        net.branch_features(obs)


def test_exploring_branches_condition_the_later_ones_on_the_explored_sub_actions() -> None:
    env = LOBVecEnv(2, seed=0, data="synthetic", num_steps=500, episode_length=20)
    model = _model(env)
    policy = model.policy
    with th.no_grad():
        policy.q_net.prefix_weight.normal_(std=3.0)  # a strong prefix: later branches follow the first
    obs = th.randn(64, env.observation_space.shape[0])
    eps = th.tensor([1.0, 0.0, 0.0, 0.0])  # the first branch explores always, the others are greedy
    generator = th.Generator().manual_seed(0)
    boltzmann = th.zeros(4, dtype=th.bool)
    actions, _, _ = policy.explore(obs, model._n_actions, eps, boltzmann, 0.0, 0.0, generator)
    assert len(set(actions[:, 0].tolist())) == 3  # uniform over the first branch
    # the acting fractions are the generator's first draw (then the uniforms)
    taus = policy.sample_taus(64, policy.n_quantiles_act, th.Generator().manual_seed(0))
    # every later branch is greedy given the selected (explored) prefix ...
    q, _, _ = policy.q_net.action_stats(obs, taus, actions)
    assert th.equal(q[:, 1:].argmax(dim=-1), actions[:, 1:])
    # ... where the greedy prefix's statistics would have chosen otherwise for some rows
    greedy_q, _, _ = policy.q_net.action_stats(obs, taus)
    assert not th.equal(greedy_q[:, 1:].argmax(dim=-1), actions[:, 1:])


def _model(env, **kwargs) -> BranchingIQN:
    policy = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                  n_quantiles_act=4, n_atoms=11, **AR)
    return BranchingIQN("MlpPolicy", env, learning_starts=0, batch_size=16, buffer_size=2000, train_freq=2,
                        policy_kwargs=policy, seed=0, device="cpu", **kwargs)


def test_trains_saves_and_loads_with_hindsight_and_the_vaccine(tmp_path: Path) -> None:
    env = LOBVecEnv(4, seed=0, data="synthetic", num_steps=1500, episode_length=20)
    model = _model(env, vaccine_interval=2, boltzmann_branches=[1], exploration_mults={0: 2.0},
                   hindsight={"relabel": True})  # every hindsight kind, the optional relabel too
    assert model.learner.autoregressive
    before = model.policy.q_net.prefix_weight.detach().clone()
    model.learn(200)
    assert model._n_updates > 0 and int(model.replay_buffer.hindsight_counts["relabel"]) > 0
    assert not th.equal(before, model.policy.q_net.prefix_weight)  # the prefix is trained
    model.save(tmp_path / "m.zip")
    loaded = BranchingIQN.load(tmp_path / "m.zip", device="cpu")
    assert loaded.policy.q_net.branch_coupling == "autoregressive"
    obs = th.as_tensor(env.reset(), dtype=th.float32)
    assert th.equal(loaded.policy._predict(obs), model.policy._predict(obs))


def test_device_loop_equals_sb3_loop_with_coupled_branches(tmp_path: Path) -> None:
    policy = {**test_device_loop.TINY_POLICY, **AR}
    sb3 = test_device_loop.run(LOBVecEnv, tmp_path, policy_kwargs=policy)
    dev = test_device_loop.run(DeviceLOBVecEnv, tmp_path, policy_kwargs=policy)
    assert sb3.learner.autoregressive and dev.learner.autoregressive
    for name in sb3.replay_buffer._tensor_names():
        assert th.equal(getattr(sb3.replay_buffer, name), getattr(dev.replay_buffer, name)), name
    for a, b in zip(sb3.policy.state_dict().values(), dev.policy.state_dict().values(), strict=True):
        assert th.equal(a, b)
    assert sb3._n_updates == dev._n_updates > 0


def test_training_blocks_equal_sb3s_loop_with_coupled_branches_across_learning_starts(tmp_path: Path) -> None:
    policy = {**test_graphed_loop.TINY_POLICY, **AR}
    sb3 = test_graphed_loop.run(tmp_path, blocks=False, total=240, policy_kwargs=policy, learning_starts=44)
    blocks = test_graphed_loop.run(tmp_path, blocks=True, total=240, policy_kwargs=policy, learning_starts=44)
    test_graphed_loop.assert_same_training(sb3, blocks)


def test_graphed_step_draws_match_the_eager_ones() -> None:
    env = LOBVecEnv(2, seed=0, data="synthetic", num_steps=500, episode_length=20)
    policy = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=3, n_quantiles_target=5,
                  n_quantiles_act=7, n_atoms=11, **AR)
    model = BranchingIQN("MlpPolicy", env, learning_starts=0, batch_size=16, train_freq=2,
                         policy_kwargs=policy, seed=0, device="cpu", vaccine_interval=0)
    shapes = model.learner._step_rand_shapes(16)
    # act, target, the within-step targets' act and target, then the online fractions
    assert shapes == [(16, 7), (16, 5), (16, 7), (16, 5), (16, 3)]
    drawn = []
    original = model.learner._rand
    model.learner._rand = lambda *shape: drawn.append(shape) or original(*shape)
    model.learn(40)
    assert drawn and drawn[: len(shapes)] == shapes


class ClimbingGame(gym.Env):
    """One-step episodes, two branches of 3 sub-actions, the climbing game's payoffs (Claus & Boutilier 1998)
    over 30: the joint optimum ``(0, 0)`` (11) sits beside the worst penalties (-30), so the first branch's
    ``0`` averaged over the second's choices looks poor and independent learners settle on ``(2, 2)`` (5)."""

    PAYOFF = np.array([[11, -30, 0], [-30, 7, 6], [0, 0, 5]], dtype=np.float32) / 30

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = spaces.MultiDiscrete([3, 3])

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.ones(2, dtype=np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(self.PAYOFF[int(action[0]), int(action[1])])
        return np.ones(2, dtype=np.float32), reward, True, False, {}


@pytest.mark.slow
@pytest.mark.parametrize("coupling,joint", [("independent", [2, 2]), ("autoregressive", [0, 0])])
def test_coupled_branches_find_the_joint_optimum_independent_ones_miss(coupling: str, joint: list) -> None:
    # seed 2 (pinned): over seeds 0-7 independent branches ended on (2, 2) every time, coupled ones on (0, 0)
    # four times out of eight (seeds 2, 3, 5, 6; the others (1, 2) twice, (1, 1), (2, 2)), with the model's
    # draws from its own generators (the buffer's and the acting fractions' since issue 24)
    env = DummyVecEnv([ClimbingGame] * 4)
    model = BranchingIQN(
        "MlpPolicy", env, learning_rate=3e-3, learning_starts=64, batch_size=32, train_freq=1,
        gradient_steps=1, target_update_interval=50, exploration_fraction=0.5, seed=2, hindsight=False,
        vaccine_interval=0,
        policy_kwargs=dict(net_arch=[16], n_ensemble=1, n_cos=8, n_quantiles=8, n_quantiles_target=8,
                           n_quantiles_act=8, n_atoms=11, popart=False, normalize_observations=False,
                           branch_coupling=coupling),
    )
    model.learn(1600)
    assert model.policy._predict(th.ones(1, 2))[0].tolist() == joint
