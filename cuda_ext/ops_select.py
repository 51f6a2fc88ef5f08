"""Define the action-selection ops ``cuda_ext::branch_select`` and ``cuda_ext::quantile_iqr``: schema,
pure-PyTorch reference and fake (shape-only) implementation.

The CUDA kernels (``csrc/select*``) register for the CUDA dispatch key when the extension is loaded.
Semantics: ``cuda_ext/README.md``; reference: :mod:`cuda_ext.reference.select`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ext._library import define_op
from cuda_ext.reference import select as ref

__all__ = ["branch_select", "quantile_iqr"]


def _fake_branch_select(*args: object) -> Tensor:
    """Fake :func:`cuda_ext.reference.select.branch_select`: validates shapes, dtypes and devices only.

    :param args: the op's arguments, in schema order.
    :return: an empty ``[B, NB] int64`` tensor.
    """
    ref.check_branch_select(*args, check_values=False)  # type: ignore[arg-type]
    q = args[0]
    return q.new_empty(q.shape[:2], dtype=torch.int64)  # type: ignore[union-attr]


def _fake_quantile_iqr(samples: Tensor) -> Tensor:
    """Fake :func:`cuda_ext.reference.select.quantile_iqr`.

    :param samples: ``[..., N] float32``.
    :return: an empty ``[...] float32`` tensor.
    """
    ref.check_quantile_iqr(samples)
    return samples.new_empty(samples.shape[:-1])


branch_select = define_op(
    "branch_select(Tensor q, Tensor iqr, Tensor ens_std, Tensor n_actions, Tensor eps, Tensor boltzmann, "
    "Tensor u_explore, Tensor u_action, float alpha, float beta) -> Tensor",
    ref.branch_select,
    _fake_branch_select,
)

quantile_iqr = define_op("quantile_iqr(Tensor samples) -> Tensor", ref.quantile_iqr, _fake_quantile_iqr)
