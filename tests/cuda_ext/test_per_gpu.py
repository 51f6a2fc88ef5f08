"""CUDA kernels of the prioritized-replay ops against their references, CUDA-graph capture, large trees.

Every test feeds the same random inputs to the CUDA op and to the reference on CPU copies: integer outputs
(slots, indices, head/size) must be equal, float outputs equal to float32 rounding, tree nodes bit-identical
given the same leaves. The ``_check_*`` helpers take the device so their logic can be exercised on CPU.
Written to also pass under ``compute-sanitizer --tool memcheck`` / ``racecheck``.
"""

from __future__ import annotations

import pytest
import torch

import cuda_ext
from cuda_ext.ops_per import new_tree
from cuda_ext.reference import per as reference
from tests.cuda_ext.per_state import full_rebuild, make_rows, make_state, push

pytestmark = pytest.mark.gpu

SIZES = [1, 31, 4097, 65536]
FLOAT_TOL = {"rtol": 2e-7, "atol": 0.0}  # float32 rounding of float64-computed values
#: Trees compare with NaN == NaN: push and update leave the dirty-subtree marker (a NaN) in marked trees,
#: and its positions must agree (``_assert_markers_equal`` checks the bits).
TREE_TOL = {**FLOAT_TOL, "equal_nan": True}


def _to(state: dict, device: str) -> dict:
    return {name: value.to(device).clone() for name, value in state.items()}


def _reference_push(state: dict, rows: dict, alpha: float) -> torch.Tensor:
    return reference.per_push(
        *(state[k] for k in ["obs", "next_obs", "action", "reward", "done", "kind", "tree", "head_size"]),
        state["max_priority"],
        *(rows[k] for k in ["new_obs", "new_next_obs", "new_action", "new_reward", "new_done", "new_kind"]),
        rows["wants"],
        rows["new_priority"],
        rows["max_multiplier"],
        alpha,
    )


def _random_rows(n: int, generator: torch.Generator, obs_dim: int = 5, n_branches: int = 4) -> dict:
    rows = make_rows(n, obs_dim, n_branches, generator=generator)
    rows["wants"] = torch.rand(n, generator=generator) < 0.7
    rows["new_priority"] = torch.rand(n, generator=generator) * 3
    rows["max_multiplier"] = torch.where(torch.rand(n, generator=generator) < 0.5, 1.0, 0.0) * 1.7
    return rows


def _assert_state_equal(actual: dict, expected: dict) -> None:
    for name in ["obs", "next_obs", "action", "reward", "done", "kind", "head_size", "max_priority"]:
        assert torch.equal(actual[name].cpu(), expected[name]), name
    torch.testing.assert_close(actual["tree"].cpu(), expected["tree"], **TREE_TOL)
    _assert_markers_equal(actual["tree"], expected["tree"])


def _assert_markers_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """The dirty-subtree markers sit at the same nodes, with the same bits."""
    marker = reference.DIRTY_MARKER
    assert torch.equal(actual.cpu().view(torch.int64) == marker, expected.view(torch.int64) == marker)


