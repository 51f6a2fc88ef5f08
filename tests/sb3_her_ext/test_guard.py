"""The NaN guard: NaN/inf injected into rewards, observations, the loss and the learning rate give clear
errors, and nothing non-finite is stored or learned (buffer contents and parameters checked). Both of the
guard's modes run here on the CPU: immediate (the CPU default) and masked (the GPU's, forced), the masked
mode on both of its paths: a fused optimizer that skips a bad step itself (``found_inf``, the default Adam)
and the full snapshot of any other optimizer."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.vec_env import DummyVecEnv

from foxhunt.device_lob_env import DeviceLOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.device_vec_env import DeviceStep
from sb3_her_ext.diagnostics import read_diagnostics
from sb3_her_ext.guard import NanGuard, NonFiniteError, named_state, nonfinite_tensors, skips_steps
from tests.sb3_her_ext._op_count import ops_of

TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)
TINY = dict(learning_starts=8, batch_size=8, buffer_size=1000, train_freq=1, policy_kwargs=TINY_POLICY,
            seed=0, device="cpu", hindsight=False, vaccine_interval=2, learning_rate=1e-3)
#: the masked mode's two paths: the default fused Adam skips a bad step on the device; a non-fused optimizer
#: gets the full snapshot of parameters and optimizer state
PATHS = {"fused": TINY, "full snapshot": {**TINY, "policy_kwargs": {**TINY_POLICY,
                                                                    "optimizer_kwargs": {"fused": False}}}}


class BadEnv(gym.Env):
    """A tiny env whose ``bad_at``-th step returns a NaN/inf in the reward or the observation."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.MultiDiscrete([3, 2])

    def __init__(self, bad_at: int | None = None, field: str = "reward", value: float = np.nan,
                 episode: int = 10) -> None:
        self.t, self.bad_at, self.field, self.value, self.episode = 0, bad_at, field, value, episode
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(3, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        obs = self.rng.uniform(-1, 1, 3).astype(np.float32)
        reward = float(self.rng.uniform(-1, 1))
        if self.t == self.bad_at:
            if self.field == "reward":
                reward = self.value
            else:
                obs[1] = self.value
        return obs, reward, self.t % self.episode == 0, False, {}


def assert_buffer_finite(model: BranchingIQN) -> None:
    buffer = model.replay_buffer
    n = buffer.size()
    for name in ("observations", "next_observations", "rewards"):
        values = getattr(buffer, name)[:n]
        assert th.isfinite(values).all(), name


def params_of(model: BranchingIQN) -> dict[str, th.Tensor]:
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


def assert_same(before: dict[str, th.Tensor], after: dict[str, th.Tensor]) -> None:
    assert before.keys() == after.keys()
    for key in before:
        assert th.equal(before[key], after[key]), key


def assert_same_optimizer_state(before: dict, after: dict) -> None:
    """Moments and step counts equal bit for bit (the optimizer state dict's ``state``)."""
    assert before.keys() == after.keys()
    for key, state in before.items():
        assert state.keys() == after[key].keys()
        for name, value in state.items():
            assert th.equal(value, after[key][name]), (key, name)


# ---------------------------------------------------------------------- env data, SB3's host path
@pytest.mark.parametrize(("field", "value", "shown"), [("reward", np.nan, "reward nan"),
                                                     ("reward", np.inf, "reward inf"),
                                                     ("observation", np.nan, "observation nan"),
                                                     ("observation", -np.inf, "observation -inf")])
def test_non_finite_env_data_is_refused_before_the_buffer(field: str, value: float, shown: str) -> None:
    env = DummyVecEnv([lambda: BadEnv(), lambda: BadEnv(bad_at=15, field=field, value=value)])
    model = BranchingIQN("MlpPolicy", env, **TINY)
    with pytest.raises(NonFiniteError, match=rf"non-finite {shown} from env 1 at step 30 \(num_timesteps\)"):
        model.learn(60)
    assert model.replay_buffer.size() == 14 * 2  # the bad step's rows were not stored
    assert_buffer_finite(model)
    model.check_finite()  # the model learned nothing non-finite


def test_non_finite_terminal_observation_names_its_env() -> None:
    # the bad observation is the last of an episode: it reaches the buffer only as a terminal observation
    env = DummyVecEnv([lambda: BadEnv(), lambda: BadEnv(), lambda: BadEnv(bad_at=10, field="observation")])
    model = BranchingIQN("MlpPolicy", env, **TINY)
    with pytest.raises(NonFiniteError, match="observation nan from env 2 at step 30"):
        model.learn(60)
    assert_buffer_finite(model)


def test_the_guard_can_be_turned_off() -> None:
    env = DummyVecEnv([lambda: BadEnv(bad_at=3, field="observation")])
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "learning_starts": 100}, nan_guard=False)
    model.learn(5)  # stored as SB3 would
    assert model.guard is None and not th.isfinite(model.replay_buffer.observations[:5]).all()
    with pytest.raises(ValueError, match="nan_guard=1 must be a bool"):
        BranchingIQN("MlpPolicy", env, **TINY, nan_guard=1)


