"""The prioritized-replay ops ``cuda_ext::per_push``, ``per_tree_rebuild``, ``per_tree_refresh``,
``per_sample``, ``per_sample_philox``, ``per_update``, and their typed Python wrappers.

Each op is defined here with its schema, its pure-PyTorch reference (:mod:`cuda_ext.reference.per`) and a
fake (shape-only) implementation; the CUDA kernels (``csrc/per*.{cu,cuh,cpp}``) register themselves
for the CUDA dispatch key when the extension loads. The module-level functions of the same names are the
wrappers callers use (named arguments, the replay state as one :class:`~cuda_ext.ReplayStorage`); each
calls the registered op, so CUDA graphs and ``torch.compile`` see the same op. Semantics:
``cuda_ext/README.md``.

Usage::

    import cuda_ext
    storage = cuda_ext.ReplayStorage.zeros(capacity, obs_dim, n_branches, device)
    slots = cuda_ext.per_push(storage, rows, alpha=0.6)
    cuda_ext.per_tree_rebuild(storage.tree, slots)
    indices, weights = cuda_ext.per_sample(storage.tree, storage.head_size, uniforms, beta=0.4)
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ext._library import define_op
from cuda_ext.reference import per as reference
from cuda_ext.replay_storage import PushRows, ReplayStorage, new_tree

__all__ = [
    "new_tree", "per_push", "per_sample", "per_sample_philox", "per_tree_rebuild", "per_tree_refresh",
    "per_update",
]


# --------------------------------------------------------------------------------------------- fakes
def _push_fake(
    obs: Tensor, next_obs: Tensor, action: Tensor, reward: Tensor, done: Tensor, kind: Tensor, tree: Tensor,
    head_size: Tensor, max_priority: Tensor, new_obs: Tensor, new_next_obs: Tensor, new_action: Tensor,
    new_reward: Tensor, new_done: Tensor, new_kind: Tensor, wants: Tensor, new_priority: Tensor,
    max_multiplier: Tensor, alpha: float,
) -> Tensor:
    """Fake :func:`cuda_ext.reference.per.per_push`: validates, then shapes the slots.

    :param obs: see the reference; the other parameters likewise.
    :return: an empty ``[N] int64`` tensor.
    """
    reference.check_per_push(
        obs, next_obs, action, reward, done, kind, tree, head_size, max_priority, new_obs, new_next_obs,
        new_action, new_reward, new_done, new_kind, wants, new_priority, max_multiplier, alpha,
    )
    return wants.new_empty(wants.shape, dtype=torch.int64)


def _rebuild_fake(tree: Tensor, leaf_idx: Tensor) -> None:
    """Fake :func:`cuda_ext.reference.per.per_tree_rebuild`: validates, returns nothing.

    :param tree: see the reference; the other parameter likewise.
    """
    reference.check_per_tree_rebuild(tree, leaf_idx)


def _refresh_fake(tree: Tensor) -> None:
    """Fake :func:`cuda_ext.reference.per.per_tree_refresh`: validates, returns nothing.

    :param tree: see the reference.
    """
    reference.check_per_tree_refresh(tree)


def _sample_fake(tree: Tensor, head_size: Tensor, uniforms: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """Fake :func:`cuda_ext.reference.per.per_sample`: validates, then shapes the outputs.

    :param tree: see the reference; the other parameters likewise.
    :return: empty ``([B] int64, [B] float32)`` tensors.
    """
    reference.check_per_sample(tree, head_size, uniforms, beta)
    return (
        uniforms.new_empty(uniforms.shape, dtype=torch.int64),
        uniforms.new_empty(uniforms.shape, dtype=torch.float32),
    )


def _sample_philox_fake(
    tree: Tensor, head_size: Tensor, rng_state: Tensor, batch_size: int, beta: float
) -> tuple[Tensor, Tensor]:
    """Fake :func:`cuda_ext.reference.per.per_sample_philox`: validates, then shapes the outputs.

    :param tree: see the reference; the other parameters likewise.
    :return: empty ``([B] int64, [B] float32)`` tensors.
    """
    reference.check_per_sample_philox(tree, head_size, rng_state, batch_size, beta)
    return (
        tree.new_empty((batch_size,), dtype=torch.int64),
        tree.new_empty((batch_size,), dtype=torch.float32),
    )


def _update_fake(
    tree: Tensor, max_priority: Tensor, indices: Tensor, td_abs: Tensor, alpha: float, eps: float
) -> None:
    """Fake :func:`cuda_ext.reference.per.per_update`: validates, returns nothing.

    :param tree: see the reference; the other parameters likewise.
    """
    reference.check_per_update(tree, max_priority, indices, td_abs, alpha, eps)


# --------------------------------------------------------------------------------------------- ops
_PER_PUSH = define_op(
    "per_push(Tensor(a!) obs, Tensor(b!) next_obs, Tensor(c!) action, Tensor(d!) reward, Tensor(e!) done, "
    "Tensor(f!) kind, Tensor(g!) tree, Tensor(h!) head_size, Tensor max_priority, Tensor new_obs, "
    "Tensor new_next_obs, Tensor new_action, Tensor new_reward, Tensor new_done, Tensor new_kind, "
    "Tensor wants, Tensor new_priority, Tensor max_multiplier, float alpha) -> Tensor",
    reference.per_push,
    _push_fake,
)
_PER_TREE_REBUILD = define_op(
    "per_tree_rebuild(Tensor(a!) tree, Tensor leaf_idx) -> ()",
    reference.per_tree_rebuild,
    _rebuild_fake,
)
_PER_TREE_REFRESH = define_op(
    "per_tree_refresh(Tensor(a!) tree) -> ()",
    reference.per_tree_refresh,
    _refresh_fake,
)
_PER_SAMPLE = define_op(
    "per_sample(Tensor tree, Tensor head_size, Tensor uniforms, float beta) -> (Tensor, Tensor)",
    reference.per_sample,
    _sample_fake,
)
_PER_SAMPLE_PHILOX = define_op(
    "per_sample_philox(Tensor tree, Tensor head_size, Tensor(a!) rng_state, int batch_size, float beta) "
    "-> (Tensor, Tensor)",
    reference.per_sample_philox,
    _sample_philox_fake,
)
_PER_UPDATE = define_op(
    "per_update(Tensor(a!) tree, Tensor(b!) max_priority, Tensor indices, Tensor td_abs, float alpha, "
    "float eps) -> ()",
    reference.per_update,
    _update_fake,
)


# --------------------------------------------------------------------------------------------- wrappers
def per_push(storage: ReplayStorage, rows: PushRows, alpha: float) -> Tensor:
    """Write the wanted ``rows`` at the write head, with their priorities (``cuda_ext::per_push``).

    Rows get slots from one prefix sum over ``rows.wants`` (only the last ``C`` if more want one); a written
    row's priority is ``rows.priority + rows.max_multiplier * max_priority``, its leaf that ``** alpha``. The
    written leaves' ancestors are stale afterwards: call :func:`per_tree_rebuild` or :func:`per_tree_refresh`.

    :param storage: the replay state (mutated: rows, tree leaves, ``head_size``).
    :param rows: ``N`` incoming rows.
    :param alpha: priority exponent; >= 0.
    :return: ``[N] int64`` slot of each row, -1 where not written.
    """
    s = storage
    return _PER_PUSH(
        s.obs, s.next_obs, s.action, s.reward, s.done, s.kind, s.tree, s.head_size, s.max_priority,
        rows.obs, rows.next_obs, rows.action, rows.reward, rows.done, rows.kind, rows.wants, rows.priority,
        rows.max_multiplier, alpha,
    )


def per_tree_rebuild(tree: Tensor, leaf_idx: Tensor) -> None:
    """Recompute every ancestor of the listed leaves (``cuda_ext::per_tree_rebuild``).

    :param tree: ``[2P] float64`` sum tree (mutated).
    :param leaf_idx: ``[M] int64`` leaves whose ancestors to rebuild; entries < 0 are ignored.
    """
    _PER_TREE_REBUILD(tree, leaf_idx)


def per_tree_refresh(tree: Tensor) -> None:
    """Rebuild every subtree the writers marked dirty, and the nodes above (``cuda_ext::per_tree_refresh``).

    :param tree: ``[2P] float64`` sum tree (mutated).
    """
    _PER_TREE_REFRESH(tree)


def per_sample(tree: Tensor, head_size: Tensor, uniforms: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """Stratified proportional sampling with the given uniforms (``cuda_ext::per_sample``).

    :param tree: ``[2P] float64`` up-to-date, non-empty sum tree.
    :param head_size: ``[2] int64`` ``(write_head, size)``.
    :param uniforms: ``[B] float64`` draws in ``[0, 1)``, one per stratum.
    :param beta: importance-sampling exponent; in ``[0, 1]``.
    :return: ``(indices [B] int64, weights [B] float32)``, weights divided by their max.
    """
    return _PER_SAMPLE(tree, head_size, uniforms, beta)


def per_sample_philox(
    tree: Tensor, head_size: Tensor, rng_state: Tensor, batch_size: int, beta: float
) -> tuple[Tensor, Tensor]:
    """:func:`per_sample` with its uniforms drawn from a Philox ``(seed, counter)`` state
    (``cuda_ext::per_sample_philox``); the counter advances by one.

    :param tree: ``[2P] float64`` up-to-date, non-empty sum tree.
    :param head_size: ``[2] int64`` ``(write_head, size)``.
    :param rng_state: ``[2] int64`` ``(seed, counter)`` (mutated).
    :param batch_size: rows ``B`` to draw; >= 0.
    :param beta: importance-sampling exponent; in ``[0, 1]``.
    :return: ``(indices [B] int64, weights [B] float32)``, weights divided by their max.
    """
    return _PER_SAMPLE_PHILOX(tree, head_size, rng_state, batch_size, beta)


def per_update(
    tree: Tensor, max_priority: Tensor, indices: Tensor, td_abs: Tensor, alpha: float, eps: float
) -> None:
    """Set sampled rows' priorities to ``td_abs + eps`` and raise the running max (``cuda_ext::per_update``).

    The leaves' ancestors are stale afterwards: call :func:`per_tree_rebuild` or :func:`per_tree_refresh`.

    :param tree: ``[2P] float64`` sum tree (mutated).
    :param max_priority: ``[1] float32`` running max raw priority (mutated).
    :param indices: ``[B] int64`` slots; for duplicates the last wins.
    :param td_abs: ``[B] float32`` absolute TD errors.
    :param alpha: priority exponent; >= 0.
    :param eps: added to ``td_abs``; >= 0.
    """
    _PER_UPDATE(tree, max_priority, indices, td_abs, alpha, eps)
