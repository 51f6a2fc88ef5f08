"""The hindsight ops ``cuda_ext::hindsight_track``, ``hindsight_inject``, ``hindsight_forward`` and
``magnitude_relabel``: schema, pure-PyTorch reference, fake (shape-only) implementation, and the typed
wrappers of the same names that callers use (keyword arguments, named outputs).

The CUDA kernels (``csrc/hindsight*``) register for the CUDA dispatch key when the extension is loaded.
Semantics: ``cuda_ext/README.md``; reference: :mod:`cuda_ext.reference.hindsight`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from cuda_ext._library import define_op
from cuda_ext.reference import hindsight as ref

__all__ = [
    "CandidateRows", "RelabelRows", "hindsight_forward", "hindsight_inject", "hindsight_track",
    "magnitude_relabel",
]


class CandidateRows(NamedTuple):
    """Fixed-size candidate rows of a hindsight op; only rows with ``wants`` are meaningful.

    :param obs: ``[n, D] float32``.
    :param next_obs: ``[n, D] float32``.
    :param action: ``[n, NB] int64``.
    :param reward: ``[n] float32``.
    :param wants: ``[n] bool`` rows to push.
    :param count: ``[1] int64`` rows wanted (a device tensor: no host sync).
    """

    obs: Tensor
    next_obs: Tensor
    action: Tensor
    reward: Tensor
    wants: Tensor
    count: Tensor


class RelabelRows(NamedTuple):
    """Candidate rows of :func:`magnitude_relabel`: :class:`CandidateRows` plus each row's priority.

    :param obs: ``[n, D] float32``.
    :param next_obs: ``[n, D] float32``.
    :param action: ``[n, NB] int64``.
    :param reward: ``[n] float32``.
    :param priority: ``[n] float32`` ``|R_k - reward|``.
    :param wants: ``[n] bool`` rows to push.
    :param count: ``[1] int64`` rows wanted.
    """

    obs: Tensor
    next_obs: Tensor
    action: Tensor
    reward: Tensor
    priority: Tensor
    wants: Tensor
    count: Tensor


def _fake_track(
    ring: Tensor, ring_len: Tensor, entry_mid: Tensor, direction: Tensor, peak: Tensor, peak_row: Tensor,
    position: Tensor, best_bid: Tensor, best_ask: Tensor, row: Tensor,
) -> None:
    """Fake :func:`cuda_ext.reference.hindsight.hindsight_track`: validates, returns nothing.

    :param ring: see the reference; the other parameters likewise.
    """
    ref.check_hindsight_track(
        ring, ring_len, entry_mid, direction, peak, peak_row, position, best_bid, best_ask, row
    )


def _candidate_rows(
    n_rows: int, obs: Tensor, action: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Empty outputs of a candidate-row op: obs, next_obs, action, reward, wants and count.

    :param n_rows: number of candidate rows.
    :param obs: ``[*, D]`` tensor giving the observation width and the device.
    :param action: ``[*, NB]`` tensor giving the number of branches.
    :return: ``(obs [n, D], next_obs [n, D], action [n, NB], reward [n], wants [n] bool, count [1] int64)``.
    """
    obs_dim, n_branches = obs.shape[1], action.shape[1]
    return (
        obs.new_empty((n_rows, obs_dim)),
        obs.new_empty((n_rows, obs_dim)),
        action.new_empty((n_rows, n_branches)),
        obs.new_empty((n_rows,)),
        obs.new_empty((n_rows,), dtype=torch.bool),
        obs.new_empty((1,), dtype=torch.int64),
    )


