"""The compiled and CUDA-graphed step of the core: :class:`AcceleratedStep` (a base of
:class:`~foxenv.core.BatchedLOB`) routes a step through ``torch.compile`` and CUDA graphs when they are
enabled, and :class:`PackedOutputs` hands out copies of a captured step's outputs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from foxenv.spec import ACTION_NVEC

if TYPE_CHECKING:
    from foxenv.core import AutoresetResult, StepOutputs


class AcceleratedStep:
    """The step machinery of :class:`~foxenv.core.BatchedLOB`: eager, compiled (:meth:`enable_compile`)
    or replayed from a CUDA graph (:meth:`enable_cuda_graph`). The core provides ``_advance`` (the step),
    ``_advance_autoreset`` (the step with the reset fused in), its state accessors and ``device``.
    """

    device: torch.device
    num_books: int

    def _init_acceleration(self) -> None:
        """Start eager: no compiled step, no graph."""
        self._graph: torch.cuda.CUDAGraph | None = None  # the captured step (enable_cuda_graph)
        self._autoreset_graph: torch.cuda.CUDAGraph | None = None  # the captured step with autoreset
        self._compiled_advance: Any = None  # set by enable_compile, as is the one below
        self._compiled_advance_autoreset: Any = None
        self._graph_state: dict[str, torch.Tensor] = {}
        self._graph_outputs: PackedOutputs | None = None
        self._autoreset_outputs: PackedOutputs | None = None
        self._graph_action = torch.empty(0)
        self._graph_offsets = torch.empty(0)

    # what the core provides
    def _advance(self, action: torch.Tensor) -> StepOutputs:
        """The step on a validated action (no host sync). Provided by the core."""
        raise NotImplementedError

    def _advance_autoreset(self, action: torch.Tensor, offsets: torch.Tensor) -> AutoresetResult:
        """The step with the reset of finished books to ``offsets`` fused in. Provided by the core."""
        raise NotImplementedError

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """The packed per-book state tensors. Provided by the core."""
        raise NotImplementedError

    def _set_state_tensors(self, state: dict[str, torch.Tensor]) -> None:
        """Point the packed per-book state at ``state``'s tensors. Provided by the core."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """A copy of the state. Provided by the core."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`. Provided by the core."""
        raise NotImplementedError

    def _run_step(
        self, action: torch.Tensor
    ) -> StepOutputs:
        """One step on a validated action: the graph's replay when captured, else :meth:`_step_fn`."""
        if self._graph is None:
            return self._step_fn(action)
        assert self._graph_outputs is not None
        self._graph_action.copy_(action)
        self._graph.replay()
        return self._graph_outputs.copies()

    def _step_fn(
        self, action: torch.Tensor
    ) -> StepOutputs:
        """The compiled step when :meth:`enable_compile` made one, else :meth:`_advance`."""
        if self._compiled_advance is None:
            return self._advance(action)
        return self._compiled_advance(action)

    def _advance_autoreset_fn(
        self, action: torch.Tensor, offsets: torch.Tensor
    ) -> AutoresetResult:
        """The compiled :meth:`_advance_autoreset` when :meth:`enable_compile` made one, else the eager
        one."""
        if self._compiled_advance_autoreset is None:
            return self._advance_autoreset(action, offsets)
        return self._compiled_advance_autoreset(action, offsets)

    def _pin_state(self) -> None:
        """With a CUDA graph, copy the state into the graph's static input tensors and point at them."""
        if self._graph is None:
            return
        for key, value in self._state_tensors().items():
            self._graph_state[key].copy_(value)
        self._set_state_tensors(self._graph_state)

    # ------------------------------------------------------------------ compiled step

    def enable_compile(self, **compile_options: Any) -> None:
        """Compile the step with ``torch.compile`` (opt-in), fusing its ~200 small tensor ops into a few
        generated kernels: on a CPU the eager step is bound by per-op overhead, so this is several times
        faster (see ``benchmarks/core_ops.py``). :meth:`step_autoreset` gets its step and reset compiled
        together. Needs a working C++ compiler on the CPU (Triton on CUDA) and takes seconds to compile on
        the first step (of each of ``step`` and ``step_autoreset``).

        Results match the eager step up to floating-point rounding: the generated code may fuse a
        multiply and an add (one rounding instead of two), so float outputs can differ in the last bits;
        masks, integers and state transitions follow the same formulas. Call it before
        :meth:`enable_cuda_graph` to capture the compiled step.

        :param compile_options: passed to ``torch.compile``; defaults: ``dynamic=False`` (``B`` is fixed) and,
            on a CPU, ``options={"cpp_wrapper": True}``.
        :raises ValueError: when a CUDA graph was already captured (it holds the eager step).
        """
        if self._graph is not None:
            raise ValueError(
                "enable_compile must come before enable_cuda_graph (the graph holds the eager step)"
            )
        if self._compiled_advance is not None:
            return
        defaults: dict[str, Any] = {"dynamic": False}
        if self.device.type == "cpu":  # C++ instead of Python glue between the generated kernels
            defaults["options"] = {"cpp_wrapper": True}
        options = {**defaults, **compile_options}
        # Each is compiled on its first call (of step, of step_autoreset(host_sync=False)). The reset of
        # step_autoreset(host_sync=True) stays eager: it runs only at episode ends, where a compile of
        # seconds at the first one would cost more than it saves.
        self._compiled_advance = torch.compile(self._advance, **options)
        self._compiled_advance_autoreset = torch.compile(self._advance_autoreset, **options)

    # ------------------------------------------------------------------ CUDA graph

    def enable_cuda_graph(self) -> None:
        """Capture :meth:`step` and :meth:`step_autoreset`'s fused step-and-reset (``host_sync=False``) in
        CUDA graphs, so each later step is one graph launch (CUDA only).

        The environment's state is unchanged by the capture (it must be a valid one: take it right after a
        reset). After it, ``step`` copies the action into a static buffer, replays the graph and returns
        copies of the outputs (so they stay valid): the graph packs them into one buffer per dtype, so that
        is a few copies, not one per output. ``step_autoreset`` also draws the start offsets into a static
        buffer before its replay (the draw stays outside the graph: no generator state is captured).
        ``reset`` and ``load_state_dict`` copy the new state into the graphs' static tensors, which both
        graphs share. Action validation still follows ``validate_actions``.

        :raises ValueError: when the env is not on a CUDA device.
        """
        if self.device.type != "cuda":
            raise ValueError(f"device={self.device}: enable_cuda_graph needs a CUDA device")
        if self._graph is not None:
            return
        saved = self.state_dict()
        action = torch.ones(self.num_books, len(ACTION_NVEC), dtype=torch.int64, device=self.device)
        offsets = torch.zeros(self.num_books, dtype=torch.int64, device=self.device)
        side_stream = torch.cuda.Stream(device=self.device)
        side_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side_stream):
            for _ in range(3):  # warm up caches, the allocator and compilation outside the capture
                self.load_state_dict(saved)  # from a valid state each time: no book steps past its end
                self._step_fn(action)
                self.load_state_dict(saved)
                self._advance_autoreset_fn(action, offsets)
        torch.cuda.current_stream(self.device).wait_stream(side_stream)
        self.load_state_dict(saved)
        static_state = self._state_tensors()
        graph, self._graph_outputs = self._capture(lambda: self._step_fn(action), static_state)
        self._autoreset_graph, self._autoreset_outputs = self._capture(
            lambda: self._advance_autoreset_fn(action, offsets), static_state
        )
        self._graph_action = action
        self._graph_offsets = offsets
        self._graph_state = static_state
        self._graph = graph

    def _capture(
        self, step: Callable[[], tuple], static_state: dict[str, torch.Tensor]
    ) -> tuple[torch.cuda.CUDAGraph, PackedOutputs]:
        """Capture ``step()`` (which reads the state from ``static_state``) in a CUDA graph that also writes
        the new state back into ``static_state`` and packs the outputs.

        :param step: the step on static inputs.
        :param static_state: the state tensors the graph reads and writes (the env points at them after).
        :return: the graph and its packed outputs.
        """
        graph = torch.cuda.CUDAGraph()
        # no cyclic GC inside the capture: it could free a dead graph there and invalidate this one (torch
        # 2.10+ no longer collects before a capture; cuda_ext.graph_capture does the same for the learner)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph):
                outputs = PackedOutputs(step())
                for key, value in self._state_tensors().items():
                    static_state[key].copy_(value)
        finally:
            if collecting:
                gc.enable()
        self._set_state_tensors(static_state)
        return graph, outputs


