"""LOBVecEnv: SB3 VecEnv contract over the batched book core (shapes, autoreset, episode info, seeding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import VecEnv, VecFrameStack

from foxenv.factory import make_core
from foxenv.gym_env import LOBEnv
from foxenv.vector_env import LOBVectorEnv
from foxhunt.envs import LOBVecEnv, UnknownEnvMethodError
from tests.foxenv.fake_market import random_market

CONTRACT_KEYS = ("mid", "best_bid", "best_ask", "position", "trade_closed", "trade_pnl", "trade_lots",
                 "entry_mid", "equity", "fees")
FLAT = np.array([1, 2, 0, 1])  # direction flat, Full, Market, normal


@pytest.fixture(scope="module")
def market():
    return random_market(300, num_levels=5, seed=3)


def make_env(market, num_envs: int = 3, seed: int | None = 7, **kwargs) -> LOBVecEnv:
    params = {"levels": 5, "episode_length": 6, "max_position": 10.0}
    params.update(kwargs)
    return LOBVecEnv(num_envs, seed=seed, data=market, **params)


def random_actions(env: LOBVecEnv, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, env.action_space.nvec, size=(env.num_envs, len(env.action_space.nvec)))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, float("nan"), float("inf"), "4"])
def test_num_envs_must_be_a_positive_integer(market, bad):
    with pytest.raises(ValueError, match="num_envs"):
        LOBVecEnv(bad, data=market, levels=5, episode_length=6)


def test_unknown_env_kwargs_are_named(market):
    with pytest.raises(ValueError, match="not_a_setting"):
        make_env(market, not_a_setting=3)
    with pytest.raises(ValueError, match="max_position"):
        make_env(market, max_position=-1.0)
    with pytest.raises(ValueError, match="data="):
        LOBVecEnv(2, data=42)


def test_spaces_shapes_and_infos(market):
    env = make_env(market, num_envs=4)
    assert isinstance(env, VecEnv)
    obs = env.reset()
    dim = env.lob.observation_dim
    assert obs.shape == (4, dim) and obs.dtype == np.float32
    assert env.observation_space.shape == (dim,)
    assert list(env.action_space.nvec) == [3, 3, 3, 3]
    assert env.n_market_features == env.lob.n_market_features < dim
    assert env.branch_names == ("direction", "magnitude", "order", "urgency")
    assert env.reward_scale == 1.0
    obs, reward, done, infos = env.step(random_actions(env, np.random.default_rng(0)))
    assert obs.shape == (4, dim) and obs.dtype == np.float32
    assert reward.shape == (4,) and reward.dtype == np.float32
    assert done.shape == (4,) and done.dtype == bool and not done.any()
    assert len(infos) == 4
    for info in infos:
        assert set(CONTRACT_KEYS) <= set(info)
        assert all(isinstance(info[k], (bool, int, float)) for k in CONTRACT_KEYS)
        assert info["step"] == 1 and isinstance(info["step"], int)
        assert isinstance(info["trade_closed"], bool) and isinstance(info["mid"], float)
    # the batched tensors of the same step are kept for the buffer's tensor path
    np.testing.assert_allclose(env.last_info_tensors["mid"].numpy(), [i["mid"] for i in infos])
    assert not env.last_info_tensors["TimeLimit.truncated"].any()


def test_bad_action_shape_raises(market):
    env = make_env(market)
    env.reset()
    with pytest.raises(ValueError, match="actions"):
        env.step(np.zeros((2, 4), dtype=np.int64))


def test_autoreset_terminal_observation_and_episode_info(market):
    # a twin env stepped through the core directly tells what the sixth step's observation is
    twin = make_env(market, num_envs=2, episode_length=6)
    twin.reset()
    rng_twin = np.random.default_rng(1)
    for _ in range(5):
        twin.step(random_actions(twin, rng_twin))
    terminal_expected = twin.lob.step(torch.as_tensor(random_actions(twin, rng_twin)))[0].numpy()
    next_episode_expected = twin.lob.reset(mask=torch.ones(2, dtype=torch.bool)).numpy()

    env = make_env(market, num_envs=2, episode_length=6)
    env.reset()
    rng = np.random.default_rng(1)
    rewards = []
    for _ in range(5):
        _, reward, done, infos = env.step(random_actions(env, rng))
        rewards.append(reward)
        assert not done.any()
        assert all("episode" not in i and "terminal_observation" not in i for i in infos)
    obs, reward, done, infos = env.step(random_actions(env, rng))
    rewards.append(reward)
    assert done.all()
    for b, info in enumerate(infos):
        np.testing.assert_array_equal(info["terminal_observation"], terminal_expected[b])
        assert info["TimeLimit.truncated"] is True
        assert info["step"] == 6
        assert info["episode"]["l"] == 6
        assert info["episode"]["r"] == pytest.approx(float(sum(r[b] for r in rewards)), rel=1e-6, abs=1e-9)
        assert info["episode"]["t"] >= 0.0
    # the returned obs is the first observation of the next episode, and the next step is step 1
    assert not np.array_equal(obs, terminal_expected)
    np.testing.assert_array_equal(obs, next_episode_expected)
    _, _, done, infos = env.step(random_actions(env, rng))
    assert not done.any() and all(i["step"] == 1 for i in infos)


def test_drawdown_termination_is_not_a_timeout(market):
    env = make_env(market, num_envs=2, episode_length=50, max_drawdown=1e-9, taker_fee_bps=50.0)
    env.reset()
    buy_market = np.tile(np.array([2, 2, 0, 2]), (2, 1))  # long, Full, Market, aggressive: pays the fee
    obs, reward, done, infos = env.step(buy_market)
    assert done.all()
    assert all(i["TimeLimit.truncated"] is False for i in infos)
    assert all(i["episode"]["l"] == 1 for i in infos)


def test_same_seed_same_results_and_seed_method(market):
    def rollout(env: LOBVecEnv) -> tuple[np.ndarray, np.ndarray]:
        obs = [env.reset()]
        rewards = []
        rng = np.random.default_rng(5)
        for _ in range(10):
            o, r, _, _ = env.step(random_actions(env, rng))
            obs.append(o)
            rewards.append(r)
        return np.stack(obs), np.stack(rewards)

    a_obs, a_rew = rollout(make_env(market, seed=11))
    b_obs, b_rew = rollout(make_env(market, seed=11))
    np.testing.assert_array_equal(a_obs, b_obs)
    np.testing.assert_array_equal(a_rew, b_rew)
    c_obs, _ = rollout(make_env(market, seed=12))
    assert not np.array_equal(a_obs, c_obs)
    reseeded = make_env(market, seed=12)
    assert reseeded.seed(11) == [11, 12, 13]
    d_obs, d_rew = rollout(reseeded)
    np.testing.assert_array_equal(a_obs, d_obs)
    np.testing.assert_array_equal(a_rew, d_rew)


def test_get_set_attr_and_env_method(market):
    env = make_env(market, num_envs=3)
    assert env.get_attr("n_market_features") == [env.lob.n_market_features] * 3
    assert env.get_attr("reward_scale", indices=[0, 2]) == [1.0, 1.0]
    assert env.get_attr("num_books") == [3, 3, 3]  # from the core
    with pytest.raises(AttributeError, match="no_such_attribute"):
        env.get_attr("no_such_attribute")
    with pytest.raises(ValueError, match="indices"):
        env.get_attr("reward_scale", indices=[5])
    env.set_attr("validate_actions", False)
    assert env.lob.validate_actions is False
    env.set_attr("my_tag", "x")
    assert env.get_attr("my_tag") == ["x", "x", "x"]
    with pytest.raises(ValueError, match="all 3 books"):
        env.set_attr("my_tag", "y", indices=[0])
    state = env.env_method("state_dict", indices=[1])
    assert len(state) == 1 and isinstance(state[0], dict)
    with pytest.raises(UnknownEnvMethodError, match="no_such_method"):
        env.env_method("no_such_method")
    with pytest.raises(ValueError, match="_observe"):
        env.env_method("_observe")
    assert env.env_is_wrapped(Monitor) == [True, True, True]
    assert env.env_is_wrapped(VecFrameStack) == [False, False, False]
    assert env.has_attr("branch_names")


class FlatModel:
    """A stand-in model that always asks to be flat (never trades)."""

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.tile(FLAT, (obs.shape[0], 1)), state


class RandomModel:
    """A stand-in model acting uniformly at random (seeded)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return self.rng.integers(0, 3, size=(obs.shape[0], 4)), state


