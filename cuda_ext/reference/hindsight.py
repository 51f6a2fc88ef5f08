"""Pure-PyTorch references of the hindsight ops: tracker, backward and forward injection, magnitude relabel.

These are the CPU path and the oracle the CUDA kernels are tested against. Every float is computed
with one float32 operation at a time (no fused multiply-add), in the order the kernels use, so the
CUDA kernel reproduces the CPU reference bit for bit. No function loops over books or slots in Python
and none syncs the host: masked rows are redirected with ``torch.where`` and scatter to a dummy row.

Semantics are specified in ``cuda_ext/README.md``. Rows a book or slot does not want are all zero here
(observations, action, reward), so the fixed-size outputs are deterministic; the CUDA kernels of
``hindsight_inject`` and ``magnitude_relabel`` leave the observation rows of unwanted rows unwritten (the
contract calls them unspecified: only rows with ``wants`` are ever read).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ext.reference.checks import check_same_device, check_scalar, check_tensor

__all__ = [
    "check_hindsight_forward",
    "check_hindsight_inject",
    "check_hindsight_track",
    "check_magnitude_relabel",
    "hindsight_forward",
    "hindsight_inject",
    "hindsight_track",
    "magnitude_relabel",
]


def check_hindsight_track(
    ring: Tensor,
    ring_len: Tensor,
    entry_mid: Tensor,
    direction: Tensor,
    peak: Tensor,
    peak_row: Tensor,
    position: Tensor,
    best_bid: Tensor,
    best_ask: Tensor,
    row: Tensor,
) -> None:
    """Validate the arguments of :func:`hindsight_track` (shapes, dtypes, devices); raise ``ValueError``.

    :param ring: see :func:`hindsight_track`; the other parameters likewise.
    """
    check_tensor("ring", ring, torch.float32, (None, None))
    n_books, ring_size = ring.shape
    if ring_size < 1:
        raise ValueError(f"ring.shape[1]={ring_size} must be >= 1")
    for name, tensor, dtype in (
        ("ring_len", ring_len, torch.int64),
        ("entry_mid", entry_mid, torch.float32),
        ("direction", direction, torch.int64),
        ("peak", peak, torch.float32),
        ("peak_row", peak_row, torch.int64),
        ("position", position, torch.float32),
        ("best_bid", best_bid, torch.float32),
        ("best_ask", best_ask, torch.float32),
        ("row", row, torch.int64),
    ):
        check_tensor(name, tensor, dtype, (n_books,))
    check_same_device(
        ring=ring, ring_len=ring_len, entry_mid=entry_mid, direction=direction, peak=peak,
        peak_row=peak_row, position=position, best_bid=best_bid, best_ask=best_ask, row=row,
    )


def hindsight_track(
    ring: Tensor,
    ring_len: Tensor,
    entry_mid: Tensor,
    direction: Tensor,
    peak: Tensor,
    peak_row: Tensor,
    position: Tensor,
    best_bid: Tensor,
    best_ask: Tensor,
    row: Tensor,
) -> None:
    """Advance every book's trade tracker by one step (in place).

    Flat books reset; a new sign (from flat or by a flip) starts a trade at this mid; in a trade the
    mid goes into the ring (``ring[ring_len % R]``, ``R = ring.shape[1]``) and the running peak moves
    when the mid is better for the trade's direction. A NaN position counts as flat.

    :param ring: ``[B, R] float32`` mids of the open trade, written in place.
    :param ring_len: ``[B] int64`` mids recorded in the open trade.
    :param entry_mid: ``[B] float32`` mid when the open trade started (0 when flat).
    :param direction: ``[B] int64`` +1 long, -1 short, 0 flat.
    :param peak: ``[B] float32`` best mid seen in the open trade (0 when flat).
    :param peak_row: ``[B] int64`` replay row whose ``next_obs`` shows the peak (-1: none).
    :param position: ``[B] float32`` signed position after this step.
    :param best_bid: ``[B] float32`` best bid after this step.
    :param best_ask: ``[B] float32`` best ask after this step.
    :param row: ``[B] int64`` replay slot of this step's real transition.
    """
    check_hindsight_track(
        ring, ring_len, entry_mid, direction, peak, peak_row, position, best_bid, best_ask, row
    )
    mid = (best_bid + best_ask) * 0.5
    sign = (position > 0).long() - (position < 0).long()
    flat = sign == 0
    new_trade = (sign != direction) & ~flat
    zero_f = torch.zeros_like(mid)

    start_len = torch.where(flat | new_trade, torch.zeros_like(ring_len), ring_len)
    start_peak = torch.where(flat, zero_f, torch.where(new_trade, mid, peak))
    start_peak_row = torch.where(flat, torch.full_like(peak_row, -1), torch.where(new_trade, row, peak_row))
    entry_mid.copy_(torch.where(flat, zero_f, torch.where(new_trade, mid, entry_mid)))
    direction.copy_(sign)

    in_trade = ~flat
    slot = (start_len % ring.shape[1]).unsqueeze(1)
    old = ring.gather(1, slot).squeeze(1)
    ring.scatter_(1, slot, torch.where(in_trade, mid, old).unsqueeze(1))
    ring_len.copy_(start_len + in_trade.long())

    better = in_trade & (((sign > 0) & (mid > start_peak)) | ((sign < 0) & (mid < start_peak)))
    peak.copy_(torch.where(better, mid, start_peak))
    peak_row.copy_(torch.where(better, row, start_peak_row))


def check_hindsight_inject(
    ring_len: Tensor,
    entry_mid: Tensor,
    direction: Tensor,
    peak: Tensor,
    peak_row: Tensor,
    trade_closed: Tensor,
    raw_reward: Tensor,
    lots: Tensor,
    obs: Tensor,
    next_obs: Tensor,
    action: Tensor,
    replay_next_obs: Tensor,
    reward_scale: float,
    threshold: float,
    anchor: int,
    direction_branch: int,
    flat_action: int,
) -> None:
    """Validate the arguments of :func:`hindsight_inject`; raise ``ValueError`` naming the bad one.

    :param ring_len: see :func:`hindsight_inject`; the other parameters likewise.
    """
    check_tensor("obs", obs, torch.float32, (None, None))
    n_books, obs_dim = obs.shape
    check_tensor("next_obs", next_obs, torch.float32, (n_books, obs_dim))
    check_tensor("action", action, torch.int64, (n_books, None))
    check_tensor("replay_next_obs", replay_next_obs, torch.float32, (None, obs_dim))
    for name, tensor, dtype in (
        ("ring_len", ring_len, torch.int64),
        ("entry_mid", entry_mid, torch.float32),
        ("direction", direction, torch.int64),
        ("peak", peak, torch.float32),
        ("peak_row", peak_row, torch.int64),
        ("trade_closed", trade_closed, torch.bool),
        ("raw_reward", raw_reward, torch.float32),
        ("lots", lots, torch.float32),
    ):
        check_tensor(name, tensor, dtype, (n_books,))
    check_same_device(
        ring_len=ring_len, entry_mid=entry_mid, direction=direction, peak=peak, peak_row=peak_row,
        trade_closed=trade_closed, raw_reward=raw_reward, lots=lots, obs=obs, next_obs=next_obs,
        action=action, replay_next_obs=replay_next_obs,
    )
    check_scalar("reward_scale", reward_scale, low=0.0, low_open=True)
    check_scalar("threshold", threshold)
    if anchor not in (0, 1):
        raise ValueError(f"anchor={anchor} must be 0 (close) or 1 (peak)")
    if anchor == 1 and replay_next_obs.shape[0] < 1:
        raise ValueError(f"replay_next_obs.shape={tuple(replay_next_obs.shape)} must have rows for anchor=1")
    if not 0 <= direction_branch < action.shape[1]:
        raise ValueError(f"direction_branch={direction_branch} must be in [0, {action.shape[1]})")
    if flat_action < 0:
        raise ValueError(f"flat_action={flat_action} must be >= 0")


def hindsight_inject(
    ring_len: Tensor,
    entry_mid: Tensor,
    direction: Tensor,
    peak: Tensor,
    peak_row: Tensor,
    trade_closed: Tensor,
    raw_reward: Tensor,
    lots: Tensor,
    obs: Tensor,
    next_obs: Tensor,
    action: Tensor,
    replay_next_obs: Tensor,
    reward_scale: float,
    threshold: float,
    anchor: int,
    direction_branch: int,
    flat_action: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Backward (peak) hindsight: one candidate row per book whose trade closed short of its peak.

    A book wants a row when ``trade_closed``, ``direction != 0`` and
    ``peak_pnl = |peak - entry_mid| * lots > threshold * (|raw_reward| / reward_scale)``.
    Its reward is ``peak_pnl * reward_scale``. With ``anchor == 0`` the row is this step's
    ``(obs, next_obs, action)``; with ``anchor == 1`` it is ``replay_next_obs[peak_row]`` as obs and
    next_obs with the direction branch set to ``flat_action`` (a book whose ``peak_row`` is outside
    ``[0, C)`` falls back to the close anchor). Every closed book's tracker is reset.

    :param ring_len: ``[B] int64`` tracker state, reset in place for closed books.
    :param entry_mid: ``[B] float32`` tracker state, reset in place.
    :param direction: ``[B] int64`` tracker state, reset in place.
    :param peak: ``[B] float32`` tracker state, reset in place.
    :param peak_row: ``[B] int64`` tracker state, reset in place.
    :param trade_closed: ``[B] bool`` a round trip or a flip ended this step.
    :param raw_reward: ``[B] float32`` realized trade PnL times ``reward_scale``.
    :param lots: ``[B] float32`` size of the closed trade in lots.
    :param obs: ``[B, D] float32`` this step's observation.
    :param next_obs: ``[B, D] float32`` this step's next observation.
    :param action: ``[B, NB] int64`` this step's action.
    :param replay_next_obs: ``[C, D] float32`` the replay buffer's ``next_obs``.
    :param reward_scale: multiplier from currency to reward, > 0.
    :param threshold: a row fires when the peak PnL exceeds ``threshold`` times the realized PnL.
    :param anchor: 0 ``close`` or 1 ``peak``.
    :param direction_branch: index of the direction branch in ``action``.
    :param flat_action: direction value meaning "flat" (the exit), used by the peak anchor.
    :return: ``(out_obs [B, D], out_next_obs [B, D], out_action [B, NB], out_reward [B], wants [B] bool,
        count [1] int64)``; rows not wanted are zero here (their obs rows are
        unspecified on CUDA).
    """
    check_hindsight_inject(
        ring_len, entry_mid, direction, peak, peak_row, trade_closed, raw_reward, lots, obs, next_obs,
        action, replay_next_obs, reward_scale, threshold, anchor, direction_branch, flat_action,
    )
    n_rows = replay_next_obs.shape[0]
    peak_pnl = (peak - entry_mid).abs() * lots
    actual = raw_reward.abs() / reward_scale
    wants = trade_closed & (direction != 0) & (peak_pnl > threshold * actual)
    reward = torch.where(wants, peak_pnl * reward_scale, torch.zeros_like(peak_pnl))

    if anchor == 1:
        use_peak = wants & (peak_row >= 0) & (peak_row < n_rows)
        peak_obs = replay_next_obs[peak_row.clamp(0, max(n_rows - 1, 0))]
        src_obs = torch.where(use_peak.unsqueeze(1), peak_obs, obs)
        src_next_obs = torch.where(use_peak.unsqueeze(1), peak_obs, next_obs)
        exit_action = action.clone()
        exit_action[:, direction_branch] = flat_action
        src_action = torch.where(use_peak.unsqueeze(1), exit_action, action)
    else:
        src_obs, src_next_obs, src_action = obs, next_obs, action
    keep = wants.unsqueeze(1)
    out_obs = torch.where(keep, src_obs, torch.zeros_like(src_obs))
    out_next_obs = torch.where(keep, src_next_obs, torch.zeros_like(src_next_obs))
    out_action = torch.where(keep, src_action, torch.zeros_like(src_action))

    closed = trade_closed
    ring_len.masked_fill_(closed, 0)
    entry_mid.masked_fill_(closed, 0.0)
    direction.masked_fill_(closed, 0)
    peak.masked_fill_(closed, 0.0)
    peak_row.masked_fill_(closed, -1)
    count = wants.sum().reshape(1)
    return out_obs, out_next_obs, out_action, reward, wants.clone(), count


