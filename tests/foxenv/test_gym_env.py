"""The single-book Gymnasium env: checkers, equality with the batched core, seeding, errors, real data."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

import foxenv
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.market import MarketData
from foxenv.gym_env import LOBEnv
from tests.foxenv.fake_market import random_market

REQUIRED_INFO = (
    "mid", "best_bid", "best_ask", "position", "trade_closed", "trade_pnl", "entry_mid", "equity", "fees"
)


@pytest.fixture(scope="module")
def market() -> MarketData:
    """A random-walk 10-level market of 600 steps."""
    return random_market(600, num_levels=10, seed=1)


def random_actions(count: int, seed: int) -> np.ndarray:
    """``count`` uniformly random actions, ``[count, 4]`` int64."""
    return np.random.default_rng(seed).integers(0, 3, size=(count, 4))


def test_make_registers_spaces_and_scalar_info(market: MarketData) -> None:
    env = gymnasium.make(foxenv.ENV_ID, data=market, seed=0, episode_length=50)
    assert isinstance(env.unwrapped, LOBEnv)
    assert env.action_space == spaces.MultiDiscrete([3, 3, 3, 3])
    obs, info = env.reset(seed=0)
    assert info == {}
    dim = env.unwrapped.core.observation_dim
    assert env.observation_space == spaces.Box(-np.inf, np.inf, (dim,), np.float32)
    assert obs.shape == (dim,) and obs.dtype == np.float32
    assert 0 < env.unwrapped.n_market_features < dim
    obs, reward, terminated, truncated, info = env.step(np.array([2, 2, 0, 2]))
    assert obs.dtype == np.float32 and obs.shape == (dim,)
    assert type(reward) is float and type(terminated) is bool and type(truncated) is bool
    for key in REQUIRED_INFO:
        assert key in info
    assert type(info["mid"]) is float and type(info["trade_closed"]) is bool and type(info["step"]) is int
    # a full long Market order at max_position=100 lots
    assert info["position"] == pytest.approx(100.0)
    assert info["step"] == 1
    assert info["best_bid"] < info["mid"] < info["best_ask"]


@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
def test_gymnasium_and_sb3_env_checkers_pass(market: MarketData, render_mode: str | None) -> None:
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = LOBEnv(data=market, seed=0, episode_length=50, render_mode=render_mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the infinite Box bounds draw a warning, not an error
        gym_check_env(env)
        sb3_check_env(env, warn=False)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "eager_core"])
def test_single_book_env_equals_a_row_of_the_batched_core(market: MarketData, lean: bool) -> None:
    config = EnvConfig(episode_length=60)
    env = LOBEnv(data=market, seed=11, config=config, lean=lean)
    assert env.lean is lean
    core = BatchedLOB(market, 4, config=config, seed=11)
    obs = env.reset(seed=11)[0]
    batch_obs = core.reset(seed=11)
    np.testing.assert_array_equal(obs, batch_obs[0].numpy())
    actions = random_actions(50, seed=3)
    other_rows = torch.from_numpy(random_actions(50 * 3, seed=4).reshape(50, 3, 4))
    for t in range(50):
        obs, reward, terminated, truncated, info = env.step(actions[t])
        batch_action = torch.cat([torch.from_numpy(actions[t])[None], other_rows[t]])
        batch_obs, batch_reward, batch_terminated, batch_truncated, batch_info = core.step(batch_action)
        np.testing.assert_array_equal(obs, batch_obs[0].numpy())
        assert reward == batch_reward[0].item()
        assert terminated == batch_terminated[0].item() and truncated == batch_truncated[0].item()
        assert set(info) == set(batch_info)
        for key, value in batch_info.items():
            assert info[key] == value[0].item(), key


def test_same_seed_same_trajectory_and_reset_reseeds(market: MarketData) -> None:
    actions = random_actions(40, seed=5)

    def trajectory(env: LOBEnv, seed: int) -> list[tuple]:
        steps = [(env.reset(seed=seed)[0].tolist(),)]
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
            steps.append((obs.tolist(), reward, terminated, truncated, sorted(info.items())))
        return steps

    first = LOBEnv(data=market, seed=2, episode_length=50)
    second = LOBEnv(data=market, seed=2, episode_length=50)
    assert trajectory(first, 7) == trajectory(second, 7)
    # reset(seed=...) on a used env replays the same trajectory
    assert trajectory(first, 7) == trajectory(first, 7)
    assert trajectory(first, 8) != trajectory(first, 7)


def test_episode_truncates_at_episode_length(market: MarketData) -> None:
    env = LOBEnv(data=market, seed=0, episode_length=10)
    env.reset()
    ends = []
    for t in range(10):
        _, _, terminated, truncated, info = env.step(np.array([1, 0, 0, 0]))
        ends.append(truncated)
        assert info["step"] == t + 1
        assert not terminated
    assert ends == [False] * 9 + [True]


@pytest.mark.parametrize(
    "action",
    [
        np.array([1, 1, 1]),
        np.array([[1, 1, 1, 1]]),
        np.array([1.0, 1.0, 1.0, 1.0]),
        np.array([True, False, True, False]),
        np.array([3, 0, 0, 0]),
        np.array([0, 0, -1, 0]),
        "long",
    ],
)
def test_bad_action_raises_value_error_naming_action(market: MarketData, action: object) -> None:
    env = LOBEnv(data=market, seed=0, episode_length=20)
    env.reset()
    with pytest.raises(ValueError, match="action"):
        env.step(action)


def test_bad_arguments_raise_value_error(market: MarketData) -> None:
    with pytest.raises(ValueError, match="max_position=-1"):
        LOBEnv(data=market, max_position=-1)
    with pytest.raises(ValueError, match="not_a_knob=3"):
        LOBEnv(data=market, not_a_knob=3)
    with pytest.raises(ValueError, match="render_mode='human'"):
        LOBEnv(data=market, render_mode="human")
    with pytest.raises(ValueError, match="step_events"):
        LOBEnv(data=market, step_events=50)


def test_config_and_keyword_overrides_combine(market: MarketData) -> None:
    env = LOBEnv(data=market, config=EnvConfig(max_position=10.0, episode_length=30), episode_length=40)
    assert env.config.max_position == 10.0 and env.config.episode_length == 40
    env.reset(seed=0)
    info = env.step(np.array([0, 1, 0, 2]))[4]  # short, half: -0.5 * 10 lots
    assert info["position"] == pytest.approx(-5.0)


def test_synthetic_default_data_runs() -> None:
    env = gymnasium.make(foxenv.ENV_ID, seed=0, episode_length=20, num_steps=500)
    obs, _ = env.reset(seed=0)
    assert np.isfinite(obs).all()
    for action in random_actions(20, seed=0):
        obs, reward, terminated, truncated, _ = env.step(action)
        assert np.isfinite(obs).all() and math.isfinite(reward)
    assert truncated


@pytest.mark.slow
def test_real_goog_episode_runs(lobster_dir: Path) -> None:
    env = gymnasium.make(foxenv.ENV_ID, data=lobster_dir, seed=0, episode_length=300)
    obs, _ = env.reset(seed=0)
    assert env.unwrapped.market.num_levels == 10
    total = 0.0
    truncated = terminated = False
    steps = 0
    for action in random_actions(300, seed=1):
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        total += reward
        assert np.isfinite(obs).all() and math.isfinite(reward)
        # GOOG traded around 560-585 USD that day
        assert 550.0 < info["mid"] < 600.0
        if terminated or truncated:
            break
    assert truncated and steps == 300
    assert math.isfinite(total)


def test_market_does_not_depend_on_env_seed() -> None:
    first = LOBEnv(seed=1, num_steps=400, episode_length=20)
    second = LOBEnv(seed=2, num_steps=400, episode_length=20)
    other = LOBEnv(seed=1, num_steps=400, episode_length=20, market_seed=5)
    assert torch.equal(first.market.bid_price, second.market.bid_price)
    assert not torch.equal(first.market.bid_price, other.market.bid_price)
    with pytest.raises(ValueError, match="market"):
        LOBEnv(data=first.market, market_seed=5)


@pytest.mark.slow
def test_package_import_is_light_and_exports_the_api() -> None:
    import subprocess
    import sys

    code = (
        "import sys, importlib, gymnasium, foxenv\n"
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules\n"
        "assert 'foxenv/LOB-v0' in gymnasium.registry\n"
        "importlib.reload(foxenv)\n"
        "names = ['EnvConfig', 'BatchedLOB', 'LOBEnv', 'LOBVectorEnv', 'make_vec', 'load_market',"
        " 'MarketData', 'metrics']\n"
        "print([getattr(foxenv, n).__name__ for n in names])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "Overriding" not in result.stderr
    assert "'LOBEnv', 'LOBVectorEnv', 'make_vec'" in result.stdout
    assert "'foxenv.metrics'" in result.stdout
    with pytest.raises(AttributeError, match="no_such_name"):
        foxenv.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    "action",
    [[0, 0, 0, 2], (0, 0, 0, 2), np.array([9, 2, 9, 0, 9, 0, 9, 0])[::-2], torch.tensor([0, 0, 0, 2]),
     np.array([0, 0, 0, 2], dtype=np.uint8)],
    ids=["list", "tuple", "strided", "tensor", "uint8"],
)
def test_action_array_likes_are_accepted(market: MarketData, action: object) -> None:
    env = LOBEnv(data=market, seed=0, episode_length=20)
    env.reset(seed=0)
    info = env.step(action)[4]
    # short, Small magnitude, Market, aggressive (the whole need at once): -0.25 * 100 lots
    assert info["position"] == pytest.approx(-25.0)


def test_out_of_range_action_names_the_branch_and_leaves_the_book_alone(market: MarketData) -> None:
    env = LOBEnv(data=market, seed=0, episode_length=20)
    env.reset(seed=0)
    before = env.core.state_dict()
    with pytest.raises(ValueError, match=r"action=.*magnitude=3 must lie in \[0, 3\)"):
        env.step(np.array([2, 3, 0, 0]))
    with pytest.raises(ValueError, match=r"urgency=-1"):
        env.step([0, 0, 0, -1])
    after = env.core.state_dict()
    for key, value in before.items():
        if key != "generator":
            assert torch.equal(value, after[key]), key
    assert env.step(np.array([2, 2, 0, 2]))[4]["step"] == 1


def test_step_after_truncation_raises_until_reset(market: MarketData) -> None:
    env = LOBEnv(data=market, seed=0, episode_length=3)
    env.reset(seed=0)
    truncated = [env.step(np.array([1, 0, 0, 0]))[3] for _ in range(3)]
    assert truncated == [False, False, True]
    with pytest.raises(ValueError, match="episode_length=3"):
        env.step(np.array([1, 0, 0, 0]))
    env.reset()
    assert env.step(np.array([1, 0, 0, 0]))[4]["step"] == 1


def test_compile_must_be_a_bool(market: MarketData) -> None:
    with pytest.raises(ValueError, match="compile='yes'"):
        LOBEnv(data=market, compile="yes")
    assert LOBEnv(data=market, episode_length=20).compiled is False
    assert LOBEnv(data=market, episode_length=20).lean is True  # the default face: the lean step


def test_packed_step_unpacks_to_the_eager_env_bit_for_bit(market: MarketData) -> None:
    """PackedStep (what compile=True compiles), run eagerly, gives exactly the eager env's results."""
    from foxenv.gym_env import PackedStep

    eager = LOBEnv(data=market, seed=4, episode_length=25, max_drawdown=50.0, lean=False)
    packed_env = LOBEnv(data=market, seed=4, episode_length=25, max_drawdown=50.0)
    eager.reset(seed=4)
    packed_env.reset(seed=4)
    packed = PackedStep.of(packed_env.core)
    assert packed.info_keys[:3] == ("mid", "best_bid", "best_ask") and ("step", int) in packed.info_casts
    fills = 0
    for action in random_actions(60, seed=8):
        expected = eager.step(action)
        got = packed.unpack(packed.step(torch.from_numpy(action).view(1, 4)))
        assert got[0].dtype == np.float32
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[1:4] == expected[1:4] and [type(v) for v in got[1:4]] == [float, bool, bool]
        assert list(got[4].items()) == list(expected[4].items())
        assert [type(v) for v in got[4].values()] == [type(v) for v in expected[4].values()]
        fills += expected[4]["fees"] != 0.0
        if expected[2] or expected[3]:
            eager.reset()
            packed_env.reset()
    assert fills > 0
    with pytest.raises(ValueError, match="num_books=2"):
        PackedStep.of(BatchedLOB(market, 2, config=EnvConfig(episode_length=25)))