# ---------------------------------------------------------------------- the gradient step
def trained_model(**kwargs) -> BranchingIQN:
    env = DummyVecEnv([lambda: BadEnv(), lambda: BadEnv()])
    model = BranchingIQN("MlpPolicy", env, **{**TINY, **kwargs})
    model.learn(40)
    return model


def poison_buffer(model: BranchingIQN) -> None:
    """A NaN reward in every stored row (as a corrupt buffer would hold): the next targets are NaN."""
    buffer = model.replay_buffer
    buffer.rewards[: buffer.size()] = float("nan")


def test_a_non_finite_target_stops_training_and_changes_nothing_on_the_cpu() -> None:
    model = trained_model()
    poison_buffer(model)
    before = params_of(model)
    optimizer_before = copy.deepcopy(model.policy.optimizer.state_dict())
    with pytest.raises(NonFiniteError, match="non-finite target .* at gradient step"):
        model.train(1, model.batch_size)
    assert_same(before, params_of(model))  # PopArt's statistics are in the policy's state dict
    after = model.policy.optimizer.state_dict()
    for key, state in optimizer_before["state"].items():
        for name, value in state.items():
            assert th.equal(value, after["state"][key][name]), name


@pytest.mark.parametrize("path", PATHS)
def test_masked_mode_restores_the_step_and_raises_at_the_next_sync_point(tmp_path: Path, path: str) -> None:
    """The GPU's mode, forced on the CPU: no raise inside the step; the step (and the later ones) undone;
    the error at the diagnostics line, which shows the NaN loss as "nan"."""
    model = trained_model(**PATHS[path], diagnostics_path=str(tmp_path / "d.jsonl"),
                          diagnostics_interval=10_000)
    model.guard = model.learner.guard = NanGuard("cpu", immediate=False)
    good = params_of(model)
    vaccine = model.vaccine.target_cos.clone()
    poison_buffer(model)
    model.train(4, model.batch_size)  # masked: no error yet (a vaccine step among them)
    assert_same(good, params_of(model))
    assert th.equal(vaccine, model.vaccine.target_cos)
    assert bool(model.guard.tripped)
    with pytest.raises(NonFiniteError, match="non-finite loss at gradient step 1:"):
        model.log_diagnostics()
    line = json.loads((tmp_path / "d.jsonl").read_text().splitlines()[-1])
    assert line["loss"] == "nan" and line["l_q"] == "nan"
    assert np.isnan(read_diagnostics(tmp_path / "d.jsonl")[-1]["loss"])
    with pytest.raises(NonFiniteError):
        model.check_finite()


@pytest.mark.parametrize("path", PATHS)
def test_masked_mode_gives_the_same_parameters_as_no_guard(path: str) -> None:
    """The guard changes no arithmetic and no random draw: masked, immediate and off train alike (the
    parameters, PopArt and the optimizer's moments and step counts, bit for bit)."""
    results, optimizers = [], []
    for guard in ("off", "immediate", "masked"):
        env = DummyVecEnv([lambda: BadEnv(), lambda: BadEnv()])
        model = BranchingIQN("MlpPolicy", env, **PATHS[path], nan_guard=guard != "off")
        if guard == "masked":
            model.guard = model.learner.guard = NanGuard("cpu", immediate=False)
        model.learn(60)
        results.append(params_of(model))
        optimizers.append(model.policy.optimizer.state_dict()["state"])
    assert_same(results[0], results[1])
    assert_same(results[0], results[2])
    for optimizer in optimizers[1:]:
        assert_same_optimizer_state(optimizers[0], optimizer)