def _check_push(device: str, capacity: int, batches: list[int], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    expected = make_state(capacity, obs_dim=5)
    expected["max_priority"][0] = 1.25
    expected["head_size"][:] = torch.tensor([max(capacity - 7, 0), capacity // 2])
    actual = _to(expected, device)
    for n in batches:
        rows = _random_rows(n, generator)
        expected_slots = _reference_push(expected, rows, 0.6)
        actual_slots = push(actual, _to(rows, device), alpha=0.6)
        assert torch.equal(actual_slots.cpu(), expected_slots)
        _assert_state_equal(actual, expected)


@pytest.mark.parametrize("n", SIZES)
def test_push_matches_reference(n: int) -> None:
    _check_push("cuda", capacity=5000, batches=[n, n, 3], seed=n)


def test_push_wraps_and_bursts_over_capacity() -> None:
    _check_push("cuda", capacity=1000, batches=[999, 4097, 1, 65536, 31], seed=7)
    _check_push("cuda", capacity=1, batches=[1, 31, 0, 2], seed=8)


def _consistent_tree(capacity: int, generator: torch.Generator, device: str) -> torch.Tensor:
    tree = new_tree(capacity)
    n_leaves = tree.shape[0] // 2
    leaves = torch.rand(capacity, dtype=torch.float64, generator=generator)
    leaves[torch.rand(capacity, generator=generator) < 0.2] = 0.0  # some zero-priority rows
    leaves[capacity // 2] = 0.75  # never an empty tree
    tree[n_leaves : n_leaves + capacity] = leaves
    return full_rebuild(tree.to(device))


def _check_rebuild(device: str, capacity: int, n_changed: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    tree = _consistent_tree(capacity, generator, "cpu")
    n_leaves = tree.shape[0] // 2
    changed = torch.randint(0, capacity, (n_changed,), generator=generator)
    tree[n_leaves + changed] = torch.rand(n_changed, dtype=torch.float64, generator=generator)
    leaf_idx = torch.cat([changed, torch.tensor([-1, -5])])  # negatives are ignored
    actual = tree.to(device)
    cuda_ext.per_tree_rebuild(actual, leaf_idx.to(device))
    expected = full_rebuild(tree.clone())
    assert torch.equal(actual.cpu(), expected)  # bit-identical, tree[0] still 0
    for _ in range(2):  # again (the CUDA kernel's arrival counter must have returned to 0)
        changed = torch.randperm(capacity, generator=generator)[:n_changed]  # distinct: no write races
        values = torch.rand(changed.numel(), dtype=torch.float64, generator=generator)
        expected[n_leaves + changed] = values
        actual[n_leaves + changed.to(device)] = values.to(device)
        cuda_ext.per_tree_rebuild(actual, changed.to(device))
        assert torch.equal(actual.cpu(), full_rebuild(expected))


@pytest.mark.parametrize("capacity", [1, 31, 4097, 65536, (1 << 20) + 3])
@pytest.mark.parametrize("n_changed", [1, 31, 4097])
def test_rebuild_bit_identical(capacity: int, n_changed: int) -> None:
    _check_rebuild("cuda", capacity, n_changed, seed=capacity + n_changed)


def _check_sample(device: str, capacity: int, batch: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    tree = _consistent_tree(capacity, generator, "cpu")
    head_size = torch.tensor([0, capacity])
    uniforms = torch.rand(batch, dtype=torch.float64, generator=generator)
    uniforms[0] = 0.0
    uniforms[-1] = 1 - 2**-53
    expected_indices, expected_weights = reference.per_sample(tree, head_size, uniforms, 0.4)
    indices, weights = cuda_ext.per_sample(tree.to(device), head_size.to(device), uniforms.to(device), 0.4)
    assert torch.equal(indices.cpu(), expected_indices)
    torch.testing.assert_close(weights.cpu(), expected_weights, **FLOAT_TOL)
    n_leaves = tree.shape[0] // 2
    assert (tree[n_leaves + indices.cpu()] > 0).all()


@pytest.mark.parametrize("batch", [*SIZES, 256, 257])  # one block up to 256; above: two launches
@pytest.mark.parametrize("capacity", [1, 31, 4097, 1 << 20])
def test_sample_matches_reference(capacity: int, batch: int) -> None:
    _check_sample("cuda", capacity, batch, seed=capacity * 7 + batch)


def _check_sample_huge(device: str) -> None:
    capacity = 1 << 24
    tree = new_tree(capacity, device)
    written = torch.tensor([0, 5, 1 << 20, capacity - 3, capacity - 1], device=device)
    priorities = torch.tensor([1e-30, 2.0, 1e-12, 3.0, 5e-20], dtype=torch.float64)
    tree[capacity + written] = priorities.to(device)
    cuda_ext.per_tree_rebuild(tree, written)
    uniforms = torch.rand(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    uniforms[-1] = 1 - 2**-53
    head_size = torch.tensor([0, capacity])
    indices, weights = cuda_ext.per_sample(tree, head_size.to(device), uniforms.to(device), 0.4)
    tree_cpu = tree.cpu()
    assert torch.equal(tree_cpu, full_rebuild(tree_cpu.clone()))
    expected_indices, expected_weights = reference.per_sample(tree_cpu, head_size, uniforms, 0.4)
    assert torch.equal(indices.cpu(), expected_indices)
    torch.testing.assert_close(weights.cpu(), expected_weights, **FLOAT_TOL)
    assert torch.isin(indices, written).all()
    assert indices[-1].item() == capacity - 1


def test_sample_capacity_2_pow_24() -> None:
    _check_sample_huge("cuda")


def _check_sample_philox(
    device: str, capacity: int, batch: int, seed: int, counter: int, offset: int = 0
) -> None:
    """Three calls in a row against the reference: the same indices, weights to float32 rounding, the same
    counter after each. ``offset`` > 0: a tree that is not 16-byte aligned (the one-block fallback kernel)."""
    generator = torch.Generator().manual_seed(capacity + batch)
    tree = _consistent_tree(capacity, generator, "cpu")
    head_size = torch.tensor([0, capacity])
    storage = torch.zeros(tree.numel() + offset, dtype=torch.float64, device=device)
    actual_tree = storage[offset:]
    actual_tree.copy_(tree)
    expected_state = torch.tensor([seed, counter])
    actual_state = expected_state.to(device)
    n_leaves = tree.shape[0] // 2
    for _ in range(3):
        expected_indices, expected_weights = reference.per_sample_philox(
            tree, head_size, expected_state, batch, 0.4
        )
        indices, weights = cuda_ext.per_sample_philox(
            actual_tree, head_size.to(device), actual_state, batch, 0.4
        )
        assert torch.equal(indices.cpu(), expected_indices)
        torch.testing.assert_close(weights.cpu(), expected_weights, **FLOAT_TOL)
        assert torch.equal(actual_state.cpu(), expected_state)
        assert (tree[n_leaves + indices.cpu()] > 0).all()


@pytest.mark.parametrize("batch", [*SIZES, 256, 257, 1024])  # one block up to 256; above: two launches
@pytest.mark.parametrize("capacity", [1, 31, 4097, 1 << 20])
def test_sample_philox_matches_reference(capacity: int, batch: int) -> None:
    _check_sample_philox("cuda", capacity, batch, seed=capacity * 7 + batch, counter=batch)


@pytest.mark.parametrize(("seed", "counter"), [(-1, 2**32 - 2), (-(2**63), -3), (2**63 - 1, 2**63 - 2)])
def test_sample_philox_seed_and_counter_words(seed: int, counter: int) -> None:
    """Negative and extreme int64 states (two's complement words; the counter crossing 2^32 and wrapping)."""
    _check_sample_philox("cuda", 4097, 300, seed, counter)
    _check_sample_philox("cuda", 4097, 3000, seed, counter)


def test_sample_philox_on_an_unaligned_tree() -> None:
    _check_sample_philox("cuda", 4097, 3000, seed=5, counter=0, offset=1)


def test_sample_philox_batch_0_advances_the_counter() -> None:
    tree = _consistent_tree(31, torch.Generator().manual_seed(0), "cuda")
    state = torch.tensor([3, 4], device="cuda")
    indices, weights = cuda_ext.per_sample_philox(tree, torch.tensor([0, 31], device="cuda"), state, 0, 0.4)
    assert indices.shape == (0,) and weights.shape == (0,)
    assert state.tolist() == [3, 5]


@pytest.mark.parametrize("batch", [256, 4096])
def test_sample_philox_graph_replays_draw_new_numbers(batch: int) -> None:
    """Captured once, replayed three times: each replay equals the next reference call (the kernel advances
    the counter on the device, so no replay repeats another's draws)."""
    generator = torch.Generator().manual_seed(batch)
    tree = _consistent_tree(1 << 16, generator, "cpu")
    head_size = torch.tensor([0, 1 << 16])
    static_tree, static_head = tree.cuda(), head_size.cuda()
    state = torch.tensor([99, 0], device="cuda")
    cuda_ext.per_sample_philox(static_tree, static_head, state, batch, 0.4)  # warm-up: counter 0 -> 1
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        indices, weights = cuda_ext.per_sample_philox(static_tree, static_head, state, batch, 0.4)
    expected_state = torch.tensor([99, 1])
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        expected = reference.per_sample_philox(tree, head_size, expected_state, batch, 0.4)
        assert torch.equal(indices.cpu(), expected[0])
        torch.testing.assert_close(weights.cpu(), expected[1], **FLOAT_TOL)
        assert torch.equal(state.cpu(), expected_state)
    assert expected_state.tolist() == [99, 4]


def _check_update(device: str, capacity: int, batch: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    tree = _consistent_tree(capacity, generator, "cpu")
    max_priority = torch.tensor([1.5])
    indices = torch.randint(0, max(1, min(capacity, batch // 2 + 1)), (batch,), generator=generator)  # dups
    td_abs = torch.rand(batch, generator=generator) * 2
    actual_tree, actual_max = tree.to(device), max_priority.to(device)
    cuda_ext.per_update(actual_tree, actual_max, indices.to(device), td_abs.to(device), 0.6, 1e-3)
    reference.per_update(tree, max_priority, indices, td_abs, 0.6, 1e-3)
    torch.testing.assert_close(actual_tree.cpu(), tree, **TREE_TOL)
    _assert_markers_equal(actual_tree, tree)
    assert torch.equal(actual_max.cpu(), max_priority)


@pytest.mark.parametrize("batch", [*SIZES, 256, 257, 1024, 1025])  # <= 256: one block; above: two passes
def test_update_matches_reference_with_duplicates(batch: int) -> None:
    _check_update("cuda", capacity=70000, batch=batch, seed=batch)


def _check_refresh(device: str, capacity: int, seed: int, offset: int = 0) -> None:
    """Pushes and updates on ``device`` and on the reference, each followed by ``per_tree_refresh``: the same
    slots and tree, every internal node ``left + right`` bit for bit, no marker left. ``offset`` > 0 puts the
    tree at an element offset in its storage (not 16-byte aligned: the kernel's whole-tree path)."""
    generator = torch.Generator().manual_seed(seed)
    expected = make_state(capacity, obs_dim=5)
    actual = _to(expected, device)
    storage = torch.zeros(expected["tree"].numel() + offset, dtype=torch.float64, device=device)
    actual["tree"] = storage[offset:]
    for n, batch in [(4097, 256), (31, 4096), (65536, 1000)]:
        rows = _random_rows(n, generator)
        expected_slots = _reference_push(expected, rows, 0.6)
        assert torch.equal(push(actual, _to(rows, device), alpha=0.6).cpu(), expected_slots)
        _assert_state_equal(actual, expected)  # leaves and markers
        for state in (expected, actual):
            cuda_ext.per_tree_refresh(state["tree"])
        tree = actual["tree"].cpu()
        assert torch.equal(tree, full_rebuild(tree.clone()))  # bit-identical: every node left + right
        torch.testing.assert_close(tree, expected["tree"], **FLOAT_TOL)  # no NaN marker left on either
        indices = torch.randint(0, capacity, (batch,), generator=generator)
        td_abs = torch.rand(batch, generator=generator)
        cuda_args = (indices.to(device), td_abs.to(device), 0.6, 1e-6)
        cuda_ext.per_update(actual["tree"], actual["max_priority"], *cuda_args)
        reference.per_update(expected["tree"], expected["max_priority"], indices, td_abs, 0.6, 1e-6)
        _assert_state_equal(actual, expected)
        for state in (expected, actual):
            cuda_ext.per_tree_refresh(state["tree"])
        tree = actual["tree"].cpu()
        assert torch.equal(tree, full_rebuild(tree.clone()))
        torch.testing.assert_close(tree, expected["tree"], **FLOAT_TOL)


@pytest.mark.parametrize("capacity", [1, 1000, 4096, 70_000, (1 << 20) + 3, (1 << 23) + 1])
def test_refresh_after_push_and_update_matches_reference(capacity: int) -> None:
    """Unmarked small trees, marked trees from P = 2^12 to 2^21, and an unmarked P = 2^24 tree."""
    _check_refresh("cuda", capacity, seed=capacity)


def test_refresh_of_an_unaligned_marked_tree_rebuilds_everything() -> None:
    _check_refresh("cuda", 70_000, seed=4, offset=1)


def test_backend_is_cuda() -> None:
    assert cuda_ext.backend() == "cuda"
    ops = ["per_push", "per_tree_rebuild", "per_tree_refresh", "per_sample", "per_sample_philox"]
    for op in [*ops, "per_update"]:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"cuda_ext::{op}", "CUDA"), op


def _training_cycle(
    state: dict, rows: dict, uniforms: torch.Tensor, td_abs: torch.Tensor, refresh: bool = False
) -> tuple:
    """Push, bring the tree up to date, sample, update (and with ``refresh`` leave the update's subtrees
    marked, to be refreshed with the next push's, as the replay buffer does on a GPU)."""
    slots = push(state, rows, alpha=0.6)
    if refresh:
        cuda_ext.per_tree_refresh(state["tree"])
    else:
        cuda_ext.per_tree_rebuild(state["tree"], slots)
    indices, weights = cuda_ext.per_sample(state["tree"], state["head_size"], uniforms, 0.4)
    cuda_ext.per_update(state["tree"], state["max_priority"], indices, td_abs, 0.6, 1e-6)
    if not refresh:
        cuda_ext.per_tree_rebuild(state["tree"], indices)
    return slots, indices, weights


@pytest.mark.parametrize("refresh", [False, True])
@pytest.mark.parametrize("batch", [256, 4096])  # per_update: the one-block path and the two-pass path
def test_cuda_graph_capture_and_replay_of_a_training_cycle(batch: int, refresh: bool) -> None:
    generator = torch.Generator().manual_seed(11)
    capacity, n = 1 << 16, 4096
    initial = make_state(capacity, obs_dim=5)
    warm_rows = _random_rows(5000, generator)
    warm_rows["wants"][:] = True
    _reference_push(initial, warm_rows, 0.6)
    full_rebuild(initial["tree"])
    rows = _random_rows(n, generator)
    uniforms = torch.rand(batch, dtype=torch.float64, generator=generator)
    td_abs = torch.rand(batch, generator=generator)

    static_state = _to(initial, "cuda")
    static_rows = _to(rows, "cuda")
    static_uniforms, static_td = uniforms.cuda(), td_abs.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        _training_cycle(_to(initial, "cuda"), static_rows, static_uniforms, static_td, refresh)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = _training_cycle(static_state, static_rows, static_uniforms, static_td, refresh)

    expected_state = _to(initial, "cpu")
    expected = _training_cycle(expected_state, rows, uniforms, td_abs, refresh)
    for replay in range(2):  # replay twice from the initial state: the same result each time
        for name, value in initial.items():
            static_state[name].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(outputs[0].cpu(), expected[0]), replay
        assert torch.equal(outputs[1].cpu(), expected[1]), replay
        torch.testing.assert_close(outputs[2].cpu(), expected[2], **FLOAT_TOL)
        _assert_state_equal(static_state, expected_state)


@pytest.mark.parametrize("op", ["push", "rebuild", "refresh", "sample", "update"])
def test_each_op_captures_in_a_cuda_graph(op: str) -> None:
    generator = torch.Generator().manual_seed(5)
    capacity = 4097
    initial = make_state(capacity, obs_dim=5)
    initial["tree"] = _consistent_tree(capacity, generator, "cpu")
    initial["head_size"][:] = torch.tensor([4000, capacity])
    rows = _random_rows(31, generator)
    uniforms = torch.rand(31, dtype=torch.float64, generator=generator)
    indices = torch.randint(0, capacity, (31,), generator=generator)
    td_abs = torch.rand(31, generator=generator)
    if op == "rebuild":  # change the listed leaves, so the rebuild has work to do
        n_leaves = initial["tree"].shape[0] // 2
        initial["tree"][n_leaves + indices] = torch.rand(31, dtype=torch.float64, generator=generator)
    if op == "refresh":  # an update marks the subtrees the refresh rebuilds
        reference.per_update(initial["tree"], initial["max_priority"], indices, td_abs, 0.6, 1e-6)

    def run(state: dict, inputs: tuple) -> tuple:
        rows_, uniforms_, indices_, td_ = inputs
        if op == "push":
            return (push(state, rows_, alpha=0.6),)
        if op == "rebuild":
            cuda_ext.per_tree_rebuild(state["tree"], indices_)
            return ()
        if op == "refresh":
            cuda_ext.per_tree_refresh(state["tree"])
            return ()
        if op == "sample":
            return cuda_ext.per_sample(state["tree"], state["head_size"], uniforms_, 0.4)
        cuda_ext.per_update(state["tree"], state["max_priority"], indices_, td_, 0.6, 1e-6)
        return ()

    cuda_inputs = (_to(rows, "cuda"), uniforms.cuda(), indices.cuda(), td_abs.cuda())
    static_state = _to(initial, "cuda")
    run(_to(initial, "cuda"), cuda_inputs)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run(static_state, cuda_inputs)
    static_state_fresh = _to(initial, "cuda")
    for name in static_state:
        static_state[name].copy_(static_state_fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    expected_state = _to(initial, "cpu")
    expected = run(expected_state, (rows, uniforms, indices, td_abs))
    for out, exp in zip(outputs, expected, strict=True):
        if out.dtype.is_floating_point:
            torch.testing.assert_close(out.cpu(), exp, **FLOAT_TOL)
        else:
            assert torch.equal(out.cpu(), exp)
    _assert_state_equal(static_state, expected_state)