class PackedOutputs:
    """The outputs of a captured step (a tuple of tensors and ``dict[str, Tensor]``), packed when captured
    into one flat buffer per dtype. :meth:`copies` clones those few buffers and hands out views of the
    clones in the outputs' structure: a handful of copy kernels per step instead of one per output (~25).

    :param outputs: the step's outputs (built inside the graph capture, or anywhere, for a test).
    """

    def __init__(self, outputs: tuple) -> None:
        tensors: list[torch.Tensor] = []
        self._structure: list[tuple[str, ...] | None] = []  # the keys of a dict, or None for a tensor
        for item in outputs:
            if isinstance(item, dict):
                self._structure.append(tuple(item))
                tensors.extend(item.values())
            else:
                self._structure.append(None)
                tensors.append(item)
        self._dtypes = list(dict.fromkeys(tensor.dtype for tensor in tensors))
        groups: list[list[torch.Tensor]] = [[] for _ in self._dtypes]
        self._order: list[tuple[int, int]] = []  # (dtype group, index in group) of each tensor
        for tensor in tensors:
            group = self._dtypes.index(tensor.dtype)
            self._order.append((group, len(groups[group])))
            groups[group].append(tensor)
        self._shapes = [[tensor.shape for tensor in group] for group in groups]
        self._sizes = [[tensor.numel() for tensor in group] for group in groups]
        #: One flat buffer per dtype holding every output of that dtype.
        self.buffers = [torch.cat([tensor.reshape(-1) for tensor in group]) for group in groups]

    def copies(self) -> tuple:
        """Copies of the packed outputs, in the structure they were given in.

        :return: a tuple of tensors and dicts of tensors (views of one fresh buffer per dtype).
        """
        parts = []
        for buffer, sizes, shapes in zip(self.buffers, self._sizes, self._shapes, strict=True):
            pieces = buffer.clone().split(sizes)
            parts.append([p if p.shape == s else p.view(s) for p, s in zip(pieces, shapes, strict=True)])
        tensors = iter([parts[group][index] for group, index in self._order])
        return tuple(
            next(tensors) if keys is None else {key: next(tensors) for key in keys}
            for keys in self._structure
        )
