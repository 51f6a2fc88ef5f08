"""``cuda_ext.graph_capture``: a capture survives dead CUDA graphs in cyclic garbage (torch 2.10+ no longer
collects them before a capture, and a collection inside one invalidates it); threads get streams no other
holder has, and a capture records on one of those, so another thread's kernels never land in its graph."""

from __future__ import annotations

import contextlib
import gc
import threading

import pytest
import torch

from cuda_ext.graph_capture import POOLED_STREAMS, capture, private_stream, side_stream, thread_streams

pytestmark = pytest.mark.gpu


class _Cycle:
    """A captured graph kept alive only by a reference cycle (as a dropped model's graphs are)."""

    def __init__(self) -> None:
        self.me = self
        x = torch.zeros(8, device="cuda")
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with capture(self.graph):
            x.add_(1)
        self.graph.replay()


def test_a_capture_is_not_invalidated_by_garbage_holding_graphs() -> None:
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)  # a collection at nearly every container allocation: inside the capture below
    try:
        for _ in range(3):
            _Cycle()  # dead at once, but only a collection frees it
        x = torch.zeros(16, device="cuda")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with capture(graph):
            for _ in range(20):
                x.add_(1)
                _ = [{"k": [i]} for i in range(50)]  # Python containers: would trigger the collector
        assert gc.isenabled()
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(x, torch.full_like(x, 40.0))
    finally:
        gc.set_threshold(*threshold)
    gc.collect()  # the dead graphs are freed now, outside any capture
    assert not [o for o in gc.get_objects() if isinstance(o, _Cycle)]


def test_the_collector_stays_off_only_during_the_capture() -> None:
    gc.disable()
    try:
        graph = torch.cuda.CUDAGraph()
        with capture(graph):
            torch.zeros(4, device="cuda").add_(1)
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


def test_private_streams_held_at_once_are_distinct_until_the_pool_is_spent() -> None:
    with contextlib.ExitStack() as stack:
        streams = [stack.enter_context(private_stream("cuda")) for _ in range(POOLED_STREAMS)]
        assert len({stream.cuda_stream for stream in streams}) == POOLED_STREAMS
        with pytest.raises(RuntimeError, match=r"all 32 pooled CUDA streams of cuda:0 are held"):
            stack.enter_context(private_stream("cuda"))
    with private_stream("cuda") as again:  # released: the pool is free again
        assert again.cuda_stream in {stream.cuda_stream for stream in streams}


def test_thread_streams_give_this_thread_its_own_main_and_side_stream() -> None:
    outside = side_stream()
    with thread_streams("cuda") as main:
        assert torch.cuda.current_stream() == main
        side = side_stream("cuda")
        assert side != main and side_stream() == side
        seen: list[torch.cuda.Stream] = []
        other = threading.Thread(target=lambda: seen.append(side_stream()))  # not inside: a pooled stream
        other.start()
        other.join()
        assert seen[0] != side
    assert torch.cuda.current_stream() != main
    assert outside != main


def test_another_threads_kernels_never_land_in_a_capture() -> None:
    """The pool handed the other thread's stream to ``torch.cuda.graph`` as its capture stream (forced here):
    the capture records on a private stream, so the other thread's 2,000 additions all run, none captured."""
    default = torch.cuda.graph.default_capture_stream
    started, done = threading.Event(), threading.Event()
    counts: list[torch.Tensor] = []

    def other() -> None:
        with thread_streams("cuda") as stream:
            torch.cuda.graph.default_capture_stream = stream
            count = torch.zeros(1, device="cuda")
            started.set()
            for _ in range(2000):
                count.add_(1)
            counts.append(count)
        done.set()

    thread = threading.Thread(target=other)
    try:
        thread.start()
        started.wait()
        mine = torch.zeros(1, device="cuda")
        graphs = []
        while not done.is_set():  # capture again and again while the other thread adds
            graph = torch.cuda.CUDAGraph()
            with capture(graph):
                mine.add_(1)
            graphs.append(graph)
        thread.join()
    finally:
        torch.cuda.graph.default_capture_stream = default
    torch.cuda.synchronize()
    assert counts[0].item() == 2000
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    assert mine.item() == len(graphs)  # each graph holds its own addition only