def check_hindsight_forward(
    slot_valid: Tensor,
    slot_entry: Tensor,
    slot_close_step: Tensor,
    slot_direction: Tensor,
    slot_actual: Tensor,
    slot_lots: Tensor,
    slot_book: Tensor,
    slot_obs: Tensor,
    slot_action: Tensor,
    ring_head: Tensor,
    step: Tensor,
    mid: Tensor,
    book_reset: Tensor,
    trade_closed: Tensor,
    entry_mid: Tensor,
    closed_direction: Tensor,
    actual: Tensor,
    lots: Tensor,
    obs: Tensor,
    action: Tensor,
    lookahead: int,
    threshold: float,
    reward_scale: float,
    direction_branch: int,
) -> None:
    """Validate the arguments of :func:`hindsight_forward`; raise ``ValueError`` naming the bad one.

    :param slot_valid: see :func:`hindsight_forward`; the other parameters likewise.
    """
    check_tensor("slot_obs", slot_obs, torch.float32, (None, None))
    n_slots, obs_dim = slot_obs.shape
    if n_slots < 1:
        raise ValueError(f"slot_obs.shape[0]={n_slots} must be >= 1")
    check_tensor("slot_action", slot_action, torch.int64, (n_slots, None))
    n_branches = slot_action.shape[1]
    for name, tensor, dtype in (
        ("slot_valid", slot_valid, torch.bool),
        ("slot_entry", slot_entry, torch.float32),
        ("slot_close_step", slot_close_step, torch.int64),
        ("slot_direction", slot_direction, torch.int64),
        ("slot_actual", slot_actual, torch.float32),
        ("slot_lots", slot_lots, torch.float32),
        ("slot_book", slot_book, torch.int64),
    ):
        check_tensor(name, tensor, dtype, (n_slots,))
    check_tensor("ring_head", ring_head, torch.int64, (1,))
    check_tensor("step", step, torch.int64, (1,))
    check_tensor("obs", obs, torch.float32, (None, obs_dim))
    n_books = obs.shape[0]
    check_tensor("action", action, torch.int64, (n_books, n_branches))
    for name, tensor, dtype in (
        ("mid", mid, torch.float32),
        ("book_reset", book_reset, torch.bool),
        ("trade_closed", trade_closed, torch.bool),
        ("entry_mid", entry_mid, torch.float32),
        ("closed_direction", closed_direction, torch.int64),
        ("actual", actual, torch.float32),
        ("lots", lots, torch.float32),
    ):
        check_tensor(name, tensor, dtype, (n_books,))
    check_same_device(
        slot_valid=slot_valid, slot_entry=slot_entry, slot_close_step=slot_close_step,
        slot_direction=slot_direction, slot_actual=slot_actual, slot_lots=slot_lots, slot_book=slot_book,
        slot_obs=slot_obs, slot_action=slot_action, ring_head=ring_head, step=step, mid=mid,
        book_reset=book_reset, trade_closed=trade_closed, entry_mid=entry_mid,
        closed_direction=closed_direction, actual=actual, lots=lots, obs=obs, action=action,
    )
    if lookahead < 1:
        raise ValueError(f"lookahead={lookahead} must be >= 1")
    check_scalar("threshold", threshold)
    check_scalar("reward_scale", reward_scale, low=0.0, low_open=True)
    if not 0 <= direction_branch < n_branches:
        raise ValueError(f"direction_branch={direction_branch} must be in [0, {n_branches})")


