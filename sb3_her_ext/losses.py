"""Distributional TD losses: IQN's quantile-Huber loss and C51's categorical projection and cross-entropy.

All functions work on arbitrary leading dimensions (batch, branch, ensemble head, ...) and return one
loss per leading index, so the caller chooses how to weight (PER importance weights) and reduce them.
None of them synchronises with the host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch as th

#: On the CPU the pair tensors are built this many pairs at a time (256 KiB per float32 buffer, 768 KiB for
#: the three), in reused buffers: they stay in the core's cache and no large allocation is touched afresh per
#: call (the block size that timed fastest: see benchmarks/RESULTS.md).
CPU_PAIRS_PER_CHUNK = 1 << 16


def _without_expanded_dims(x: th.Tensor) -> th.Tensor:
    """``x`` with each expanded (stride-0) dim of size > 1 cut to size 1: a view that broadcasts to ``x``."""
    dims = zip(x.stride(), x.shape, strict=True)
    return x[tuple(slice(0, 1) if step == 0 and size > 1 else slice(None) for step, size in dims)]


class _QuantileHuber(th.autograd.Function):
    """Fused quantile-Huber loss; the forward pass also forms the gradient, so backward is a scaling.

    With ``delta = target_j - current_i``, ``c = clamp(delta, -kappa, kappa)``, ``c- = min(c, 0)`` (which is
    ``c * 1{delta < 0}``) and ``h = delta - c / 2``, the pair weight times the clipped error is
    ``g = |taus_i - 1{delta < 0}| * c = taus_i * c + (1 - 2 taus_i) * c-``, the pair loss is ``g * h / kappa``
    and its derivative in ``delta`` is ``g / kappa``. The factors of ``taus_i`` come out of the sums over
    ``j``, so only four row sums over the pairs are needed: ``sum_j c``, ``sum_j c-`` (the gradient of
    ``current``) and ``sum_j c * h``, ``sum_j c- * h`` (the loss); the gradient of ``target`` (when it is
    needed) is ``sum_i g_ij``, two batched matrix products.

    The pair tensors are laid out ``[N', rows, N]`` (``j`` outermost), so the sums over ``j`` add whole
    contiguous ``[rows, N]`` slabs instead of reducing 32-element rows (the faster layout on the CPU).
    """

    @staticmethod
    def forward(
        ctx: Any, current: th.Tensor, target: th.Tensor, taus: th.Tensor, kappa: float, values: bool
    ) -> th.Tensor:
        n, n_target = current.shape[-1], target.shape[-1]
        lead = th.broadcast_shapes(current.shape[:-1], target.shape[:-1], taus.shape[:-1])
        ctx.shapes = (current.shape, target.shape)
        current = current.broadcast_to(*lead, n)
        # The rows go through in the memory order of ``current`` (its leading dims by decreasing stride): the
        # training step's quantiles are a permuted view, which a row-major flattening had to copy, and whose
        # gradient, formed in that order, reaches the network's output as a view (no copy in autograd's view
        # backward either). Each row's sums are the same whatever the order, so the values are too.
        order = sorted(range(len(lead)), key=lambda dim: -current.stride(dim))
        inverse = sorted(range(len(lead) + 1), key=lambda dim: (order + [len(lead)])[dim])
        rows_lead = tuple(lead[dim] for dim in order)
        rows_current = current.permute([*order, -1]).reshape(-1, n)
        rows_target = target.broadcast_to(*lead, n_target).permute([*order, -1]).reshape(-1, n_target)
        # taus and 1 - 2 taus are not copied out per row: only the final weighting of the row sums reads them,
        # by broadcasting, and 1 - 2 taus is formed over the dims that are not expanded (the caller's taus are
        # shared by the ensemble heads and the branches: 20x fewer values at the default sizes)
        taus = _without_expanded_dims(taus.to(current.dtype)).permute([*order, -1])
        neg_weight = 1.0 - 2.0 * taus
        n_rows = rows_current.shape[0]
        chunk = n_rows if current.device.type != "cpu" else CPU_PAIRS_PER_CHUNK // (n * n_target)
        chunk = max(1, min(n_rows, chunk))
        need_target_grad = ctx.needs_input_grad[1]
        delta = rows_current.new_empty(n_target, chunk, n)
        parts = rows_current.new_empty(2, n_target, chunk, n)  # c and c-
        grad_sums = rows_current.new_empty(2, n_rows, n)  # sum_j c, sum_j c-
        # sum_j c * h, sum_j c- * h (no columns when the caller wants no values)
        loss_sums = rows_current.new_empty(2, n_rows, n if values else 0)
        grad_target = rows_current.new_empty(n_rows, n_target, 1) if need_target_grad else None
        rows_taus = rows_neg_weight = None
        if grad_target is not None:  # the target's gradient weights the pairs row by row
            rows_taus = taus.broadcast_to(*rows_lead, n).reshape(-1, n, 1)
            rows_neg_weight = neg_weight.broadcast_to(*rows_lead, n).reshape(-1, n, 1)
        # The blocks' views, made up front (split: one call instead of a dozen Python indexings per block),
        # and the pair buffers' views for a full block and for a last partial one, made once: the loop's
        # Python and dispatch cost is paid per block.
        blocks = zip(
            rows_target.t().unsqueeze(-1).split(chunk, dim=1),  # [N', rows, 1]
            rows_current.unsqueeze(0).split(chunk, dim=1),  # [1, rows, N]
            grad_sums.split(chunk, dim=1),
            loss_sums.split(chunk, dim=1),
            range(0, n_rows, chunk),
            strict=True,
        )
        last = n_rows - (n_rows - 1) // chunk * chunk  # rows of the last block
        full_views = (delta, parts, *parts.unbind(0))
        last_parts = parts[:, :, :last]
        last_views = (delta[:, :last], last_parts, *last_parts.unbind(0))
        for block_target, block_current, block_grad_sums, block_loss_sums, start in blocks:
            views = full_views if block_current.shape[1] == chunk else last_views
            pair_delta, pair_parts, clipped, negative = views
            th.sub(block_target, block_current, out=pair_delta)
            th.clamp(pair_delta, -kappa, kappa, out=clipped)
            th.clamp(clipped, max=0.0, out=negative)
            th.sum(pair_parts, dim=1, out=block_grad_sums)
            if grad_target is not None and rows_taus is not None and rows_neg_weight is not None:
                stop = start + block_current.shape[1]  # [rows, N', N] @ [rows, N, 1]
                block_grad = grad_target[start:stop]
                th.bmm(clipped.transpose(0, 1), rows_taus[start:stop], out=block_grad)
                block_grad.baddbmm_(negative.transpose(0, 1), rows_neg_weight[start:stop])
            if values:
                pair_parts.mul_(pair_delta.sub_(clipped, alpha=0.5))  # c * h, c- * h
                th.sum(pair_parts, dim=1, out=block_loss_sums)
        # The row sums weighted in place, taus * sums[0] + (1 - 2 taus) * sums[1] (the products and the sum
        # of the textbook order, which commute bit for bit): no fresh [rows, N] temporaries.
        scale = 1.0 / (kappa * n_target)
        grad_sums = grad_sums.view(2, *rows_lead, n)
        grad_sums[0].mul_(taus).add_(grad_sums[1].mul_(neg_weight))
        if values:
            loss_sums = loss_sums.view(2, *rows_lead, n)
            loss_sums[0].mul_(taus).add_(loss_sums[1].mul_(neg_weight))
            loss = loss_sums[0].sum(dim=-1).mul_(scale).permute(inverse[:-1])
        else:  # the caller only backpropagates: zeros that carry the gradient
            loss = rows_current.new_zeros(rows_lead).permute(inverse[:-1])
        grad_current = grad_sums[0].mul_(-scale).permute(inverse)  # the strides of ``current``
        if grad_target is not None:
            grad_target = grad_target.view(*rows_lead, n_target).mul_(scale).permute(inverse)
        ctx.save_for_backward(grad_current, grad_target)
        # the loss in the leading dims' row-major layout, as before (a caller's reductions over it keep
        # their order)
        return loss.contiguous()

    @staticmethod
    def backward(
        ctx: Any, grad_out: th.Tensor
    ) -> tuple[th.Tensor | None, th.Tensor | None, None, None, None]:
        grad_current_unit, grad_target_unit = ctx.saved_tensors
        current_shape, target_shape = ctx.shapes
        grad_current = grad_target = None
        if ctx.needs_input_grad[0]:
            grad_current = (grad_current_unit * grad_out[..., None]).sum_to_size(current_shape)
        if ctx.needs_input_grad[1]:
            grad_target = (grad_target_unit * grad_out[..., None]).sum_to_size(target_shape)
        return grad_current, grad_target, None, None, None


def _pairwise_quantile_huber(
    current: th.Tensor, target: th.Tensor, taus: th.Tensor, kappa: float
) -> th.Tensor:
    """The loss written over the ``[..., N, N']`` pairs, for ``torch.compile`` to fuse (autograd backward).

    ``clipped * (delta - clipped / 2)`` is ``Huber_kappa(delta)``; see :func:`quantile_huber_loss`.
    """
    delta = target.unsqueeze(-2) - current.unsqueeze(-1)
    clipped = delta.clamp(-kappa, kappa)
    weight = th.where(delta < 0, 1.0 - taus.unsqueeze(-1), taus.unsqueeze(-1))
    return (weight * clipped * (delta - 0.5 * clipped)).sum(dim=(-2, -1)) / (kappa * target.shape[-1])


@functools.cache
def _compiled_quantile_huber() -> Callable[..., th.Tensor]:
    """:func:`_pairwise_quantile_huber` through ``torch.compile`` (built on first use; one per process)."""
    return th.compile(_pairwise_quantile_huber, dynamic=False)


def quantile_huber_loss(
    current: th.Tensor,
    target: th.Tensor,
    taus: th.Tensor,
    kappa: float = 1.0,
    compiled: bool = False,
    values: bool = True,
) -> th.Tensor:
    """IQN's quantile-Huber loss (Dabney et al. 2018, eq. 3).

    With pairwise errors ``delta_ij = target_j - current_i``::

        loss = sum_i mean_j |taus_i - 1{delta_ij < 0}| * Huber_kappa(delta_ij) / kappa

    where ``Huber_kappa(d) = d^2 / 2`` if ``|d| <= kappa`` else ``kappa * (|d| - kappa / 2)``. Computed by a
    fused autograd function (gradients for ``current`` and ``target``; ``taus`` is treated as a constant)
    that never keeps the ``[..., N, N']`` pair tensors: see :class:`_QuantileHuber`. With ``compiled`` the
    pairwise formula goes through ``torch.compile`` instead (one fused loop on the CPU, one or two kernels
    on a GPU; see benchmarks/RESULTS.md); the first call of each input shape compiles (seconds).

    :param current: predicted quantile values ``[..., N]`` at the fractions ``taus``.
    :param target: target quantile samples ``[..., N']`` (the caller detaches them when they are a target).
    :param taus: quantile fractions of ``current``, ``[..., N]`` (broadcastable to ``current``).
    :param kappa: Huber threshold, > 0.
    :param compiled: use the ``torch.compile``-d pairwise formula (same values up to float rounding).
    :param values: False for a caller that only backpropagates the loss (the vaccine's auxiliary gradient):
        the fused function then skips the loss's own sums (3 of its 7 passes over the pairs per block) and
        returns zeros that carry the same gradient. Ignored with ``compiled``.
    :return: the loss per leading index, shape ``current.shape[:-1]`` broadcast with ``target.shape[:-1]``
        (zeros with ``values=False``).
    """
    if not kappa > 0:
        raise ValueError(f"kappa={kappa} must be > 0")
    if current.dim() == 0 or target.dim() == 0:
        raise ValueError(
            f"current.shape={tuple(current.shape)} and target.shape={tuple(target.shape)} need a quantile dim"
        )
    if taus.shape[-1] != current.shape[-1]:
        raise ValueError(f"taus.shape={tuple(taus.shape)} must end in N={current.shape[-1]} like current")
    if compiled:
        return _compiled_quantile_huber()(current, target, taus.detach(), float(kappa))
    return _QuantileHuber.apply(current, target, taus.detach(), float(kappa), values)


def c51_project(
    next_probs: th.Tensor,
    rewards: th.Tensor,
    dones: th.Tensor,
    gamma: float | th.Tensor,
    support: th.Tensor,
) -> th.Tensor:
    """Project the Bellman-shifted distribution ``r + gamma * (1 - done) * z`` back onto ``support`` (C51).

    Each shifted atom is clipped to ``[v_min, v_max] = [support[0], support[-1]]`` and its probability is
    split between the two neighbouring atoms in proportion to closeness; an atom landing exactly on a
    support point keeps all its mass there. Done rows collapse onto the projection of ``r``.

    :param next_probs: next-state probabilities ``[..., n_atoms]`` (each row sums to 1).
    :param rewards: rewards with the same number of dims as ``next_probs.shape[:-1]`` (each dim equal or 1),
        e.g. ``[B, 1]`` for ``next_probs`` of shape ``[B, NB, n_atoms]``.
    :param dones: episode-end flags (0/1, float or bool), same shape rule as ``rewards``.
    :param gamma: discount (a float or a tensor broadcastable like ``rewards``).
    :param support: ``[n_atoms]`` evenly spaced, increasing atom values.
    :return: projected target probabilities, shape ``next_probs.shape``.
    """
    n_atoms = support.shape[0] if support.dim() == 1 else -1
    if support.dim() != 1 or n_atoms < 2:
        raise ValueError(f"support.shape={tuple(support.shape)} must be [n_atoms] with n_atoms >= 2")
    if next_probs.shape[-1] != n_atoms:
        raise ValueError(f"next_probs.shape={tuple(next_probs.shape)} must end in n_atoms={n_atoms}")
    batch_shape = next_probs.shape[:-1]
    for name, value in (("rewards", rewards), ("dones", dones)):
        ok = value.dim() == len(batch_shape) and all(
            v in (1, b) for v, b in zip(value.shape, batch_shape, strict=True)
        )
        if not ok:
            raise ValueError(
                f"{name}.shape={tuple(value.shape)} must have the dims of next_probs.shape[:-1]="
                f"{tuple(batch_shape)} (each equal or 1)"
            )
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    not_done = 1.0 - dones.to(next_probs.dtype)
    shifted = rewards.unsqueeze(-1) + gamma * not_done.unsqueeze(-1) * support  # [..., n_atoms]
    shifted = th.minimum(th.maximum(shifted, v_min), v_max)
    # in [0, n_atoms - 1]; the clamp only removes float rounding of (v_max - v_min) / delta_z
    position = ((shifted - v_min) / delta_z).clamp(0.0, n_atoms - 1.0)
    if next_probs.device.type != "cpu":
        return _project_by_shares(next_probs, position)
    # so lower + 1 is always a valid atom; a NaN position (a NaN reward) indexes atom 0 and stays NaN
    # through upper_weight, for the NaN guard to see, instead of an out-of-bounds index
    lower = position.nan_to_num(0.0).floor().clamp(max=n_atoms - 2)
    upper_weight = position - lower  # 1 when the atom sits exactly on the last support point
    lower_index = lower.long().expand(next_probs.shape)
    projected = th.zeros_like(next_probs)
    projected.scatter_add_(-1, lower_index, next_probs * (1.0 - upper_weight))
    projected.scatter_add_(-1, lower_index + 1, next_probs * upper_weight)
    return projected


def _project_by_shares(next_probs: th.Tensor, position: th.Tensor) -> th.Tensor:
    """The projection as a product with each atom's shares: atom ``j`` at ``position_j`` gives atom ``i`` the
    share ``max(0, 1 - |position_j - i|)`` of its mass, i.e. ``1 - u`` to ``floor(position_j)`` and ``u`` to
    the next atom, exactly the two weights of the scatter form (and all of it to an atom it sits on).

    The GPU path: a scatter-add on CUDA accumulates with atomics, in no fixed order, and under
    ``torch.use_deterministic_algorithms`` (a seeded BranchingIQN on CUDA) it becomes a sort-based index_put
    of dozens of small launches. This form is a few kernels and deterministic. On the CPU the scatter form
    is the faster, sequential and deterministic, so it stays there.

    :param next_probs: ``[..., n_atoms]`` probabilities.
    :param position: ``[..., n_atoms]`` (broadcastable) positions of the shifted atoms on the support, in
        ``[0, n_atoms - 1]``.
    :return: ``[..., n_atoms]`` projected probabilities.
    """
    n_atoms = next_probs.shape[-1]
    atoms = th.arange(n_atoms, device=next_probs.device, dtype=next_probs.dtype)
    shares = (position.unsqueeze(-1) - atoms).abs_().neg_().add_(1.0).clamp_(min=0.0)  # [..., j, i]
    # products and a sum over j, not a matrix product: exact float32 products on any GPU setting (a cuBLAS
    # product may run in TF32), and a reduction in a fixed order
    return (next_probs.unsqueeze(-1) * shares).sum(dim=-2)


def c51_cross_entropy(logits: th.Tensor, target_probs: th.Tensor) -> th.Tensor:
    """Cross-entropy ``-sum_k target_k * log softmax(logits)_k`` over the last (atom) dimension.

    :param logits: predicted logits ``[..., n_atoms]``.
    :param target_probs: target probabilities ``[..., n_atoms]`` (e.g. from :func:`c51_project`).
    :return: the loss per leading index, shape ``logits.shape[:-1]``.
    """
    if logits.shape != target_probs.shape:
        raise ValueError(
            f"target_probs.shape={tuple(target_probs.shape)} must equal logits.shape={tuple(logits.shape)}"
        )
    return -(target_probs * th.log_softmax(logits, dim=-1)).sum(dim=-1)


class DistributionalLoss(NamedTuple):
    """Per-sample pieces of the loss of one batch.

    :param per_sample: ``[B]`` mixed loss ``(1 − α)·L_IQN + α·L_C51`` (before importance weights).
    :param l_q: ``[B]`` IQN quantile-Huber loss (mean over ensemble heads and branches).
    :param l_c51: ``[B]`` C51 cross-entropy (mean over branches).
    :param td_abs: ``[B, NB]`` absolute per-branch TD errors (normalised scale), for PER priorities; None
        when the loss was formed for its gradient only.
    """

    per_sample: th.Tensor
    l_q: th.Tensor
    l_c51: th.Tensor
    td_abs: th.Tensor | None
