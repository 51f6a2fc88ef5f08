"""Counterfactual all-action targets (``BranchingIQN(counterfactual=True)``): the toy env's exactness, the
all-action loss against a loop of the learner's own loss over single transitions, the per-branch mask's
gradient, and the argument checks."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces

from sb3_her_ext import BranchingIQN
from sb3_her_ext.counterfactual import STATE_KEY
from sb3_her_ext.counterfactual_targets import CounterfactualTargets
from tests.sb3_her_ext._counterfactual_toy import ToyCounterfactualEnv, all_actions

TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=5,
                   n_quantiles_act=3, n_atoms=11)
TINY = dict(learning_starts=0, batch_size=8, buffer_size=1000, policy_kwargs=TINY_POLICY, seed=0,
            device="cpu", vaccine_interval=0)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks run faster on one thread, above all on a shared 2-core CI machine."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


# ---------------------------------------------------------------------- the toy env


def test_the_toy_env_replays_its_logged_transitions_exactly() -> None:
    env = ToyCounterfactualEnv(6)
    env.record_counterfactual_states(True)
    generator = th.Generator().manual_seed(0)
    for _ in range(20):  # across episode ends
        actions = th.randint(0, 3, (6, 2), generator=generator)
        obs = env.current_obs().clone()
        step = env.step_tensors(actions)
        states = step.infos[STATE_KEY]
        assert states.dtype == th.float64 and states.shape == (6, env.counterfactual_state_dim)
        assert th.equal(env.observe(states), obs)
        replay = env.counterfactual_step(states, all_actions()[None].expand(6, -1, -1))
        assert replay.next_obs.shape == (6, 9, 4) and replay.reward.shape == replay.terminated.shape == (6, 9)
        taken = (actions[:, 0] * 3 + actions[:, 1])[:, None]
        assert th.equal(replay.next_obs.gather(1, taken[:, :, None].expand(-1, 1, 4))[:, 0], step.final_obs)
        assert th.equal(replay.reward.gather(1, taken)[:, 0], step.reward)
        assert th.equal(replay.terminated.gather(1, taken)[:, 0], step.done)


def test_the_toy_env_records_states_only_when_asked() -> None:
    env = ToyCounterfactualEnv(2)
    assert STATE_KEY not in env.step_tensors(th.zeros(2, 2, dtype=th.int64)).infos
    env.record_counterfactual_states(True)
    assert STATE_KEY in env.step_tensors(th.zeros(2, 2, dtype=th.int64)).infos


# ---------------------------------------------------------------------- the loss against a loop


def fixed_fractions(*shape: int) -> th.Tensor:
    """The same quantile fractions for every row: each row's loss is then its own, whatever the batch."""
    return th.linspace(0.1, 0.9, shape[1]).expand(shape).contiguous()


def model_and_batch(batch_size: int = 5, joint: bool = False, **kwargs) -> (
    tuple[BranchingIQN, ToyCounterfactualEnv, SimpleNamespace]
):
    """A model on the toy env (the targets attached by hand), fixed fractions, and a batch of replayed rows
    with their states (built here: what the replay buffer samples)."""
    env = ToyCounterfactualEnv(batch_size, seed=3, joint=joint)
    model = BranchingIQN("MlpPolicy", env, **{**TINY, **kwargs})
    model.learner._rand = fixed_fractions
    generator = th.Generator().manual_seed(1)
    states = th.stack([th.randint(0, 4000, (batch_size,), generator=generator),
                       th.randint(0, env.horizon, (batch_size,), generator=generator),
                       th.randint(-3, 4, (batch_size,), generator=generator)], dim=1).double()
    actions = th.randint(0, 9, (batch_size, 1), generator=generator) if joint else \
        th.randint(0, 3, (batch_size, 2), generator=generator)
    next_states, reward, terminated = env.transition(states, actions)
    batch = SimpleNamespace(observations=env.observe(states), actions=actions,
                            next_observations=env.observe(next_states), rewards=reward[:, None],
                            dones=terminated[:, None].float(), counterfactual_states=states)
    return model, env, batch


def single(env: ToyCounterfactualEnv, batch: SimpleNamespace, row: int, action: th.Tensor) -> SimpleNamespace:
    """Row ``row``'s state with ``action``: one transition, from the env's own dynamics."""
    state = batch.counterfactual_states[row:row + 1]
    next_state, reward, terminated = env.transition(state, action[None])
    return SimpleNamespace(observations=batch.observations[row:row + 1], actions=action[None],
                           next_observations=env.observe(next_state), rewards=reward[:, None],
                           dones=terminated[:, None].float())


