"""Compiled CUDA kernels for prioritized replay, hindsight injection and branch action selection.

Importing the package defines every op in ``torch.ops.cuda_ext`` with its pure-PyTorch reference; nothing
is built. The first op call on a CUDA tensor builds (first time, then cached) and loads the CUDA extension
that registers the kernels for CUDA tensors; without a GPU every op runs its reference.
:func:`backend` tells which one runs; ``python -m cuda_ext build`` builds ahead of time.

Callers use the typed wrappers re-exported here (named arguments, the replay state as one
:class:`ReplayStorage`); each calls its ``torch.ops.cuda_ext`` op.
"""

from cuda_ext.build import backend
from cuda_ext.ops_hindsight import (
    CandidateRows,
    RelabelRows,
    hindsight_forward,
    hindsight_inject,
    hindsight_track,
    magnitude_relabel,
)
from cuda_ext.ops_per import (
    per_push,
    per_sample,
    per_sample_philox,
    per_tree_rebuild,
    per_tree_refresh,
    per_update,
)
from cuda_ext.ops_select import branch_select, quantile_iqr
from cuda_ext.replay_storage import PushRows, ReplayStorage, new_tree

__all__ = [
    "CandidateRows",
    "PushRows",
    "RelabelRows",
    "ReplayStorage",
    "backend",
    "branch_select",
    "hindsight_forward",
    "hindsight_inject",
    "hindsight_track",
    "magnitude_relabel",
    "new_tree",
    "per_push",
    "per_sample",
    "per_sample_philox",
    "per_tree_rebuild",
    "per_tree_refresh",
    "per_update",
    "quantile_iqr",
]
