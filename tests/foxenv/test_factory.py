"""make_core: the one factory every face builds its core through."""

from __future__ import annotations

import pytest

from foxenv.config import EnvConfig
from foxenv.factory import make_core
from tests.foxenv.fake_market import random_market


def test_make_core_config_and_keywords():
    market = random_market(60, num_levels=3, seed=0)
    core = make_core(market, 3, config=EnvConfig(levels=3, episode_length=9), max_position=4.0, seed=2)
    assert core.num_books == 3 and core.config.episode_length == 9 and core.config.max_position == 4.0
    assert core.market.num_steps == 60


@pytest.mark.parametrize(
    ("data", "kwargs", "match"),
    [
        (42, {}, "data=42"),
        ("synthetic", {"not_a_setting": 1}, "not_a_setting=1"),
        (None, {"market_seed": 3}, "market_seed=3"),
        ("synthetic", {"config": "x"}, "config='x'"),
    ],
)
def test_make_core_refuses_bad_input(data, kwargs, match):
    if data is None:
        data = random_market(60, num_levels=3, seed=0)
    with pytest.raises(ValueError, match=match):
        make_core(data, 1, levels=3, episode_length=9, **kwargs)


def test_every_load_market_keyword_is_a_market_option():
    # a run's env.market reaches load_market through MARKET_KWARGS: the session split (split_times), the days
    # of a folder and the validation cut must pass (foxhunt train --env.market '{"split_times": [...]}')
    import inspect

    from foxenv.data import load_market
    from foxenv.data.synthetic import WAVE_KNOBS
    from foxenv.factory import MARKET_KWARGS

    parameters = inspect.signature(load_market).parameters
    named = {k for k, p in parameters.items() if p.kind != inspect.Parameter.VAR_KEYWORD}
    loader = named - {"source", "levels", "device", "seed"}
    assert loader <= set(MARKET_KWARGS), sorted(loader - set(MARKET_KWARGS))
    assert set(WAVE_KNOBS) <= set(MARKET_KWARGS)  # load_market's **waves
