"""Hypothesis properties of the prioritized-replay references: ring bookkeeping and sampling safety."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cuda_ext
from tests.cuda_ext.per_state import make_rows, make_state, push

pushes = st.lists(st.lists(st.booleans(), min_size=0, max_size=40), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 17), batches=pushes, alpha=st.sampled_from([0.0, 0.6, 1.0]))
def test_push_bookkeeping_matches_a_ring_model(
    capacity: int, batches: list[list[bool]], alpha: float
) -> None:
    state = make_state(capacity)
    n_leaves = state["tree"].shape[0] // 2
    head, size, counter = 0, 0, 0
    owner = [-1] * capacity  # model: which pushed row (global counter) each slot holds
    for wants_list in batches:
        n = len(wants_list)
        wants = torch.tensor(wants_list, dtype=torch.bool)
        rows = make_rows(n, wants=wants)
        rows["new_reward"] = torch.arange(counter, counter + n, dtype=torch.float32)
        slots = push(state, rows, alpha)
        written = slots[slots >= 0]
        total = int(wants.sum())
        assert written.numel() == min(total, capacity)  # capacity never exceeded
        assert written.unique().numel() == written.numel()  # no two rows of one push share a slot
        assert ((written >= 0) & (written < capacity)).all()
        assert (slots[~wants] == -1).all()
        for prefix, position in enumerate(torch.nonzero(wants).flatten().tolist()):
            if prefix >= total - capacity:  # only the last C wanted rows are written
                owner[(head + prefix) % capacity] = counter + position
        head = (head + total) % capacity
        size = min(size + total, capacity)
        counter += n
        assert state["head_size"].tolist() == [head, size]
    for slot, row in enumerate(owner):
        if row >= 0:
            assert state["reward"][slot].item() == float(row)
            assert state["tree"][n_leaves + slot].item() == 1.0  # 1.0 ** alpha
    assert sum(o >= 0 for o in owner) == size


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 40),
    n_rows=st.integers(1, 60),
    priorities=st.lists(st.floats(0.0, 10.0), min_size=60, max_size=60),
    uniforms=st.lists(
        st.sampled_from([0.0, 0.5, 1 - 2**-53]) | st.floats(0.0, 1.0, exclude_max=True),
        min_size=1,
        max_size=33,
    ),
    beta=st.floats(0.0, 1.0),
)
def test_sampled_rows_are_written_with_nonzero_priority(
    capacity: int, n_rows: int, priorities: list[float], uniforms: list[float], beta: float
) -> None:
    state = make_state(capacity)
    rows = make_rows(n_rows)
    rows["new_priority"] = torch.tensor(priorities[:n_rows])
    rows["max_multiplier"] = torch.zeros(n_rows)  # relabel-style rows: priority exactly as given (may be 0)
    slots = push(state, rows, alpha=0.6)
    cuda_ext.per_tree_rebuild(state["tree"], slots)
    n_leaves = state["tree"].shape[0] // 2
    if state["tree"][1] <= 0:
        return  # undefined on an empty tree; the caller guards
    indices, weights = cuda_ext.per_sample(
        state["tree"], state["head_size"], torch.tensor(uniforms, dtype=torch.float64), beta
    )
    assert ((indices >= 0) & (indices < state["head_size"][1])).all()  # written rows only
    assert (state["tree"][n_leaves + indices] > 0).all()  # never a zero-priority row
    assert torch.isin(indices, slots[slots >= 0]).all()
    assert (weights > 0).all() and weights.max() == 1.0


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(2, 30),
    indices=st.lists(st.integers(0, 29), min_size=1, max_size=50),
    eps=st.floats(1e-6, 0.1),
)
def test_update_keeps_tree_consistent_and_priorities_positive(
    capacity: int, indices: list[int], eps: float
) -> None:
    state = make_state(capacity)
    push(state, make_rows(capacity))
    cuda_ext.per_tree_rebuild(state["tree"], torch.arange(capacity))
    index = torch.tensor(indices) % capacity
    td_abs = torch.rand(index.numel(), generator=torch.Generator().manual_seed(len(indices)))
    cuda_ext.per_update(state["tree"], state["max_priority"], index, td_abs, 0.6, eps)
    cuda_ext.per_tree_rebuild(state["tree"], index)
    tree = state["tree"]
    n_leaves = tree.shape[0] // 2
    internal = torch.arange(1, n_leaves)
    assert torch.equal(tree[internal], tree[2 * internal] + tree[2 * internal + 1])
    assert (tree[n_leaves : n_leaves + capacity] > 0).all()
    assert state["max_priority"].item() == max(1.0, float((td_abs + torch.tensor(eps)).max()))
