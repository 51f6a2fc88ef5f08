"""Stratified uniform sampling of a replay buffer's rows by one action branch's value (the gradient
vaccine's batches, :meth:`sb3_her_ext.replay.PrioritizedHindsightReplayBuffer.sample_stratified`).

Everything on the buffer's device, from the buffer's own generator, with no host sync.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["stratified_indices", "stratum_candidates"]


def stratum_candidates(buffer: Any, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate slots for :func:`stratified_indices`: ``M = STRATIFIED_OVERSAMPLE * batch_size`` of them.

    While at most ``M`` rows are written, the candidates are the slots ``0 .. M - 1`` (the written ones
    valid), i.e. every written row. Beyond that, ``M`` uniform draws among the written rows, sorted, with
    repeats marked invalid, so the valid candidates are distinct rows, a uniform random subset. The
    choice is made on the device (no host sync); the cost is O(``batch_size``), not O(capacity).

    :param buffer: the :class:`~sb3_her_ext.replay.PrioritizedHindsightReplayBuffer`.
    :param batch_size: rows the caller will draw.
    :return: ``(slots [M'] int64, valid [M'] bool)`` with ``M' = min(M, capacity)``.
    """
    c, dev = buffer.buffer_size, buffer.device
    n_draws = buffer.STRATIFIED_OVERSAMPLE * batch_size
    n_written = buffer.head_size[1]
    if c <= n_draws:
        slots = torch.arange(c, device=dev)
        return slots, slots < n_written
    first_slots = torch.arange(n_draws, device=dev)
    uniforms = torch.rand(n_draws, dtype=torch.float64, device=dev, generator=buffer.generator)
    draws = (uniforms * n_written).to(torch.int64)
    draws = draws.clamp(max=c - 1).sort().values
    distinct = torch.ones(n_draws, dtype=torch.bool, device=dev)
    distinct[1:] = draws[1:] != draws[:-1]
    few_written = n_written <= n_draws
    return torch.where(few_written, first_slots, draws), torch.where(
        few_written, first_slots < n_written, distinct
    )


def stratified_indices(buffer: Any, batch_size: int, branch: int, n_values: int) -> torch.Tensor:
    """The slots of a uniform draw of rows, an equal share for each value of one action branch.

    Value ``v`` gets ``batch_size // n_values`` rows (the first ``batch_size % n_values`` values one
    more), drawn without replacement among the candidate rows whose ``branch`` action is ``v``. A short
    stratum's missing rows are filled, without replacement, from the candidates not yet chosen; only
    when there are fewer than ``batch_size`` candidates are rows repeated (uniformly among the written).

    The candidates are every written row while at most ``M = STRATIFIED_OVERSAMPLE * batch_size`` rows
    are written; beyond that, the distinct rows of ``M`` uniform draws among the written rows, so the
    cost is O(``batch_size``), not O(capacity), and a stratum whose share of the buffer is below about
    ``1 / (STRATIFIED_OVERSAMPLE * n_values)`` may come up short (then filled) although the buffer
    holds enough of its rows.
    All on the device, no host sync: a random permutation, a stable sort by stratum, prefix sums.

    :param buffer: the buffer (its actions, ``head_size``, generator, ``STRATIFIED_OVERSAMPLE``).
    :param batch_size: rows to draw; >= 1 (checked by the caller, as ``branch`` and ``n_values``).
    :param branch: the action branch to stratify on.
    :param n_values: number of strata (values ``0 .. n_values - 1`` of ``branch``); >= 1.
    :return: ``[batch_size]`` int64 slots.
    """
    dev = buffer.device
    slots, valid = stratum_candidates(buffer, batch_size)
    n_candidates = slots.numel()
    # a candidate's group: its stratum, or n_values (other value: fill only), n_values + 1 (invalid)
    values = buffer.actions[slots, branch]
    in_range = (values >= 0) & (values < n_values)
    group = torch.where(valid, torch.where(in_range, values, n_values), n_values + 1)
    # random order within each group: shuffle, then a stable sort by group
    shuffled = torch.argsort(torch.rand(n_candidates, device=dev, generator=buffer.generator))
    order = shuffled[torch.sort(group[shuffled], stable=True).indices]
    sorted_group = group[order]
    counts = torch.zeros(n_values + 2, dtype=torch.int64, device=dev).scatter_add_(
        0, group, torch.ones_like(group)
    )
    starts = torch.cumsum(counts, 0) - counts
    # stratum v's quota is base (+1 for the first `extra` strata); groups n_values, n_values + 1 get none
    base, extra = divmod(batch_size, n_values)
    group_ids = torch.arange(n_values + 2, device=dev)
    quotas = torch.where(group_ids < n_values, base + (group_ids < extra).to(torch.int64), 0)
    # output slot k -> (its stratum, its rank in the stratum), the strata one after another
    k = torch.arange(batch_size, device=dev)
    long_part = extra * (base + 1)  # the slots of the strata with base + 1 rows
    tail = (k - long_part).clamp(min=0)
    slot_stratum = torch.where(k < long_part, k // (base + 1), extra + tail // max(base, 1))
    slot_rank = torch.where(k < long_part, k % (base + 1), tail % max(base, 1))
    ok = slot_rank < counts[slot_stratum]
    position = (starts[slot_stratum] + slot_rank).clamp(max=n_candidates - 1)
    chosen = slots[order[position]]
    # the spare candidates (valid, beyond their stratum's quota), in random order, fill the short strata
    rank_in_group = torch.arange(n_candidates, device=dev) - starts[sorted_group]
    spare = torch.empty(n_candidates, dtype=torch.bool, device=dev)
    spare[order] = (sorted_group <= n_values) & (rank_in_group >= quotas[sorted_group])
    fill_order = shuffled[torch.sort((~spare[shuffled]).to(torch.uint8), stable=True).indices]
    fill_rank = torch.cumsum((~ok).to(torch.int64), 0) - 1
    fill_ok = fill_rank < spare.sum()
    fill = slots[fill_order[fill_rank.clamp(min=0, max=n_candidates - 1)]]
    # last resort (fewer candidates than batch_size): uniform with replacement among written rows
    n_written = buffer.head_size[1].clamp(min=1)
    repeat = (torch.rand(batch_size, device=dev, generator=buffer.generator) * n_written).to(torch.int64)
    repeat = repeat.clamp(max=buffer.buffer_size - 1)
    indices = torch.where(ok, chosen, torch.where(fill_ok, fill, repeat))
    return indices
