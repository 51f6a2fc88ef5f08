"""Define the hindsight ops ``cuda_ext::hindsight_track``, ``hindsight_inject``, ``hindsight_forward`` and
``magnitude_relabel``: schema, pure-PyTorch reference and fake (shape-only) implementation.

The CUDA kernels (``csrc/hindsight*``) register for the CUDA dispatch key when the extension is loaded.
Semantics: ``cuda_ext/README.md``; reference: :mod:`cuda_ext.reference.hindsight`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ext._library import define_op
from cuda_ext.reference import hindsight as ref

__all__ = ["hindsight_forward", "hindsight_inject", "hindsight_track", "magnitude_relabel"]


def _fake_track(*args: Tensor) -> None:
    """Fake :func:`cuda_ext.reference.hindsight.hindsight_track`: validates, returns nothing.

    :param args: the op's arguments.
    """
    ref.check_hindsight_track(*args)


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


def _fake_inject(*args: object) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Fake :func:`cuda_ext.reference.hindsight.hindsight_inject`.

    :param args: the op's arguments.
    :return: empty outputs of the right shapes.
    """
    ref.check_hindsight_inject(*args)  # type: ignore[arg-type]
    obs, action = args[8], args[10]
    return _candidate_rows(obs.shape[0], obs, action)  # type: ignore[union-attr,arg-type]


def _fake_forward(*args: object) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Fake :func:`cuda_ext.reference.hindsight.hindsight_forward`.

    :param args: the op's arguments.
    :return: empty outputs of the right shapes.
    """
    ref.check_hindsight_forward(*args)  # type: ignore[arg-type]
    slot_obs, slot_action = args[7], args[8]
    return _candidate_rows(slot_obs.shape[0], slot_obs, slot_action)  # type: ignore[union-attr,arg-type]


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


hindsight_track = define_op(
    "hindsight_track(Tensor(a!) ring, Tensor(b!) ring_len, Tensor(c!) entry_mid, Tensor(d!) direction, "
    "Tensor(e!) peak, Tensor(f!) peak_row, Tensor position, Tensor best_bid, Tensor best_ask, "
    "Tensor row) -> ()",
    ref.hindsight_track,
    _fake_track,
)

hindsight_inject = define_op(
    "hindsight_inject(Tensor(a!) ring_len, Tensor(b!) entry_mid, Tensor(c!) direction, Tensor(d!) peak, "
    "Tensor(e!) peak_row, Tensor trade_closed, Tensor raw_reward, Tensor lots, Tensor obs, Tensor next_obs, "
    "Tensor action, Tensor replay_next_obs, float reward_scale, float threshold, int anchor, "
    "int direction_branch, int flat_action) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    ref.hindsight_inject,
    _fake_inject,
)

hindsight_forward = define_op(
    "hindsight_forward(Tensor(a!) slot_valid, Tensor(b!) slot_entry, Tensor(c!) slot_close_step, "
    "Tensor(d!) slot_direction, Tensor(e!) slot_actual, Tensor(f!) slot_lots, Tensor(g!) slot_book, "
    "Tensor(h!) slot_obs, Tensor(i!) slot_action, Tensor(j!) ring_head, Tensor step, Tensor mid, "
    "Tensor book_reset, Tensor trade_closed, Tensor entry_mid, Tensor closed_direction, Tensor actual, "
    "Tensor lots, Tensor obs, Tensor action, int lookahead, float threshold, float reward_scale, "
    "int direction_branch) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    ref.hindsight_forward,
    _fake_forward,
)

magnitude_relabel = define_op(
    "magnitude_relabel(Tensor trade_closed, Tensor obs, Tensor next_obs, Tensor action, Tensor reward, "
    "Tensor magnitudes, int magnitude_branch) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    ref.magnitude_relabel,
    _fake_relabel,
)