def mean_target(model: BranchingIQN, transition: SimpleNamespace) -> float:
    """``mean(r + γ(1 − d)(σ·Z' + μ))`` of one transition, by hand: the BDQ double-Q target (fixed
    fractions), averaged over ensemble heads, branches and quantiles."""
    learner, policy = model.learner, model.policy
    with th.no_grad():
        next_obs = transition.next_observations
        next_values = learner.q_net.mean_values(next_obs, fixed_fractions(1, policy.n_quantiles_act))
        next_actions = next_values.argmax(dim=-1)
        z, _ = learner.q_net_target.taken_quantiles_and_logits(
            next_obs, fixed_fractions(1, policy.n_quantiles_target), next_actions)
        mu, sigma = (policy.popart.mu, policy.popart.sigma) if policy.popart is not None else (0.0, 1.0)
        done = float(transition.dones[0, 0])
        return float(transition.rewards[0, 0] + model.gamma * (1.0 - done) * (sigma * z.mean() + mu))


@pytest.mark.parametrize("popart", [True, False])
def test_the_joint_face_equals_a_loop_over_single_transitions(popart: bool) -> None:
    # each branch value learns the target of its best joint action (the largest mean target among the
    # joint actions with that value), from the learner's loss of that single transition on that branch
    model, env, batch = model_and_batch(policy_kwargs={**TINY_POLICY, "popart": popart})
    learner = model.learner
    targets = CounterfactualTargets(lambda: env, [3, 3], 128, learner.device)
    assert targets.joint and targets.n_trained == 6
    result = targets.loss(learner, batch, update_popart=False)
    joint = all_actions()
    for row in range(batch.observations.shape[0]):
        transitions = [single(env, batch, row, action) for action in joint]
        means = np.array([mean_target(model, transition) for transition in transitions])
        reference = {field: 0.0 for field in ("per_sample", "l_q", "l_c51")}
        for branch in range(2):
            only = th.nn.functional.one_hot(th.tensor([branch]), 2).float()
            for value in range(3):
                candidates = [k for k in range(9) if joint[k, branch] == value]
                best = candidates[int(np.argmax(means[candidates]))]
                loss = learner.loss(transitions[best], update_popart=False, branch_weights=only)
                for field in reference:
                    reference[field] += getattr(loss, field)[0].item() / 6
        for field, value in reference.items():
            assert getattr(result, field)[row].item() == pytest.approx(value, rel=1e-5, abs=1e-6), field
        logged = int(batch.actions[row, 0] * 3 + batch.actions[row, 1])
        plain = learner.loss(transitions[logged], update_popart=False)
        assert th.allclose(result.td_abs[row], plain.td_abs[0], rtol=1e-5, atol=1e-6)


def test_one_branch_learns_every_action_and_samples_past_the_cap() -> None:
    model, env, batch = model_and_batch(joint=True)
    learner = model.learner
    for cap, actions in ((128, list(range(9))), (4, [0, 3, 5, 8])):  # 4 < 9: fractions 0.1 .. 0.9 of 9
        targets = CounterfactualTargets(lambda: env, [9], cap, learner.device)
        assert targets.face == ("joint" if cap == 128 else "sampled")
        result = targets.loss(learner, batch, update_popart=False)
        for row in range(5):
            losses = [learner.loss(single(env, batch, row, th.tensor([a])), update_popart=False)
                      for a in actions]
            reference = th.stack([loss.per_sample[0] for loss in losses]).mean()
            assert result.per_sample[row].item() == pytest.approx(reference.item(), rel=1e-5)
            logged = learner.loss(single(env, batch, row, batch.actions[row]), update_popart=False)
            assert th.allclose(result.td_abs[row], logged.td_abs[0], rtol=1e-5, atol=1e-6)


def test_the_branched_face_equals_a_loop_with_the_other_branches_greedy() -> None:
    model, env, batch = model_and_batch()
    learner = model.learner
    targets = CounterfactualTargets(lambda: env, [3, 3], 8, learner.device)  # 9 > 8: the branched face
    assert targets.face == "branched" and targets.n_trained == 6
    result = targets.loss(learner, batch, update_popart=False)
    with th.no_grad():
        values = learner.q_net.mean_values(batch.observations, fixed_fractions(5, 3))
    greedy = values.argmax(dim=-1)  # [B, NB]
    for row in range(5):
        per_sample = []
        for branch in range(2):
            only = th.nn.functional.one_hot(th.tensor([branch]), 2).float()
            for value in range(3):
                action = greedy[row].clone()
                action[branch] = value
                loss = learner.loss(single(env, batch, row, action), update_popart=False, branch_weights=only)
                per_sample.append(loss.per_sample[0])
        assert result.per_sample[row].item() == pytest.approx(th.stack(per_sample).mean().item(), rel=1e-5)
        logged = learner.loss(single(env, batch, row, batch.actions[row]), update_popart=False)
        assert th.allclose(result.td_abs[row], logged.td_abs[0], rtol=1e-5, atol=1e-6)


