"""Pictures of one book: depth by level, the agent's resting order and position, the recent mid path.

Drawn with matplotlib's Agg canvas directly (no pyplot, no global state, no window), returned as an
``H x W x 3`` uint8 array for ``render_mode="rgb_array"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from foxenv.core import BatchedLOB

BID_COLOR = "#2e7d32"
ASK_COLOR = "#c62828"
ORDER_COLOR = "#1565c0"


def render_book(
    bid_price: Sequence[float] | np.ndarray,
    bid_size: Sequence[float] | np.ndarray,
    ask_price: Sequence[float] | np.ndarray,
    ask_size: Sequence[float] | np.ndarray,
    *,
    mids: Sequence[float] = (),
    position: float = 0.0,
    max_position: float | None = None,
    order_price: float | None = None,
    order_remaining: float = 0.0,
    equity: float | None = None,
    step: int | None = None,
    width: int = 640,
    height: int = 360,
) -> np.ndarray:
    """Draw one book snapshot.

    :param bid_price: ``[L]`` bid prices, best first.
    :param bid_size: ``[L]`` visible bid sizes.
    :param ask_price: ``[L]`` ask prices, best first.
    :param ask_size: ``[L]`` visible ask sizes.
    :param mids: recent mid prices, oldest first (the right panel; empty: no path drawn).
    :param position: the agent's signed position, lots.
    :param max_position: the position limit, shown beside the position when given.
    :param order_price: price of the agent's resting order, ``None`` when there is none.
    :param order_remaining: its unfilled size.
    :param equity: the agent's equity, shown in the title when given.
    :param step: the episode step, shown in the title when given.
    :param width: image width in pixels.
    :param height: image height in pixels.
    :return: ``[height, width, 3]`` uint8 RGB image.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if width < 64 or height < 64:
        raise ValueError(f"width={width}, height={height} must both be >= 64 pixels")
    bids = np.asarray(bid_price, dtype=np.float64)
    asks = np.asarray(ask_price, dtype=np.float64)
    dpi = 100
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(figure)
    depth_axes, path_axes = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})

    # Depth: one horizontal bar per level at its price, bids left (negative), asks right.
    span = np.concatenate([bids, asks])
    gaps = np.diff(np.sort(span))
    bar_height = 0.8 * float(gaps[gaps > 0].min()) if (gaps > 0).any() else 0.01
    bid_depth = -np.asarray(bid_size, dtype=np.float64)
    ask_depth = np.asarray(ask_size, dtype=np.float64)
    depth_axes.barh(bids, bid_depth, height=bar_height, color=BID_COLOR, label="bid")
    depth_axes.barh(asks, ask_depth, height=bar_height, color=ASK_COLOR, label="ask")
    depth_axes.axvline(0.0, color="black", linewidth=0.5)
    if order_price is not None:
        depth_axes.axhline(order_price, color=ORDER_COLOR, linestyle="--", linewidth=1.2,
                           label=f"own order {order_remaining:g} @ {order_price:g}")
    depth_axes.set_xlabel("size (bid < 0 < ask)")
    depth_axes.set_ylabel("price")
    depth_axes.legend(loc="upper left", fontsize=6)
    limit = f" / {max_position:g}" if max_position is not None else ""
    title = f"position {position:+g}{limit}"
    if equity is not None:
        title += f"   equity {equity:+.2f}"
    if step is not None:
        title += f"   step {step}"
    depth_axes.set_title(title, fontsize=8)

    # Recent mid path.
    if len(mids) > 0:
        steps_ago = np.arange(len(mids)) - len(mids) + 1
        path_axes.plot(steps_ago, np.asarray(mids, dtype=np.float64), color="black")
        if order_price is not None:
            path_axes.axhline(order_price, color=ORDER_COLOR, linestyle="--", linewidth=1.0)
    path_axes.set_xlabel("steps ago")
    path_axes.set_title("mid", fontsize=8)
    for axes in (depth_axes, path_axes):
        axes.tick_params(labelsize=6)
    figure.tight_layout()
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    return image


def render_core_book(core: BatchedLOB, book: int, mids: Sequence[float], info: dict[str, Any]) -> np.ndarray:
    """Draw book ``book`` of a batched core as it stands now.

    :param core: the batched core.
    :param book: index of the book.
    :param mids: its recent mid prices, oldest first.
    :param info: its last step's info as Python scalars (``{}`` right after a reset).
    :return: ``[H, W, 3]`` uint8 RGB image.
    """
    state = core.state_dict()
    row = int(state["offset"][book] + state["step"][book])
    market = core.market
    levels = core.config.levels
    active = bool(info.get("order_active", False))
    return render_book(
        market.bid_price[row, :levels].cpu().numpy(),
        market.bid_size[row, :levels].cpu().numpy(),
        market.ask_price[row, :levels].cpu().numpy(),
        market.ask_size[row, :levels].cpu().numpy(),
        mids=mids,
        position=float(info.get("position", 0.0)),
        max_position=core.config.max_position,
        order_price=float(info["order_price"]) if active else None,
        order_remaining=float(info.get("order_remaining", 0.0)),
        equity=float(info["equity"]) if "equity" in info else None,
        step=int(state["step"][book]),
    )