def test_an_inf_learning_rate_is_refused() -> None:
    env = DummyVecEnv([lambda: BadEnv()])
    for bad in (float("inf"), float("nan"), 0.0, -1e-3):
        with pytest.raises(ValueError, match=rf"learning_rate={bad!r} must be finite and > 0"):
            BranchingIQN("MlpPolicy", env, **{**TINY, "learning_rate": bad})


def test_a_schedule_that_turns_nan_stops_training_before_the_update() -> None:
    env = DummyVecEnv([lambda: BadEnv(), lambda: BadEnv()])

    def schedule(progress: float) -> float:  # fine at 1, 0.5 and 0, NaN in between
        return float("nan") if 0.6 < progress < 0.8 else 1e-3

    model = BranchingIQN("MlpPolicy", env, **{**TINY, "learning_rate": schedule})
    message = r"learning_rate=nan \(the schedule's value at progress_remaining=0\.7"
    with pytest.raises(ValueError, match=message):
        model.learn(100)
    model.check_finite()
    assert_buffer_finite(model)


# ---------------------------------------------------------------------- training blocks on a device env
class BadDeviceEnv(DeviceLOBVecEnv):
    """A device env whose ``bad_at``-th vector step gives env 2 a NaN reward or an inf observation."""

    bad_at = 6
    field = "reward"

    def step_tensors(self, actions: th.Tensor) -> DeviceStep:
        return self._spoil(super().step_tensors(actions))

    def step_tensors_static(self, actions: th.Tensor) -> DeviceStep:  # what a training block steps
        return self._spoil(super().step_tensors_static(actions))

    def _spoil(self, step: DeviceStep) -> DeviceStep:
        self.n_steps = getattr(self, "n_steps", 0) + 1
        if self.n_steps != self.bad_at:
            return step
        if self.field == "reward":
            reward = step.reward.clone()
            reward[2] = float("nan")
            return step._replace(reward=reward)
        final = step.final_obs.clone()
        final[2, 0] = float("inf")
        return step._replace(final_obs=final)


@pytest.mark.parametrize("field", ["reward", "observation"])
@pytest.mark.parametrize("mode", ["immediate", "masked"])
def test_training_blocks_refuse_non_finite_rows(field: str, mode: str) -> None:
    env = BadDeviceEnv(4, device="cpu", seed=0, data="synthetic", num_steps=1500, episode_length=20)
    env.field = field
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "hindsight": "auto", "diagnostics_interval": 40})
    if mode == "masked":
        model.guard = model.learner.guard = NanGuard("cpu", immediate=False)
    with pytest.raises(NonFiniteError, match=f"non-finite {field}.* from env 2 at step 24"):
        model.learn(200)
    assert_buffer_finite(model)
    if mode == "immediate":
        assert model.replay_buffer.size() >= 5 * 4  # the rows before the bad step were stored
        model.check_finite()
    else:  # the failure stays recorded: check_finite reports it again
        with pytest.raises(NonFiniteError, match="from env 2 at step 24"):
            model.check_finite()
    assert model.num_timesteps <= 40  # raised at the first sync point (the diagnostics line at 40)


# ---------------------------------------------------------------------- what the guard vouches for (issue 26)
class HugeRewardEnv(BadEnv):
    """Finite rewards of 1e30: the targets are finite, PopArt's second moment (their square) is not."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward * 1e30, terminated, truncated, info


def masked_guard(model: BranchingIQN) -> NanGuard:
    guard = model.guard = model.learner.guard = NanGuard("cpu", immediate=False)
    guard.watch(lambda: named_state(model.policy, model.policy.optimizer))
    return guard


def test_popart_overflow_is_refused_before_the_statistics_change() -> None:
    """The issue's reward_scale=1e30 example: the guard used to call inf statistics the last good ones."""
    model = BranchingIQN("MlpPolicy", DummyVecEnv([HugeRewardEnv, HugeRewardEnv]), **TINY)
    with pytest.raises(NonFiniteError, match=r"non-finite PopArt statistics \(PopArt nu\) at gradient step "
                       r"1: .*PopArt statistics are the last good ones \(checked finite\)"):
        model.learn(40)
    popart = model.policy.popart
    assert (popart.mu.item(), popart.nu.item(), popart.sigma.item()) == (0.0, 1.0, 1.0)  # never updated
    assert not nonfinite_tensors(named_state(model.policy, model.policy.optimizer))


