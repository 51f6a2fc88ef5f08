"""BranchingIQN's gradient steps captured in CUDA graphs (``BranchingIQN(cuda_graph=True)``).

On a GPU a gradient step is hundreds of small kernels, bound by launch overhead, not arithmetic. This module
runs a step — double-Q target, PopArt update, IQN + C51 loss, backward, gradient clipping, optimizer step —
as one graph replay. Per step, outside the graph: the prioritized batch (and, for a vaccine step, the
stratified vaccine batch) is sampled and copied into static input tensors, the step's quantile fractions are
drawn from the model's generator into static tensors (in the order the eager step draws them, so both paths
see the same numbers), and afterwards the priorities are updated and the diagnostics accumulated from the
graph's static outputs.

The :class:`~sb3_her_ext.learner.Learner` keeps two of these: one for the plain steps and one for the
vaccine steps (every ``vaccine_interval``-th), whose graph also holds the vaccine batch's loss, backward and
the GradVac correction. Each runs its first ``WARMUP_STEPS`` steps eagerly on a side stream (they are real
steps: optimizer state and library workspaces come to exist), captures the next, and replays it from then on.
A new batch size captures anew. The optimizer must be capturable (``BranchingIQN`` sets
``capturable=True`` and a tensor learning rate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch as th

from cuda_ext.graph_capture import capture, side_stream


class StaticBatch(NamedTuple):
    """The batch fields the loss reads, as static tensors the graph reads.

    :param observations: ``[B, D]``.
    :param actions: ``[B, NB]``.
    :param next_observations: ``[B, D]``.
    :param dones: ``[B, 1]``.
    :param rewards: ``[B, 1]``.
    """

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor


class StepOutputs(NamedTuple):
    """What one gradient step hands back: TD errors for the priorities, scalars for the diagnostics.

    :param td_abs_sum: ``[B]`` sum over branches of ``|δ_b|``.
    :param l_q: weighted mean IQN loss.
    :param l_c51: weighted mean C51 loss.
    :param loss: the mixed loss.
    :param mean_weight: mean importance weight.
    :param vaccine_cos: a vaccine step's cosine of the main and vaccine gradients (None on other steps).
    :param vaccine_corrected: whether a vaccine step corrected the main gradient (None on other steps).
    """

    td_abs_sum: th.Tensor
    l_q: th.Tensor
    l_c51: th.Tensor
    loss: th.Tensor
    mean_weight: th.Tensor
    vaccine_cos: th.Tensor | None = None
    vaccine_corrected: th.Tensor | None = None


class GraphedTrainStep:
    """Runs one kind of BranchingIQN gradient step (plain, or vaccine) through one captured CUDA graph.

    :param step_fn: ``step_fn(batches, weights, rands) -> StepOutputs``: one gradient step on the static
        ``batches`` (the main batch first) with importance ``weights`` of the main batch, taking its random
        fractions from the list ``rands`` in order.
    :param rand_shapes: ``rand_shapes(batch_size)``: the shapes of the step's random draws, in draw order.
    :param generator: the model's generator the draws come from.
    """

    WARMUP_STEPS = 3

    def __init__(
        self,
        step_fn: Callable[[tuple[StaticBatch, ...], th.Tensor, list[th.Tensor]], StepOutputs],
        rand_shapes: Callable[[int], list[tuple[int, ...]]],
        generator: th.Generator,
    ) -> None:
        self.step_fn = step_fn
        self.rand_shapes = rand_shapes
        self.generator = generator
        self.graph: th.cuda.CUDAGraph | None = None
        self.batches: tuple[StaticBatch, ...] = ()
        self.weights: th.Tensor | None = None
        self.rands: list[th.Tensor] = []
        self.outputs: StepOutputs | None = None
        self.warmup_left = self.WARMUP_STEPS
        #: graph replays so far (the steps that ran as one graph launch)
        self.replays = 0

    def run(self, batches: Sequence[Any], weights: th.Tensor, consume: Callable[[StepOutputs], None]) -> None:
        """One gradient step on ``batches``; ``consume`` gets its outputs on the stream that made them.

        :param batches: replay samples (SB3's field names): the main batch, then any others the step reads.
        :param weights: ``[B]`` importance weights of the main batch.
        :param consume: called with the step's outputs (priority update, diagnostics).
        """
        shapes = [tuple(batch.observations.shape) for batch in batches]
        if [tuple(static.observations.shape) for static in self.batches] != shapes:
            self._allocate(batches, weights)
        if self.graph is not None:
            self._load(batches, weights)
            self.graph.replay()
            self.replays += 1
            assert self.outputs is not None
            consume(self.outputs)
            return
        if self.warmup_left > 0:  # an eager step on a side stream, as CUDA-graph capture requires
            self.warmup_left -= 1
            side = side_stream()
            side.wait_stream(th.cuda.current_stream())
            with th.cuda.stream(side):
                self._load(batches, weights)
                consume(self._step())
            th.cuda.current_stream().wait_stream(side)
            return
        self._load(batches, weights)  # the draws happen before (outside) the capture
        graph = th.cuda.CUDAGraph()
        with capture(graph):
            self.outputs = self._step()
        self.graph = graph
        graph.replay()
        self.replays += 1
        consume(self.outputs)

    def _allocate(self, batches: Sequence[Any], weights: th.Tensor) -> None:
        """Static tensors shaped like ``batches`` (new shapes drop the captured graph)."""
        self.batches = tuple(
            StaticBatch(*(th.empty_like(getattr(batch, name)) for name in StaticBatch._fields))
            for batch in batches
        )
        self.weights = th.empty_like(weights)
        self.rands = [
            th.empty(shape, device=weights.device) for shape in self.rand_shapes(int(weights.shape[0]))
        ]
        self.graph, self.outputs, self.warmup_left = None, None, self.WARMUP_STEPS

    def _load(self, batches: Sequence[Any], weights: th.Tensor) -> None:
        """Copy the batches into the static inputs and draw this step's random fractions."""
        assert self.weights is not None
        for static_batch, batch in zip(self.batches, batches, strict=True):
            for name, static in zip(StaticBatch._fields, static_batch, strict=True):
                static.copy_(getattr(batch, name))
        self.weights.copy_(weights)
        for buffer in self.rands:
            th.rand(buffer.shape, generator=self.generator, out=buffer)

    def _step(self) -> StepOutputs:
        assert self.weights is not None
        return self.step_fn(self.batches, self.weights, list(self.rands))
