"""The one ``torch.library.Library`` that defines every ``cuda_ext`` op.

Op modules (``ops_per``, ``ops_hindsight``, ``ops_select``) call :func:`define_op` with the schema,
the pure-PyTorch reference (registered for every device as ``CompositeExplicitAutograd``) and the
fake (shape-only) implementation. CUDA kernels are registered from C++ with
``TORCH_LIBRARY_IMPL(cuda_ext, CUDA, m)`` and take precedence on CUDA tensors once the extension is loaded,
which happens on the first call of any op on a CUDA tensor (:func:`cuda_ext.build.ensure_loaded`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from cuda_ext import build

NAMESPACE = "cuda_ext"
LIB = torch.library.Library(NAMESPACE, "DEF")


def _first_call_on_cuda(args: tuple) -> bool:
    """Whether no load was attempted yet and this call's tensors are on a CUDA device."""
    if build.load_attempted:
        return False
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return tensor is not None and tensor.is_cuda


def define_op(schema: str, reference: Callable, fake: Callable) -> Callable:
    """Define ``cuda_ext::<name>`` from ``schema`` and register its reference and fake implementations.

    The registered reference loads the CUDA extension on the op's first call on a CUDA tensor and, when it
    loaded, dispatches that call again so the kernel runs it: importing the package builds nothing.

    :param schema: the op schema, e.g. ``"quantile_iqr(Tensor samples) -> Tensor"``.
    :param reference: pure-PyTorch implementation with the schema's signature.
    :param fake: shape-only implementation used under ``FakeTensorMode`` / ``torch.compile``.
    :return: the op handle ``torch.ops.cuda_ext.<name>``.
    """
    name = schema.split("(", 1)[0].strip()
    LIB.define(schema)
    op = getattr(getattr(torch.ops, NAMESPACE), name)

    @functools.wraps(reference)
    def reference_or_first_load(*args: object) -> object:
        if _first_call_on_cuda(args) and build.load_if_possible():
            return op(*args)  # the kernel is registered now
        return reference(*args)

    LIB.impl(name, reference_or_first_load, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIB)
    return op