@pytest.mark.parametrize(("path", "when"), [("fused", "before"), ("full snapshot", "after")])
def test_masked_mode_restores_an_overflowed_popart_and_names_it(tmp_path: Path, path: str, when: str) -> None:
    """The fused path checks PopArt with the rest of what changed before the optimizer step (and skips the
    step); the full path checks the whole state after it (and restores it)."""
    model = BranchingIQN("MlpPolicy", DummyVecEnv([HugeRewardEnv, HugeRewardEnv]),
                         **{**PATHS[path], "learning_starts": 30})
    masked_guard(model)
    model.learn(29)
    model._fit_observation_normalizer()  # as the first train() would
    good = params_of(model)
    model.replay_buffer.rewards[: model.replay_buffer.size()] = 1e30
    model.train(2, model.batch_size)
    assert_same(good, params_of(model))  # PopArt's buffers are in the state dict: restored
    with pytest.raises(NonFiniteError, match=rf"model state {when} the optimizer step \(popart\.nu\) at "
                       r"gradient step 1: .*last good ones \(checked finite\)"):
        model.guard.raise_if_tripped()


def test_the_guard_names_state_that_is_not_good_instead_of_vouching_for_it(tmp_path: Path) -> None:
    model = trained_model()
    steps = int(model.guard.steps)
    with th.no_grad():  # as an optimizer step that overflowed would leave it
        model.policy.q_net.hidden[0].weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=rf"but the model already holds non-finite values in "
                       rf"q_net\.hidden\.0\.weight.*made so by gradient step {steps}: it is not usable"):
        model.train(1, model.batch_size)
    with pytest.raises(NonFiniteError, match=rf"refusing to save a model with non-finite values in "
                       rf"q_net\.hidden\.0\.weight.*it went bad at gradient step {steps}"):
        model.save(tmp_path / "model.zip")
    assert not (tmp_path / "model.zip").exists()


def test_save_refuses_a_non_finite_model_without_a_guard(tmp_path: Path) -> None:
    model = BranchingIQN("MlpPolicy", DummyVecEnv([HugeRewardEnv, HugeRewardEnv]), **TINY, nan_guard=False)
    model.learn(40)  # nothing stops it: PopArt's statistics overflow and the network follows
    with pytest.raises(NonFiniteError, match=r"refusing to save a model with non-finite values in .*"
                       r"the NaN guard was off \(nan_guard=False\), so the step it went bad is unknown"):
        model.save(tmp_path / "model.zip")
    assert not (tmp_path / "model.zip").exists()


def test_save_refuses_state_changed_outside_training(tmp_path: Path) -> None:
    model = trained_model()
    model.save(tmp_path / "good.zip")
    model.policy.optimizer.state[next(iter(model.policy.optimizer.state))]["exp_avg_sq"].fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"non-finite values in optimizer .*\.exp_avg_sq; every gradient "
                       r"step the NaN guard checked left it finite"):
        model.save(tmp_path / "bad.zip")


# ---------------------------------------------------------------------- the masked mode's fused path
def test_skips_steps_is_the_fused_optimizers_contract() -> None:
    params = [th.nn.Parameter(th.zeros(2))]
    assert skips_steps(th.optim.Adam(params, fused=True)) and skips_steps(th.optim.AdamW(params, fused=True))
    assert skips_steps(th.optim.SGD(params, lr=0.1, fused=True))
    assert not skips_steps(th.optim.Adam(params, foreach=True))
    assert not skips_steps(th.optim.Adam(params, fused=False, capturable=True))
    guard = NanGuard("cpu", immediate=False)
    assert not guard.snapshots_all(th.optim.Adam(params, fused=True))
    assert guard.snapshots_all(th.optim.Adam(params, foreach=True))
    assert not NanGuard("cpu").snapshots_all(th.optim.Adam(params, foreach=True))  # immediate: never