def test_equal_branch_weights_give_the_plain_loss() -> None:
    model, _, batch = model_and_batch()
    plain = model.learner.loss(batch, update_popart=False)
    weighted = model.learner.loss(batch, update_popart=False, branch_weights=th.full((5, 2), 0.5))
    for field in ("per_sample", "l_q", "l_c51", "td_abs"):
        assert th.allclose(getattr(plain, field), getattr(weighted, field), rtol=1e-6, atol=1e-7), field


def branch_grads(model: BranchingIQN) -> th.Tensor:
    """``[NB]`` the summed |gradient| of each branch's own parameters (hidden layers and output heads)."""
    net = model.learner.q_net
    layers = [*net.hidden, net.iqn_out, net.c51_out]
    return th.stack([sum(layer.weight.grad[b].abs().sum() + layer.bias.grad[b].abs().sum()
                         for layer in layers) for b in range(net.n_branches)])


def test_the_branched_mask_trains_only_its_branch() -> None:
    model, env, batch = model_and_batch()
    learner = model.learner
    targets = CounterfactualTargets(lambda: env, [3, 3], 8, learner.device)
    actions = targets.actions(learner, batch.observations, batch.actions)  # [B, K + 1, NB]
    outcome = env.counterfactual_step(batch.counterfactual_states, actions)
    for rows, trained in ((slice(0, 3), 0), (slice(3, 6), 1), (slice(6, 7), None)):  # the last: logged row
        k = actions[:, rows].shape[1]
        virtual = SimpleNamespace(
            observations=batch.observations.repeat_interleave(k, dim=0),
            actions=actions[:, rows].reshape(-1, 2),
            next_observations=outcome.next_obs[:, rows].reshape(-1, 4),
            rewards=outcome.reward[:, rows].reshape(-1, 1),
            dones=outcome.terminated[:, rows].reshape(-1, 1).float())
        weights = targets.branch_weights[rows].repeat(5, 1)
        learner.policy.optimizer.zero_grad(set_to_none=False)
        learner.loss(virtual, update_popart=False, branch_weights=weights).per_sample.sum().backward()
        grads = branch_grads(model)
        for branch in range(2):
            assert (grads[branch] > 0) == (branch == trained), (rows, branch, grads)


def test_the_step_uses_the_targets_and_updates_popart() -> None:
    model, env, batch = model_and_batch()
    learner = model.learner
    learner.counterfactual = CounterfactualTargets(lambda: env, [3, 3], 128, learner.device)
    sigma = learner.policy.popart.sigma.clone()
    outputs = learner.step(batch, th.ones(5))
    assert outputs.td_abs_sum.shape == (5,) and th.isfinite(outputs.loss)
    assert not th.equal(learner.policy.popart.sigma, sigma)  # PopArt saw the 45 virtual targets
    # a batch without states (a buffer that keeps none) takes the plain loss
    plain = SimpleNamespace(**{**vars(batch), "counterfactual_states": None})
    assert learner.step(plain, th.ones(5)).td_abs_sum.shape == (5,)


# ---------------------------------------------------------------------- arguments


class PlainEnv(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.MultiDiscrete([3, 3])

    def reset(self, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 0.0, False, True, {}


@pytest.mark.parametrize("env, kwargs, message", [
    (PlainEnv(), {}, "CounterfactualEnv.*DummyVecEnv"),
    (ToyCounterfactualEnv(2), {"hindsight": True}, "hindsight relabels.*hindsight=False"),
    (ToyCounterfactualEnv(2), {"policy_kwargs": {**TINY_POLICY, "branch_coupling": "autoregressive"}},
     "branch_coupling='autoregressive'"),
    (ToyCounterfactualEnv(2), {"counterfactual_actions": 0}, "counterfactual_actions=0"),
    (ToyCounterfactualEnv(2), {"counterfactual": 1}, "counterfactual=1 must be a bool"),
])
def test_unsupported_combinations_raise_naming_them(env, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BranchingIQN("MlpPolicy", env, **{**TINY, "counterfactual": True, **kwargs})
