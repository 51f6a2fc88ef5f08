"""The one ``torch.library.Library`` that defines every ``cuda_ext`` op.

Op modules (``ops_per``, ``ops_hindsight``, ``ops_select``) call :func:`define_op` with the schema,
the pure-PyTorch reference (registered for every device as ``CompositeExplicitAutograd``) and the
fake (shape-only) implementation. CUDA kernels are registered from C++ with
``TORCH_LIBRARY_IMPL(cuda_ext, CUDA, m)`` and take precedence on CUDA tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "cuda_ext"
LIB = torch.library.Library(NAMESPACE, "DEF")


def define_op(schema: str, reference: Callable, fake: Callable) -> Callable:
    """Define ``cuda_ext::<name>`` from ``schema`` and register its reference and fake implementations.

    :param schema: the op schema, e.g. ``"quantile_iqr(Tensor samples) -> Tensor"``.
    :param reference: pure-PyTorch implementation with the schema's signature.
    :param fake: shape-only implementation used under ``FakeTensorMode`` / ``torch.compile``.
    :return: the op handle ``torch.ops.cuda_ext.<name>``.
    """
    name = schema.split("(", 1)[0].strip()
    LIB.define(schema)
    LIB.impl(name, reference, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIB)
    return getattr(getattr(torch.ops, NAMESPACE), name)
