"""The NaN guard's masked mode on a GPU, its fused path: the guard sets the fused Adam's ``found_inf`` and
the optimizer skips a bad step on the device, inside CUDA graph replays too. A poisoned batch changes no
parameter, moment, step count or PopArt statistic, bit for bit; the error names the step; guarded and
unguarded training give the same parameters, bit for bit; no host sync inside a guarded step.

Run on a CUDA machine: ``python3 -m pytest -m gpu -q tests/sb3_her_ext/test_guard_gpu.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch as th

from cuda_ext.graph_capture import capture
from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.guard import NanGuard, NonFiniteError, skips_steps
from tests.sb3_her_ext.test_algorithm import TINY, TINY_POLICY

pytestmark = pytest.mark.gpu


def _toy() -> tuple[th.nn.Module, th.Tensor, th.optim.Optimizer]:
    """A small network, a buffer changed before the optimizer step (as PopArt's statistics are) and a
    fused, capturable Adam (BranchingIQN's optimizer with ``cuda_graph=True``)."""
    th.manual_seed(0)
    net = th.nn.Sequential(th.nn.Linear(8, 32), th.nn.ReLU(), th.nn.Linear(32, 2)).cuda()
    return net, th.zeros(3, device="cuda"), th.optim.Adam(net.parameters(), lr=1e-2, fused=True,
                                                          capturable=True)


def _step(net: th.nn.Module, stats: th.Tensor, optimizer: th.optim.Optimizer, guard: NanGuard | None,
          x: th.Tensor, y: th.Tensor) -> None:
    """One gradient step as the learner makes it: snapshot, a statistic updated from the batch, loss,
    backward, clipping, the (guarded) optimizer step."""
    if guard is not None:
        guard.snapshot([stats])
    stats.lerp_(x.mean(dim=0)[:3], 0.1)
    loss = ((net(x) - y) ** 2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = th.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    if guard is None:
        optimizer.step()
    else:
        guard.optimizer_step(optimizer, loss, grad_norm)


def _state(net: th.nn.Module, stats: th.Tensor, optimizer: th.optim.Optimizer) -> list[th.Tensor]:
    """Parameters, the statistic, moments and step counts, copied."""
    optimizer_state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, th.Tensor)]
    return [t.detach().clone() for t in (*net.parameters(), stats, *optimizer_state)]


def _graphed(step: Callable[[], None]) -> th.cuda.CUDAGraph:
    """``step`` run 3 times eagerly on a side stream, then captured."""
    side = th.cuda.Stream()
    side.wait_stream(th.cuda.current_stream())
    with th.cuda.stream(side):
        for _ in range(3):
            step()
    th.cuda.current_stream().wait_stream(side)
    graph = th.cuda.CUDAGraph()
    with capture(graph):
        step()
    return graph


def test_a_captured_guarded_step_skips_a_poisoned_batch_bit_for_bit() -> None:
    x, y = th.randn(64, 8, device="cuda"), th.randn(64, 2, device="cuda")
    guarded, unguarded, guard = _toy(), _toy(), NanGuard("cuda")
    assert not guard.immediate and skips_steps(guarded[2])
    # eager guarded steps never read the device on the host
    th.cuda.synchronize()
    th.cuda.set_sync_debug_mode("error")
    try:
        _step(*guarded, guard, x, y)
    finally:
        th.cuda.set_sync_debug_mode("default")
    _step(*unguarded, None, x, y)
    graph = _graphed(lambda: _step(*guarded, guard, x, y))
    graph_twin = _graphed(lambda: _step(*unguarded, None, x, y))
    for _ in range(5):
        graph.replay()
        graph_twin.replay()
    # the guard changes no arithmetic: the same parameters, moments and step counts, bit for bit
    for a, b in zip(_state(*guarded), _state(*unguarded), strict=True):
        assert th.equal(a, b)
    assert not hasattr(guarded[2], "found_inf")
    before = _state(*guarded)
    x[3, 1] = float("nan")  # the static batch the graph reads
    for _ in range(3):
        graph.replay()
    for a, b in zip(before, _state(*guarded), strict=True):
        assert th.equal(a, b)  # parameters, the statistic, moments and step counts
    x[3, 1] = 0.0  # a good batch again: training stays stopped until the error is read
    graph.replay()
    for a, b in zip(before, _state(*guarded), strict=True):
        assert th.equal(a, b)
    # 1 eager step, 3 warm-up steps (the capture runs nothing), 5 replays: the poisoned one is step 10
    with pytest.raises(NonFiniteError, match=r"non-finite loss at gradient step 10: that step and any later "
                       r"ones were not applied"):
        guard.raise_if_tripped()


def _lob_model(tmp_path: Path, cuda_graph: bool, nan_guard: bool = True, steps: int = 300) -> BranchingIQN:
    env = LOBVecEnv(4, device="cuda", seed=0, data="synthetic", num_steps=1500, episode_length=100)
    policy = {**TINY_POLICY, "optimizer_kwargs": {"capturable": True}}
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "device": "cuda", "policy_kwargs": policy},
                         vaccine_interval=5, cuda_graph=cuda_graph, nan_guard=nan_guard)
    return model.learn(steps)


@pytest.mark.parametrize("cuda_graph", [True, False])
def test_the_learner_skips_poisoned_steps_bit_for_bit(tmp_path: Path, cuda_graph: bool) -> None:
    """BranchingIQN's own steps (graph replays, or eager GPU steps): NaN targets change nothing, the
    optimizer's step counts included, and the error names the first poisoned step."""
    model = _lob_model(tmp_path, cuda_graph)
    guard, optimizer = model.guard, model.policy.optimizer
    assert guard is not None and not guard.immediate and skips_steps(optimizer)
    steps = int(guard.steps)
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    optimizer_before = copy.deepcopy(optimizer.state_dict()["state"])
    vaccine = model.vaccine.target_cos.clone()
    replays = model._graphed_step.replays if cuda_graph else 0
    buffer = model.replay_buffer
    buffer.rewards[: buffer.size()] = float("nan")
    model.train(12, model.batch_size)  # plain and vaccine steps
    if cuda_graph:
        assert model._graphed_step.replays > replays
    for key, value in model.policy.state_dict().items():
        assert th.equal(value, before[key]), key
    after = optimizer.state_dict()["state"]
    for key, state in optimizer_before.items():
        for name, value in state.items():
            assert th.equal(value, after[key][name]), (key, name)  # moments and step counts
    assert th.equal(vaccine, model.vaccine.target_cos)
    assert int(guard.steps) == steps + 12 and not hasattr(optimizer, "found_inf")
    with pytest.raises(NonFiniteError, match=rf"non-finite loss at gradient step {steps + 1}: that step and "
                       r"any later ones were not applied; .*last good ones \(checked finite\)"):
        model.check_finite()


def test_guarded_graphed_training_equals_unguarded_bit_for_bit(tmp_path: Path) -> None:
    guarded = _lob_model(tmp_path, cuda_graph=True, steps=600)
    unguarded = _lob_model(tmp_path, cuda_graph=True, nan_guard=False, steps=600)
    assert guarded._graphed_step.replays > 20 and guarded.guard is not None and unguarded.guard is None
    for (name, a), b in zip(guarded.policy.state_dict().items(), unguarded.policy.state_dict().values(),
                            strict=True):
        assert th.equal(a, b), name
    a, b = guarded.policy.optimizer.state_dict()["state"], unguarded.policy.optimizer.state_dict()["state"]
    for key, state in a.items():
        for name, value in state.items():
            assert th.equal(value, b[key][name]), (key, name)
