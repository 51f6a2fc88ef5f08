"""Pure-PyTorch references of the prioritized-replay ops: ``per_push``, ``per_tree_rebuild``,
``per_tree_refresh``, ``per_sample``, ``per_sample_philox`` and ``per_update``.

They are the CPU path and the oracle the CUDA kernels are tested against; the semantics are those of
``cuda_ext/README.md``. Arithmetic order is chosen so that the kernels can reproduce it exactly:

* a pushed row's raw priority is ``new_priority + max_multiplier * max_priority`` in float32 (one
  multiply, one add, no fused multiply-add), its leaf ``float64(p) ** alpha``;
* an updated row's raw priority is ``td_abs + float32(eps)`` in float32, its leaf ``float64(p) ** alpha``;
* every tree node is ``left + right`` in float64, so any rebuild order gives the same bits;
* a sampling target is ``(i + u_i) / B * total`` in float64.

Dirty subtrees: when ``MARKED_MIN_LEAVES <= P <= MARKED_MAX_LEAVES``, ``per_push`` and ``per_update`` also set
the root of each written leaf's subtree of ``SUBTREE_LEAVES`` leaves (heap node ``P / SUBTREE_LEAVES +
leaf // SUBTREE_LEAVES``) to ``DIRTY_MARKER`` (a NaN bit pattern), so that ``per_tree_refresh`` can bring the
tree up to date without being told which leaves changed (on a GPU: one launch, no marking pass). Outside
that range nothing is marked and ``per_tree_refresh`` rebuilds the whole tree.

The replay state layout (``tree [2P] float64``, ``head_size [2] int64``, ``max_priority [1] float32``)
is described in ``cuda_ext/README.md``.
"""

from __future__ import annotations

import torch

from cuda_ext.reference.checks import check_same_device, check_scalar, check_tensor
from cuda_ext.reference.philox import philox_uniforms

#: Leaves under one marked subtree root (the CUDA rebuild's per-block subtree).
SUBTREE_LEAVES = 2048
#: Trees of ``P`` leaves in ``[MARKED_MIN_LEAVES, MARKED_MAX_LEAVES]`` get their dirty subtrees marked.
MARKED_MIN_LEAVES = 2 * SUBTREE_LEAVES
MARKED_MAX_LEAVES = 1 << 23
#: The bits a dirty subtree root holds (read as float64: a NaN), as a signed int64.
DIRTY_MARKER = 0x7FF4C0FFEE0DDBA1


def marks_subtrees(n_leaves: int) -> bool:
    """Whether the writers of a ``P``-leaf tree mark their dirty subtrees (see the module docstring).

    :param n_leaves: ``P``.
    :return: True when ``MARKED_MIN_LEAVES <= P <= MARKED_MAX_LEAVES``.
    """
    return MARKED_MIN_LEAVES <= n_leaves <= MARKED_MAX_LEAVES


