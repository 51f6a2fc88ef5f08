"""The action-selection ops ``cuda_ext::branch_select`` and ``cuda_ext::quantile_iqr``: schema,
pure-PyTorch reference, fake (shape-only) implementation, and the typed wrappers of the same names.

The CUDA kernels (``csrc/select*``) register for the CUDA dispatch key when the extension is loaded.
Semantics: ``cuda_ext/README.md``; reference: :mod:`cuda_ext.reference.select`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ext._library import define_op
from cuda_ext.reference import select as ref

__all__ = ["branch_select", "quantile_iqr"]


def _fake_branch_select(
    q: Tensor, iqr: Tensor, ens_std: Tensor, n_actions: Tensor, eps: Tensor, boltzmann: Tensor,
    u_explore: Tensor, u_action: Tensor, alpha: float, beta: float,
) -> Tensor:
    """Fake :func:`cuda_ext.reference.select.branch_select`: validates shapes, dtypes and devices only.

    :param q: see the reference; the other parameters likewise.
    :return: an empty ``[B, NB] int64`` tensor.
    """
    ref.check_branch_select(q, iqr, ens_std, n_actions, eps, boltzmann, u_explore, u_action, alpha, beta,
                            check_values=False)
    return q.new_empty(q.shape[:2], dtype=torch.int64)


def _fake_quantile_iqr(samples: Tensor) -> Tensor:
    """Fake :func:`cuda_ext.reference.select.quantile_iqr`.

    :param samples: ``[..., N] float32``.
    :return: an empty ``[...] float32`` tensor.
    """
    ref.check_quantile_iqr(samples)
    return samples.new_empty(samples.shape[:-1])


_BRANCH_SELECT = define_op(
    "branch_select(Tensor q, Tensor iqr, Tensor ens_std, Tensor n_actions, Tensor eps, Tensor boltzmann, "
    "Tensor u_explore, Tensor u_action, float alpha, float beta) -> Tensor",
    ref.branch_select,
    _fake_branch_select,
)

_QUANTILE_IQR = define_op("quantile_iqr(Tensor samples) -> Tensor", ref.quantile_iqr, _fake_quantile_iqr)


def branch_select(
    q: Tensor, iqr: Tensor, ens_std: Tensor, *, n_actions: Tensor, eps: Tensor, boltzmann: Tensor,
    u_explore: Tensor, u_action: Tensor, alpha: float, beta: float,
) -> Tensor:
    """One action per book and branch: ε-greedy, Boltzmann on chosen branches (``cuda_ext::branch_select``).

    Over a branch's valid actions, ``score = (q + alpha * iqr) + beta * ens_std``; ``u_explore < eps`` picks
    uniformly with ``u_action``, else a Boltzmann branch samples with ``u_action`` and the others take the
    argmax (lowest index on ties).

    :param q: ``[B, NB, A] float32`` action values (padding beyond ``n_actions`` is never read).
    :param iqr: ``[B, NB, A] float32`` quantile IQRs.
    :param ens_std: ``[B, NB, A] float32`` ensemble standard deviations.
    :param n_actions: ``[NB] int64`` valid actions per branch, in ``[1, A]``.
    :param eps: ``[NB] float32`` per-branch ε.
    :param boltzmann: ``[NB] bool`` branches that sample from a Boltzmann distribution.
    :param u_explore: ``[B, NB] float32`` uniforms of the ε test.
    :param u_action: ``[B, NB] float32`` uniforms of the action draw.
    :param alpha: weight of the IQR bonus; finite.
    :param beta: weight of the ensemble-std bonus; finite.
    :return: ``[B, NB] int64`` actions.
    """
    return _BRANCH_SELECT(q, iqr, ens_std, n_actions, eps, boltzmann, u_explore, u_action, alpha, beta)


def quantile_iqr(samples: Tensor) -> Tensor:
    """``Q(0.75) - Q(0.25)`` over the last dimension, as ``torch.quantile`` (``cuda_ext::quantile_iqr``).

    :param samples: ``[..., N] float32``, ``N >= 1``.
    :return: ``[...] float32``.
    """
    return _QUANTILE_IQR(samples)