def _fake_inject(
    ring_len: Tensor, entry_mid: Tensor, direction: Tensor, peak: Tensor, peak_row: Tensor,
    trade_closed: Tensor, raw_reward: Tensor, lots: Tensor, obs: Tensor, next_obs: Tensor, action: Tensor,
    replay_next_obs: Tensor,
    reward_scale: float, threshold: float, anchor: int, direction_branch: int, flat_action: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Fake :func:`cuda_ext.reference.hindsight.hindsight_inject`.

    :param ring_len: see the reference; the other parameters likewise.
    :return: empty outputs of the right shapes.
    """
    ref.check_hindsight_inject(
        ring_len, entry_mid, direction, peak, peak_row, trade_closed, raw_reward, lots, obs, next_obs, action,
        replay_next_obs, reward_scale, threshold, anchor, direction_branch, flat_action,
    )
    return _candidate_rows(obs.shape[0], obs, action)


def _fake_forward(
    slot_valid: Tensor, slot_entry: Tensor, slot_close_step: Tensor, slot_direction: Tensor,
    slot_actual: Tensor, slot_lots: Tensor, slot_book: Tensor, slot_obs: Tensor, slot_action: Tensor,
    ring_head: Tensor, step: Tensor, mid: Tensor, book_reset: Tensor, trade_closed: Tensor, entry_mid: Tensor,
    closed_direction: Tensor,
    actual: Tensor, lots: Tensor, obs: Tensor, action: Tensor, lookahead: int, threshold: float,
    reward_scale: float, direction_branch: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Fake :func:`cuda_ext.reference.hindsight.hindsight_forward`.

    :param slot_valid: see the reference; the other parameters likewise.
    :return: empty outputs of the right shapes.
    """
    ref.check_hindsight_forward(
        slot_valid, slot_entry, slot_close_step, slot_direction, slot_actual, slot_lots, slot_book, slot_obs,
        slot_action, ring_head, step, mid, book_reset, trade_closed, entry_mid, closed_direction, actual,
        lots, obs, action, lookahead, threshold, reward_scale, direction_branch,
    )
    return _candidate_rows(slot_obs.shape[0], slot_obs, slot_action)


def _fake_relabel(
    trade_closed: Tensor,
    obs: Tensor,
    next_obs: Tensor,
    action: Tensor,
    reward: Tensor,
    magnitudes: Tensor,
    magnitude_branch: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Fake :func:`cuda_ext.reference.hindsight.magnitude_relabel`.

    :param trade_closed: see the reference; the other parameters likewise.
    :return: empty outputs of the right shapes.
    """
    ref.check_magnitude_relabel(trade_closed, obs, next_obs, action, reward, magnitudes, magnitude_branch)
    n_rows = (magnitudes.shape[0] - 1) * obs.shape[0]
    out_obs, out_next_obs, out_action, out_reward, wants, count = _candidate_rows(n_rows, obs, action)
    return out_obs, out_next_obs, out_action, out_reward, obs.new_empty((n_rows,)), wants, count


_HINDSIGHT_TRACK = define_op(
    "hindsight_track(Tensor(a!) ring, Tensor(b!) ring_len, Tensor(c!) entry_mid, Tensor(d!) direction, "
    "Tensor(e!) peak, Tensor(f!) peak_row, Tensor position, Tensor best_bid, Tensor best_ask, "
    "Tensor row) -> ()",
    ref.hindsight_track,
    _fake_track,
)

_HINDSIGHT_INJECT = define_op(
    "hindsight_inject(Tensor(a!) ring_len, Tensor(b!) entry_mid, Tensor(c!) direction, Tensor(d!) peak, "
    "Tensor(e!) peak_row, Tensor trade_closed, Tensor raw_reward, Tensor lots, Tensor obs, Tensor next_obs, "
    "Tensor action, Tensor replay_next_obs, float reward_scale, float threshold, int anchor, "
    "int direction_branch, int flat_action) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    ref.hindsight_inject,
    _fake_inject,
)

_HINDSIGHT_FORWARD = define_op(
    "hindsight_forward(Tensor(a!) slot_valid, Tensor(b!) slot_entry, Tensor(c!) slot_close_step, "
    "Tensor(d!) slot_direction, Tensor(e!) slot_actual, Tensor(f!) slot_lots, Tensor(g!) slot_book, "
    "Tensor(h!) slot_obs, Tensor(i!) slot_action, Tensor(j!) ring_head, Tensor step, Tensor mid, "
    "Tensor book_reset, Tensor trade_closed, Tensor entry_mid, Tensor closed_direction, Tensor actual, "
    "Tensor lots, Tensor obs, Tensor action, int lookahead, float threshold, float reward_scale, "
    "int direction_branch) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    ref.hindsight_forward,
    _fake_forward,
)

_MAGNITUDE_RELABEL = define_op(
    "magnitude_relabel(Tensor trade_closed, Tensor obs, Tensor next_obs, Tensor action, Tensor reward, "
    "Tensor magnitudes, int magnitude_branch) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    ref.magnitude_relabel,
    _fake_relabel,
)


def hindsight_track(
    *, ring: Tensor, ring_len: Tensor, entry_mid: Tensor, direction: Tensor, peak: Tensor, peak_row: Tensor,
    position: Tensor, best_bid: Tensor, best_ask: Tensor, row: Tensor,
) -> None:
    """Advance each book's trade tracker by one step (``cuda_ext::hindsight_track``).

    :param ring: ``[B, R] float32`` recent mids of the open trade (mutated).
    :param ring_len: ``[B] int64`` mids recorded in the trade (mutated).
    :param entry_mid: ``[B] float32`` mid at the trade's entry (mutated).
    :param direction: ``[B] int64`` +1 long, -1 short, 0 flat (mutated).
    :param peak: ``[B] float32`` best mid of the trade so far (mutated).
    :param peak_row: ``[B] int64`` replay slot whose ``next_obs`` shows the peak, -1 none (mutated).
    :param position: ``[B] float32`` position after this step (its sign is the trade's direction).
    :param best_bid: ``[B] float32``.
    :param best_ask: ``[B] float32``.
    :param row: ``[B] int64`` replay slot of this step's real row, -1 if not written.
    """
    _HINDSIGHT_TRACK(ring, ring_len, entry_mid, direction, peak, peak_row, position, best_bid, best_ask, row)


def hindsight_inject(
    *, ring_len: Tensor, entry_mid: Tensor, direction: Tensor, peak: Tensor, peak_row: Tensor,
    trade_closed: Tensor, raw_reward: Tensor, lots: Tensor, obs: Tensor, next_obs: Tensor, action: Tensor,
    replay_next_obs: Tensor, reward_scale: float, threshold: float, anchor: int, direction_branch: int,
    flat_action: int,
) -> CandidateRows:
    """Backward (peak) hindsight rows for the trades that closed this step (``cuda_ext::hindsight_inject``).

    A closed trade whose peak PnL beat ``threshold`` x its realised PnL wants a row paying the peak PnL;
    every closed book's tracker is reset. Call before :func:`hindsight_track`.

    :param ring_len: ``[B] int64`` tracker state (mutated: reset on close).
    :param entry_mid: ``[B] float32`` tracker state (mutated).
    :param direction: ``[B] int64`` tracker state (mutated).
    :param peak: ``[B] float32`` tracker state (mutated).
    :param peak_row: ``[B] int64`` tracker state (mutated).
    :param trade_closed: ``[B] bool`` a trade closed this step.
    :param raw_reward: ``[B] float32`` realised PnL times ``reward_scale``.
    :param lots: ``[B] float32`` size of the closed trade.
    :param obs: ``[B, D] float32`` this step's observation.
    :param next_obs: ``[B, D] float32`` this step's next observation.
    :param action: ``[B, NB] int64`` this step's action.
    :param replay_next_obs: ``[C, D] float32`` the replay ring's ``next_obs`` (the ``peak`` anchor reads it).
    :param reward_scale: reward per unit of currency; > 0.
    :param threshold: the peak must beat ``threshold`` x the realised PnL; finite.
    :param anchor: 0 the closing transition, 1 the transition into the peak with the exit action.
    :param direction_branch: index of the direction branch in ``action``.
    :param flat_action: the direction branch's exit value (anchor 1).
    :return: ``B`` candidate rows (row ``b`` is book ``b``).
    """
    return CandidateRows(*_HINDSIGHT_INJECT(
        ring_len, entry_mid, direction, peak, peak_row, trade_closed, raw_reward, lots, obs, next_obs, action,
        replay_next_obs, reward_scale, threshold, anchor, direction_branch, flat_action,
    ))


def hindsight_forward(
    *, slot_valid: Tensor, slot_entry: Tensor, slot_close_step: Tensor, slot_direction: Tensor,
    slot_actual: Tensor, slot_lots: Tensor, slot_book: Tensor, slot_obs: Tensor, slot_action: Tensor,
    ring_head: Tensor, step: Tensor, mid: Tensor, book_reset: Tensor, trade_closed: Tensor, entry_mid: Tensor,
    closed_direction: Tensor, actual: Tensor, lots: Tensor, obs: Tensor, action: Tensor, lookahead: int,
    threshold: float, reward_scale: float, direction_branch: int,
) -> CandidateRows:
    """Forward hindsight over a ring of ``S`` closed trades (``cuda_ext::hindsight_forward``).

    A slot ``lookahead`` to ``2 * lookahead - 1`` steps old whose "stay in the trade" PnL now beats
    ``threshold`` x the realised PnL wants a row and is cleared; expired slots and slots of reset books are
    cleared; then this step's closed trades enter the ring.

    :param slot_valid: ``[S] bool`` ring state (mutated), like every ``slot_*`` and ``ring_head``.
    :param slot_entry: ``[S] float32`` entry mid of the slot's trade.
    :param slot_close_step: ``[S] int64`` step at which it closed.
    :param slot_direction: ``[S] int64`` +1 long, -1 short.
    :param slot_actual: ``[S] float32`` realised PnL (currency).
    :param slot_lots: ``[S] float32`` size.
    :param slot_book: ``[S] int64`` book index.
    :param slot_obs: ``[S, D] float32`` observation at the close.
    :param slot_action: ``[S, NB] int64`` action at the close.
    :param ring_head: ``[1] int64`` next slot written.
    :param step: ``[1] int64`` the current step.
    :param mid: ``[B] float32`` this step's mids.
    :param book_reset: ``[B] bool`` books that started a new episode.
    :param trade_closed: ``[B] bool`` a trade closed this step.
    :param entry_mid: ``[B] float32`` entry mid of the closed trade.
    :param closed_direction: ``[B] int64`` direction of the closed trade.
    :param actual: ``[B] float32`` realised PnL (currency).
    :param lots: ``[B] float32`` size of the closed trade.
    :param obs: ``[B, D] float32`` this step's observation.
    :param action: ``[B, NB] int64`` this step's action.
    :param lookahead: steps after a close at which the check runs; >= 1.
    :param threshold: the alternative must beat ``threshold`` x the realised PnL; finite.
    :param reward_scale: reward per unit of currency; > 0.
    :param direction_branch: index of the direction branch in ``action``.
    :return: ``S`` candidate rows (row ``i`` is slot ``i``).
    """
    return CandidateRows(*_HINDSIGHT_FORWARD(
        slot_valid, slot_entry, slot_close_step, slot_direction, slot_actual, slot_lots, slot_book, slot_obs,
        slot_action, ring_head, step, mid, book_reset, trade_closed, entry_mid, closed_direction, actual,
        lots, obs, action, lookahead, threshold, reward_scale, direction_branch,
    ))


def magnitude_relabel(
    *, trade_closed: Tensor, obs: Tensor, next_obs: Tensor, action: Tensor, reward: Tensor,
    magnitudes: Tensor, magnitude_branch: int,
) -> RelabelRows:
    """Relabel each closed trade with every other magnitude (``cuda_ext::magnitude_relabel``).

    :param trade_closed: ``[B] bool`` a trade closed this step.
    :param obs: ``[B, D] float32`` this step's observation.
    :param next_obs: ``[B, D] float32`` this step's next observation.
    :param action: ``[B, NB] int64`` this step's action.
    :param reward: ``[B] float32`` this step's reward.
    :param magnitudes: ``[M] float32`` the magnitude of each value of the magnitude branch; ``M >= 2``.
    :param magnitude_branch: index of the magnitude branch in ``action``.
    :return: ``(M - 1) B`` candidate rows (row ``j * B + b``: book ``b``, the ``j``-th other magnitude).
    """
    return RelabelRows(*_MAGNITUDE_RELABEL(trade_closed, obs, next_obs, action, reward, magnitudes,
                                          magnitude_branch))
