"""The counterfactual step: every action's outcome from a stored book state, in one batched core step.

foxenv's market path is exogenous: the replayed market rows do not depend on the agent's orders, and a
step draws no random numbers. What a step does to one book is a pure function of the book's own state
(:data:`~foxenv.state.BOOK_ROWS`, 14 float64 numbers, and :data:`~foxenv.state.COUNTER_ROWS`, 3 int64
counters: the book reads its market row ``offset + step`` from them), its action and the shared
:class:`~foxenv.tables.MarketTables`. So ``B`` stored states with ``K`` actions each are ``B * K`` books:
repeat each state ``K`` times, step them once with :class:`~foxenv.core.BatchedLOB`'s own step over the
same tables, and every action's reward, done flags, next state and next observation come out at once, the
same numbers (bit for bit) the env gave or would have given for that action.

- :func:`export_state` / :func:`restore_state`: the state of a vector env's books, as a replay row would
  store it (:class:`AgentState`: ``[N, 14]`` float64 + ``[N, 3]`` int64), and back.
- :func:`start_state`: fresh books (flat, no cash, no order) at given market rows.
- :func:`pack_state` / :func:`unpack_state` / :func:`packed_state_of`: the state as one ``[N, 17]`` float64
  row per book (:data:`STATE_DIM`: the 14 book numbers, then the 3 counters as float64, exact for integers
  below 2**53), the form a replay buffer stores.
- :class:`CounterfactualStep`: the batched step of ``B`` states times ``K`` actions (no Python loop over
  books; no host sync on an accelerator unless asked to validate the actions).

The clone is exact against the env's eager step (the default); a compiled step (``compile=True``) may
differ from it in the last bits of floats (:meth:`~foxenv.core.BatchedLOB.enable_compile`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from foxenv.core import BatchedLOB
from foxenv.state import BOOK_ROWS, COUNTER_ROWS

#: Columns of :attr:`AgentState.books` and :attr:`AgentState.counters`, by ``state_dict`` name.
STATE_COLUMNS = (BOOK_ROWS, COUNTER_ROWS)
#: Width of a packed state (:func:`pack_state`): the book numbers, then the counters.
STATE_DIM = len(BOOK_ROWS) + len(COUNTER_ROWS)


class AgentState(NamedTuple):
    """The agent's part of ``N`` books: what a replay row stores to restore its book.

    :param books: ``[..., len(BOOK_ROWS)]`` float64 (equity, peak equity, resting order, ledger).
    :param counters: ``[..., len(COUNTER_ROWS)]`` int64 (episode start row ``offset``, ``step``,
        ``ledger.trade_start``); the book's market row is ``offset + step``.
    """

    books: torch.Tensor
    counters: torch.Tensor

    @property
    def row(self) -> torch.Tensor:
        """``[...]`` int64 market row each book observes (``offset + step``)."""
        return self.counters[..., 0] + self.counters[..., 1]

    def column(self, name: str) -> torch.Tensor:
        """One field by its ``state_dict`` name (``"ledger.cash"``, ``"order_ahead"``, ``"step"``, ...)."""
        if name in BOOK_ROWS:
            return self.books[..., BOOK_ROWS.index(name)]
        if name in COUNTER_ROWS:
            return self.counters[..., COUNTER_ROWS.index(name)]
        raise ValueError(f"name={name!r} must be one of {BOOK_ROWS + COUNTER_ROWS}")

    def reshape(self, *shape: int) -> AgentState:
        """The same books with leading shape ``shape``."""
        return AgentState(
            self.books.reshape(*shape, len(BOOK_ROWS)), self.counters.reshape(*shape, len(COUNTER_ROWS))
        )

    def index(self, index: Any) -> AgentState:
        """The books selected by ``index`` over the leading dimensions."""
        return AgentState(self.books[index], self.counters[index])


class Counterfactual(NamedTuple):
    """What :class:`CounterfactualStep` returns for ``B`` states and ``K`` actions each (all ``[B, K, ...]``).

    :param obs: ``[B, K, D]`` float32, the observation the step produced (before any autoreset: the env's
        ``final_obs``).
    :param reward: ``[B, K]`` float32.
    :param terminated: ``[B, K]`` bool (drawdown).
    :param truncated: ``[B, K]`` bool (episode length).
    :param info: the core's per-book info (:data:`foxenv.spec.INFO_KEYS`), each ``[B, K]``.
    :param state: the next agent state (before any autoreset), ``[B, K, ...]``.
    :param actions: ``[B, K, 4]`` int64 branch actions taken.
    """

    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    info: dict[str, torch.Tensor]
    state: AgentState
    actions: torch.Tensor


def core_of(env: Any) -> BatchedLOB:
    """The :class:`~foxenv.core.BatchedLOB` of a core, a ``LOBVectorEnv`` or a ``LOBEnv`` (``.core``), or
    foxhunt's SB3 ``LOBVecEnv`` (``.lob``).

    :raises ValueError: for anything else.
    """
    if isinstance(env, BatchedLOB):
        return env
    for name in ("core", "lob"):
        core = getattr(env, name, None)
        if isinstance(core, BatchedLOB):
            return core
    raise ValueError(f"env of type {type(env).__name__} must be a BatchedLOB or hold one as .core or .lob")


def export_state(env: Any) -> AgentState:
    """The agent state of every book of ``env`` now (copies): what a replay row stores.

    :param env: a :class:`~foxenv.core.BatchedLOB`, ``LOBVectorEnv`` or ``LOBEnv``.
    :return: ``books [B, 14]`` float64 and ``counters [B, 3]`` int64 on the env's device.
    """
    packed = core_of(env)._state_tensors()
    return AgentState(packed["books"].T.clone(), packed["counters"].T.clone())


def check_state(state: AgentState, core: BatchedLOB, name: str = "state") -> AgentState:
    """``state`` as ``[N, ...]`` tensors on the core's device, checked (shape, dtype; metadata only).

    :raises ValueError: naming the field for a wrong type, shape or dtype.
    """
    if not isinstance(state, tuple) or len(state) != 2:
        raise ValueError(f"{name} of type {type(state).__name__} must be an AgentState(books, counters)")
    books, counters = state
    for field, value, width, dtype in (("books", books, len(BOOK_ROWS), torch.float64),
                                       ("counters", counters, len(COUNTER_ROWS), torch.int64)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name}.{field} of type {type(value).__name__} must be a torch.Tensor")
        if value.ndim < 1 or value.shape[-1] != width:
            raise ValueError(f"{name}.{field} shape {tuple(value.shape)} must end in {width}")
        if value.dtype != dtype:
            raise ValueError(f"{name}.{field} dtype {value.dtype} must be {dtype}")
    if books.shape[:-1] != counters.shape[:-1]:
        raise ValueError(f"{name}.books shape {tuple(books.shape)} and {name}.counters shape "
                         f"{tuple(counters.shape)} must have the same leading dimensions")
    return AgentState(books.to(core.device), counters.to(core.device))


def restore_state(env: Any, state: AgentState) -> None:
    """Set every book of ``env`` to ``state`` (one row per book); the env's random stream is not touched.

    On the CPU (or with ``check_range``) the counters are checked to lie in the market: a host read.

    :param env: a :class:`~foxenv.core.BatchedLOB`, ``LOBVectorEnv`` or ``LOBEnv``.
    :param state: ``[B, ...]`` as :func:`export_state` gives.
    :raises ValueError: for another number of books, a wrong dtype, or a book outside its market window.
    """
    core = core_of(env)
    state = check_state(state, core)
    if state.books.shape[:-1] != (core.num_books,):
        raise ValueError(f"state.books shape {tuple(state.books.shape)} must be ({core.num_books}, "
                         f"{len(BOOK_ROWS)}): one row per book")
    if core.device.type == "cpu":
        check_counters(state, core)
    core._set_state_tensors({"books": state.books.T.contiguous(), "counters": state.counters.T.contiguous()})
    core._pin_state()


def check_counters(state: AgentState, core: BatchedLOB) -> None:
    """Check on the host that every book lies in its market window (``0 <= offset < T - L``,
    ``0 <= step < L``, so that it can step).

    :raises ValueError: naming the field and the values out of range.
    """
    high = core._tables.num_steps - core.config.episode_length
    offset, step = state.counters[..., 0], state.counters[..., 1]
    for field, values, top in (("offset", offset, high), ("step", step, core.config.episode_length)):
        if values.numel() and bool(((values < 0) | (values >= top)).any()):
            raise ValueError(f"state.counters[..., {field!r}] values in [{int(values.min())}, "
                             f"{int(values.max())}] must lie in [0, {top}) to step")


def pack_state(state: AgentState) -> torch.Tensor:
    """``state`` as one float64 row per book: ``[..., STATE_DIM]``, the book numbers then the counters
    (converted to float64: exact, as every counter lies below 2**53).

    :param state: the state, ``[..., 14]`` float64 books and ``[..., 3]`` int64 counters.
    :return: a new ``[..., 17]`` float64 tensor.
    """
    return torch.cat([state.books, state.counters.to(torch.float64)], dim=-1)


def unpack_state(packed: torch.Tensor, name: str = "states") -> AgentState:
    """The :class:`AgentState` of :func:`pack_state`'s rows (checked: metadata only, no host read).

    :param packed: ``[..., STATE_DIM]`` float64.
    :param name: the argument's name in error messages.
    :return: the state (the counters converted back to int64; the books a view of ``packed``).
    :raises ValueError: naming ``name``, for another type, dtype or last dimension.
    """
    if not isinstance(packed, torch.Tensor):
        raise ValueError(f"{name} of type {type(packed).__name__} must be a torch.Tensor")
    if packed.dtype != torch.float64 or packed.ndim < 1 or packed.shape[-1] != STATE_DIM:
        raise ValueError(f"{name} shape {tuple(packed.shape)} dtype {packed.dtype} must be "
                         f"[..., {STATE_DIM}] float64 (pack_state's rows)")
    width = len(BOOK_ROWS)
    return AgentState(packed[..., :width], packed[..., width:].to(torch.int64))


def packed_state_of(env: Any) -> torch.Tensor:
    """The packed state (:func:`pack_state`) of every book of ``env`` now: ``[N, 17]`` float64, a new tensor
    (one op: no host sync, capturable in a CUDA graph).

    :param env: a :class:`~foxenv.core.BatchedLOB`, ``LOBVectorEnv`` or ``LOBEnv``.
    """
    packed = core_of(env)._state_tensors()
    return torch.cat([packed["books"].T, packed["counters"].T.to(torch.float64)], dim=1)


def start_state(offsets: torch.Tensor, device: str | torch.device | None = None) -> AgentState:
    """Fresh books (flat, no cash, no order, step 0) starting at market rows ``offsets``.

    :param offsets: ``[N]`` integer start rows.
    :param device: device of the state (default: the offsets').
    :return: the state, ``[N, ...]``.
    """
    offsets = torch.as_tensor(offsets)
    if offsets.ndim != 1 or offsets.dtype.is_floating_point or offsets.dtype == torch.bool:
        raise ValueError(f"offsets shape {tuple(offsets.shape)} dtype {offsets.dtype} must be [N] integers")
    offsets = offsets.to(device=device or offsets.device, dtype=torch.int64)
    books = torch.zeros(offsets.shape[0], len(BOOK_ROWS), dtype=torch.float64, device=offsets.device)
    counters = torch.zeros(offsets.shape[0], len(COUNTER_ROWS), dtype=torch.int64, device=offsets.device)
    counters[:, 0] = offsets
    return AgentState(books, counters)


class CounterfactualStep:
    """Every given action's transition from each of ``B`` stored agent states, in one step of the core.

    :param env: the env whose market, config and tables the books replay (a
        :class:`~foxenv.core.BatchedLOB`, ``LOBVectorEnv`` or ``LOBEnv``); its own books are never changed.
    :param validate: check action ranges and that every book can step (host reads); default: on the CPU.
    """

    def __init__(self, env: Any, validate: bool | None = None) -> None:
        self.core = core_of(env)
        self.device = self.core.device
        self.config = self.core.config
        self.nvec = tuple(self.core.ACTION_NVEC)
        self.validate = self.device.type == "cpu" if validate is None else bool(validate)
        weights = self.config.grid.code_weights
        self._weights = torch.tensor(weights, dtype=torch.int64, device=self.device)
        self._nvec = torch.tensor(self.nvec, dtype=torch.int64, device=self.device)
        self._all = self.decode(torch.arange(self.num_actions, device=self.device))

    @property
    def num_actions(self) -> int:
        """Joint codes of the env's grid (81 on the default grid, 1,080 on ``"wide"``)."""
        return int(self.config.grid.joint_actions)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Branch actions ``[..., 4]`` of joint codes ``[...]`` (``code = sum(action * code_weights)``)."""
        return torch.div(codes[..., None], self._weights, rounding_mode="floor") % self._nvec

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Joint codes ``[...]`` of branch actions ``[..., 4]``."""
        return (actions * self._weights).sum(dim=-1)

    def actions_of(self, num_states: int, actions: torch.Tensor | None) -> torch.Tensor:
        """``[B, K, 4]`` int64 branch actions from ``None`` (every joint code, the same for each state),
        ``[K]`` codes (the same for each state), ``[B, K]`` codes or ``[B, K, 4]`` branch actions.

        :raises ValueError: naming the argument for a wrong dtype or shape, or (when validating) a value
            out of range.
        """
        if actions is None:
            return self._all.expand(num_states, -1, -1)
        if not isinstance(actions, torch.Tensor):
            raise ValueError(f"actions of type {type(actions).__name__} must be a torch.Tensor or None")
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise ValueError(f"actions dtype {actions.dtype} must be an integer dtype")
        actions = actions.to(self.device, torch.int64)
        joint = actions.ndim in (1, 2)
        if actions.ndim == 1:
            actions = actions.expand(num_states, -1)
        if (actions.ndim == 2 and actions.shape[0] != num_states) or (
            actions.ndim == 3 and actions.shape[::2] != (num_states, len(self.nvec))
        ) or actions.ndim not in (2, 3):
            raise ValueError(f"actions shape {tuple(actions.shape)} must be [K] or [{num_states}, K] joint "
                             f"codes or [{num_states}, K, {len(self.nvec)}] branch actions")
        if self.validate:
            limit = self.num_actions if joint else self._nvec
            if bool(((actions < 0) | (actions >= limit)).any()):
                bad = actions[(actions < 0) | (actions >= limit)][0]
                what = f"a joint code in [0, {self.num_actions})" if joint else f"in branch nvec {self.nvec}"
                raise ValueError(f"actions holds {int(bad)}: each must be {what}")
        return self.decode(actions) if joint else actions

    def __call__(self, state: AgentState, actions: torch.Tensor | None = None) -> Counterfactual:
        """Step each of the ``B`` states with each of its ``K`` actions, as ``B * K`` books at once.

        :param state: ``[B, ...]`` agent states (:func:`export_state`, :func:`start_state`, or the ``state``
            of an earlier result reshaped to ``[B, ...]``).
        :param actions: ``None`` for every joint code of the grid, ``[K]`` or ``[B, K]`` joint codes, or
            ``[B, K, 4]`` branch actions.
        :return: the :class:`Counterfactual`, ``[B, K, ...]``.
        """
        state = check_state(state, self.core)
        if state.books.ndim != 2:
            raise ValueError(f"state.books shape {tuple(state.books.shape)} must be [B, {len(BOOK_ROWS)}]")
        if self.validate:
            check_counters(state, self.core)
        num_states = state.books.shape[0]
        branch = self.actions_of(num_states, actions)
        clones = branch.shape[1]
        # each state once per action, as [rows, B * K] (an expand, not repeat_interleave: no host sync)
        books = state.books.T[:, :, None].expand(-1, -1, clones).reshape(len(BOOK_ROWS), -1).contiguous()
        counters = state.counters.T[:, :, None].expand(-1, -1, clones).reshape(len(COUNTER_ROWS), -1)
        counters = counters.contiguous()
        outputs, books, counters = self._step(books, counters, branch.reshape(-1, len(self.nvec)))
        obs, reward, terminated, truncated, info = outputs
        shape = (num_states, clones)
        return Counterfactual(
            obs=obs.reshape(*shape, -1),
            reward=reward.reshape(shape),
            terminated=terminated.reshape(shape),
            truncated=truncated.reshape(shape),
            info={key: value.reshape(shape) for key, value in info.items()},
            state=AgentState(books.T.reshape(*shape, -1), counters.T.reshape(*shape, -1)),
            actions=branch,
        )

    def _step(
        self, books: torch.Tensor, counters: torch.Tensor, action: torch.Tensor
    ) -> tuple[tuple[Any, ...], torch.Tensor, torch.Tensor]:
        """One eager step of the core on the packed state of any number of books (``[rows, N]``), the
        core's own books left as they were."""
        core = self.core
        saved = core._state_tensors()
        core._set_state_tensors({"books": books, "counters": counters})
        try:
            outputs = core._advance(action)
            after = core._state_tensors()
        finally:
            core._set_state_tensors(saved)
        return outputs, after["books"], after["counters"]
