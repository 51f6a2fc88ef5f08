"""``capture``: ``torch.cuda.graph`` with Python's cyclic garbage collector paused for the capture.

Since torch 2.10 ``torch.cuda.graph`` no longer runs ``gc.collect()`` before a capture
(``torch.compiler.config.force_cudagraph_gc``). A collection that the capture's own allocations trigger
then frees dead objects mid-capture; a dead ``CUDAGraph`` among them destroys its executable graph, which
is not permitted while a stream captures, and the capture fails ("operation failed due to a previous
error during capture"; seen on the H200 when an earlier model with graphs was cyclic garbage).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["capture"]


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, **kwargs: Any) -> Iterator[None]:
    """Capture into ``graph`` what runs inside, as ``torch.cuda.graph(graph, **kwargs)``, with the cyclic
    garbage collector off until the capture has ended (the garbage is collected later, outside it).

    :param graph: the graph to capture into.
    :param kwargs: other arguments of ``torch.cuda.graph`` (``pool``, ``stream``, ``capture_error_mode``).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    finally:
        if was_enabled:
            gc.enable()
