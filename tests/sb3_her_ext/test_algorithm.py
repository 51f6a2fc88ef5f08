"""BranchingIQN's SB3 contract: learn, predict, save/load, set_env, replay, callbacks, logging, errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from foxhunt import presets
from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)
TINY = dict(learning_starts=20, batch_size=16, buffer_size=2000, train_freq=2, target_update_interval=50,
            policy_kwargs=TINY_POLICY, seed=0, device="cpu")


class TinyEnv(gym.Env):
    """A 4-feature env with Discrete or MultiDiscrete actions; reward 1 when action (branch 0) is 2."""

    def __init__(self, action_space: spaces.Space | None = None, horizon: int = 8) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = action_space if action_space is not None else spaces.Discrete(3)
        self.horizon = horizon
        self.t = 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        first = int(np.asarray(action).reshape(-1)[0])
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, float(first == 2), False, self.t >= self.horizon, {}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks run faster on one thread, above all on a shared 2-core CI machine."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def lob_env(n_envs: int = 2, seed: int = 0) -> LOBVecEnv:
    return LOBVecEnv(n_envs, seed=seed, data="synthetic", num_steps=1500, episode_length=100)


#: TINY with foxhunt's trading presets (ε multipliers, Boltzmann and vaccine branches, bottleneck widths).
TRADING_TINY = {**TINY, **presets.trading_algorithm_kwargs(),
                "policy_kwargs": {**TINY_POLICY, **presets.trading_policy_kwargs()}}


@pytest.fixture(scope="module")
def lob_model(one_torch_thread: None, tmp_path_factory: pytest.TempPathFactory) -> BranchingIQN:
    folder = tmp_path_factory.mktemp("lob")
    model = BranchingIQN("MlpPolicy", lob_env(), diagnostics_path=str(folder / "diag.jsonl"),
                         diagnostics_interval=40, tensorboard_log=str(folder / "tb"), vaccine_interval=2,
                         **TRADING_TINY)
    model.learn(200, log_interval=1)
    return model


# ---------------------------------------------------------------------- construction and bad configs


@pytest.mark.slow
def test_lob_env_with_the_trading_presets(lob_model: BranchingIQN) -> None:
    assert lob_model.action_dims == [3, 3, 3, 3]
    assert lob_model.branch_names == ["direction", "magnitude", "order", "urgency"]
    assert lob_model.exploration_mults == [1.0, 2.0, 1.5, 1.5]
    assert lob_model.boltzmann_flags == [False, False, True, True]
    assert lob_model.vaccine_branch_index == 1  # magnitude
    assert lob_model.policy.bottleneck_dims == [4, 8, 6, 4]
    assert lob_model.hindsight_config is not None  # "auto": the env publishes n_market_features
    assert isinstance(lob_model.replay_buffer, PrioritizedHindsightReplayBuffer)
    assert lob_model.policy.n_market_features == lob_model.env.get_attr("n_market_features")[0]
    assert lob_model.c51_alpha == 0.5


def test_lob_env_generic_defaults() -> None:
    """Without the presets: the env's branch names, multiplier 1, no Boltzmann branch, equal bottleneck
    widths, the vaccine stratified by the first branch."""
    model = BranchingIQN("MlpPolicy", lob_env(1), **TINY)
    assert model.branch_names == ["direction", "magnitude", "order", "urgency"]
    assert model.exploration_mults == [1.0] * 4 and model.boltzmann_flags == [False] * 4
    assert model.policy.bottleneck_dims == [8] * 4 and model.vaccine_branch_index == 0


def test_generic_branch_names_and_name_keyed_arguments() -> None:
    """An env that publishes no names: branches "0", "1", ...; name keys still work."""
    env = TinyEnv(spaces.MultiDiscrete([3, 2, 3]))
    kwargs = {**TINY, "policy_kwargs": {**TINY_POLICY, "bottleneck_dims": {"1": 3}}}
    model = BranchingIQN("MlpPolicy", env, exploration_mults={"2": 2.0}, boltzmann_branches=["1"],
                         vaccine_branch="2", **kwargs)
    assert model.branch_names == ["0", "1", "2"]
    assert model.exploration_mults == [1.0, 1.0, 2.0] and model.boltzmann_flags == [False, True, False]
    assert model.policy.bottleneck_dims == [8, 3, 8] and model.vaccine_branch_index == 2
    assert BranchingIQN("MlpPolicy", env, vaccine_branch=1, **TINY).vaccine_branch_index == 1


@pytest.mark.parametrize(("branch", "message"), [("speed", "vaccine_branch: unknown branch 'speed'"),
                                                 (3, r"vaccine_branch: branch index 3 must lie in \[0, 3\)")])
def test_bad_vaccine_branch_names_field_and_value(branch: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BranchingIQN("MlpPolicy", TinyEnv(spaces.MultiDiscrete([3, 2, 3])), vaccine_branch=branch, **TINY)


def test_vaccine_batch_is_stratified_by_the_vaccine_branch() -> None:
    """Every ``vaccine_interval``-th gradient step is a vaccine step; its batch holds an equal share of rows
    for each action of the chosen branch."""
    model = BranchingIQN("MlpPolicy", TinyEnv(spaces.MultiDiscrete([3, 2, 3])), vaccine_branch=1,
                         vaccine_interval=3, **TINY).learn(60)
    learner = model.learner
    assert [learner.vaccine_due(n, model.replay_buffer) for n in range(1, 7)] == [False, False, True] * 2
    batch = learner.sample_vaccine_batch(model.replay_buffer, 16)
    assert th.bincount(batch.actions[:, 1].long(), minlength=2).tolist() == [8, 8]
    assert not learner.vaccine_due(3, SimpleNamespace())  # a buffer without stratified sampling: never


def test_hindsight_auto_is_off_without_the_info_contract() -> None:
    model = BranchingIQN("MlpPolicy", TinyEnv(), **TINY)
    assert model.hindsight_config is None
    assert model.replay_buffer.hindsight_state is None


def test_hindsight_auto_is_off_on_one_branch_and_on_with_four() -> None:
    """A foxenv face with the info contract but one joint branch has no direction / magnitude to relabel."""
    joint_env = LOBVecEnv(2, seed=0, data="synthetic", num_steps=1500, episode_length=100,
                          action_face="joint")
    joint = BranchingIQN("MlpPolicy", joint_env, hindsight="auto", **TINY)
    assert joint.hindsight_config is None
    branched = BranchingIQN("MlpPolicy", lob_env(), hindsight="auto", **TINY)
    assert branched.hindsight_config is not None


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_c51_alpha_outside_unit_interval(alpha: float) -> None:
    with pytest.raises(ValueError, match=f"c51_alpha={alpha} must lie in"):
        BranchingIQN("MlpPolicy", TinyEnv(), c51_alpha=alpha, **TINY)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gamma", 1.5, "gamma=1.5 must lie in [0, 1]"),
        ("tau", 0.0, "tau=0.0 must lie in (0, 1]"),
        ("max_grad_norm", 0.0, "max_grad_norm=0.0 must be > 0"),
        ("vaccine_beta", 0.0, "vaccine_beta=0.0 must lie in (0, 1]"),
        ("ensemble_bonus", -0.1, "ensemble_bonus=-0.1 must be >= 0"),
        ("iqr_bonus", (0.3, -0.1), "iqr_bonus=(0.3, -0.1) must be >= 0"),
        ("buffer_size", float("nan"), "buffer_size=nan must be an integer >= 1"),
        ("batch_size", 0, "batch_size=0 must be an integer >= 1"),
        ("batch_size", "64", "batch_size='64' must be an integer >= 1"),
        ("learning_starts", 2.5, "learning_starts=2.5 must be an integer >= 0"),
        ("gradient_steps", -2, "gradient_steps=-2 must be an integer >= -1"),
        ("train_freq", 0, "train_freq=0 must be an integer >= 1 or (integer >= 1, unit)"),
        ("train_freq", (float("inf"), "step"),
         "train_freq=(inf, 'step') must be an integer >= 1 or (integer >= 1, unit)"),
        ("target_update_interval", "x", "target_update_interval='x' must be an integer > 0"),
        ("diagnostics_interval", float("nan"), "diagnostics_interval=nan must be an integer > 0"),
        ("vaccine_interval", 2.5, "vaccine_interval=2.5 must be an integer >= 0 (0 = off)"),
    ],
)
def test_bad_hyper_parameters_name_field_and_value(field: str, value: object, message: str) -> None:
    kwargs = {**TINY, field: value}
    with pytest.raises(ValueError) as excinfo:
        BranchingIQN("MlpPolicy", TinyEnv(), **kwargs)
    assert str(excinfo.value) == message


def test_mults_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="exploration_mults has length 2"):
        BranchingIQN("MlpPolicy", TinyEnv(spaces.MultiDiscrete([3, 3, 3])), exploration_mults=[1, 2], **TINY)


@pytest.mark.parametrize(
    "space",
    [spaces.Box(-1, 1, (2,), np.float32), spaces.MultiBinary(3), spaces.MultiDiscrete([[2, 2], [2, 2]])],
)
def test_unsupported_action_spaces(space: spaces.Space) -> None:
    with pytest.raises(ValueError, match="action_space=.* is not supported"):
        BranchingIQN("MlpPolicy", TinyEnv(space), **TINY)


def test_unknown_hindsight_field() -> None:
    with pytest.raises(ValueError, match=r"hindsight has unknown fields \['treshold'\]"):
        BranchingIQN("MlpPolicy", lob_env(1), hindsight={"treshold": 2.0}, **TINY)


def test_hindsight_dict_and_env_fields() -> None:
    env = lob_env(1)
    model = BranchingIQN("MlpPolicy", env, hindsight={"threshold": 2.0, "forward": False}, **TINY)
    config = model.hindsight_config
    assert config.threshold == 2.0 and config.forward is False
    assert config.reward_scale == env.reward_scale and config.magnitudes == env.magnitudes


# ---------------------------------------------------------------------- learn and predict


@pytest.mark.slow
def test_learn_multidiscrete_lob(lob_model: BranchingIQN) -> None:
    assert lob_model.num_timesteps == 200
    assert lob_model._n_updates > 0
    assert lob_model.replay_buffer.size() >= 200  # real rows plus any hindsight rows
    obs = lob_model.env.reset()
    actions, _ = lob_model.predict(obs, deterministic=True)
    assert actions.shape == (2, 4)
    explore, _ = lob_model.predict(obs, deterministic=False)
    assert explore.shape == (2, 4) and explore.dtype == np.int64
    single, _ = lob_model.predict(obs[0], deterministic=True)
    assert single.shape == (4,)
    assert np.array_equal(single, actions[0])


def test_learn_discrete_gym_env_and_predict_shapes() -> None:
    env = DummyVecEnv([TinyEnv, TinyEnv, TinyEnv])
    model = BranchingIQN("MlpPolicy", env, **TINY).learn(90)
    assert model.action_dims == [3] and model._n_updates > 0
    obs = env.reset()
    actions, _ = model.predict(obs, deterministic=True)
    assert actions.shape == (3,)
    explore, _ = model.predict(obs)
    assert explore.shape == (3,) and ((0 <= explore) & (explore < 3)).all()
    single, _ = model.predict(obs[0], deterministic=True)
    assert single.shape == ()


@pytest.mark.slow
def test_same_seed_same_parameters() -> None:
    def run() -> list[th.Tensor]:
        model = BranchingIQN("MlpPolicy", TinyEnv(spaces.MultiDiscrete([3, 2])), **TINY).learn(80)
        return [p.detach().clone() for p in model.policy.parameters()]

    first, second = run(), run()
    assert all(th.equal(a, b) for a, b in zip(first, second, strict=True))


# ---------------------------------------------------------------------- save, load, set_env, replay


@pytest.mark.slow
def test_save_load_predicts_identically(lob_model: BranchingIQN, tmp_path: Path) -> None:
    path = tmp_path / "model.zip"
    lob_model.vaccine.target_cos.fill_(0.123)  # GradVac state must survive too
    lob_model.save(path)
    loaded = BranchingIQN.load(path, env=lob_env())
    obs = lob_model.env.reset()
    expected = lob_model.predict(obs, deterministic=True)[0]
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], expected)
    q_saved = lob_model.policy.q_net.action_stats(th.as_tensor(obs), th.full((2, 4), 0.5))[0]
    q_loaded = loaded.policy.q_net.action_stats(th.as_tensor(obs), th.full((2, 4), 0.5))[0]
    assert th.equal(q_saved, q_loaded)
    assert th.equal(loaded.policy.popart.mu, lob_model.policy.popart.mu)
    assert th.equal(loaded.policy.popart.sigma, lob_model.policy.popart.sigma)
    assert loaded.vaccine.target_cos.item() == pytest.approx(0.123)
    assert loaded.exploration_mults == lob_model.exploration_mults
    assert loaded.boltzmann_flags == lob_model.boltzmann_flags
    assert loaded.vaccine_branch_index == lob_model.vaccine_branch_index == 1
    assert loaded.policy.bottleneck_dims == lob_model.policy.bottleneck_dims
    assert loaded.hindsight_config == lob_model.hindsight_config
    loaded.learn(20, reset_num_timesteps=False)  # the loaded model keeps training
    assert loaded.num_timesteps == 220


@pytest.mark.slow
def test_set_env_and_replay_buffer_save_load(lob_model: BranchingIQN, tmp_path: Path) -> None:
    model = BranchingIQN("MlpPolicy", lob_env(), **TRADING_TINY)
    model.set_env(lob_env(2, seed=3))
    lob_model.save_replay_buffer(tmp_path / "replay.pkl")
    model.load_replay_buffer(tmp_path / "replay.pkl")
    assert model.replay_buffer.size() == lob_model.replay_buffer.size()
    batch = model.replay_buffer.sample(8)
    assert batch.observations.shape == (8, model.observation_space.shape[0])
    model.learn(30)
    assert model._n_updates > 0


@pytest.mark.slow
def test_callbacks_and_evaluate_policy(tmp_path: Path) -> None:
    eval_env = DummyVecEnv([lambda: Monitor(TinyEnv())])
    callbacks = [
        EvalCallback(eval_env, eval_freq=40, n_eval_episodes=2, log_path=str(tmp_path / "eval"),
                     best_model_save_path=str(tmp_path / "best")),
        CheckpointCallback(save_freq=40, save_path=str(tmp_path / "ckpt"), name_prefix="iqn"),
    ]
    model = BranchingIQN("MlpPolicy", TinyEnv(), **TINY).learn(80, callback=callbacks, progress_bar=True)
    assert (tmp_path / "eval" / "evaluations.npz").exists()
    assert (tmp_path / "best" / "best_model.zip").exists()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["iqn_40_steps.zip", "iqn_80_steps.zip"]
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=2)
    assert 0.0 <= mean <= 8.0 and std >= 0.0


@pytest.mark.slow
def test_logger_and_tensorboard_scalars(lob_model: BranchingIQN, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = list(Path(lob_model.tensorboard_log).iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("BranchingIQN")
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("diagnostics/l_q", "diagnostics/l_c51", "diagnostics/eps/magnitude", "train/loss",
                "diagnostics/hindsight/relabel", "rollout/exploration_rate"):
        assert tag in tags, tag


@pytest.mark.slow
def test_diagnostics_lines_have_the_documented_keys(lob_model: BranchingIQN) -> None:
    from sb3_her_ext.diagnostics import DIAGNOSTICS_KEYS, HINDSIGHT_KEYS, read_diagnostics

    lines = read_diagnostics(lob_model.diagnostics_path)
    assert [line["step"] for line in lines] == [40, 80, 120, 160, 200]
    for line in lines:
        assert tuple(line) == DIAGNOSTICS_KEYS
        assert tuple(line["hindsight"]) == HINDSIGHT_KEYS
        assert set(line["eps"]) == {"direction", "magnitude", "order", "urgency"}
        assert set(line["per"]) == {"beta", "size", "max_priority", "mean_weight"}
    assert lines[-1]["l_q"] is not None and lines[-1]["l_q"] > 0
    assert lines[-1]["vaccine"]["cos"] is not None  # vaccine_interval=2: vaccine steps ran
    assert lines[-1]["popart_sigma"] > 0


@pytest.mark.slow
def test_schedules_follow_progress(lob_model: BranchingIQN) -> None:
    # at the end of training: ε reached its final value, β and the IQR bonus their end points
    assert lob_model.exploration_rate == pytest.approx(0.05)
    assert lob_model.branch_epsilons() == pytest.approx([0.05, 0.1, 0.075, 0.075])
    assert lob_model.replay_buffer.beta == pytest.approx(1.0, abs=0.02)
    assert lob_model.iqr_bonus == pytest.approx(0.05, abs=0.01)


# ---------------------------------------------------------------------- the train step by hand


class FixedQuantiles(th.nn.Module):
    """Stand-in network: constant quantiles per (branch, action), separately for obs = 0 and obs = 1."""

    def __init__(self, at_obs: th.Tensor, at_next: th.Tensor, n_atoms: int) -> None:
        super().__init__()
        self.at_obs, self.at_next, self.n_atoms = at_obs, at_next, n_atoms
        self.offset = th.nn.Parameter(th.zeros(()))
        self.n_branches = at_obs.shape[0]

    def quantiles(self, obs: th.Tensor, taus: th.Tensor) -> th.Tensor:
        values = th.where(obs[:, :1, None] > 0.5, self.at_next, self.at_obs) + self.offset  # [B, NB, A]
        return values[None, :, :, :, None].expand(2, -1, -1, -1, taus.shape[1])

    def c51_logits(self, obs: th.Tensor) -> th.Tensor:
        nb, na = self.at_obs.shape
        return th.zeros(obs.shape[0], nb, na, self.n_atoms) + self.offset

    def quantiles_and_logits(self, obs: th.Tensor, taus: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return self.quantiles(obs, taus), self.c51_logits(obs)


def test_bdq_double_q_target_and_per_branch_td_by_hand() -> None:
    env = TinyEnv(spaces.MultiDiscrete([3, 3]))
    kwargs = {**TINY, "policy_kwargs": {**TINY_POLICY, "popart": False}}
    model = BranchingIQN("MlpPolicy", env, gamma=0.5, **kwargs)
    # online at s': branch 0 prefers action 2, branch 1 prefers action 0
    online_next = th.tensor([[0.0, 1.0, 5.0], [4.0, 0.0, 1.0]])
    # target at s': the values the target network gives those actions are 10 (b0, a2) and 2 (b1, a0)
    target_next = th.tensor([[7.0, 8.0, 10.0], [2.0, 30.0, 40.0]])
    current = th.tensor([[1.0, 1.0, 1.0], [-3.0, -3.0, -3.0]])
    model.q_net = FixedQuantiles(current, online_next, 11)
    model.q_net_target = FixedQuantiles(current, target_next, 11)
    batch = SimpleNamespace(
        observations=th.zeros(2, 4), next_observations=th.ones(2, 4),
        actions=th.tensor([[0, 1], [2, 2]]), rewards=th.tensor([[1.0], [1.0]]),
        dones=th.tensor([[0.0], [1.0]]),
    )
    result = model._distributional_loss(batch, update_popart=False)
    # row 0: y = 1 + 0.5 * mean(10, 2) = 4; row 1 (done): y = 1
    # per-branch |δ_b| = |y - current_b|: row 0 -> |4 - 1|, |4 + 3|; row 1 -> |1 - 1|, |1 + 3|
    assert result.td_abs.tolist() == [[3.0, 7.0], [0.0, 4.0]]
    # priorities are Σ_b |δ_b| (a signed sum would give 10 and 4 here too, so check a cancelling case)
    model.q_net.at_obs = th.tensor([[5.0, 5.0, 5.0], [-3.0, -3.0, -3.0]])
    result = model._distributional_loss(batch, update_popart=False)
    assert result.td_abs.sum(dim=1).tolist() == [1.0 + 7.0, 4.0 + 4.0]  # signed: -1 + 7 and -4 + 4 = 0


def test_c51_alpha_mixes_the_two_losses() -> None:
    env = TinyEnv(spaces.MultiDiscrete([3, 3]))
    kwargs = {**TINY, "policy_kwargs": {**TINY_POLICY, "popart": False}}
    batch = SimpleNamespace(
        observations=th.zeros(4, 4), next_observations=th.ones(4, 4), actions=th.zeros(4, 2, dtype=th.long),
        rewards=th.ones(4, 1), dones=th.ones(4, 1),
    )
    losses = {}
    for alpha in (0.0, 0.25, 1.0):
        model = BranchingIQN("MlpPolicy", env, c51_alpha=alpha, **kwargs)
        model._generator.manual_seed(0)
        losses[alpha] = model._distributional_loss(batch, update_popart=False)
    assert th.allclose(losses[0.0].per_sample, losses[0.0].l_q)
    assert th.allclose(losses[1.0].per_sample, losses[1.0].l_c51)
    mixed = losses[0.25]
    assert th.allclose(mixed.per_sample, 0.75 * mixed.l_q + 0.25 * mixed.l_c51)


@pytest.mark.gpu
def test_learn_on_cuda_is_deterministic(tmp_path: Path) -> None:
    def run() -> tuple[list[th.Tensor], np.ndarray]:
        env = LOBVecEnv(4, device="cuda", seed=0, data="synthetic", num_steps=1500, episode_length=100)
        model = BranchingIQN("MlpPolicy", env, **{**TINY, "device": "cuda"},
                             diagnostics_path=str(tmp_path / "diag.jsonl"), diagnostics_interval=100)
        model.learn(400)
        assert model.device.type == "cuda" and model._n_updates > 0
        # deterministic kernels on, without a NaN fill kernel after every allocation
        assert th.are_deterministic_algorithms_enabled()
        assert th.utils.deterministic.fill_uninitialized_memory is False
        actions = model.predict(env.reset(), deterministic=True)[0]
        return [p.detach().cpu() for p in model.policy.parameters()], actions

    (params_a, actions_a), (params_b, actions_b) = run(), run()
    assert all(th.equal(a, b) for a, b in zip(params_a, params_b, strict=True))
    assert np.array_equal(actions_a, actions_b) and actions_a.shape == (4, 4)