def test_evaluate_policy_runs_without_monitor(market):
    env = make_env(market, num_envs=2, episode_length=6)
    rewards, lengths = evaluate_policy(FlatModel(), env, n_eval_episodes=4, return_episode_rewards=True,
                                       warn=True)
    assert lengths == [6, 6, 6, 6]
    assert rewards == [0.0, 0.0, 0.0, 0.0]  # never trades: no PnL, no fees
    mean, std = evaluate_policy(RandomModel(0), env, n_eval_episodes=4)
    assert np.isfinite(mean) and np.isfinite(std)
    assert std > 0.0  # random trading on a random walk: episodes differ


def test_synthetic_source_market_does_not_depend_on_the_env_seed():
    settings = {"num_steps": 400, "levels": 5, "episode_length": 20}
    a = LOBVecEnv(1, seed=1, **settings)
    b = LOBVecEnv(1, seed=2, **settings)
    c = LOBVecEnv(1, seed=2, market_seed=3, **settings)
    assert a.lob.market.num_steps == 400 and a.lob.market.num_levels == 5
    assert torch.equal(a.lob.market.bid_price, b.lob.market.bid_price)
    assert not torch.equal(a.lob.market.bid_price, c.lob.market.bid_price)
    with pytest.raises(ValueError, match="market_seed"):
        LOBVecEnv(1, data=a.lob.market, market_seed=3, levels=5, episode_length=20)


