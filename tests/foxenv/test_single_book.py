"""The lean one-book step (foxenv.single_book) equals the batched core at B = 1 bit for bit.

The lean step re-implements ``BatchedLOB._advance`` on Python floats, so these tests are what ties it to
the core: every config knob, order type, reset, truncation and termination on synthetic, random and real
GOOG markets, compared value by value (obs, reward, flags and every info entry, with their types) against a
``BatchedLOB(num_books=1)`` stepped with the same actions. A change of the core's rules shows up here as a
failing comparison; a new config field or state row as a failing :func:`test_the_lean_step_knows_the_core`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch

import foxenv
from foxenv import single_book
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data import load_market
from foxenv.data.market import MarketData
from foxenv.factory import make_core
from foxenv.gym_env import LOBEnv
from foxenv.single_book import SingleBook, check_walk, lean_path_problem
from tests.foxenv.fake_market import random_market


@pytest.fixture(scope="module")
def market() -> MarketData:
    """A random-walk 10-level market of 800 steps."""
    return random_market(800, num_levels=10, seed=3)


@pytest.fixture(scope="module")
def goog(lobster_dir: Path) -> MarketData:
    """The real GOOG sample day (10 levels)."""
    return load_market(str(lobster_dir))


def draw_actions(count: int, seed: int, maker_share: float) -> np.ndarray:
    """``count`` random actions, ``[count, 4]`` int64; a ``maker_share`` of them LimitMaker orders (so
    resting orders live long enough to queue, fill and be kept or replaced)."""
    generator = np.random.default_rng(seed)
    actions = generator.integers(0, 3, size=(count, 4))
    actions[generator.random(count) < maker_share, 2] = 1
    return actions


def follow_core(
    data: MarketData, config: EnvConfig, seed: int, actions: np.ndarray, reseed_every: int = 0
) -> dict[str, int]:
    """Step a default (lean) ``LOBEnv`` and a ``BatchedLOB(num_books=1)`` side by side with ``actions``,
    resetting both where an episode ends (and reseeding both every ``reseed_every`` steps), and assert
    every output equal. Returns counts of what the run covered."""
    env = LOBEnv(data=data, seed=seed, config=config)
    assert env.lean
    core = BatchedLOB(data, 1, config=config, seed=seed)
    np.testing.assert_array_equal(env.reset(seed=seed)[0], core.reset(seed=seed)[0].numpy())
    covered = {"taker_fills": 0, "maker_fills": 0, "closed": 0, "terminated": 0, "truncated": 0, "kept": 0,
               "pending": 0}
    position = 0.0
    for t, action in enumerate(actions):
        obs, reward, terminated, truncated, info = env.step(action)
        batch_obs, batch_reward, batch_terminated, batch_truncated, batch_info = core.step(
            torch.from_numpy(action)[None]
        )
        np.testing.assert_array_equal(obs, batch_obs[0].numpy(), err_msg=f"obs at step {t}")
        assert obs.dtype == np.float32
        assert (reward, terminated, truncated) == (
            batch_reward.item(), batch_terminated.item(), batch_truncated.item()
        ), t
        assert [type(value) for value in (reward, terminated, truncated)] == [float, bool, bool]
        expected = {key: value.item() for key, value in batch_info.items()}
        assert list(info) == list(expected)
        differ = {key: (info[key], value) for key, value in expected.items() if info[key] != value}
        assert not differ, (t, differ)
        assert [type(value) for value in info.values()] == [type(value) for value in expected.values()]
        if info["position"] != position:
            covered["taker_fills" if action[2] != 1 else "maker_fills"] += 1
        position = info["position"]
        covered["closed"] += info["trade_closed"]
        covered["kept"] += action[2] == 1 and info["order_active"]
        covered["pending"] += core.state_dict()["order_ahead"].item() < 0  # an order_latency wait
        covered["terminated"] += terminated
        covered["truncated"] += truncated
        if reseed_every and (t + 1) % reseed_every == 0:
            np.testing.assert_array_equal(env.reset(seed=t)[0], core.reset(seed=t)[0].numpy())
            position = 0.0
        elif terminated or truncated:
            np.testing.assert_array_equal(env.reset()[0], core.reset()[0].numpy())
            position = 0.0
    # the env's core, handed out, holds the same state (and generator) as the reference core
    env_state, core_state = env.core.state_dict(), core.state_dict()
    for key, value in core_state.items():
        assert torch.equal(env_state[key], value), key
    return covered


CONFIGS = {
    "default": {},
    "power_1.5_fees": {"queue_power": 1.5, "maker_fee_bps": 0.3, "taker_fee_bps": 2.0},
    "power_0.5_penalty": {"queue_power": 0.5, "inventory_penalty": 0.2, "reward_scale": 0.25},
    "power_0_drawdown": {"queue_power": 0.0, "max_drawdown": 3.0},
    "power_3_levels_4": {"queue_power": 3.0, "levels": 4, "max_position": 7.0, "return_horizons": (2, 7)},
    "power_1_rebate": {"queue_power": 1.0, "maker_fee_bps": -1.5, "taker_fee_bps": 0.0, "max_drawdown": 40.0},
    "optimistic": {"fill_model": "optimistic"},
    "optimistic_power_0.5_fees": {"fill_model": "optimistic", "queue_power": 0.5, "maker_fee_bps": 0.3},
    "latency_1": {"order_latency": 1},
    "latency_1_optimistic": {"order_latency": 1, "fill_model": "optimistic", "queue_power": 1.5},
    "latency_3_levels_4": {"order_latency": 3, "levels": 4, "max_position": 7.0, "max_drawdown": 40.0},
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("maker_share", [0.0, 0.6])
def test_lean_env_equals_the_core_on_a_random_market(
    market: MarketData, name: str, maker_share: float
) -> None:
    config = EnvConfig(episode_length=120, **CONFIGS[name])
    actions = draw_actions(1500, seed=len(name) + int(10 * maker_share), maker_share=maker_share)
    covered = follow_core(market, config, seed=7, actions=actions)
    assert covered["taker_fills"] > 0 and covered["closed"] > 0
    assert covered["truncated"] + covered["terminated"] > 0
    if maker_share:
        assert covered["maker_fills"] > 0 and covered["kept"] > 0
        assert (covered["pending"] > 0) == (config.order_latency > 0)
    if config.max_drawdown is not None and config.max_drawdown < 10:
        assert covered["terminated"] > 0


@pytest.mark.parametrize("fills", [{}, {"fill_model": "optimistic", "order_latency": 2}])
def test_lean_env_equals_the_core_on_the_synthetic_market_with_reseeds(fills: dict) -> None:
    data = make_core("synthetic", 1, num_steps=3000).market
    config = EnvConfig(episode_length=400, max_drawdown=200.0, **fills)
    covered = follow_core(data, config, seed=1, actions=draw_actions(3000, seed=2, maker_share=0.5),
                          reseed_every=700)
    assert covered["maker_fills"] > 0 and covered["taker_fills"] > 0 and covered["closed"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("maker_share", [0.0, 0.7])
def test_lean_env_equals_the_core_on_real_goog_data(goog: MarketData, maker_share: float) -> None:
    config = EnvConfig(episode_length=500, max_drawdown=100.0, inventory_penalty=0.01)
    covered = follow_core(goog, config, seed=4, actions=draw_actions(2500, seed=5, maker_share=maker_share))
    assert covered["taker_fills"] > 0 and covered["closed"] > 0
    assert covered["truncated"] + covered["terminated"] > 0
    if maker_share:
        assert covered["maker_fills"] > 0 and covered["kept"] > 0


@pytest.mark.slow
def test_lean_walk_equals_walk_book_on_real_goog_data(goog: MarketData) -> None:
    check_walk(BatchedLOB(goog, 1, config=EnvConfig(episode_length=50), seed=0), count=2000)


@pytest.mark.parametrize("levels", [3, 5, 8, 10, 12])
def test_lean_walk_equals_walk_book(levels: int) -> None:
    data = random_market(300, num_levels=levels, seed=levels)
    check_walk(BatchedLOB(data, 1, config=EnvConfig(episode_length=50, levels=min(levels, 5)), seed=0))


@pytest.mark.parametrize("exponent", [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 0.3, 4.0, 7.0])
def test_powers_are_torchs(exponent: float) -> None:
    """Every queue_power (>= 0) powers as torch does, two zeros (no resting order: no tensor) included."""
    generator = np.random.default_rng(0)
    bases = [0.0, 1.0, 2.0, 1e-300, 3.7, 123.456, 1e5, 987654.321]
    bases += [*generator.uniform(0, 1e4, 200), *generator.integers(0, 10**6, 50)]
    for queue, behind in [(0.0, 0.0), *zip(bases, reversed(bases), strict=True)]:
        expected = torch.tensor([queue, behind], dtype=torch.float64).pow(exponent).tolist()
        assert list(single_book._powers(float(queue), float(behind), exponent)) == expected


def test_the_lean_step_knows_the_core(market: MarketData) -> None:
    """Fails when the core gains a config field or state the lean step does not carry: port it to
    foxenv/single_book.py (and its KNOWN_* lists), then these equality tests tell whether it is right."""
    core = BatchedLOB(market, 1, config=EnvConfig(episode_length=20), seed=0)
    assert lean_path_problem(core) is None
    assert (core.config.fill_model, core.config.order_latency) == ("conservative", 0)  # the default
    for name in ("optimistic", "latency_1", "latency_1_optimistic"):
        config = EnvConfig(episode_length=20, **CONFIGS[name])
        assert lean_path_problem(BatchedLOB(market, 1, config=config, seed=0)) is None, name
    info = core.step(torch.zeros(1, 4, dtype=torch.int64))[4]
    assert tuple(info) == single_book.INFO_KEYS


def test_default_face_is_lean_and_the_eager_core_stays_reachable(market: MarketData) -> None:
    env = gymnasium.make(foxenv.ENV_ID, data=market, seed=0, episode_length=30)
    assert env.unwrapped.lean and not env.unwrapped.compiled
    eager = gymnasium.make(foxenv.ENV_ID, data=market, seed=0, episode_length=30, lean=False)
    assert not eager.unwrapped.lean and not eager.unwrapped.compiled
    np.testing.assert_array_equal(env.reset(seed=2)[0], eager.reset(seed=2)[0])
    for action in draw_actions(80, seed=1, maker_share=0.5):
        got, expected = env.step(action), eager.step(action)
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[1:4] == expected[1:4] and got[4] == expected[4]
        if got[2] or got[3]:
            np.testing.assert_array_equal(env.reset()[0], eager.reset()[0])
    with pytest.raises(ValueError, match="lean='no'"):
        LOBEnv(data=market, lean="no")


def test_env_core_carries_the_lean_state_and_stepping_resumes(market: MarketData) -> None:
    """Reading env.core (render, checkpoints) writes the lean state into it and changes nothing."""
    config = EnvConfig(episode_length=60)
    first, second = LOBEnv(data=market, seed=3, config=config), LOBEnv(data=market, seed=3, config=config)
    first.reset(seed=3)
    second.reset(seed=3)
    for t, action in enumerate(draw_actions(50, seed=9, maker_share=0.5)):
        if t % 7 == 0:
            first.core.state_dict()
        got, expected = first.step(action), second.step(action)
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[1:] == expected[1:]
    assert first.core.state_dict()["step"].item() == 50


def test_unknown_config_field_falls_back_to_the_core(market: MarketData, monkeypatch) -> None:
    known = tuple(name for name in single_book.KNOWN_CONFIG_FIELDS if name != "flow_window")
    monkeypatch.setattr(single_book, "KNOWN_CONFIG_FIELDS", known)
    with pytest.warns(UserWarning, match="flow_window"):
        env = LOBEnv(data=market, seed=0, episode_length=20)
    assert not env.lean
    env.reset(seed=0)
    assert env.step(np.array([2, 2, 0, 2]))[4]["step"] == 1
    with pytest.raises(ValueError, match="SingleBook"):
        SingleBook(env.core)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not LOBEnv(data=market, seed=0, episode_length=20, lean=False).lean  # asked for: no warning


def test_a_lean_step_that_drifts_from_the_core_is_caught_when_the_env_is_built(
    market: MarketData, monkeypatch
) -> None:
    """A core rule the lean step does not follow shows at construction: the env warns and steps the core."""
    walk = SingleBook.walk

    def drifting_walk(self, *args):
        taken, notional, reachable = walk(self, *args)
        return taken, notional * (1 + 1e-15), reachable

    book = SingleBook(BatchedLOB(market, 1, config=EnvConfig(episode_length=60), seed=0))
    assert book.self_check() is None
    monkeypatch.setattr(SingleBook, "walk", drifting_walk)
    assert "info at step" in book.self_check()
    with pytest.warns(UserWarning, match="the lean step differs from the core"):
        env = LOBEnv(data=market, seed=0, episode_length=60)
    assert not env.lean
    reference = LOBEnv(data=market, seed=0, episode_length=60, lean=False)
    np.testing.assert_array_equal(env.reset(seed=1)[0], reference.reset(seed=1)[0])
    for action in draw_actions(20, seed=0, maker_share=0.0):
        assert env.step(action)[4] == reference.step(action)[4]


def test_lean_env_pickles_and_copies_with_its_state(market: MarketData) -> None:
    import copy
    import pickle

    env = LOBEnv(data=market, seed=5, episode_length=80)
    env.reset(seed=5)
    actions = draw_actions(60, seed=4, maker_share=0.5)
    for action in actions[:30]:
        env.step(action)
    clones = [pickle.loads(pickle.dumps(env)), copy.deepcopy(env)]
    assert all(clone.lean for clone in clones)
    for action in actions[30:]:
        expected = env.step(action)
        for clone in clones:
            got = clone.step(action)
            np.testing.assert_array_equal(got[0], expected[0])
            assert got[1:] == expected[1:]


def test_a_core_moved_directly_hands_its_state_to_the_lean_step(market: MarketData) -> None:
    """A checkpoint loaded into env.core (or the core stepped through it) is where the env goes on from."""
    config = EnvConfig(episode_length=80)
    env, reference = LOBEnv(data=market, seed=6, config=config), LOBEnv(data=market, seed=6, config=config)
    env.reset(seed=6)
    reference.reset(seed=6)
    actions = draw_actions(40, seed=2, maker_share=0.5)
    for action in actions[:10]:
        reference.step(action)
        env.step(action)
    checkpoint = env.core.state_dict()
    for action in actions[10:20]:
        env.step(action)
    env.core.load_state_dict(checkpoint)  # back to step 10
    for action in actions[10:20]:
        got, expected = env.step(action), reference.step(action)
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[1:] == expected[1:]
    core_result = env.core.step(torch.from_numpy(actions[20])[None])  # one step through the core itself
    reference.step(actions[20])
    assert core_result[4]["step"].item() == 21
    for action in actions[21:]:
        got, expected = env.step(action), reference.step(action)
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[1:] == expected[1:]