def hindsight_forward(
    slot_valid: Tensor,
    slot_entry: Tensor,
    slot_close_step: Tensor,
    slot_direction: Tensor,
    slot_actual: Tensor,
    slot_lots: Tensor,
    slot_book: Tensor,
    slot_obs: Tensor,
    slot_action: Tensor,
    ring_head: Tensor,
    step: Tensor,
    mid: Tensor,
    book_reset: Tensor,
    trade_closed: Tensor,
    entry_mid: Tensor,
    closed_direction: Tensor,
    actual: Tensor,
    lots: Tensor,
    obs: Tensor,
    action: Tensor,
    lookahead: int,
    threshold: float,
    reward_scale: float,
    direction_branch: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Forward hindsight over a ring of ``S`` closed trades: "holding on would have paid".

    Phase 1, every valid slot (``age = step - close_step``): its book reset (or a book index outside
    ``[0, B)``) → cleared; ``age >= 2 * lookahead`` → cleared (expired); ``age >= lookahead`` and
    ``fwd = direction * (mid[book] - entry) * lots > threshold * actual`` → a row and cleared.
    The row's obs and next_obs are the slot's obs, its action the slot's action with the direction
    branch set to 2 (long) or 0 (short), its reward ``fwd * reward_scale``; row ``i`` is slot ``i``.
    Phase 2: books with ``trade_closed`` and ``closed_direction != 0`` enter the ring at
    ``(ring_head + prefix) % S`` (exclusive prefix sum over books; only the last ``S`` if more) with
    ``close_step = step``; ``ring_head`` becomes ``(ring_head + entrants) % S``.

    :param slot_valid: ``[S] bool`` slot holds a pending trade (in place).
    :param slot_entry: ``[S] float32`` entry mid of the slot's trade (in place).
    :param slot_close_step: ``[S] int64`` step at which the trade closed (in place).
    :param slot_direction: ``[S] int64`` +1 long, -1 short (in place).
    :param slot_actual: ``[S] float32`` realized PnL of the trade in currency (in place).
    :param slot_lots: ``[S] float32`` trade size in lots (in place).
    :param slot_book: ``[S] int64`` book index (in place).
    :param slot_obs: ``[S, D] float32`` observation at the close (in place).
    :param slot_action: ``[S, NB] int64`` action at the close (in place).
    :param ring_head: ``[1] int64`` next ring position (in place).
    :param step: ``[1] int64`` the current step.
    :param mid: ``[B] float32`` current mid per book.
    :param book_reset: ``[B] bool`` the book started a new episode.
    :param trade_closed: ``[B] bool`` a trade closed this step.
    :param entry_mid: ``[B] float32`` entry mid of the closed trade.
    :param closed_direction: ``[B] int64`` direction of the closed trade.
    :param actual: ``[B] float32`` realized PnL of the closed trade, in currency.
    :param lots: ``[B] float32`` size of the closed trade in lots.
    :param obs: ``[B, D] float32`` this step's observation.
    :param action: ``[B, NB] int64`` this step's action.
    :param lookahead: steps to wait before judging a slot, >= 1.
    :param threshold: a row fires when the forward PnL exceeds ``threshold`` times the actual.
    :param reward_scale: multiplier from currency to reward.
    :param direction_branch: index of the direction branch in ``action``.
    :return: ``(out_obs [S, D], out_next_obs [S, D], out_action [S, NB], out_reward [S], wants [S] bool,
        count [1] int64)``; rows not wanted are zero.
    """
    check_hindsight_forward(
        slot_valid, slot_entry, slot_close_step, slot_direction, slot_actual, slot_lots, slot_book,
        slot_obs, slot_action, ring_head, step, mid, book_reset, trade_closed, entry_mid, closed_direction,
        actual, lots, obs, action, lookahead, threshold, reward_scale, direction_branch,
    )
    rows = _judge_slots(slot_valid, slot_entry, slot_close_step, slot_direction, slot_actual, slot_lots,
                        slot_book, slot_obs, slot_action, step, mid, book_reset, lookahead, threshold,
                        reward_scale, direction_branch)
    _enter_ring(
        (slot_valid, slot_entry, slot_close_step, slot_direction, slot_actual, slot_lots, slot_book, slot_obs,
         slot_action),
        ring_head, step, trade_closed, entry_mid, closed_direction, actual, lots, obs, action,
    )
    return rows


def _judge_slots(
    slot_valid: Tensor, slot_entry: Tensor, slot_close_step: Tensor, slot_direction: Tensor,
    slot_actual: Tensor, slot_lots: Tensor, slot_book: Tensor, slot_obs: Tensor, slot_action: Tensor,
    step: Tensor, mid: Tensor, book_reset: Tensor, lookahead: int, threshold: float, reward_scale: float,
    direction_branch: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Phase 1 of :func:`hindsight_forward`: judge every pending slot, clear the judged ones.

    :return: ``(out_obs, out_next_obs, out_action, out_reward, wants, count)`` as
        :func:`hindsight_forward` returns them.
    """
    n_books = mid.shape[0]
    book_ok = (slot_book >= 0) & (slot_book < n_books)
    book = slot_book.clamp(0, max(n_books - 1, 0))
    if n_books > 0:
        reset = book_reset[book] | ~book_ok
        book_mid = mid[book]
    else:
        reset = torch.ones_like(slot_valid)
        book_mid = torch.zeros_like(slot_entry)
    age = step - slot_close_step
    fwd = slot_direction.to(torch.float32) * (book_mid - slot_entry) * slot_lots
    mature = (age >= lookahead) & (age < 2 * lookahead)
    wants = slot_valid & ~reset & mature & (fwd > threshold * slot_actual)
    clear = slot_valid & (reset | (age >= 2 * lookahead) | wants)

    keep = wants.unsqueeze(1)
    out_obs = torch.where(keep, slot_obs, torch.zeros_like(slot_obs))
    out_next_obs = out_obs.clone()
    stay = torch.where(slot_direction > 0, 2, 0)
    stay_action = slot_action.clone()
    stay_action[:, direction_branch] = stay
    out_action = torch.where(keep, stay_action, torch.zeros_like(stay_action))
    out_reward = torch.where(wants, fwd * reward_scale, torch.zeros_like(fwd))
    count = wants.sum().reshape(1)
    slot_valid.masked_fill_(clear, False)
    return out_obs, out_next_obs, out_action, out_reward, wants.clone(), count


def _enter_ring(
    slots: tuple[Tensor, ...], ring_head: Tensor, step: Tensor, trade_closed: Tensor, entry_mid: Tensor,
    closed_direction: Tensor, actual: Tensor, lots: Tensor, obs: Tensor, action: Tensor,
) -> None:
    """Phase 2 of :func:`hindsight_forward`: closed trades enter the ring at prefix-sum positions (the last
    ``S`` when more), in place.

    :param slots: the nine slot tensors in :func:`hindsight_forward`'s order (valid ... action).
    """
    slot_valid = slots[0]
    n_slots = slot_valid.shape[0]
    n_books = obs.shape[0]
    enters = trade_closed & (closed_direction != 0)
    enters_long = enters.long()
    prefix = torch.cumsum(enters_long, 0) - enters_long
    total = enters_long.sum()
    kept = enters & (prefix >= total - n_slots)
    position = torch.where(kept, (ring_head + prefix) % n_slots, n_slots)  # n_slots: the dummy row
    values = (enters, entry_mid, step.expand(n_books), closed_direction, actual, lots,
              torch.arange(n_books, device=obs.device), obs, action)
    for state, value in zip(slots, values, strict=True):
        padded = torch.cat([state, state[:1]])
        padded.index_copy_(0, position, value)
        state.copy_(padded[:n_slots])
    ring_head.copy_((ring_head + total) % n_slots)


def check_magnitude_relabel(
    trade_closed: Tensor,
    obs: Tensor,
    next_obs: Tensor,
    action: Tensor,
    reward: Tensor,
    magnitudes: Tensor,
    magnitude_branch: int,
) -> None:
    """Validate the arguments of :func:`magnitude_relabel`; raise ``ValueError`` naming the bad one.

    :param trade_closed: see :func:`magnitude_relabel`; the other parameters likewise.
    """
    check_tensor("obs", obs, torch.float32, (None, None))
    n_books, obs_dim = obs.shape
    check_tensor("next_obs", next_obs, torch.float32, (n_books, obs_dim))
    check_tensor("action", action, torch.int64, (n_books, None))
    check_tensor("trade_closed", trade_closed, torch.bool, (n_books,))
    check_tensor("reward", reward, torch.float32, (n_books,))
    check_tensor("magnitudes", magnitudes, torch.float32, (None,))
    if magnitudes.shape[0] < 2:
        raise ValueError(f"magnitudes.shape={tuple(magnitudes.shape)} must hold >= 2 magnitudes")
    check_same_device(
        trade_closed=trade_closed, obs=obs, next_obs=next_obs, action=action, reward=reward,
        magnitudes=magnitudes,
    )
    if not 0 <= magnitude_branch < action.shape[1]:
        raise ValueError(f"magnitude_branch={magnitude_branch} must be in [0, {action.shape[1]})")


def magnitude_relabel(
    trade_closed: Tensor,
    obs: Tensor,
    next_obs: Tensor,
    action: Tensor,
    reward: Tensor,
    magnitudes: Tensor,
    magnitude_branch: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Relabel every closed trade with each other magnitude: ``M - 1`` candidate rows per book.

    For a closed book with magnitude index ``a`` (a book whose index is outside ``[0, M)`` wants no
    rows), row ``j * B + b`` is the ``j``-th other magnitude ``k`` (ascending, skipping ``a``): the
    action with the magnitude branch set to ``k``, reward ``R_k = reward * magnitudes[k] / magnitudes[a]``
    and priority ``|R_k - reward|``.

    :param trade_closed: ``[B] bool`` a trade closed this step.
    :param obs: ``[B, D] float32`` this step's observation.
    :param next_obs: ``[B, D] float32`` this step's next observation.
    :param action: ``[B, NB] int64`` this step's action.
    :param reward: ``[B] float32`` this step's reward.
    :param magnitudes: ``[M] float32`` the magnitude of each index of the magnitude branch.
    :param magnitude_branch: index of the magnitude branch in ``action``.
    :return: ``(out_obs [(M-1)B, D], out_next_obs [(M-1)B, D], out_action [(M-1)B, NB],
        out_reward [(M-1)B], out_priority [(M-1)B], wants [(M-1)B] bool, count [1] int64)``;
        rows not wanted are zero here (their obs rows are unspecified on CUDA).
    """
    check_magnitude_relabel(trade_closed, obs, next_obs, action, reward, magnitudes, magnitude_branch)
    n_mags = magnitudes.shape[0]
    current = action[:, magnitude_branch]
    valid = trade_closed & (current >= 0) & (current < n_mags)
    mag_current = magnitudes[current.clamp(0, n_mags - 1)]
    other = torch.arange(n_mags - 1, device=obs.device).unsqueeze(1)  # j, [M-1, 1]
    target = other + (other >= current.unsqueeze(0)).long()  # k = j, or j + 1 past a, [M-1, B]

    wants = valid.unsqueeze(0).expand(n_mags - 1, -1)
    relabeled = reward * magnitudes[target] / mag_current
    out_reward = torch.where(wants, relabeled, torch.zeros_like(relabeled))
    out_priority = torch.where(wants, (relabeled - reward).abs(), torch.zeros_like(relabeled))
    keep = wants.unsqueeze(2)
    out_obs = torch.where(keep, obs.unsqueeze(0), torch.zeros_like(obs).unsqueeze(0))
    out_next_obs = torch.where(keep, next_obs.unsqueeze(0), torch.zeros_like(next_obs).unsqueeze(0))
    new_action = action.unsqueeze(0).repeat(n_mags - 1, 1, 1)
    new_action[:, :, magnitude_branch] = target
    out_action = torch.where(keep, new_action, torch.zeros_like(new_action))
    count = wants.sum().reshape(1)
    rows = (n_mags - 1) * obs.shape[0]
    return (
        out_obs.reshape(rows, -1),
        out_next_obs.reshape(rows, -1),
        out_action.reshape(rows, -1),
        out_reward.reshape(rows),
        out_priority.reshape(rows),
        wants.reshape(rows).clone(),
        count,
    )
