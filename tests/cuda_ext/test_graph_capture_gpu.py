"""``cuda_ext.graph_capture.capture``: a capture survives dead CUDA graphs in cyclic garbage (torch 2.10+
no longer collects them before a capture, and a collection inside one invalidates it)."""

from __future__ import annotations

import gc

import pytest
import torch

from cuda_ext.graph_capture import capture

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
