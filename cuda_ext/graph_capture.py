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

Streams of their own (:func:`private_stream`, :func:`thread_streams`, :func:`side_stream`):
``torch.cuda.Stream()`` hands out the 32 pooled streams of a device in turn, so two threads can be handed the
same stream, and ``torch.cuda.graph`` captures on one pooled stream shared by the whole process. A capture
records every kernel queued to its stream, whichever thread queues it: a model whose stream is the capture
stream of another loses its kernels into the other's graph. And memory freed on a stream is reused by the
next allocation on that stream, whichever thread makes it, without waiting for the work that still reads it
on another stream. So a thread training a model gets a main and a side stream that no other holder has
(:func:`thread_streams`: warm-ups run on its side stream, which only this thread uses), and each capture
records on a stream no one else holds meanwhile.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["capture", "collect_garbage", "private_stream", "side_stream", "thread_streams"]

#: one capture at a time in the process (see the module docstring)
_CAPTURE_LOCK = threading.RLock()
#: (device index, stream handle) of the streams held by :func:`private_stream` now
_HELD_STREAMS: set[tuple[int, int]] = set()
_HELD_LOCK = threading.Lock()
#: torch's pooled streams per device and priority (``c10::cuda`` ``kStreamsPerPool``)
POOLED_STREAMS = 32
#: per thread: ``{device index: side stream}`` while inside :func:`thread_streams`
_THREAD = threading.local()


@contextmanager
def private_stream(device: torch.device | str | int | None = None) -> Iterator[torch.cuda.Stream]:
    """A pooled CUDA stream of ``device`` that no other holder of a private stream has while inside.

    :param device: the CUDA device (None: the current one).
    :return: the stream (not made current).
    :raises RuntimeError: every pooled stream of the device is held (too many models at once).
    """
    with _HELD_LOCK:
        for _ in range(2 * POOLED_STREAMS):  # torch hands the pool out in turn: two rounds see every stream
            stream = torch.cuda.Stream(device=device)
            key = (stream.device_index, stream.cuda_stream)
            if key not in _HELD_STREAMS:
                _HELD_STREAMS.add(key)
                break
        else:
            held = sum(index == stream.device_index for index, _ in _HELD_STREAMS)
            raise RuntimeError(f"private_stream: all {held} pooled CUDA streams of cuda:"
                               f"{stream.device_index} are held (each model trained at once holds 2); "
                               f"train fewer models at once")
    try:
        yield stream
    finally:
        with _HELD_LOCK:
            _HELD_STREAMS.discard(key)


@contextmanager
def thread_streams(device: torch.device | str | int | None = None) -> Iterator[torch.cuda.Stream]:
    """Give this thread a main stream (made current) and a side stream (:func:`side_stream`) of its own on
    ``device`` while inside; at the end wait for both, so what they computed can be read on any stream.

    :param device: the CUDA device (None: the current one).
    :return: the main stream.
    """
    with private_stream(device) as main, private_stream(device) as side:
        main.wait_stream(torch.cuda.current_stream(main.device))  # what this thread queued before comes first
        sides = _thread_sides()
        before = sides.get(main.device_index)
        sides[main.device_index] = side
        try:
            with torch.cuda.stream(main):
                yield main
        finally:
            if before is None:
                del sides[main.device_index]
            else:
                sides[main.device_index] = before
            side.synchronize()
            main.synchronize()


def side_stream(device: torch.device | str | int | None = None) -> torch.cuda.Stream:
    """The stream for an eager warm-up before a capture: this thread's side stream inside
    :func:`thread_streams` (only this thread allocates on it, so memory freed there is not reused while
    another thread's stream still reads it), else a pooled stream as ``torch.cuda.Stream()`` gives.

    :param device: the CUDA device (None: the current one).
    """
    if device is None:
        index = torch.cuda.current_device()
    elif isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
    side = _thread_sides().get(index)
    return side if side is not None else torch.cuda.Stream(device=index)


def _thread_sides() -> dict[int, torch.cuda.Stream]:
    """This thread's ``{device index: side stream}`` (inside :func:`thread_streams`)."""
    if not hasattr(_THREAD, "sides"):
        _THREAD.sides = {}
    return _THREAD.sides


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
    with _CAPTURE_LOCK, contextlib.ExitStack() as stack:
        if kwargs.get("stream") is None:  # not torch's shared capture stream: it may be another's stream
            kwargs["stream"] = stack.enter_context(private_stream())
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
