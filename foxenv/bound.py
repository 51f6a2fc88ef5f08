"""The clairvoyant bound: the best PnL any policy can get on a window's replayed market path under foxenv's
own fill rules, by exhaustive search over the agent's state with the counterfactual step.

The market path is exogenous (:mod:`foxenv.counterfactual`), so a window's outcomes form a tree over the
agent's actions only. The search runs forward over the window: every distinct agent state is stepped with
every joint action of the grid (one :class:`~foxenv.counterfactual.CounterfactualStep` per chunk of states),
and states that differ only in their cash are merged, keeping the one with the most cash. That merge is
exact: what a step does to cash, position and the resting order reads only the position, the resting
order's five numbers (side, price, queue ahead, remaining, target) and the market row; the other ledger
fields (average price, realized PnL, the open trade's bookkeeping), equity and peak equity are accounts that
no fill reads. So the future cash is additive: a state with more cash ends every continuation with that
much more equity. The bound of a window is the most equity a state holds after its last step (PnL, not the
reward: an inventory penalty or reward scale is not applied).

``max_drawdown``: termination reads equity, which the merge ignores. The search never terminates a book;
under a config with ``max_drawdown`` the bound is the most equity any state holds at *any* step of the
window (a terminated policy keeps the equity it had when it stopped), which bounds every policy, stopped or
not, and is looser than the drawdown-free bound only through that maximum over time.

The number of distinct states can grow with the window (partial fills make new positions, queue places
differ); ``max_states`` caps the states kept per window. Where the cap binds, the states with the most
equity are kept, the result is flagged inexact, and it is then a floor: the PnL of an action sequence that
exists, no longer a bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.counterfactual import AgentState, CounterfactualStep, core_of, start_state
from foxenv.data.market import MarketData
from foxenv.state import BOOK_ROWS

#: The state fields the future cash depends on (``BOOK_ROWS`` names): the merge key, besides the window.
FUTURE_FIELDS = (
    "ledger.position", "order_side", "order_tick", "order_ahead", "order_remaining", "order_target",
)
_KEY_COLUMNS = [BOOK_ROWS.index(name) for name in FUTURE_FIELDS]
_CASH = BOOK_ROWS.index("ledger.cash")
_EQUITY = BOOK_ROWS.index("equity")


@dataclass
class BoundResult:
    """What :func:`clairvoyant_bound` returns.

    :param pnl: ``[W]`` float64, the bound of each window (currency); a floor where not ``exact``.
    :param exact: ``[W]`` bool, no state was dropped by ``max_states``.
    :param states: ``[W, L]`` int64 distinct agent states after each step (after merging, before the cap).
    :param offsets: ``[W]`` int64 start rows of the windows.
    :param length: steps of each window.
    :param anytime: the bound is the maximum over every step of the window (a ``max_drawdown`` config).
    """

    pnl: torch.Tensor
    exact: torch.Tensor
    states: torch.Tensor
    offsets: torch.Tensor
    length: int
    anytime: bool


def bound_core(env_or_market: Any, config: EnvConfig | None = None,
               device: str | torch.device | None = None) -> BatchedLOB:
    """The core whose market, config and tables the search steps: ``env_or_market``'s own, or a one-book
    core over a :class:`~foxenv.data.market.MarketData` with ``config`` (default :class:`EnvConfig`)."""
    if isinstance(env_or_market, MarketData):
        return BatchedLOB(env_or_market, 1, config or EnvConfig(), device=device, seed=0)
    if config is not None:
        raise ValueError("config is taken from the env; give it only with a MarketData")
    return core_of(env_or_market)


def merge_states(state: AgentState, window: torch.Tensor) -> tuple[AgentState, torch.Tensor]:
    """Merge states of the same window that differ only in what the future cash does not read, keeping
    the one with the most cash (the lowest index among ties).

    :param state: ``[N, ...]`` agent states.
    :param window: ``[N]`` int64 window of each state.
    :return: the kept states and their windows, sorted by window and key.
    """
    key = torch.cat([window[:, None].double(), state.books[:, _KEY_COLUMNS]], dim=1)
    _, group = torch.unique(key, dim=0, return_inverse=True)
    groups = int(group.max()) + 1 if group.numel() else 0
    cash = state.books[:, _CASH]
    best = torch.full((groups,), -torch.inf, dtype=cash.dtype, device=cash.device)
    best = best.scatter_reduce(0, group, cash, reduce="amax")
    index = torch.arange(cash.shape[0], device=cash.device)
    candidate = torch.where(cash == best[group], index, cash.shape[0])
    first = torch.full((groups,), cash.shape[0], dtype=torch.int64, device=cash.device)
    first = first.scatter_reduce(0, group, candidate, reduce="amin")
    return state.index(first), window[first]


def cap_states(state: AgentState, window: torch.Tensor, num_windows: int,
               max_states: int) -> tuple[AgentState, torch.Tensor, torch.Tensor]:
    """Keep at most ``max_states`` states per window, those with the most equity.

    :return: the kept states, their windows, and ``[W]`` bool: the window lost a state.
    """
    counts = torch.bincount(window, minlength=num_windows)
    if int(counts.max()) <= max_states:
        return state, window, torch.zeros(num_windows, dtype=torch.bool, device=window.device)
    order = torch.argsort(state.books[:, _EQUITY], descending=True, stable=True)
    order = order[torch.argsort(window[order], stable=True)]  # by window, then by equity (descending)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.shape[0], device=window.device) - starts[window[order]]
    kept = order[rank < max_states]
    return state.index(kept), window[kept], counts > max_states


def expand(cf: CounterfactualStep, state: AgentState, chunk: int) -> AgentState:
    """Every joint action from every state: ``[N * A, ...]`` next states, ``chunk`` states at a time."""
    parts = []
    for start in range(0, state.books.shape[0], chunk):
        out = cf(state.index(slice(start, start + chunk)))
        parts.append(out.state.reshape(-1))
    return AgentState(torch.cat([p.books for p in parts]), torch.cat([p.counters for p in parts]))


def clairvoyant_bound(
    env_or_market: Any,
    offsets: Any,
    length: int | None = None,
    *,
    config: EnvConfig | None = None,
    device: str | torch.device | None = None,
    max_states: int = 100_000,
    chunk: int = 2_048,
    merge: bool = True,
) -> BoundResult:
    """The best PnL any policy can get on each window of the env's market under its fill rules.

    :param env_or_market: a :class:`~foxenv.core.BatchedLOB`, ``LOBVectorEnv`` or ``LOBEnv`` (its market,
        config and action grid), or a :class:`~foxenv.data.market.MarketData` with ``config``.
    :param offsets: ``[W]`` start rows of the windows (episodes start there: flat, no cash, step 0).
    :param length: steps of each window; ``None``: the config's ``episode_length`` (at most that).
    :param config: the env config with a ``MarketData`` (default :class:`EnvConfig`).
    :param device: device of the search with a ``MarketData`` (default the market's).
    :param max_states: states kept per window after each step but the last (see the module docstring);
        >= 1.
    :param chunk: states stepped at once (``chunk * A`` books in one core step); >= 1.
    :param merge: merge states that differ only in cash (exact); ``False`` keeps every distinct full
        state (a check of the merge; the state count grows much faster).
    :return: the :class:`BoundResult`.
    """
    core = bound_core(env_or_market, config, device)
    episode = core.config.episode_length
    length = episode if length is None else length
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= episode:
        raise ValueError(f"length={length!r} must be an integer in [1, episode_length={episode}]")
    for name, value in (("max_states", max_states), ("chunk", chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    offsets = torch.as_tensor(offsets)
    if offsets.ndim != 1 or offsets.numel() < 1:
        raise ValueError(f"offsets shape {tuple(offsets.shape)} must be [W] with W >= 1")
    high = core.market.num_steps - episode
    if bool(((offsets < 0) | (offsets >= high)).any()):
        raise ValueError(f"offsets values in [{int(offsets.min())}, {int(offsets.max())}] must lie in [0, "
                         f"{high}): episodes of {episode} steps start there")
    cf = CounterfactualStep(core)
    state = start_state(offsets, core.device)
    num_windows = offsets.shape[0]
    window = torch.arange(num_windows, device=core.device)
    anytime = core.config.max_drawdown is not None
    best = torch.zeros(num_windows, dtype=torch.float64, device=core.device)  # equity 0 at the start
    exact = torch.ones(num_windows, dtype=torch.bool, device=core.device)
    states = torch.zeros(num_windows, length, dtype=torch.int64, device=core.device)
    for t in range(length):
        state = expand(cf, state, chunk)
        window = window.repeat_interleave(cf.num_actions)
        if merge:
            state, window = merge_states(state, window)
        else:
            state, window = unique_states(state, window)
        states[:, t] = torch.bincount(window, minlength=num_windows)
        equity = torch.full((num_windows,), -torch.inf, dtype=torch.float64, device=core.device)
        equity = equity.scatter_reduce(0, window, state.books[:, _EQUITY], reduce="amax")
        best = torch.maximum(best, equity) if anytime else equity
        if t < length - 1:  # the last step's states have no future: the cap would drop nothing that counts
            state, window, dropped = cap_states(state, window, num_windows, max_states)
            exact &= ~dropped
    return BoundResult(pnl=best, exact=exact, states=states, offsets=offsets.to(core.device),
                       length=length, anytime=anytime)


def unique_states(state: AgentState, window: torch.Tensor) -> tuple[AgentState, torch.Tensor]:
    """Drop exact duplicates (every book field and counter equal, in the same window): no merge at all."""
    key = torch.cat([window[:, None].double(), state.books, state.counters.double()], dim=1)
    _, group = torch.unique(key, dim=0, return_inverse=True)
    groups = int(group.max()) + 1
    index = torch.arange(group.shape[0], device=group.device)
    first = torch.full((groups,), group.shape[0], dtype=torch.int64, device=group.device)
    first = first.scatter_reduce(0, group, index, reduce="amin")
    return state.index(first), window[first]
