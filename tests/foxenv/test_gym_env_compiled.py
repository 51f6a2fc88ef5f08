"""LOBEnv(compile=True): the compiled single-book env follows the eager one (CPU; slow: it compiles)."""

from __future__ import annotations

import shutil

import gymnasium
import numpy as np
import pytest

import foxenv
from foxenv.gym_env import LOBEnv, StepResult, compiled_step_key
from tests.foxenv.fake_market import random_market

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs g++")


def assert_steps_match(compiled: StepResult, eager: StepResult) -> None:
    """A compiled step's result equals the eager one's: flags, integers and types exactly, floats up to
    the last bits (the generated code may fuse a multiply and an add)."""
    obs_c, reward_c, terminated_c, truncated_c, info_c = compiled
    obs_e, reward_e, terminated_e, truncated_e, info_e = eager
    assert obs_c.dtype == np.float32 and type(reward_c) is float
    np.testing.assert_allclose(obs_c, obs_e, rtol=0, atol=1e-5)
    assert reward_c == pytest.approx(reward_e, rel=0, abs=1e-6)
    assert (terminated_c, truncated_c) == (terminated_e, truncated_e)
    assert info_c.keys() == info_e.keys()
    for key, value in info_e.items():
        assert type(info_c[key]) is type(value), key
        if isinstance(value, float):
            assert info_c[key] == pytest.approx(value, rel=0, abs=1e-9), key
        else:
            assert info_c[key] == value, key


@pytest.mark.slow
@needs_compiler
def test_compiled_env_follows_the_eager_env() -> None:
    market = random_market(600, num_levels=10, seed=21)
    options = {"data": market, "seed": 5, "episode_length": 30, "max_drawdown": 50.0}
    eager = LOBEnv(**options)
    compiled = gymnasium.make(foxenv.ENV_ID, compile=True, **options)
    assert compiled.unwrapped.compiled and not eager.compiled
    assert eager.lean and not compiled.unwrapped.lean  # the compiled step runs the core, not the lean one
    assert compiled.unwrapped._packed_step is not None  # the step really is compiled
    actions = np.random.default_rng(6).integers(0, 3, size=(70, 4))
    obs_e, _ = eager.reset(seed=9)
    obs_c, _ = compiled.reset(seed=9)
    np.testing.assert_array_equal(obs_e, obs_c)  # the reset is not compiled
    fills = ends = 0
    for action in actions:
        result_e = eager.step(action)
        assert_steps_match(compiled.step(action), result_e)
        _, _, terminated_e, truncated_e, info_e = result_e
        fills += info_e["fees"] != 0.0
        if terminated_e or truncated_e:
            ends += 1
            np.testing.assert_array_equal(eager.reset()[0], compiled.reset()[0])
    assert fills > 0 and ends >= 2  # the comparison covered fills and resets, not only idle steps
    with pytest.raises(ValueError, match="action"):
        compiled.step(np.array([0, 0, 3, 0]))


@pytest.mark.slow
@needs_compiler
def test_two_compiled_envs_with_one_config_share_the_graph_and_step_their_own_books() -> None:
    """Two compiled envs of one config on markets of one shape run one compiled graph, each on its own
    book and market."""
    options = {"episode_length": 30, "max_drawdown": 50.0}
    markets = [random_market(600, num_levels=10, seed=seed) for seed in (21, 22)]
    pairs = [
        (LOBEnv(data=market, seed=seed, compile=True, **options), LOBEnv(data=market, seed=seed, **options))
        for seed, market in zip((1, 2), markets, strict=True)
    ]
    assert compiled_step_key(pairs[0][0].core) == compiled_step_key(pairs[1][0].core)
    for compiled, eager in pairs:
        compiled.reset(seed=None)
        eager.reset(seed=None)
    mids = set()
    for action in np.random.default_rng(3).integers(0, 3, size=(25, 4)):
        for compiled, eager in pairs:
            obs_c, _, _, _, info_c = compiled.step(action)
            obs_e, _, _, _, info_e = eager.step(action)
            np.testing.assert_allclose(obs_c, obs_e, rtol=0, atol=1e-5)
            assert info_c["position"] == info_e["position"] and info_c["step"] == info_e["step"]
            assert info_c["equity"] == pytest.approx(info_e["equity"], rel=0, abs=1e-9)
            mids.add(info_c["mid"])
    assert len(mids) > 25  # the two books sit on different markets


@pytest.mark.slow
@needs_compiler
def test_compiled_envs_with_other_fees_configs_and_markets_follow_their_own_eager_env() -> None:
    """A compiled step runs without ``torch.compile``'s guards, so each env must run a graph traced for its
    own settings. Envs built in one process that differ only in their fees (the same shapes: a shared
    graph would pass every size check), or in their config, tick size and market shape, stepped in turn,
    each follow an eager env of their own settings."""
    market = random_market(400, num_levels=10, seed=31)
    other_market = random_market(700, num_levels=6, seed=32, tick_size=0.05)
    base = {"data": market, "episode_length": 30, "max_drawdown": 50.0}
    settings = [
        base,
        {**base, "taker_fee_bps": 5.0, "maker_fee_bps": 2.0},
        {
            "data": other_market, "episode_length": 45, "levels": 4, "max_position": 40.0, "queue_power": 3.0,
            "inventory_penalty": 0.01, "reward_scale": 2.0, "return_horizons": (1, 3),
        },
    ]
    pairs = [(LOBEnv(seed=7, compile=True, **options), LOBEnv(seed=7, **options)) for options in settings]
    keys = {compiled_step_key(compiled.core) for compiled, _ in pairs}
    assert len(keys) == len(settings)  # three graphs
    for compiled, eager in pairs:
        np.testing.assert_array_equal(compiled.reset(seed=8)[0], eager.reset(seed=8)[0])
    fees: list[list[float]] = [[] for _ in pairs]
    for action in np.random.default_rng(9).integers(0, 3, size=(100, 4)):
        for (compiled, eager), env_fees in zip(pairs, fees, strict=True):
            result_e = eager.step(action)
            assert_steps_match(compiled.step(action), result_e)
            env_fees.append(result_e[4]["fees"])
            if result_e[2] or result_e[3]:
                np.testing.assert_array_equal(compiled.reset()[0], eager.reset()[0])
    assert fees[0] != fees[1] and any(fees[0])  # the fee rates really differ, and the steps filled orders