@pytest.mark.slow
def test_lobster_folder_source(lobster_dir):
    env = LOBVecEnv(2, seed=0, data=lobster_dir, split="test", episode_length=30)
    obs = env.reset()
    assert obs.shape == (2, env.lob.observation_dim) and np.isfinite(obs).all()
    _, _, _, infos = env.step(np.tile(FLAT, (2, 1)))
    assert 500.0 < infos[0]["mid"] < 650.0  # GOOG on 2012-06-21 traded around 560-590 USD


@pytest.mark.gpu
def test_cuda_env_matches_cpu_env_shapes_and_infos(market):
    cuda_env = LOBVecEnv(3, device="cuda", seed=7, data=market, levels=5, episode_length=6)
    obs = cuda_env.reset()
    assert isinstance(obs, np.ndarray) and obs.shape == (3, cuda_env.lob.observation_dim)
    for _ in range(6):
        obs, reward, done, infos = cuda_env.step(np.tile(FLAT, (3, 1)))
    assert done.all() and all(i["episode"]["l"] == 6 for i in infos)
    assert cuda_env.last_info_tensors["mid"].is_cuda


def test_every_face_builds_through_make_core(monkeypatch):
    calls = []
    real = make_core

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr("foxenv.gym_env.make_core", spy)
    monkeypatch.setattr("foxenv.vector_env.make_core", spy)
    monkeypatch.setattr("foxhunt.envs.make_core", spy)
    settings = {"num_steps": 300, "levels": 4, "episode_length": 20, "market_seed": 5}
    single = LOBEnv(seed=1, **settings)
    vector = LOBVectorEnv(2, seed=1, **settings)
    sb3 = LOBVecEnv(2, seed=1, **settings)
    assert len(calls) == 3
    assert single.core.config == vector.core.config == sb3.lob.config
    assert torch.equal(single.core.market.bid_price, sb3.lob.market.bid_price)
    assert torch.equal(vector.core.market.ask_size, sb3.lob.market.ask_size)