def test_a_fused_optimizer_skips_a_poisoned_step_bit_for_bit() -> None:
    """The masked mode's default path: a NaN loss leaves parameters, PopArt, GradVac and the optimizer's
    moments and step counts as they were, bit for bit, and every later step too."""
    model = trained_model()
    guard = masked_guard(model)
    optimizer = model.policy.optimizer
    assert skips_steps(optimizer) and not guard.snapshots_all(optimizer)
    model.train(2, model.batch_size)  # good masked steps
    assert not bool(guard.tripped) and int(guard.steps) == 2
    before, optimizer_before = params_of(model), copy.deepcopy(optimizer.state_dict()["state"])
    vaccine = model.vaccine.target_cos.clone()
    poison_buffer(model)
    model.train(3, model.batch_size)  # a vaccine step among them
    assert_same(before, params_of(model))
    assert_same_optimizer_state(optimizer_before, optimizer.state_dict()["state"])  # step counts included
    assert th.equal(vaccine, model.vaccine.target_cos)
    assert int(guard.steps) == 5
    with pytest.raises(NonFiniteError, match=r"non-finite loss at gradient step 3: that step and any later "
                       r"ones were not applied; .*last good ones \(checked finite\)"):
        model.log_diagnostics()


def test_the_found_inf_flag_lives_only_for_the_guarded_step(tmp_path: Path) -> None:
    """``found_inf`` is one tensor (what a CUDA graph replays), set on the optimizer for its step only: not
    after it, not after a step that raised, never in the state dict or a saved model."""
    model = trained_model()
    masked_guard(model)
    optimizer = model.policy.optimizer
    original, seen = optimizer.step, []

    def spy(*args, **kwargs):
        seen.append(optimizer.found_inf)
        return original(*args, **kwargs)

    optimizer.step = spy
    model.train(3, model.batch_size)
    assert len(seen) == 3 and seen[0] is seen[1] is seen[2] and float(seen[0]) == 0.0
    assert not hasattr(optimizer, "found_inf")

    def failing(*args, **kwargs):
        raise RuntimeError("the optimizer failed")

    optimizer.step = failing
    with pytest.raises(RuntimeError, match="the optimizer failed"):
        model.train(1, model.batch_size)
    assert not hasattr(optimizer, "found_inf")
    del optimizer.step  # the class's step again
    assert "found_inf" not in str(model.get_parameters())
    model.save(tmp_path / "model.zip")
    loaded = BranchingIQN.load(tmp_path / "model.zip", env=model.get_env())
    assert not hasattr(loaded.policy.optimizer, "found_inf")
    masked_guard(loaded)
    loaded.learn(30)  # trains on, masked
    loaded.check_finite()
    assert int(loaded.guard.steps) > 0 and not hasattr(loaded.policy.optimizer, "found_inf")


@pytest.mark.parametrize(("poisoned", "train_steps", "message"), [
    # the next step's check meets the non-finite loss first; the guard then names what made it so
    ("q_net.hidden.0.weight", 4, r"non-finite loss at gradient step 3: that step and any later ones were not "
     r"applied; but the model already holds non-finite values in q_net\.hidden\.0\.weight.*, made so by "
     r"gradient step 2"),
    # an inf second moment leaves the next loss finite: the next step's check names the moment
    ("exp_avg_sq", 4, r"non-finite model state after the optimizer step \(optimizer q_net\.hidden\.0\.weight"
     r"\.exp_avg_sq\) at gradient step 2: its gradients were finite, so the optimizer applied that step"),
    # the last step before the sync point: checked there
    ("q_net.hidden.0.weight", 2, r"non-finite model state after the optimizer step \(q_net\.hidden\.0\."
     r"weight\) at gradient step 2: its gradients were finite, so the optimizer applied that step \(a "
     r"skipping optimizer cannot undo it\), not the later ones; .*made so by gradient step 2"),
])
def test_an_optimizer_step_that_overflows_is_named_and_later_steps_are_skipped(
    tmp_path: Path, poisoned: str, train_steps: int, message: str,
) -> None:
    """Finite gradients, a non-finite result of the update (written into the state by the test): the skipping
    path cannot undo that step, but records it, skips every later one and names the step and the tensor;
    save then refuses the model, naming the step."""
    model = trained_model()
    guard = masked_guard(model)
    optimizer = model.policy.optimizer
    weight = model.policy.q_net.hidden[0].weight
    original, after_bad = optimizer.step, {}

    def overflowing(*args, **kwargs):
        original(*args, **kwargs)
        if int(guard.steps) == 2:
            with th.no_grad():
                target = optimizer.state[weight]["exp_avg_sq"] if poisoned == "exp_avg_sq" else weight
                target.view(-1)[0] = float("inf")
            after_bad["params"] = params_of(model)
            after_bad["optimizer"] = copy.deepcopy(optimizer.state_dict()["state"])

    optimizer.step = overflowing
    model.train(train_steps, model.batch_size)
    assert_same(after_bad["params"], params_of(model))  # nothing after the bad step was applied
    assert_same_optimizer_state(after_bad["optimizer"], optimizer.state_dict()["state"])
    with pytest.raises(NonFiniteError, match=message):
        guard.raise_if_tripped()
    with pytest.raises(NonFiniteError, match=r"refusing to save .*it went bad at gradient step 2"):
        model.save(tmp_path / "model.zip")


