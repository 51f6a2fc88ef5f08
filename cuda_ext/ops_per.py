"""The prioritized-replay ops ``cuda_ext::per_push``, ``per_tree_rebuild``, ``per_tree_refresh``,
``per_sample``, ``per_sample_philox``, ``per_update``.

Each is defined here with its schema, its pure-PyTorch reference (:mod:`cuda_ext.reference.per`) and a
fake (shape-only) implementation; the CUDA kernels (``csrc/per*.{cu,cuh,cpp}``) register themselves
for the CUDA dispatch key when the extension loads. Semantics: ``cuda_ext/README.md``.

Usage::

    import cuda_ext  # defines the ops, loads the CUDA kernels when a GPU is present
    slots = cuda_ext.ops_per.per_push(obs, next_obs, ..., alpha=0.6)
    cuda_ext.ops_per.per_tree_rebuild(tree, slots)
    indices, weights = cuda_ext.ops_per.per_sample(tree, head_size, uniforms, beta=0.4)
"""

from __future__ import annotations

import torch

from cuda_ext._library import define_op
from cuda_ext.reference import per as reference


def _push_fake(*args: torch.Tensor | float) -> torch.Tensor:
    """Fake :func:`cuda_ext.reference.per.per_push`: validates, then shapes the slots.

    :param args: the op's arguments, in schema order.
    :return: an empty ``[N] int64`` tensor.
    """
    reference.check_per_push(*args)  # type: ignore[arg-type]
    wants = args[15]
    assert isinstance(wants, torch.Tensor)
    return wants.new_empty(wants.shape, dtype=torch.int64)


def _rebuild_fake(tree: torch.Tensor, leaf_idx: torch.Tensor) -> None:
    """Fake :func:`cuda_ext.reference.per.per_tree_rebuild`: validates, returns nothing.

    :param tree: see the reference; the other parameter likewise.
    """
    reference.check_per_tree_rebuild(tree, leaf_idx)


def _refresh_fake(tree: torch.Tensor) -> None:
    """Fake :func:`cuda_ext.reference.per.per_tree_refresh`: validates, returns nothing.

    :param tree: see the reference.
    """
    reference.check_per_tree_refresh(tree)


def _sample_fake(
    tree: torch.Tensor, head_size: torch.Tensor, uniforms: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
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
    tree: torch.Tensor, head_size: torch.Tensor, rng_state: torch.Tensor, batch_size: int, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake :func:`cuda_ext.reference.per.per_sample_philox`: validates, then shapes the outputs.

    :param tree: see the reference; the other parameters likewise.
    :return: empty ``([B] int64, [B] float32)`` tensors.
    """
    reference.check_per_sample_philox(tree, head_size, rng_state, batch_size, beta)
    return (
        tree.new_empty((batch_size,), dtype=torch.int64),
        tree.new_empty((batch_size,), dtype=torch.float32),
    )


def _update_fake(*args: torch.Tensor | float) -> None:
    """Fake :func:`cuda_ext.reference.per.per_update`: validates, returns nothing.

    :param args: the op's arguments, in schema order.
    """
    reference.check_per_update(*args)  # type: ignore[arg-type]


per_push = define_op(
    "per_push(Tensor(a!) obs, Tensor(b!) next_obs, Tensor(c!) action, Tensor(d!) reward, Tensor(e!) done, "
    "Tensor(f!) kind, Tensor(g!) tree, Tensor(h!) head_size, Tensor max_priority, Tensor new_obs, "
    "Tensor new_next_obs, Tensor new_action, Tensor new_reward, Tensor new_done, Tensor new_kind, "
    "Tensor wants, Tensor new_priority, Tensor max_multiplier, float alpha) -> Tensor",
    reference.per_push,
    _push_fake,
)
per_tree_rebuild = define_op(
    "per_tree_rebuild(Tensor(a!) tree, Tensor leaf_idx) -> ()",
    reference.per_tree_rebuild,
    _rebuild_fake,
)
per_tree_refresh = define_op(
    "per_tree_refresh(Tensor(a!) tree) -> ()",
    reference.per_tree_refresh,
    _refresh_fake,
)
per_sample = define_op(
    "per_sample(Tensor tree, Tensor head_size, Tensor uniforms, float beta) -> (Tensor, Tensor)",
    reference.per_sample,
    _sample_fake,
)
per_sample_philox = define_op(
    "per_sample_philox(Tensor tree, Tensor head_size, Tensor(a!) rng_state, int batch_size, float beta) "
    "-> (Tensor, Tensor)",
    reference.per_sample_philox,
    _sample_philox_fake,
)
per_update = define_op(
    "per_update(Tensor(a!) tree, Tensor(b!) max_priority, Tensor indices, Tensor td_abs, float alpha, "
    "float eps) -> ()",
    reference.per_update,
    _update_fake,
)


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
