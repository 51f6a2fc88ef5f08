"""``capture``: ``torch.cuda.graph`` with Python's cyclic garbage collector paused for the capture, one
capture at a time in the process, in the ``thread_local`` error mode.

Since torch 2.10 ``torch.cuda.graph`` no longer runs ``gc.collect()`` before a capture
(``torch.compiler.config.force_cudagraph_gc``). A collection that the capture's own allocations trigger
then frees dead objects mid-capture; a dead ``CUDAGraph`` among them destroys its executable graph, which
is not permitted while a stream captures, and the capture fails ("operation failed due to a previous
error during capture"; seen on the H200 when an earlier model with graphs was cyclic garbage).

Models trained in several threads at once (``sb3_her_ext.concurrent``) capture their graphs while other
threads run: captures take a process-wide lock (a capture registers torch's default CUDA generator, starts
from ``torch.cuda.graph``'s shared capture stream and empties the allocator's cache, none of which may
overlap another capture; the garbage collector's pause is process-wide too), and the default error mode is
``thread_local``, so another thread's allocations and syncs meanwhile neither fail nor break the capture.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["capture", "collect_garbage"]

#: one capture at a time in the process (see the module docstring)
_CAPTURE_LOCK = threading.RLock()


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, **kwargs: Any) -> Iterator[None]:
    """Capture into ``graph`` what runs inside, as ``torch.cuda.graph(graph, **kwargs)``, with the cyclic
    garbage collector off until the capture has ended (the garbage is collected later, outside it), while
    no other thread captures.

    :param graph: the graph to capture into.
    :param kwargs: other arguments of ``torch.cuda.graph`` (``pool``, ``stream``; ``capture_error_mode``,
        by default ``"thread_local"``).
    """
    kwargs.setdefault("capture_error_mode", "thread_local")
    with _CAPTURE_LOCK:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, **kwargs):
                yield
        finally:
            if was_enabled:
                gc.enable()


def collect_garbage() -> None:
    """``gc.collect()`` while no thread captures a graph (a dead graph freed mid-capture breaks it)."""
    with _CAPTURE_LOCK:
        gc.collect()
