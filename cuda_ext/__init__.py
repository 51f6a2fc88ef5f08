"""Compiled CUDA kernels for prioritized replay, hindsight injection and branch action selection.

Importing the package defines every op in ``torch.ops.cuda_ext`` with its pure-PyTorch reference.
(The build/load of the CUDA extension and :func:`backend` are added by ``cuda_ext.build``.)
"""

from cuda_ext import ops_hindsight, ops_per, ops_select  # noqa: F401  (define the ops)
