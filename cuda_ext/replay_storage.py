"""The replay state the prioritized-replay ops work on, allocated in one place.

:class:`ReplayStorage` is the layout of ``cuda_ext/README.md`` ("Replay state"): the transition ring, the sum
tree, the write head and the running max priority. :class:`PushRows` is a batch of incoming rows for
:func:`cuda_ext.per_push`; :class:`PushJoiner` joins :class:`PushBlock` s (blocks whose kind, done,
priority or max multiplier are one value for all their rows) into one, making those constant columns once
instead of on every push. Every user (the replay buffer of ``sb3_her_ext``, the tests, the benchmarks)
allocates through :meth:`ReplayStorage.zeros` instead of spelling the dtypes and shapes out again.

Usage::

    storage = cuda_ext.ReplayStorage.zeros(capacity=100_000, obs_dim=64, n_branches=4, device="cuda")
    rows = cuda_ext.PushRows.make(obs, next_obs, action, reward, wants, kind=0, done=done,
                                  priority=0.0, max_multiplier=1.0)
    slots = cuda_ext.per_push(storage, rows, alpha=0.6)

    joiner = PushJoiner()   # (cuda_ext.replay_storage) per push only the columns that vary are concatenated
    rows = joiner.join([PushBlock(obs, next_obs, action, reward, None, kind=0, done=done, priority=0.0,
                                  max_multiplier=1.0), PushBlock(...), ...])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

__all__ = ["PushBlock", "PushJoiner", "PushRows", "ReplayStorage", "new_tree"]


def new_tree(capacity: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """An empty sum tree for ``capacity`` rows: ``[2P] float64`` zeros, ``P`` = next power of two.

    :param capacity: number of replay rows, > 0.
    :param device: where the tree lives.
    :return: the zeroed tree.
    """
    if capacity <= 0:
        raise ValueError(f"capacity={capacity} must be > 0")
    n_leaves = 1 << (capacity - 1).bit_length()
    return torch.zeros(2 * n_leaves, dtype=torch.float64, device=device)


@dataclass
class ReplayStorage:
    """Device tensors of one replay ring of capacity ``C`` (obs width ``D``, ``NB`` action branches).

    :param obs: ``[C, D] float32`` observations.
    :param next_obs: ``[C, D] float32`` next observations.
    :param action: ``[C, NB] int64``, one index per branch.
    :param reward: ``[C] float32``.
    :param done: ``[C] float32`` (synthetic rows have 1).
    :param kind: ``[C] int8``: 0 real, 1 backward hindsight, 2 forward hindsight, 3 magnitude relabel.
    :param tree: ``[2P] float64`` sum tree, ``P`` the next power of two >= ``C``.
    :param head_size: ``[2] int64`` ``(write_head, size)``.
    :param max_priority: ``[1] float32`` running max raw priority (starts at 1).
    :param state: ``[C, S] float64`` each row's env state before its step (a counterfactual env's, see
        :mod:`sb3_her_ext.counterfactual`), or None: not stored. :func:`cuda_ext.per_push` does not write it
        (:meth:`write_state` does, at the slots the push returned).
    """

    obs: torch.Tensor
    next_obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    kind: torch.Tensor
    tree: torch.Tensor
    head_size: torch.Tensor
    max_priority: torch.Tensor
    state: torch.Tensor | None = None

    @classmethod
    def zeros(cls, capacity: int, obs_dim: int, n_branches: int,
              device: torch.device | str = "cpu", state_dim: int = 0) -> ReplayStorage:
        """An empty ring: zero rows and tree, ``head_size = (0, 0)``, ``max_priority = 1``.

        :param capacity: rows ``C``; >= 1.
        :param obs_dim: observation width ``D``; >= 0.
        :param n_branches: action branches ``NB``; >= 1.
        :param device: where the tensors live.
        :param state_dim: width ``S`` of the stored states; 0: no ``state`` field (None).
        :return: the storage.
        """
        checks = (("capacity", capacity, 1), ("obs_dim", obs_dim, 0), ("n_branches", n_branches, 1),
                  ("state_dim", state_dim, 0))
        for name, value, low in checks:
            if isinstance(value, bool) or int(value) != value or value < low:
                raise ValueError(f"{name}={value} must be an integer >= {low}")
        c, d, nb = int(capacity), int(obs_dim), int(n_branches)
        return cls(
            obs=torch.zeros(c, d, dtype=torch.float32, device=device),
            next_obs=torch.zeros(c, d, dtype=torch.float32, device=device),
            action=torch.zeros(c, nb, dtype=torch.int64, device=device),
            reward=torch.zeros(c, dtype=torch.float32, device=device),
            done=torch.zeros(c, dtype=torch.float32, device=device),
            kind=torch.zeros(c, dtype=torch.int8, device=device),
            tree=new_tree(c, device),
            head_size=torch.zeros(2, dtype=torch.int64, device=device),
            max_priority=torch.ones(1, dtype=torch.float32, device=device),
            state=torch.zeros(c, int(state_dim), dtype=torch.float64, device=device) if state_dim else None,
        )

    @property
    def capacity(self) -> int:
        """Rows ``C`` of the ring."""
        return self.obs.shape[0]

    @property
    def tree_leaves(self) -> int:
        """Leaves ``P`` of the sum tree (leaf ``i`` at ``tree[P + i]``)."""
        return self.tree.shape[0] // 2

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by field name (``state`` only where stored).

        :return: name -> tensor.
        """
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to(self, device: torch.device | str) -> ReplayStorage:
        """A copy whose tensors live on ``device`` (tensors already there are shared, as ``Tensor.to``).

        :param device: target device.
        :return: the moved storage.
        """
        return ReplayStorage(**{name: t.to(device) for name, t in self.tensors().items()})

    def write_state(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``values[i]`` into ``state`` at ``slots[i]``, the slots :func:`cuda_ext.per_push` returned
        for the rows (-1: not written), with no host sync.

        A row that was not written (more rows wanted a slot than the ring holds) repeats the write of the
        last written row, so every slot gets exactly one value whatever order the writes land in. At least
        one row must have been written (the last row that wanted a slot always is).

        :param slots: ``[N]`` int64 slots.
        :param values: ``[N, S]`` float64 states.
        :raises ValueError: when no ``state`` is stored, or ``values`` has another shape.
        """
        if self.state is None:
            raise ValueError("write_state: this storage stores no state (state_dim=0)")
        if values.shape != (slots.shape[0], self.state.shape[1]):
            raise ValueError(f"values shape {tuple(values.shape)} must be ({slots.shape[0]}, "
                             f"{self.state.shape[1]})")
        written = slots >= 0
        order = torch.arange(1, slots.shape[0] + 1, device=slots.device)
        last = torch.argmax(written * order)  # the last written row
        targets = torch.where(written, slots, slots[last])
        # unsafe: no range check of the (valid) targets; the checked index_put_ reads their min and max on the
        # host where deterministic algorithms are on (a sync, which a CUDA graph capture refuses)
        rows = torch.where(written[:, None], values, values[last])
        torch.ops.aten._index_put_impl_(self.state, [targets], rows, False, True)  # accumulate=False, unsafe


class PushRows(NamedTuple):
    """Incoming rows for :func:`cuda_ext.per_push` (all of length ``N``).

    :param obs: ``[N, D]`` float32.
    :param next_obs: ``[N, D]`` float32.
    :param action: ``[N, NB]`` int64.
    :param reward: ``[N]`` float32.
    :param done: ``[N]`` float32.
    :param kind: ``[N]`` int8 replay kind.
    :param wants: ``[N]`` bool, rows that take a slot.
    :param priority: ``[N]`` float32 raw priority term (``new_priority``).
    :param max_multiplier: ``[N]`` float32 multiplier of the running max priority.
    """

    obs: torch.Tensor
    next_obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    kind: torch.Tensor
    wants: torch.Tensor
    priority: torch.Tensor
    max_multiplier: torch.Tensor

    @classmethod
    def make(cls, obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
             wants: torch.Tensor, kind: int, done: torch.Tensor | float, priority: torch.Tensor | float,
             max_multiplier: float) -> PushRows:
        """Build a block, casting to the op's dtypes and broadcasting scalar ``done``, ``priority`` and
        ``max_multiplier``.

        :param obs: ``[N, D]`` observations.
        :param next_obs: ``[N, D]`` next observations.
        :param action: ``[N, NB]`` actions.
        :param reward: ``[N]`` rewards.
        :param wants: ``[N]`` rows that take a slot.
        :param kind: the replay kind of every row.
        :param done: ``[N]`` dones or one value for all.
        :param priority: ``[N]`` raw priority terms or one value for all.
        :param max_multiplier: multiplier of the running max priority for all rows.
        :return: the block.
        """
        n, device = reward.shape[0], reward.device
        f32 = torch.float32

        def column(value: torch.Tensor | float) -> torch.Tensor:
            # torch.full, not as_tensor(float): a host scalar copied to the GPU would synchronise
            if isinstance(value, torch.Tensor):
                return value.to(dtype=f32).reshape(n)
            return torch.full((n,), float(value), dtype=f32, device=device)

        return cls(
            obs=obs.to(f32),
            next_obs=next_obs.to(f32),
            action=action.to(torch.int64),
            reward=reward.to(f32),
            done=column(done),
            kind=torch.full((n,), kind, dtype=torch.int8, device=device),
            wants=wants.to(torch.bool),
            priority=column(priority),
            max_multiplier=torch.full((n,), max_multiplier, dtype=f32, device=device),
        )

    @staticmethod
    def concat(blocks: list[PushRows]) -> PushRows:
        """Concatenate blocks row-wise, in order.

        :param blocks: the blocks.
        :return: one block.
        """
        return PushRows(*(torch.cat(parts, dim=0) for parts in zip(*blocks, strict=True)))


class PushBlock(NamedTuple):
    """A block of ``N`` incoming rows for :class:`PushJoiner`: the varying columns as tensors, the columns
    that are one value for every row of the block as numbers.

    :param obs: ``[N, D]`` observations.
    :param next_obs: ``[N, D]`` next observations.
    :param action: ``[N, NB]`` actions.
    :param reward: ``[N]`` rewards.
    :param wants: ``[N]`` rows that take a slot, or None: every row.
    :param kind: the replay kind of every row.
    :param done: ``[N]`` dones or one value for all.
    :param priority: ``[N]`` raw priority terms or one value for all.
    :param max_multiplier: multiplier of the running max priority for all rows.
    """

    obs: torch.Tensor
    next_obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    wants: torch.Tensor | None
    kind: int
    done: torch.Tensor | float
    priority: torch.Tensor | float
    max_multiplier: float


#: the :class:`PushRows` columns a :class:`PushBlock` may give as one value, with their dtypes
_CONSTANT_COLUMNS = {"wants": torch.bool, "kind": torch.int8, "done": torch.float32,
                     "priority": torch.float32, "max_multiplier": torch.float32}
_ROW_COLUMNS = {"obs": torch.float32, "next_obs": torch.float32, "action": torch.int64,
                "reward": torch.float32}
#: columns of one dtype and row width, concatenated by one cat (each column a contiguous slice of it)
_JOINED_TOGETHER = (("obs", "next_obs"), ("action",), ("reward", "done", "priority", "max_multiplier"),
                    ("wants",), ("kind",))


class PushJoiner:
    """Joins :class:`PushBlock` s into the :class:`PushRows` of one :func:`cuda_ext.per_push`, as
    ``PushRows.concat`` of their ``PushRows.make`` would (the same values and dtypes).

    The parts of a column that are one value per block (``kind``, ``max_multiplier``, ``wants=None``, a
    number ``done`` or ``priority``) are made once per layout (the blocks' sizes and values, and the device)
    and kept: per push only the tensor parts are cast (a no-op when already of the column's dtype) and
    concatenated (the columns of one dtype and row width by one cat: each is a contiguous slice of it), and
    a column made of constants only is the kept tensor itself. The kept tensors are made outside CUDA graph
    capture (a capture that meets a new layout builds that push's constants without keeping them), and
    :func:`cuda_ext.per_push` only reads them; callers must not write the returned rows in place.
    """

    #: layouts kept at most (a buffer pushes one)
    MAX_LAYOUTS = 16

    def __init__(self) -> None:
        self._constants: dict[tuple, dict[str, list[torch.Tensor | None]]] = {}

    def join(self, blocks: Sequence[PushBlock]) -> PushRows:
        """One block of rows from ``blocks``, in order.

        :param blocks: at least one block, all on one device.
        :return: the joined rows.
        """
        if not blocks:
            raise ValueError("blocks=[] must hold at least one block")
        device = blocks[0].reward.device
        sizes = [block.reward.shape[0] for block in blocks]
        layout = (device, tuple(
            (n, b.kind, float(b.max_multiplier), b.wants is None, _number_or_none(b.done),
             _number_or_none(b.priority)) for n, b in zip(sizes, blocks, strict=True)
        ))
        constants = self._constants.get(layout)
        if constants is None:
            constants = _constant_parts(blocks, sizes, device)
            if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
                if len(self._constants) >= self.MAX_LAYOUTS:  # e.g. NaN values: a key that never matches
                    self._constants.clear()
                self._constants[layout] = constants
        parts: dict[str, list[torch.Tensor]] = {}
        for name, dtype in _ROW_COLUMNS.items():
            parts[name] = [getattr(block, name).to(dtype) for block in blocks]
        for name, dtype in _CONSTANT_COLUMNS.items():
            column = parts[name] = []
            for kept, block, n in zip(constants[name], blocks, sizes, strict=True):
                if kept is None:  # this block's own tensor
                    column.append(getattr(block, name).to(dtype).reshape(n))
                elif not column or column[-1] is not kept:  # a run of constant blocks is one kept piece
                    column.append(kept)
        columns = {name: column[0] for name, column in parts.items() if len(column) == 1}
        total = sum(sizes)
        for group in _JOINED_TOGETHER:  # one cat per group of the columns that need one; each a slice of it
            names = [name for name in group if len(parts[name]) > 1]
            if names:
                joined = torch.cat([part for name in names for part in parts[name]], dim=0)
                columns.update(zip(names, joined.split(total), strict=True))
        return PushRows(**{name: columns[name] for name in PushRows._fields})


def _number_or_none(value: torch.Tensor | float) -> float | None:
    """A constant column value as a number (a layout key), or None for a tensor."""
    return None if isinstance(value, torch.Tensor) else float(value)


def _constant_parts(blocks: Sequence[PushBlock], sizes: list[int],
                    device: torch.device) -> dict[str, list[torch.Tensor | None]]:
    """Per constant column, per block: the kept tensor that holds its rows (shared by a run of consecutive
    constant blocks: one piece covers them all), or None where the block gives a tensor."""
    out: dict[str, list[torch.Tensor | None]] = {}
    for name, dtype in _CONSTANT_COLUMNS.items():
        values = [_column_value(name, block) for block in blocks]
        pieces: list[torch.Tensor | None] = [None] * len(blocks)
        start = 0
        while start < len(blocks):
            if values[start] is None:
                start += 1
                continue
            end = start
            while end < len(blocks) and values[end] is not None:
                end += 1
            piece = torch.cat([
                torch.full((n,), value, dtype=dtype, device=device)
                for n, value in zip(sizes[start:end], values[start:end], strict=True)
            ])
            pieces[start:end] = [piece] * (end - start)
            start = end
        out[name] = pieces
    return out


def _column_value(name: str, block: PushBlock) -> float | int | bool | None:
    """The one value of a block's constant column, or None where the block gives a tensor."""
    if name == "wants":
        return True if block.wants is None else None
    if name == "kind":
        return int(block.kind)
    if name == "max_multiplier":
        return float(block.max_multiplier)
    return _number_or_none(getattr(block, name))
