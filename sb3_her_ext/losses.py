"""Distributional TD losses: IQN's quantile-Huber loss and C51's categorical projection and cross-entropy.

All functions work on arbitrary leading dimensions (batch, branch, ensemble head, ...) and return one
loss per leading index, so the caller chooses how to weight (PER importance weights) and reduce them.
None of them synchronises with the host.
"""

from __future__ import annotations

from typing import Any

import torch as th


class _QuantileHuber(th.autograd.Function):
    """Fused quantile-Huber loss with an analytic gradient (a few passes over the ``[..., N, N']`` pairs).

    With ``delta = target_j - current_i``, ``c = clamp(delta, -kappa, kappa)`` and
    ``g = |taus_i - 1{delta < 0}| * c = taus_i * c + (1 - 2 taus_i) * min(c, 0)``, the pair loss is
    ``g * (delta - c / 2) / kappa`` and its derivative in ``delta`` is ``g / kappa``.
    """

    @staticmethod
    def forward(ctx: Any, current: th.Tensor, target: th.Tensor, taus: th.Tensor, kappa: float) -> th.Tensor:
        delta = target.unsqueeze(-2) - current.unsqueeze(-1)  # [..., N, N']
        clipped = delta.clamp(-kappa, kappa)
        taus = taus.unsqueeze(-1)
        weighted = clipped.clamp(max=0.0).mul_(1.0 - 2.0 * taus).addcmul_(clipped, taus)  # g, in place
        half_huber = delta.sub_(clipped, alpha=0.5)  # delta - c / 2 (delta is not needed any more)
        pair_sum = half_huber.mul_(weighted).sum(dim=(-2, -1))
        ctx.save_for_backward(weighted)
        ctx.scale = 1.0 / (kappa * target.shape[-1])
        ctx.shapes = (current.shape, target.shape)
        return pair_sum * ctx.scale

    @staticmethod
    def backward(ctx: Any, grad_out: th.Tensor) -> tuple[th.Tensor | None, th.Tensor | None, None, None]:
        (weighted,) = ctx.saved_tensors
        current_shape, target_shape = ctx.shapes
        grad_pairs = weighted * (grad_out * ctx.scale)[..., None, None]
        grad_current = grad_target = None
        if ctx.needs_input_grad[0]:
            grad_current = (-grad_pairs.sum(-1)).sum_to_size(current_shape)
        if ctx.needs_input_grad[1]:
            grad_target = grad_pairs.sum(-2).sum_to_size(target_shape)
        return grad_current, grad_target, None, None


def quantile_huber_loss(
    current: th.Tensor, target: th.Tensor, taus: th.Tensor, kappa: float = 1.0
) -> th.Tensor:
    """IQN's quantile-Huber loss (Dabney et al. 2018, eq. 3).

    With pairwise errors ``delta_ij = target_j - current_i``::

        loss = sum_i mean_j |taus_i - 1{delta_ij < 0}| * Huber_kappa(delta_ij) / kappa

    where ``Huber_kappa(d) = d^2 / 2`` if ``|d| <= kappa`` else ``kappa * (|d| - kappa / 2)``. Computed by a
    fused autograd function (gradients for ``current`` and ``target``; ``taus`` is treated as a constant).

    :param current: predicted quantile values ``[..., N]`` at the fractions ``taus``.
    :param target: target quantile samples ``[..., N']`` (the caller detaches them when they are a target).
    :param taus: quantile fractions of ``current``, ``[..., N]`` (broadcastable to ``current``).
    :param kappa: Huber threshold, > 0.
    :return: the loss per leading index, shape ``current.shape[:-1]`` broadcast with ``target.shape[:-1]``.
    """
    if not kappa > 0:
        raise ValueError(f"kappa={kappa} must be > 0")
    if current.dim() == 0 or target.dim() == 0:
        raise ValueError(
            f"current.shape={tuple(current.shape)} and target.shape={tuple(target.shape)} need a quantile dim"
        )
    if taus.shape[-1] != current.shape[-1]:
        raise ValueError(f"taus.shape={tuple(taus.shape)} must end in N={current.shape[-1]} like current")
    return _QuantileHuber.apply(current, target, taus.detach(), float(kappa))


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
    lower = position.floor().clamp(max=n_atoms - 2)  # so lower + 1 is always a valid atom
    upper_weight = position - lower  # 1 when the atom sits exactly on the last support point
    lower_index = lower.long().expand(next_probs.shape)
    projected = th.zeros_like(next_probs)
    projected.scatter_add_(-1, lower_index, next_probs * (1.0 - upper_weight))
    projected.scatter_add_(-1, lower_index + 1, next_probs * upper_weight)
    return projected


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