@pytest.mark.parametrize(
    ("make_actions", "match"),
    [
        (lambda n: np.full((n, 4), 1.7), r"actions dtype float64 must be an integer dtype \(actions=.*1\.7"),
        (lambda n: np.ones((n, 4), dtype=bool), "actions dtype bool must be an integer dtype"),
        (lambda n: torch.ones(n, 4, dtype=torch.bool), "actions dtype torch.bool must be an integer dtype"),
        (lambda n: torch.full((n, 4), 1.7), "actions dtype torch.float32 must be an integer dtype"),
        (lambda n: np.ones(n * 4, dtype=np.int64), r"actions shape \(8,\) must be \(2, 4\)"),
        (lambda n: np.ones((4, n), dtype=np.int64), r"actions shape \(4, 2\) must be \(2, 4\)"),
        (lambda n: np.ones((1, n, 4), dtype=np.int64), r"actions shape \(1, 2, 4\) must be \(2, 4\)"),
        (lambda n: np.array([[0, 0, 0, 0], [3, 0, 0, 0]]), r"actions\[1, 0\]=3 out of range: direction=3"),
        (lambda n: torch.tensor([[0, -1, 0, 0], [0, 0, 0, 0]]), r"actions\[0, 1\]=-1 out of range"),
    ],
)
def test_actions_follow_the_make_vec_rules(market, make_actions, match):
    # what make_vec refuses, LOBVecEnv refuses too: no truncated floats, bools, or reshaped batches
    from foxenv.vector_env import make_vec

    env = make_env(market, num_envs=2)
    env.reset()
    with pytest.raises(ValueError, match=match):
        env.step(make_actions(2))
    vector = make_vec(2, data=market, levels=5, episode_length=6, max_position=10.0)
    vector.reset()
    with pytest.raises(ValueError, match=match):
        vector.step(make_actions(2))


def test_integer_actions_of_any_integer_dtype_step(market):
    env = make_env(market, num_envs=2)
    env.reset()
    ones = np.ones((2, 4), dtype=np.int32)
    for actions in (ones, ones.astype(np.uint8), torch.ones(2, 4, dtype=torch.int16)):
        _, _, done, infos = env.step(actions)
        assert len(infos) == 2 and not done.any()


def test_vec_normalize_wraps_lobvecenv(market):
    # LOBVecEnv works under SB3's VecNormalize: reset/step pass through and observations get normalised
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_env(market, num_envs=3, episode_length=6), gamma=0.9)
    assert env.get_attr("branch_names")[0] == ("direction", "magnitude", "order", "urgency")
    raw_env = make_env(market, num_envs=3, episode_length=6)
    obs = env.reset()
    raw = raw_env.reset()
    assert obs.shape == raw.shape and obs.dtype == np.float32
    rng = np.random.default_rng(0)
    seen_terminal = False
    for _ in range(12):
        actions = random_actions(raw_env, rng)
        obs, reward, done, infos = env.step(actions)
        raw, raw_reward, raw_done, raw_infos = raw_env.step(actions)
        np.testing.assert_array_equal(done, raw_done)
        assert np.isfinite(obs).all() and np.isfinite(reward).all()
        assert np.abs(obs).max() <= env.clip_obs
        np.testing.assert_allclose(obs, env.normalize_obs(raw), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(env.get_original_obs(), raw)
        for info, raw_info in zip(infos, raw_infos, strict=True):
            if "terminal_observation" in info:
                seen_terminal = True
                np.testing.assert_allclose(
                    info["terminal_observation"], env.normalize_obs(raw_info["terminal_observation"]),
                    rtol=1e-5, atol=1e-5,
                )
    assert seen_terminal
    assert env.obs_rms.count > 1 and not np.allclose(env.obs_rms.mean, 0.0)