def test_the_masked_guard_costs_a_fixed_handful_of_ops_whatever_the_model_size() -> None:
    """Each op is about one GPU kernel. The fused path adds a fixed handful to a gradient step (the full
    snapshot added two per state tensor: over a hundred for foxhunt's network), the env check a fixed
    handful to a vector step."""
    added = []
    for net_arch in ([16], [32, 32, 32]):
        counts = []
        for guard in ("off", "masked"):
            policy = {**TINY_POLICY, "net_arch": net_arch}
            model = trained_model(policy_kwargs=policy, nan_guard=guard != "off")
            if guard == "masked":
                masked_guard(model)
            batch = model.replay_buffer.sample(model.batch_size)
            weights = th.ones(model.batch_size)
            model.learner.step(batch, weights)  # the optimizer state exists, as in every later step
            counts.append(len(ops_of(lambda: model.learner.step(batch, weights))))  # noqa: B023
        added.append(counts[1] - counts[0])
    assert added[0] == added[1] <= 17, added
    guard = NanGuard("cpu", immediate=False)
    obs, rewards = th.zeros(4, 3), th.zeros(4)
    for observations in ((obs,), (obs, obs)):
        ops = ops_of(lambda: guard.check_env_tensors(5, observations, rewards))  # noqa: B023
        assert len(ops) <= 12 + 2 * len(observations), ops


def test_the_masked_env_check_names_the_first_bad_env_and_zeroes_only_non_finite_values() -> None:
    guard = NanGuard("cpu", immediate=False)
    obs = th.tensor([[1.0, -0.0], [2.0, 3.0], [4.0, 5.0]])
    final = th.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    rewards = th.tensor([0.5, -1.0, 2.0])
    (safe_obs, safe_final), safe_rewards = guard.check_env_tensors(7, (obs, final), rewards)
    assert not bool(guard.tripped)  # all finite: the same values, bit for bit (-0.0 stays -0.0)
    assert th.equal(safe_obs.view(th.int32), obs.view(th.int32)) and th.equal(safe_final, final)
    assert th.equal(safe_rewards, rewards)
    final[2, 1], obs[1, 0] = float("-inf"), float("nan")  # observations of envs 1 and 2
    (safe_obs, safe_final), _ = guard.check_env_tensors(8, (obs, final), rewards)
    assert safe_obs[1, 0] == 0.0 and safe_final[2, 1] == 0.0 and th.equal(safe_final[:2], final[:2])
    rewards[2] = float("inf")  # a later failure: the first one stays recorded
    guard.check_env_tensors(9, (obs, final), rewards)
    with pytest.raises(NonFiniteError, match="non-finite observation from env 1 at step 8"):
        guard.raise_if_tripped()
    guard = NanGuard("cpu", immediate=False)  # a reward and an observation at once: the reward is named
    _, safe_rewards = guard.check_env_tensors(th.tensor(10), (obs, final), rewards)
    assert safe_rewards[2] == 0.0
    with pytest.raises(NonFiniteError, match="non-finite reward from env 2 at step 10"):
        guard.raise_if_tripped()
