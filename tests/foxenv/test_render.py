"""rgb_array rendering: image shape and dtype, and that the book, the order and the mid path are drawn."""

from __future__ import annotations

import numpy as np
import pytest

from foxenv.data.market import MarketData
from foxenv.gym_env import LOBEnv
from foxenv.render import render_book
from foxenv.vector_env import make_vec
from tests.foxenv.fake_market import random_market


def color_pixels(image: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 30) -> int:
    """Number of pixels within ``tolerance`` of ``rgb`` on every channel."""
    return int((np.abs(image.astype(np.int32) - np.array(rgb)) <= tolerance).all(axis=-1).sum())


GREEN, RED, BLUE = (0x2E, 0x7D, 0x32), (0xC6, 0x28, 0x28), (0x15, 0x65, 0xC0)


@pytest.fixture(scope="module")
def market() -> MarketData:
    """A random-walk 10-level market of 300 steps."""
    return random_market(300, num_levels=10, seed=4)


def test_render_book_draws_depth_and_order() -> None:
    bids = [99.9, 99.8, 99.7]
    asks = [100.1, 100.2, 100.3]
    with_order = render_book(bids, [5, 10, 15], asks, [7, 8, 9], mids=[100.0, 100.05, 100.0],
                             position=25.0, max_position=100.0, order_price=99.8, order_remaining=10.0,
                             width=400, height=300)
    assert with_order.shape == (300, 400, 3) and with_order.dtype == np.uint8
    assert color_pixels(with_order, GREEN) > 100
    assert color_pixels(with_order, RED) > 100
    assert color_pixels(with_order, BLUE) > 20
    without_order = render_book(bids, [5, 10, 15], asks, [7, 8, 9], width=400, height=300)
    assert color_pixels(without_order, BLUE) == 0
    with pytest.raises(ValueError, match="width=10"):
        render_book(bids, [1, 1, 1], asks, [1, 1, 1], width=10)


def test_env_render_rgb_array(market: MarketData) -> None:
    env = LOBEnv(data=market, seed=0, episode_length=50, render_mode="rgb_array")
    env.reset(seed=0)
    first = env.render()
    assert isinstance(first, np.ndarray) and first.shape == (360, 640, 3) and first.dtype == np.uint8
    for _ in range(10):
        env.step(np.array([2, 2, 1, 0]))  # full long target as a resting LimitMaker bid
    later = env.render()
    assert later.shape == first.shape and later.dtype == np.uint8
    assert color_pixels(later, GREEN) > 100 and color_pixels(later, RED) > 100
    assert not np.array_equal(first, later)


def test_render_without_mode_returns_none_and_bad_mode_raises(market: MarketData) -> None:
    env = LOBEnv(data=market, seed=0, episode_length=50)
    env.reset(seed=0)
    assert env.render() is None
    with pytest.raises(ValueError, match="render_mode='ansi'"):
        make_vec(2, data=market, render_mode="ansi")


def test_vector_env_renders_first_book(market: MarketData) -> None:
    env = make_vec(3, data=market, seed=0, episode_length=50, render_mode="rgb_array")
    env.reset(seed=0)
    env.step(np.ones((3, 4), dtype=np.int64))
    frames = env.render()
    assert isinstance(frames, tuple) and len(frames) == 1
    assert frames[0].shape == (360, 640, 3) and frames[0].dtype == np.uint8


def test_vector_env_render_after_autoreset(market: MarketData) -> None:
    env = make_vec(2, data=market, seed=0, episode_length=2, render_mode="rgb_array")
    env.reset(seed=0)
    for _ in range(2):
        _, _, _, truncated, _ = env.step(np.full((2, 4), 2))
    assert truncated.all()
    frame = env.render()[0]
    assert frame.shape == (360, 640, 3)
    assert color_pixels(frame, BLUE) == 0  # the reset book has no resting order and no history
