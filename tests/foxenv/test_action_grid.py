"""Action grids (``EnvConfig.action_grid``): the default grid is today's action bit for bit, the wide grid's
every size and price level works on a hand-built book, and bad grids are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxenv import spec
from foxenv.config import EnvConfig, config_settings
from foxenv.core import BatchedLOB
from foxenv.matching import maker_offset_tick
from foxenv.tables import MarketTables
from tests.foxenv.fake_market import flat_market

SHORT, FLAT, LONG = 0, 1, 2
MARKET, MAKER, IOC = 0, 1, 2
WIDE = spec.WIDE_GRID
# twelve levels a tick apart each side, 10 lots each; a two-tick spread, so one tick inside is free
BID = [(round(100.00 - 0.01 * k, 2), 10.0) for k in range(12)]
ASK = [(round(100.02 + 0.01 * k, 2), 10.0) for k in range(12)]


def make_env(grid: object = "wide", bid=BID, ask=ASK, **config) -> BatchedLOB:
    market = flat_market(3, bid, ask)
    cfg = EnvConfig(levels=market.num_levels, episode_length=2, action_grid=grid, taker_fee_bps=0.0,
                    **config)
    return BatchedLOB(market, 1, cfg, seed=0)


def act(env: BatchedLOB, *action: int) -> dict[str, torch.Tensor]:
    return env.step(torch.tensor([action]))[4]


def test_the_default_grid_is_todays_action_table() -> None:
    # today's table, written out from its rules: 27 d + 9 m + 3 o + u
    slices = [1 / 3, 2 / 3, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    limits = [float(1 << 50)] * 3 + [0.0] * 3 + [0.0, 1.0, 3.0]
    rows = [[d * m * 100.0, slices[3 * o + u], limits[3 * o + u], float(o == 1), float(min(u - 1, 0)),
             float(u == 2)] for d in (-1, 0, 1) for m in (0.25, 0.5, 1.0) for o in range(3) for u in range(3)]
    tables = make_env("default")._tables
    assert torch.equal(tables.actions, torch.tensor(rows, dtype=torch.float64))
    assert tables.action_code.tolist() == [27, 9, 3, 1]
    assert EnvConfig().grid is spec.DEFAULT_GRID and EnvConfig().grid.nvec == spec.ACTION_NVEC
    assert spec.DEFAULT_GRID.joint_actions == spec.JOINT_ACTIONS == 81
    assert "action_grid" not in config_settings(EnvConfig())  # default fingerprints are unchanged
    from foxenv.metrics import ACTION_LABELS

    assert spec.DEFAULT_GRID.labels() == ACTION_LABELS  # the default grid's action mixes keep their names


def test_the_wide_grid_has_over_a_thousand_joint_codes() -> None:
    assert WIDE.nvec == (3, 10, 3, 12) and WIDE.joint_actions == 1080
    assert WIDE.code_weights == (360, 36, 12, 1)
    assert (WIDE.full_size, WIDE.whole_gap, WIDE.at_touch) == (9, 11, 10)
    env = make_env()
    assert env._tables.actions.shape == (1080, 6)
    assert env.ACTION_NVEC == (3, 10, 3, 12)
    assert EnvConfig(action_grid=WIDE.to_dict()).grid == WIDE  # the JSON form round-trips
    assert config_settings(EnvConfig(action_grid="wide"))["action_grid"] == WIDE.to_dict()


@pytest.mark.parametrize("magnitude", range(10))
def test_each_wide_size_sets_its_target(magnitude: int) -> None:
    env = make_env(max_position=20.0)
    info = act(env, SHORT, magnitude, MARKET, WIDE.whole_gap)
    assert info["position"].item() == pytest.approx(-20.0 * (magnitude + 1) / 10)


@pytest.mark.parametrize("urgency", range(12))
def test_each_wide_market_slice_works_its_share_of_the_need(urgency: int) -> None:
    env = make_env(max_position=60.0)
    info = act(env, LONG, WIDE.full_size, MARKET, urgency)
    assert info["position"].item() == pytest.approx(60.0 * (urgency + 1) / 12, abs=1e-9)


@pytest.mark.parametrize("urgency", range(12))
@pytest.mark.parametrize("direction", [LONG, SHORT])
def test_each_wide_ioc_offset_takes_the_levels_up_to_its_limit(direction: int, urgency: int) -> None:
    env = make_env(max_position=1000.0)  # more than the book holds: the limit alone stops it
    info = act(env, direction, WIDE.full_size, IOC, urgency)
    side = 1 if direction == LONG else -1
    levels = (ASK if side > 0 else BID)[: urgency + 1]  # the touch and u ticks beyond it
    assert info["position"].item() == pytest.approx(side * 10.0 * (urgency + 1))
    assert info["cash"].item() == pytest.approx(-side * sum(10.0 * p for p, _ in levels), abs=1e-8)
    assert not info["order_active"].item()


@pytest.mark.parametrize("urgency", range(12))
@pytest.mark.parametrize("direction", [LONG, SHORT])
def test_each_wide_maker_offset_rests_behind_at_or_inside_the_touch(direction: int, urgency: int) -> None:
    info = act(make_env(), direction, 0, MAKER, urgency)
    side, offset = (1 if direction == LONG else -1), WIDE.maker_offsets[urgency]
    touch = 100.00 if side > 0 else 100.02
    assert offset == urgency - 10
    assert info["order_active"].item() and info["position"].item() == 0.0
    assert info["order_price"].item() == pytest.approx(touch + side * 0.01 * offset, abs=1e-9)
    # the reference formula of matching gives the same tick
    tick = maker_offset_tick(torch.tensor([10000.0]), torch.tensor([10002.0]), torch.tensor([float(side)]),
                             torch.tensor([float(offset)]))
    assert tick.item() == pytest.approx(round(info["order_price"].item() / 0.01))


def test_one_inside_stays_at_the_touch_on_a_one_tick_spread() -> None:
    ask = [(round(100.01 + 0.01 * k, 2), 10.0) for k in range(12)]
    info = act(make_env(ask=ask), LONG, 0, MAKER, 11)
    assert info["order_price"].item() == pytest.approx(100.00, abs=1e-9)


def test_the_wide_grids_checks_name_the_branch_and_its_size() -> None:
    env = make_env()
    act(env, LONG, 9, IOC, 11)  # the largest values are in range
    with pytest.raises(ValueError, match=r"magnitude=10 must lie in \[0, 10\)"):
        env.step(torch.tensor([[LONG, 10, IOC, 0]]))
    with pytest.raises(ValueError, match=r"urgency=12 must lie in \[0, 12\)"):
        env.step(torch.tensor([[LONG, 0, IOC, 12]]))
    with pytest.raises(ValueError, match=r"urgency=3 must lie in \[0, 3\)"):
        make_env("default").step(torch.tensor([[LONG, 0, IOC, 3]]))


def test_range_checks_of_the_tensor_faces_follow_nvec() -> None:
    values = torch.tensor([[2, 9, 2, 11], [0, 0, 0, 12]])
    with pytest.raises(ValueError, match=r"actions\[1, 3\]=12 out of range: urgency=12 must lie in \[0, 12"):
        spec.check_action_values(values, joint=False, nvec=WIDE.nvec)
    with pytest.raises(ValueError, match=r"a joint code must lie in \[0, 1080\)"):
        spec.check_action_values(torch.tensor([[1080]]), joint=True, nvec=WIDE.nvec)
    flag = spec.ActionRangeFlag("cpu", joint=True, nvec=WIDE.nvec)
    assert flag.record(torch.tensor([[1079], [1080]])).tolist() == [[1079], [0]]
    with pytest.raises(ValueError, match=r"actions\[1\]=1080 out of range"):
        flag.raise_if_set()


@pytest.mark.parametrize(("value", "message"), [
    ("huge", r"action_grid='huge' must be one of \['default', 'wide'\]"),
    (3, "must be a grid name"),
    ({"magnitudes": [0.5, 1.0]}, "lacks"),
    ({**WIDE.to_dict(), "sizes": [1]}, r"unknown fields \['sizes'\]"),
    ({**WIDE.to_dict(), "name": "x", "magnitudes": [1.0]}, "magnitudes=.* at least 2 numbers"),
    ({**WIDE.to_dict(), "name": "x", "magnitudes": [0.5, 1.5]}, r"magnitudes=.* \(0, 1\], got 1.5"),
    ({**WIDE.to_dict(), "name": "x", "magnitudes": [0.25, 0.5]}, "magnitudes=.* must hold 1.0"),
    ({**WIDE.to_dict(), "name": "x", "magnitudes": [1.0, 0.5]}, "strictly increasing"),
    ({**WIDE.to_dict(), "name": "x", "magnitudes": [0.5, float("nan"), 1.0]}, "finite numbers, got nan"),
    ({**WIDE.to_dict(), "name": "x", "market_slices": [0.0] + [1.0] * 11}, r"market_slices=.* \(0, 1\]"),
    ({**WIDE.to_dict(), "name": "x", "ioc_offsets": [-1] + list(range(11))}, "ioc_offsets=.* >= 0, got -1"),
    ({**WIDE.to_dict(), "name": "x", "ioc_offsets": [0.5] + list(range(11))}, "ioc_offsets=.* got 0.5"),
    ({**WIDE.to_dict(), "name": "x", "maker_offsets": list(range(-9, 3))}, "maker_offsets=.* <= 1 .* got 2"),
    ({**WIDE.to_dict(), "name": "x", "maker_offsets": list(range(-12, 0))}, "maker_offsets=.* must hold 0"),
    ({**WIDE.to_dict(), "name": "x", "ioc_offsets": [0, 1, 2]}, "one value per urgency each"),
    ({**WIDE.to_dict(), "name": "default"}, "names a built-in grid"),
    ({**WIDE.to_dict(), "name": ""}, "name='' must be a non-empty string"),
])
def test_bad_grids_are_refused_in_one_line(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        EnvConfig(action_grid=value)
    assert "\n" not in str(error.value)


def test_a_custom_grid_is_data() -> None:
    grid = {"name": "three_sizes", "magnitudes": [0.5, 1.0], "market_slices": [0.5, 1.0],
            "ioc_offsets": [0, 2], "maker_offsets": [0, 1]}
    config = EnvConfig(action_grid=grid)
    assert config.grid.nvec == (3, 2, 3, 2) and config.grid.joint_actions == 36
    env = make_env(grid, max_position=10.0)
    info = act(env, LONG, 1, IOC, 1)  # full size, IoC up to 2 ticks beyond the ask: 10 lots at 100.02
    assert info["position"].item() == pytest.approx(10.0)


def test_the_wide_grid_steps_the_same_on_the_lean_path_and_the_core() -> None:
    import gymnasium as gym

    import foxenv  # noqa: F401 (registers the env)

    env = gym.make("foxenv/LOB-v0", action_grid="wide", episode_length=40, num_steps=600)
    assert env.unwrapped.lean  # its self-check against the core passed on random wide actions
    assert env.action_space.nvec.tolist() == [3, 10, 3, 12]
    assert env.unwrapped._book.self_check(steps=40, seed=3) is None
    env.reset(seed=0)
    for action in np.random.default_rng(0).integers(0, WIDE.nvec, size=(30, 4)):
        env.step(action)
    with pytest.raises(ValueError, match=r"urgency=12 must lie in \[0, 12\)"):
        env.step(np.array([0, 0, 0, 12]))


def test_vector_env_takes_the_grid() -> None:
    from foxenv.vector_env import LOBVectorEnv

    env = LOBVectorEnv(3, action_grid="wide", episode_length=20, num_steps=400, seed=0)
    assert env.single_action_space.nvec.tolist() == [3, 10, 3, 12]
    env.reset(seed=0)
    for action in np.random.default_rng(1).integers(0, WIDE.nvec, size=(25, 3, 4)):
        obs, *_ = env.step(action)
    assert np.isfinite(obs).all()


def test_tables_build_one_row_per_code() -> None:
    env = make_env()
    tables: MarketTables = env._tables
    codes = torch.arange(WIDE.joint_actions)
    weights = torch.tensor(WIDE.code_weights)
    actions = (codes[:, None] // weights) % torch.tensor(WIDE.nvec)
    rows = tables.actions.index_select(0, (actions * tables.action_code).sum(dim=1))
    assert torch.equal(rows, tables.actions)  # the code weights address each row once, in order
    is_maker = rows[:, 3] == 1
    assert torch.equal(is_maker, actions[:, 2] == MAKER)
    targets = rows[:, 0].reshape(3, 10, 36)[:, :, 0]
    assert torch.allclose(targets[2], torch.tensor(WIDE.magnitudes, dtype=torch.float64) * 100.0)
