"""``benchmarks/train_step.py``'s matrix-product replay: what it records and that the replay rebuilds it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch as th


def _train_step_module() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "train_step.py"
    spec = importlib.util.spec_from_file_location("train_step_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


def _products() -> None:
    """Products with transposed, expanded and strided operands, an ``out=`` form and an in-between add."""
    gen = th.Generator().manual_seed(0)
    a, b = th.randn(6, 5, generator=gen), th.randn(7, 5, generator=gen)
    th.mm(a, b.t())  # transposed operand
    batch = th.randn(3, 6, 5, generator=gen)
    shared = th.randn(5, 4, generator=gen).expand(3, 5, 4)  # stride 0 in the batch dim
    out = th.empty(3, 6, 4)
    th.bmm(batch, shared, out=out)
    th.add(a, 1.0)  # not a product: not recorded
    wide = th.randn(6, 10, generator=gen)[:, ::2]  # strided columns
    th.addmm(th.randn(4, generator=gen), wide, th.randn(5, 4, generator=gen), beta=0.5)
    th.baddbmm(th.zeros(3, 6, 4), batch, shared)


def test_recorder_keeps_only_the_products_with_their_layouts_and_the_replay_rebuilds_them() -> None:
    bench = _train_step_module()
    recorder = bench.MatmulRecorder()
    with recorder:
        _products()
    names = [str(func) for func, _, _ in recorder.calls]
    assert names == ["aten.mm.default", "aten.bmm.out", "aten.addmm.default", "aten.baddbmm.default"]
    _, mm_args, _ = recorder.calls[0]
    assert mm_args[1].shape == (5, 7) and mm_args[1].stride == (1, 5)  # the transposed view, as dispatched
    _, bmm_args, bmm_kwargs = recorder.calls[1]
    assert bmm_args[1].stride == (0, 4, 1) and bmm_kwargs["out"].shape == (3, 6, 4)
    _, addmm_args, addmm_kwargs = recorder.calls[2]
    assert addmm_args[1].stride == (10, 2) and addmm_kwargs["beta"] == 0.5

    # Replaying under a second recorder dispatches the same ops with the same layouts and scalars.
    again = bench.MatmulRecorder()
    with again:
        seconds = bench.replay_matmuls(recorder.calls, passes=2)
    assert seconds > 0.0
    per_pass = len(recorder.calls)
    assert len(again.calls) == 3 * per_pass  # one warm-up pass and two timed ones
    for index, call in enumerate(again.calls):
        assert call == recorder.calls[index % per_pass]


@pytest.mark.slow
def test_without_sb3_contrib_the_qrdqn_rows_are_skipped_with_a_note(monkeypatch) -> None:  # noqa: ANN001
    bench = _train_step_module()
    monkeypatch.setitem(sys.modules, "sb3_contrib", None)  # an import of it raises ImportError
    rows = bench.bench_device("cpu", widths=[8], batch=8, steps=2, fill=64, obs_dim=4, n_quantiles=4)
    skipped = [row for row in rows if row["algorithm"] == "QRDQN"]
    assert len(skipped) == 2
    for row in skipped:
        assert "sb3-contrib" in row["skipped"] and row["grad_steps_per_s"] is None
    timed = [row for row in rows if row["algorithm"] == "BranchingIQN"]
    assert timed and all(row["grad_steps_per_s"] > 0 and "skipped" not in row for row in timed)
    assert all(row["qrdqn_over_this"] is None and row["matmul_only_over_qrdqn_step"] is None for row in rows)


def test_op_counter_counts_by_name_and_leaves_out_views() -> None:
    bench = _train_step_module()
    with bench.OpCounter() as counter:
        x = th.ones(4, 3)
        x.t().sum()
    assert counter.counts["t"] == 1 and counter.counts["sum"] == 1
    assert counter.count == sum(counter.counts.values())
    assert counter.kernel_count < counter.count  # the transpose is a view
