"""CUDA kernels of ``branch_select`` and ``quantile_iqr`` against their references (run on CPU copies) on
fresh random inputs of awkward sizes, and inside a captured CUDA graph. Written to run cleanly under
``compute-sanitizer --tool memcheck`` / ``racecheck``."""

from __future__ import annotations

import pytest
import torch

import cuda_ext

pytestmark = pytest.mark.gpu

ops = torch.ops.cuda_ext
F32 = torch.float32
SIZES = [1, 31, 4097, 65536]


@pytest.fixture(scope="module", autouse=True)
def _kernels_loaded() -> None:
    assert cuda_ext.backend() == "cuda", "the CUDA extension must be built and loaded on a GPU machine"
    for name in ("branch_select", "quantile_iqr"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"cuda_ext::{name}", "CUDA"), name


def select_args(n_books: int, gen: torch.Generator, n_actions: list[int], max_actions: int) -> tuple:
    n_branches = len(n_actions)
    shape = (n_books, n_branches, max_actions)
    return (
        torch.randn(shape, generator=gen), torch.rand(shape, generator=gen), torch.rand(shape, generator=gen),
        torch.tensor(n_actions), torch.linspace(0.0, 0.4, n_branches),
        torch.tensor([i % 2 == 0 for i in range(n_branches)]),
        torch.rand(n_books, n_branches, generator=gen), torch.rand(n_books, n_branches, generator=gen),
        0.3, 0.7,
    )


def near_boundary(args: tuple, rel: float = 1e-5) -> torch.Tensor:
    """``[B, NB]``: ``u_action * Σp`` lies within ``rel`` (relative) of a cumulative boundary (float64)."""
    q, iqr, ens_std, n_actions, _, _, _, u_action, alpha, beta = args
    score = q.double() + alpha * iqr.double() + beta * ens_std.double()
    valid = torch.arange(q.shape[2]) < n_actions.unsqueeze(1)
    best = torch.where(valid, score, -torch.inf).amax(-1, keepdim=True)
    worst = torch.where(valid, score, torch.inf).amin(-1, keepdim=True)
    tau = (best - worst).clamp_min(0.01)
    weight = torch.where(valid, torch.exp((score - best) / tau), 0.0)
    cumulative = weight.cumsum(-1)
    total = cumulative[..., -1:]
    target = u_action.double().unsqueeze(-1) * total
    distance = torch.where(valid, (cumulative - target).abs(), torch.inf).amin(-1)
    return distance <= rel * total.squeeze(-1)


@pytest.mark.parametrize("layout", [([3, 3, 3, 3], 3), ([3, 3, 2, 3], 3), ([5, 1, 3, 2], 5)])
@pytest.mark.parametrize("n_books", SIZES)
def test_branch_select_matches_reference(n_books: int, layout: tuple[list[int], int]) -> None:
    n_actions, max_actions = layout
    gen = torch.Generator().manual_seed(n_books + max_actions)
    args = select_args(n_books, gen, n_actions, max_actions)
    want = ops.branch_select(*args)
    got = ops.branch_select(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)).cpu()
    assert got.dtype == torch.int64 and got.shape == want.shape
    mismatch = got != want
    # Only a Boltzmann draw whose target sits within float32 rounding of a cumulative boundary may differ.
    allowed = near_boundary(args)
    assert not (mismatch & ~allowed).any(), f"{int((mismatch & ~allowed).sum())} mismatches off a boundary"
    assert int(mismatch.sum()) <= max(1, want.numel() // 10000), f"{int(mismatch.sum())} boundary mismatches"
    assert (got >= 0).all() and (got < torch.tensor(n_actions)).all()


def test_branch_select_invalid_n_actions_gives_minus_one_on_cuda() -> None:
    gen = torch.Generator().manual_seed(3)
    args = list(select_args(5, gen, [3, 3], 3))
    args[3] = torch.tensor([3, 4])
    got = ops.branch_select(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)).cpu()
    assert (got[:, 1] == -1).all() and (got[:, 0] >= 0).all()


@pytest.mark.parametrize("n_samples", [1, 2, 7, 32, 33, 64, 65, 200])
@pytest.mark.parametrize("n_books", SIZES)
def test_quantile_iqr_matches_reference(n_books: int, n_samples: int) -> None:
    if n_books == 65536 and n_samples > 64:
        n_books = 4097  # long rows through the sort path: keep the CPU reference quick
    gen = torch.Generator().manual_seed(n_books * 7 + n_samples)
    samples = torch.randn(n_books, 3, n_samples, generator=gen) * 5
    samples[0, 0, 0] = float("nan")
    want = ops.quantile_iqr(samples)
    got = ops.quantile_iqr(samples.cuda()).cpu()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert torch.isnan(got[0, 0]) and not torch.isnan(got[0, 1:]).any()


def test_quantile_iqr_non_contiguous_and_torch_quantile() -> None:
    gen = torch.Generator().manual_seed(2)
    samples = torch.randn(32, 300, generator=gen).cuda().t()  # [300, 32], rows strided
    expected = torch.quantile(samples, 0.75, dim=-1) - torch.quantile(samples, 0.25, dim=-1)
    torch.testing.assert_close(ops.quantile_iqr(samples), expected, rtol=1e-5, atol=1e-5)


def _capture(fn) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:  # noqa: ANN001
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def test_graph_branch_select() -> None:
    static = [a.cuda() if isinstance(a, torch.Tensor) else a
              for a in select_args(4097, torch.Generator().manual_seed(0), [3, 3, 2, 3], 3)]
    graph, out = _capture(lambda: ops.branch_select(*static))
    for replay in range(1, 4):
        fresh = select_args(4097, torch.Generator().manual_seed(replay), [3, 3, 2, 3], 3)
        for s, f in zip(static, fresh, strict=True):
            if isinstance(s, torch.Tensor):
                s.copy_(f)
        graph.replay()
        want = ops.branch_select(*fresh)
        mismatch = out.cpu() != want
        assert not (mismatch & ~near_boundary(fresh)).any()


@pytest.mark.parametrize("n_samples", [32, 48])
def test_graph_quantile_iqr(n_samples: int) -> None:
    static = torch.randn(4097, 12, n_samples, device="cuda")
    graph, out = _capture(lambda: ops.quantile_iqr(static))
    for replay in range(3):
        fresh = torch.randn(4097, 12, n_samples, generator=torch.Generator().manual_seed(replay))
        static.copy_(fresh)
        graph.replay()
        torch.testing.assert_close(out.cpu(), ops.quantile_iqr(fresh), rtol=1e-6, atol=1e-6)
