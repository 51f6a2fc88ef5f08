"""Compiled CUDA kernels for prioritized replay, hindsight injection and branch action selection.

Importing the package defines every op in ``torch.ops.cuda_ext`` with its pure-PyTorch reference, then,
when a GPU is present, builds (first use, cached) and loads the CUDA extension that registers the kernels
for CUDA tensors. Without a GPU it says so once and every op runs its reference.
:func:`backend` tells which one runs; ``python -m cuda_ext build`` builds ahead of time.
"""

from cuda_ext import ops_hindsight, ops_per, ops_select  # noqa: F401  (define the ops first)
from cuda_ext.build import backend, load_if_possible

load_if_possible()

__all__ = ["backend", "ops_hindsight", "ops_per", "ops_select"]
