"""Hand-worked cases for the prioritized-replay ops (reference path, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

import cuda_ext
from cuda_ext.ops_per import new_tree
from cuda_ext.reference import per as per_reference
from tests.cuda_ext.per_state import full_rebuild, make_rows, make_state, push


def test_new_tree_pads_to_power_of_two() -> None:
    assert new_tree(5).shape == (16,)
    assert new_tree(8).shape == (16,)
    assert new_tree(1).shape == (2,)
    with pytest.raises(ValueError, match="capacity=0"):
        new_tree(0)


def test_push_slots_from_exclusive_prefix_sum() -> None:
    state = make_state(8)
    rows = make_rows(4, wants=torch.tensor([True, False, True, True]))
    slots = push(state, rows)
    assert slots.tolist() == [0, -1, 1, 2]
    assert state["head_size"].tolist() == [3, 3]
    torch.testing.assert_close(state["obs"][:3], rows["new_obs"][[0, 2, 3]])
    torch.testing.assert_close(state["next_obs"][:3], rows["new_next_obs"][[0, 2, 3]])
    assert state["action"][:3].tolist() == rows["new_action"][[0, 2, 3]].tolist()
    assert state["reward"][:3].tolist() == [0.0, 1.0, 1.5]
    assert state["done"][:3].tolist() == [0.0, 0.0, 1.0]
    assert state["kind"][:3].tolist() == [0, 2, 3]
    assert state["obs"][3:].abs().sum() == 0  # the unwanted row wrote nothing
    # New rows get the running max (1.0) ** alpha = 1 on their leaves; the others stay 0.
    assert state["tree"][8:].tolist() == [1.0, 1.0, 1.0, 0, 0, 0, 0, 0]


def test_push_continues_at_write_head_and_wraps_over_oldest_rows() -> None:
    state = make_state(4)
    push(state, make_rows(3))
    state["tree"][4:7] = torch.tensor([5.0, 6.0, 7.0])  # old rows' priorities
    rows = make_rows(2)
    rows["new_obs"] += 50
    slots = push(state, rows, alpha=1.0)
    assert slots.tolist() == [3, 0]
    assert state["head_size"].tolist() == [1, 4]
    torch.testing.assert_close(state["obs"][3], rows["new_obs"][0])
    torch.testing.assert_close(state["obs"][0], rows["new_obs"][1])  # overwrote the oldest row
    assert state["tree"][4:8].tolist() == [1.0, 6.0, 7.0, 1.0]  # and its priority


def test_burst_larger_than_capacity_keeps_the_last_rows() -> None:
    state = make_state(4)
    state["head_size"][:] = torch.tensor([1, 2])
    rows = make_rows(7, wants=torch.tensor([True, True, False, True, True, True, True]))
    slots = push(state, rows)
    # prefix over wants = [0, 1, -, 2, 3, 4, 5], total 6: rows with prefix >= 2 are kept,
    # slot = (1 + prefix) % 4.
    assert slots.tolist() == [-1, -1, -1, 3, 0, 1, 2]
    assert state["head_size"].tolist() == [(1 + 6) % 4, 4]
    torch.testing.assert_close(state["obs"][[3, 0, 1, 2]], rows["new_obs"][3:])


def test_priority_uses_running_max_multiplier_and_alpha() -> None:
    state = make_state(4)
    state["max_priority"][0] = 2.0
    rows = make_rows(3)
    rows["new_priority"] = torch.tensor([0.0, 0.0, 3.0])
    rows["max_multiplier"] = torch.tensor([1.0, 2.5, 0.0])
    push(state, rows, alpha=0.5)
    # p = [0 + 1 * 2, 0 + 2.5 * 2, 3 + 0] = [2, 5, 3]; leaf = sqrt(p)
    expected = [math.sqrt(2.0), math.sqrt(5.0), math.sqrt(3.0), 0.0]
    torch.testing.assert_close(state["tree"][4:], torch.tensor(expected, dtype=torch.float64))
    assert state["max_priority"].item() == 2.0  # per_push never raises it


def test_push_of_nothing_changes_nothing() -> None:
    state = make_state(4)
    slots = push(state, make_rows(3, wants=torch.zeros(3, dtype=torch.bool)))
    assert slots.tolist() == [-1, -1, -1]
    assert state["head_size"].tolist() == [0, 0]
    assert state["tree"].abs().sum() == 0


def test_rebuild_sums_children_hand_worked() -> None:
    tree = new_tree(4)
    tree[4:] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    cuda_ext.per_tree_rebuild(tree, torch.arange(4))
    assert tree[1:].tolist() == [10.0, 3.0, 7.0, 1.0, 2.0, 3.0, 4.0]


def test_rebuild_touches_only_ancestors_and_ignores_negative_entries() -> None:
    tree = new_tree(4)
    tree[4:] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    cuda_ext.per_tree_rebuild(tree, torch.arange(4))
    tree[6] = 30.0  # leaf 2 changes
    tree[4] = 99.0  # leaf 0 changes too, but is not listed: node 2 must stay stale
    cuda_ext.per_tree_rebuild(tree, torch.tensor([-1, 2, 2]))
    assert tree[1:4].tolist() == [3.0 + 34.0, 3.0, 34.0]


def test_rebuild_equals_from_scratch_sum_on_random_leaves() -> None:
    generator = torch.Generator().manual_seed(0)
    capacity = 1000
    tree = new_tree(capacity)
    n_leaves = tree.shape[0] // 2
    tree[n_leaves : n_leaves + capacity] = torch.rand(capacity, generator=generator, dtype=torch.float64)
    cuda_ext.per_tree_rebuild(tree, torch.arange(capacity))
    level = tree[n_leaves:].clone()
    start = n_leaves
    while start > 1:
        level = level[0::2] + level[1::2]
        start //= 2
        assert torch.equal(tree[start : 2 * start], level)  # bit-identical, level by level


def test_sample_stratified_descent_and_weights_by_hand() -> None:
    tree = new_tree(4)
    tree[4:] = torch.tensor([1.0, 0.0, 3.0, 4.0])
    cuda_ext.per_tree_rebuild(tree, torch.arange(4))
    head_size = torch.tensor([0, 4])
    # targets: (0 + 0.5) / 2 * 8 = 2 -> right (2 - 1 = 1), 1 < 3 -> leaf 2;
    #          (1 + 0.25) / 2 * 8 = 5 -> right (4), 4 >= 3 -> leaf 3.
    uniforms = torch.tensor([0.5, 0.25], dtype=torch.float64)
    indices, weights = cuda_ext.per_sample(tree, head_size, uniforms, beta=1.0)
    assert indices.tolist() == [2, 3]
    # w = (4 * P) ** -1 = [1 / 1.5, 1 / 2], divided by the max -> [1, 0.75]
    torch.testing.assert_close(weights, torch.tensor([1.0, 0.75]))
    assert weights.dtype == torch.float32
    _, weights_half = cuda_ext.per_sample(tree, head_size, uniforms, beta=0.5)
    torch.testing.assert_close(weights_half, torch.tensor([1.0, math.sqrt(0.75)]))


def test_sample_never_enters_a_zero_child() -> None:
    tree = new_tree(4)
    tree[4:] = torch.tensor([2.0, 0.0, 0.0, 2.0])
    cuda_ext.per_tree_rebuild(tree, torch.arange(4))
    head_size = torch.tensor([0, 4])
    # target 2 = the left sum exactly: go right, then leaf 2 is zero -> leaf 3.
    indices, _ = cuda_ext.per_sample(tree, head_size, torch.tensor([0.5], dtype=torch.float64), 0.4)
    assert indices.tolist() == [3]
    # A target at the very end of rows with trailing zeros clamps to the last non-zero leaf.
    tree = new_tree(4)
    tree[4:] = torch.tensor([1.0, 2.0, 0.0, 0.0])
    cuda_ext.per_tree_rebuild(tree, torch.arange(4))
    indices, _ = cuda_ext.per_sample(tree, head_size, torch.tensor([1.0], dtype=torch.float64), 0.4)
    assert indices.tolist() == [1]


def test_sample_capacity_one() -> None:
    tree = new_tree(1)
    tree[1] = 0.7
    uniforms = torch.tensor([0.3, 0.9], dtype=torch.float64)
    indices, weights = cuda_ext.per_sample(tree, torch.tensor([0, 1]), uniforms, 0.4)
    assert indices.tolist() == [0, 0]
    assert weights.tolist() == [1.0, 1.0]


def test_update_duplicates_last_wins_and_max_priority_rises() -> None:
    tree = new_tree(4)
    tree[4:] = 1.0
    max_priority = torch.ones(1)
    cuda_ext.per_update(tree, max_priority, torch.tensor([1, 2, 1]), torch.tensor([1.0, 2.0, 3.0]), 1.0, 0.0)
    assert tree[4:].tolist() == [1.0, 3.0, 2.0, 1.0]
    assert max_priority.tolist() == [3.0]
    cuda_ext.per_update(tree, max_priority, torch.tensor([3, 1]), torch.tensor([7.0, 0.5]), 1.0, 0.0)
    assert tree[4:].tolist() == [1.0, 0.5, 2.0, 7.0]
    assert max_priority.tolist() == [7.0]


def test_update_eps_and_alpha_and_max_never_falls() -> None:
    tree = new_tree(2)
    max_priority = torch.tensor([4.0])
    cuda_ext.per_update(tree, max_priority, torch.tensor([0]), torch.tensor([0.5]), 0.5, 0.25)
    assert tree[2].item() == pytest.approx(math.sqrt(0.75))
    assert max_priority.tolist() == [4.0]


def test_update_then_push_uses_the_raised_max() -> None:
    state = make_state(4)
    push(state, make_rows(2), alpha=1.0)
    cuda_ext.per_update(state["tree"], state["max_priority"], torch.tensor([0]), torch.tensor([5.0]),
                        alpha=1.0, eps=0.5)
    push(state, make_rows(1), alpha=1.0)
    assert state["tree"][4:].tolist() == [5.5, 1.0, 5.5, 0.0]


def test_update_rejects_out_of_range_indices() -> None:
    tree = new_tree(4)
    with pytest.raises(ValueError, match=r"indices range=\[0, 4\]"):
        cuda_ext.per_update(tree, torch.ones(1), torch.tensor([0, 4]), torch.ones(2), 1.0, 0.0)


def _dirty_roots(tree: torch.Tensor) -> list[int]:
    """Subtree-root heap nodes that hold the dirty marker."""
    return torch.nonzero(tree.view(torch.int64) == per_reference.DIRTY_MARKER).flatten().tolist()


def test_push_and_update_mark_the_dirty_subtree_roots_of_a_marked_tree() -> None:
    capacity = 3 * per_reference.SUBTREE_LEAVES + 5  # P = 8192: 4 subtrees, roots at heap nodes 4..7
    state = make_state(capacity)
    state["head_size"][0] = per_reference.SUBTREE_LEAVES - 2  # the 4 rows straddle subtrees 0 and 1
    push(state, make_rows(4), alpha=1.0)
    assert _dirty_roots(state["tree"]) == [4, 5]
    cuda_ext.per_tree_refresh(state["tree"])
    assert _dirty_roots(state["tree"]) == []
    assert torch.equal(state["tree"], full_rebuild(state["tree"].clone()))
    assert state["tree"][1].item() == 4.0  # four rows of priority 1
    cuda_ext.per_update(state["tree"], state["max_priority"],
                        torch.tensor([3 * per_reference.SUBTREE_LEAVES + 1]),
                        torch.tensor([2.0]), alpha=1.0, eps=0.0)
    assert _dirty_roots(state["tree"]) == [7]
    cuda_ext.per_tree_refresh(state["tree"])
    assert _dirty_roots(state["tree"]) == [] and state["tree"][1].item() == 6.0


def test_refresh_equals_rebuild_of_the_changed_leaves() -> None:
    generator = torch.Generator().manual_seed(3)
    for capacity in [1, 7, 2048, 4096, 70_000]:  # unmarked (whole-tree refresh) and marked trees
        state = make_state(capacity)
        listed = make_state(capacity)
        for _ in range(3):
            rows = make_rows(50, generator=generator)
            rows["new_priority"] = torch.rand(50, generator=generator)
            slots = push(state, dict(rows), alpha=0.6)
            assert torch.equal(push(listed, dict(rows), alpha=0.6), slots)
            cuda_ext.per_tree_refresh(state["tree"])
            cuda_ext.per_tree_rebuild(listed["tree"], slots)
            assert torch.equal(state["tree"], listed["tree"]), capacity
            indices = torch.randint(0, min(capacity, 150), (20,), generator=generator)
            td_abs = torch.rand(20, generator=generator)
            for target in (state, listed):
                cuda_ext.per_update(target["tree"], target["max_priority"], indices, td_abs, 0.6, 1e-6)
            cuda_ext.per_tree_refresh(state["tree"])
            cuda_ext.per_tree_rebuild(listed["tree"], indices)
            assert torch.equal(state["tree"], listed["tree"]), capacity
            assert torch.equal(state["tree"], full_rebuild(state["tree"].clone())), capacity


def test_refresh_of_an_unmarked_tree_rebuilds_every_node() -> None:
    tree = new_tree(1000)  # P = 1024 < MARKED_MIN_LEAVES
    tree[1024:] = torch.rand(1024, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cuda_ext.per_tree_refresh(tree)
    assert torch.equal(tree, full_rebuild(tree.clone()))
    assert not per_reference.marks_subtrees(1024) and per_reference.marks_subtrees(4096)
    assert not per_reference.marks_subtrees(1 << 24)


def test_refresh_rejects_a_bad_tree() -> None:
    with pytest.raises(ValueError, match="tree length=6"):
        cuda_ext.per_tree_refresh(torch.zeros(6, dtype=torch.float64))


def test_bad_tree_is_rejected() -> None:
    with pytest.raises(ValueError, match="tree length=6"):
        cuda_ext.per_tree_rebuild(torch.zeros(6, dtype=torch.float64), torch.arange(2))
    with pytest.raises(ValueError, match="float64"):
        cuda_ext.per_tree_rebuild(torch.zeros(8), torch.arange(2))


@pytest.mark.slow
def test_sample_at_capacity_2_pow_24_returns_written_rows() -> None:
    capacity = 1 << 24
    tree = new_tree(capacity)
    written = torch.tensor([0, 5, 1 << 20, capacity - 3, capacity - 1])
    tree[capacity + written] = torch.tensor([1e-30, 2.0, 1e-12, 3.0, 5e-20], dtype=torch.float64)
    cuda_ext.per_tree_rebuild(tree, written)
    uniforms = torch.cat([torch.rand(4093, dtype=torch.float64), torch.tensor([0.0, 1 - 2**-53, 1.0])])
    indices, weights = cuda_ext.per_sample(tree, torch.tensor([0, capacity]), uniforms, 0.4)
    assert torch.isin(indices, written).all()
    assert (tree[capacity + indices] > 0).all()
    assert indices[-1] == capacity - 1  # the end clamps to the last non-zero leaf
    assert torch.isfinite(weights).all() and weights.max() == 1.0


def test_wrong_dtype_or_shape_raises_naming_the_argument() -> None:
    """The reference checks what the CUDA binding checks instead of casting silently."""
    tree = new_tree(4)
    tree[1] = 1.0
    head_size = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="uniforms.dtype=torch.float32 must be torch.float64"):
        cuda_ext.per_sample(tree, head_size, torch.rand(3), 0.4)
    with pytest.raises(ValueError, match=r"head_size.shape=\(3,\)"):
        cuda_ext.per_sample(tree, torch.tensor([0, 1, 2]), torch.rand(3, dtype=torch.float64), 0.4)
    with pytest.raises(ValueError, match="td_abs.dtype=torch.float64 must be torch.float32"):
        cuda_ext.per_update(tree, torch.ones(1), torch.tensor([0]), torch.ones(1, dtype=torch.float64),
                            alpha=0.6, eps=1e-3)
    with pytest.raises(ValueError, match="leaf_idx.dtype=torch.int32"):
        cuda_ext.per_tree_rebuild(tree, torch.tensor([0], dtype=torch.int32))
    state = make_state(4)
    rows = make_rows(2)
    rows["new_done"] = rows["new_done"].bool()
    with pytest.raises(ValueError, match="new_done.dtype=torch.bool must be torch.float32"):
        push(state, rows)
    assert state["head_size"].tolist() == [0, 0]  # nothing was written