def _mark_dirty(tree: torch.Tensor, leaves: torch.Tensor) -> None:
    """Set the subtree roots above ``leaves`` (valid leaf indices) to ``DIRTY_MARKER`` in a marked tree."""
    n_leaves = tree.shape[0] // 2
    if marks_subtrees(n_leaves) and leaves.numel():
        tree.view(torch.int64)[n_leaves // SUBTREE_LEAVES + leaves // SUBTREE_LEAVES] = DIRTY_MARKER


def tree_leaf_count(tree: torch.Tensor) -> int:
    """Number of leaves ``P`` of a sum tree stored as ``[2P]``.

    :param tree: the sum tree, ``[2P] float64`` with ``P`` a power of two.
    :return: ``P``.
    """
    if tree.dim() != 1 or tree.dtype != torch.float64:
        raise ValueError(f"tree (shape={tuple(tree.shape)}, dtype={tree.dtype}) must be a 1-D float64 tensor")
    n_nodes = tree.shape[0]
    if n_nodes < 2 or n_nodes % 2 or (n_nodes // 2) & (n_nodes // 2 - 1):
        raise ValueError(f"tree length={n_nodes} must be 2P with P a power of two")
    return n_nodes // 2


def check_per_push(
    obs: torch.Tensor,
    next_obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    kind: torch.Tensor,
    tree: torch.Tensor,
    head_size: torch.Tensor,
    max_priority: torch.Tensor,
    new_obs: torch.Tensor,
    new_next_obs: torch.Tensor,
    new_action: torch.Tensor,
    new_reward: torch.Tensor,
    new_done: torch.Tensor,
    new_kind: torch.Tensor,
    wants: torch.Tensor,
    new_priority: torch.Tensor,
    max_multiplier: torch.Tensor,
    alpha: float,
) -> None:
    """Validate the arguments of :func:`per_push` (dtypes, shapes, devices); raise ``ValueError``.

    The dtypes are those of ``cuda_ext/README.md``, which the CUDA kernel requires too.

    :param obs: see :func:`per_push`; the other parameters likewise.
    """
    n_leaves = tree_leaf_count(tree)
    check_tensor("obs", obs, torch.float32, (None, None))
    capacity, obs_dim = obs.shape
    if not 1 <= capacity <= n_leaves:
        raise ValueError(f"capacity={capacity} (obs.shape[0]) must be in [1, P={n_leaves}]")
    check_tensor("action", action, torch.int64, (capacity, None))
    n_branches = action.shape[1]
    check_tensor("new_obs", new_obs, torch.float32, (None, obs_dim))
    n_new = new_obs.shape[0]
    for name, tensor, dtype, shape in (
        ("next_obs", next_obs, torch.float32, (capacity, obs_dim)),
        ("reward", reward, torch.float32, (capacity,)),
        ("done", done, torch.float32, (capacity,)),
        ("kind", kind, torch.int8, (capacity,)),
        ("head_size", head_size, torch.int64, (2,)),
        ("max_priority", max_priority, torch.float32, (1,)),
        ("new_next_obs", new_next_obs, torch.float32, (n_new, obs_dim)),
        ("new_action", new_action, torch.int64, (n_new, n_branches)),
        ("new_reward", new_reward, torch.float32, (n_new,)),
        ("new_done", new_done, torch.float32, (n_new,)),
        ("new_kind", new_kind, torch.int8, (n_new,)),
        ("wants", wants, torch.bool, (n_new,)),
        ("new_priority", new_priority, torch.float32, (n_new,)),
        ("max_multiplier", max_multiplier, torch.float32, (n_new,)),
    ):
        check_tensor(name, tensor, dtype, shape)
    check_same_device(
        tree=tree, obs=obs, next_obs=next_obs, action=action, reward=reward, done=done, kind=kind,
        head_size=head_size, max_priority=max_priority, new_obs=new_obs, new_next_obs=new_next_obs,
        new_action=new_action, new_reward=new_reward, new_done=new_done, new_kind=new_kind, wants=wants,
        new_priority=new_priority, max_multiplier=max_multiplier,
    )
    check_scalar("alpha", alpha, low=0.0)


def check_per_tree_rebuild(tree: torch.Tensor, leaf_idx: torch.Tensor) -> None:
    """Validate the arguments of :func:`per_tree_rebuild` (dtypes, shapes, devices); raise ``ValueError``.

    :param tree: see :func:`per_tree_rebuild`; the other parameter likewise.
    """
    tree_leaf_count(tree)
    check_tensor("leaf_idx", leaf_idx, torch.int64, (None,))
    check_same_device(tree=tree, leaf_idx=leaf_idx)


def check_per_tree_refresh(tree: torch.Tensor) -> None:
    """Validate the argument of :func:`per_tree_refresh`; raise ``ValueError``.

    :param tree: see :func:`per_tree_refresh`.
    """
    tree_leaf_count(tree)


def check_per_sample(
    tree: torch.Tensor, head_size: torch.Tensor, uniforms: torch.Tensor, beta: float
) -> None:
    """Validate the arguments of :func:`per_sample` (dtypes, shapes, devices); raise ``ValueError``.

    :param tree: see :func:`per_sample`; the other parameters likewise.
    """
    tree_leaf_count(tree)
    check_tensor("head_size", head_size, torch.int64, (2,))
    check_tensor("uniforms", uniforms, torch.float64, (None,))
    check_same_device(tree=tree, head_size=head_size, uniforms=uniforms)
    check_scalar("beta", beta, low=0.0, high=1.0)


def check_per_sample_philox(
    tree: torch.Tensor, head_size: torch.Tensor, rng_state: torch.Tensor, batch_size: int, beta: float
) -> None:
    """Validate the arguments of :func:`per_sample_philox` (dtypes, shapes, devices); raise ``ValueError``.

    :param tree: see :func:`per_sample_philox`; the other parameters likewise.
    """
    tree_leaf_count(tree)
    check_tensor("head_size", head_size, torch.int64, (2,))
    check_tensor("rng_state", rng_state, torch.int64, (2,))
    check_same_device(tree=tree, head_size=head_size, rng_state=rng_state)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(f"batch_size={batch_size!r} must be an int >= 0")
    check_scalar("beta", beta, low=0.0, high=1.0)


def check_per_update(
    tree: torch.Tensor,
    max_priority: torch.Tensor,
    indices: torch.Tensor,
    td_abs: torch.Tensor,
    alpha: float,
    eps: float,
) -> None:
    """Validate the arguments of :func:`per_update` (dtypes, shapes, devices); raise ``ValueError``.

    :param tree: see :func:`per_update`; the other parameters likewise.
    """
    tree_leaf_count(tree)
    check_tensor("max_priority", max_priority, torch.float32, (1,))
    check_tensor("indices", indices, torch.int64, (None,))
    check_tensor("td_abs", td_abs, torch.float32, (indices.shape[0],))
    check_same_device(tree=tree, max_priority=max_priority, indices=indices, td_abs=td_abs)
    check_scalar("alpha", alpha, low=0.0)
    check_scalar("eps", eps, low=0.0)


def per_push(
    obs: torch.Tensor,
    next_obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    kind: torch.Tensor,
    tree: torch.Tensor,
    head_size: torch.Tensor,
    max_priority: torch.Tensor,
    new_obs: torch.Tensor,
    new_next_obs: torch.Tensor,
    new_action: torch.Tensor,
    new_reward: torch.Tensor,
    new_done: torch.Tensor,
    new_kind: torch.Tensor,
    wants: torch.Tensor,
    new_priority: torch.Tensor,
    max_multiplier: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """Write the wanted rows of a batch into the replay ring at prefix-sum slots and set their leaves.

    Slots come from one exclusive prefix sum over ``wants``: ``slot = (write_head + prefix) % C``. If more
    than ``C`` rows want a slot, only the last ``C`` are written; the others, and unwanted rows, get -1.
    A written row's leaf becomes ``(new_priority + max_multiplier * max_priority[0]) ** alpha``.
    ``head_size`` advances by the number of wanted rows. Leaves change (and, in a marked tree, the dirty
    subtree roots): call :func:`per_tree_rebuild` with the returned slots, or :func:`per_tree_refresh`, next.

    :param obs: replay observations ``[C, D]`` (written in place).
    :param next_obs: replay next observations ``[C, D]`` (written in place).
    :param action: replay actions ``[C, NB] int64`` (written in place).
    :param reward: replay rewards ``[C]`` (written in place).
    :param done: replay done flags ``[C]`` (written in place).
    :param kind: replay row kinds ``[C] int8`` (written in place).
    :param tree: sum tree ``[2P] float64`` (leaves written in place).
    :param head_size: ``(write_head, size)`` ``[2] int64`` (updated in place).
    :param max_priority: running max raw priority ``[1] float32`` (read only).
    :param new_obs: incoming observations ``[N, D]``.
    :param new_next_obs: incoming next observations ``[N, D]``.
    :param new_action: incoming actions ``[N, NB] int64``.
    :param new_reward: incoming rewards ``[N]``.
    :param new_done: incoming done flags ``[N]``.
    :param new_kind: incoming row kinds ``[N] int8``.
    :param wants: which incoming rows want a slot ``[N] bool``.
    :param new_priority: raw priority term ``[N] float32``.
    :param max_multiplier: multiplier of the running max priority ``[N] float32``.
    :param alpha: priority exponent.
    :return: the slot of each incoming row, -1 where nothing was written, ``[N] int64``.
    """
    check_per_push(
        obs, next_obs, action, reward, done, kind, tree, head_size, max_priority, new_obs, new_next_obs,
        new_action, new_reward, new_done, new_kind, wants, new_priority, max_multiplier, alpha,
    )
    capacity = obs.shape[0]
    n_leaves = tree_leaf_count(tree)
    wants_count = wants.to(torch.int64)
    prefix = torch.cumsum(wants_count, 0) - wants_count
    total = wants_count.sum()
    keep = wants & (prefix >= total - capacity)
    slots = torch.where(keep, (head_size[0] + prefix) % capacity, torch.full_like(prefix, -1))

    rows = slots[keep]
    obs[rows] = new_obs[keep].to(obs.dtype)
    next_obs[rows] = new_next_obs[keep].to(next_obs.dtype)
    action[rows] = new_action[keep].to(action.dtype)
    reward[rows] = new_reward[keep].to(reward.dtype)
    done[rows] = new_done[keep].to(done.dtype)
    kind[rows] = new_kind[keep].to(kind.dtype)
    raw = new_priority[keep].float() + max_multiplier[keep].float() * max_priority[0].float()
    tree[n_leaves + rows] = raw.double() ** alpha
    _mark_dirty(tree, rows)

    head_size[0] = (head_size[0] + total) % capacity
    head_size[1] = torch.clamp(head_size[1] + total, max=capacity)
    return slots


def per_tree_rebuild(tree: torch.Tensor, leaf_idx: torch.Tensor) -> None:
    """Recompute every ancestor of the given leaves as the float64 sum of its two children.

    Entries below 0 are ignored and duplicates are fine; passing every leaf index is a full rebuild.

    :param tree: sum tree ``[2P] float64`` (internal nodes written in place).
    :param leaf_idx: leaf indices ``[M] int64``, each in ``[-inf, P)``.
    """
    check_per_tree_rebuild(tree, leaf_idx)
    n_leaves = tree_leaf_count(tree)
    leaves = leaf_idx[leaf_idx >= 0]
    if leaves.numel() and int(leaves.max()) >= n_leaves:
        raise ValueError(f"leaf_idx max={int(leaves.max())} must be < P={n_leaves}")
    nodes = torch.unique(leaves + n_leaves)
    while n_leaves > 1:
        nodes = torch.unique(nodes // 2)
        tree[nodes] = tree[2 * nodes] + tree[2 * nodes + 1]
        n_leaves //= 2


def per_tree_refresh(tree: torch.Tensor) -> None:
    """Bring the tree up to date after :func:`per_push` / :func:`per_update`, without the changed leaves.

    In a marked tree (``marks_subtrees(P)``): rebuild every subtree whose root holds ``DIRTY_MARKER`` and
    every node above (the same nodes and bits as :func:`per_tree_rebuild` of the leaves those writers
    changed); otherwise rebuild every node. Either way every internal node ends as ``left + right``.

    :param tree: sum tree ``[2P] float64`` (internal nodes written in place).
    """
    check_per_tree_refresh(tree)
    n_leaves = tree_leaf_count(tree)
    if not marks_subtrees(n_leaves):
        start = n_leaves
        while start > 1:
            tree[start // 2 : start] = tree[start : 2 * start : 2] + tree[start + 1 : 2 * start : 2]
            start //= 2
        return
    n_subtrees = n_leaves // SUBTREE_LEAVES
    roots = tree.view(torch.int64)[n_subtrees : 2 * n_subtrees]
    dirty = torch.nonzero(roots == DIRTY_MARKER).flatten()
    if dirty.numel() == 0:
        return
    offsets = torch.arange(SUBTREE_LEAVES, device=tree.device)
    per_tree_rebuild(tree, (dirty[:, None] * SUBTREE_LEAVES + offsets).flatten())


def per_sample(
    tree: torch.Tensor, head_size: torch.Tensor, uniforms: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified proportional sampling of ``B`` rows with importance weights.

    ``target_i = (i + u_i) / B * tree[1]``; the descent goes left when ``target < left`` and otherwise
    subtracts the left sum and goes right, but never enters a child whose sum is 0 (so a target pushed
    past the end by rounding ends on the last non-zero leaf). ``w_i = (size * leaf_i / total) ** -beta``,
    divided by the batch maximum. Undefined on an empty tree.

    :param tree: sum tree ``[2P] float64``.
    :param head_size: ``(write_head, size)`` ``[2] int64``.
    :param uniforms: one uniform draw in ``[0, 1)`` per sample, ``[B] float64``.
    :param beta: importance-sampling exponent.
    :return: ``(indices [B] int64, weights [B] float32)``.
    """
    check_per_sample(tree, head_size, uniforms, beta)
    n_leaves = tree_leaf_count(tree)
    batch = uniforms.shape[0]
    total = tree[1]
    strata = torch.arange(batch, dtype=torch.float64, device=uniforms.device)
    target = (strata + uniforms.double()) / batch * total
    node = torch.ones(batch, dtype=torch.int64, device=uniforms.device)
    while n_leaves > 1:
        left = tree[2 * node]
        right = tree[2 * node + 1]
        go_left = ((target < left) & (left > 0)) | (right == 0)
        target = torch.where(go_left, target, target - left)
        node = 2 * node + (~go_left).to(torch.int64)
        n_leaves //= 2
    indices = node - tree.shape[0] // 2
    probability = tree[node] / total
    weights = (head_size[1].double() * probability) ** -beta
    weights = weights / weights.max()
    return indices, weights.float()


def per_sample_philox(
    tree: torch.Tensor, head_size: torch.Tensor, rng_state: torch.Tensor, batch_size: int, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`per_sample` with its uniforms drawn by Philox4x32-10 from ``rng_state``, which then advances.

    The same as ``per_sample(tree, head_size, philox_uniforms(rng_state, batch_size), beta)`` followed by
    ``rng_state[1] += 1`` (:func:`cuda_ext.reference.philox.philox_uniforms`): every call draws from a fresh
    counter, so consecutive calls (and CUDA graph replays) get new numbers, and a kernel that evaluates the
    generator per thread gives exactly these indices and weights. The counter advances also when
    ``batch_size`` is 0.

    :param tree: sum tree ``[2P] float64``.
    :param head_size: ``(write_head, size)`` ``[2] int64``.
    :param rng_state: ``(seed, counter)`` ``[2] int64`` (the counter is incremented in place).
    :param batch_size: ``B``, samples to draw.
    :param beta: importance-sampling exponent.
    :return: ``(indices [B] int64, weights [B] float32)``.
    """
    check_per_sample_philox(tree, head_size, rng_state, batch_size, beta)
    uniforms = philox_uniforms(rng_state, batch_size)
    rng_state[1] += 1
    if batch_size == 0:
        empty = uniforms.new_empty(0, dtype=torch.int64)
        return empty, uniforms.new_empty(0, dtype=torch.float32)
    return per_sample(tree, head_size, uniforms, beta)


def last_occurrence_mask(indices: torch.Tensor) -> torch.Tensor:
    """Mark, for every repeated value, only its last position in ``indices``.

    :param indices: ``[B] int64``.
    :return: ``[B] bool``, True where no later entry holds the same value.
    """
    sorted_values, order = torch.sort(indices, stable=True)
    is_last_of_run = torch.ones_like(indices, dtype=torch.bool)
    is_last_of_run[:-1] = sorted_values[:-1] != sorted_values[1:]
    winner = torch.empty_like(is_last_of_run)
    winner[order] = is_last_of_run
    return winner


def per_update(
    tree: torch.Tensor,
    max_priority: torch.Tensor,
    indices: torch.Tensor,
    td_abs: torch.Tensor,
    alpha: float,
    eps: float,
) -> None:
    """Set the leaves of sampled rows from their absolute TD errors and raise the running max priority.

    ``p = td_abs + eps`` (float32), leaf ``= p ** alpha``; for duplicate indices the last occurrence wins;
    ``max_priority = max(max_priority, max p)``. In a marked tree the dirty subtree roots are marked too.
    Call :func:`per_tree_rebuild` with ``indices``, or :func:`per_tree_refresh`, next.

    :param tree: sum tree ``[2P] float64`` (leaves written in place).
    :param max_priority: running max raw priority ``[1] float32`` (updated in place).
    :param indices: leaf indices ``[B] int64`` in ``[0, P)``.
    :param td_abs: absolute TD errors ``[B] float32``.
    :param alpha: priority exponent.
    :param eps: added to every ``td_abs``.
    """
    check_per_update(tree, max_priority, indices, td_abs, alpha, eps)
    n_leaves = tree_leaf_count(tree)
    if indices.numel() == 0:
        return
    lowest, highest = int(indices.min()), int(indices.max())
    if lowest < 0 or highest >= n_leaves:
        raise ValueError(f"indices range=[{lowest}, {highest}] must lie in [0, P={n_leaves})")
    raw = td_abs.float() + torch.tensor(eps, dtype=torch.float32, device=td_abs.device)
    winner = last_occurrence_mask(indices)
    tree[n_leaves + indices[winner]] = raw[winner].double() ** alpha
    _mark_dirty(tree, indices)
    max_priority.copy_(torch.maximum(max_priority, raw.max().reshape(1)))
