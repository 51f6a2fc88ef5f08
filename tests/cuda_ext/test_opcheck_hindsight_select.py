"""``torch.library.opcheck`` for every hindsight and selection op: schema (mutations declared), fake tensor
kernel, autograd registration and AOT dispatch, on CPU (the references) and on CUDA (the kernels)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import cuda_ext  # noqa: F401  (defines the ops)

ops = torch.ops.cuda_ext
F32 = torch.float32
I64 = torch.int64
N_BOOKS, OBS_DIM, N_BRANCHES, N_SLOTS, CAPACITY = 37, 5, 4, 8, 50

DEVICES = [
    pytest.param("cpu"),
    pytest.param("cuda", marks=pytest.mark.gpu),
]


def _track_args(device: str, gen: torch.Generator) -> tuple:
    direction = torch.randint(-1, 2, (N_BOOKS,), generator=gen)
    mid = 100 + torch.rand(N_BOOKS, generator=gen)
    args = (
        torch.rand(N_BOOKS, 16, generator=gen), torch.randint(0, 40, (N_BOOKS,), generator=gen),
        torch.where(direction != 0, 100.0, 0.0), direction, torch.where(direction != 0, 100.5, 0.0),
        torch.where(direction != 0, 3, -1), torch.randint(-2, 3, (N_BOOKS,), generator=gen).to(F32),
        mid - 0.01, mid + 0.01, torch.randint(0, CAPACITY, (N_BOOKS,), generator=gen),
    )
    return tuple(a.to(device) for a in args)


def _inject_args(device: str, gen: torch.Generator) -> tuple:
    _, ring_len, entry_mid, direction, peak, peak_row, *_ = _track_args(device, gen)
    tensors = (
        ring_len.cpu(), entry_mid.cpu(), direction.cpu(), peak.cpu(), peak_row.cpu(),
        torch.rand(N_BOOKS, generator=gen) < 0.5, torch.rand(N_BOOKS, generator=gen) * 0.3,
        torch.ones(N_BOOKS), torch.randn(N_BOOKS, OBS_DIM, generator=gen),
        torch.randn(N_BOOKS, OBS_DIM, generator=gen),
        torch.randint(0, 3, (N_BOOKS, N_BRANCHES), generator=gen),
        torch.randn(CAPACITY, OBS_DIM, generator=gen),
    )
    return (*(t.to(device) for t in tensors), 2.0, 1.1, 1, 0, 1)


def _inject_args_all_wanted(device: str, gen: torch.Generator) -> tuple:
    """Every book closes a trade whose peak beats the threshold: every row is wanted (``CUDA_ARGS``)."""
    direction = torch.where(torch.rand(N_BOOKS, generator=gen) < 0.5, 1, -1)
    tensors = (
        torch.randint(0, 40, (N_BOOKS,), generator=gen), torch.full((N_BOOKS,), 100.0), direction,
        100.0 + 5.0 * direction.to(F32), torch.randint(0, CAPACITY, (N_BOOKS,), generator=gen),
        torch.ones(N_BOOKS, dtype=torch.bool), torch.rand(N_BOOKS, generator=gen) * 0.3, torch.ones(N_BOOKS),
        torch.randn(N_BOOKS, OBS_DIM, generator=gen), torch.randn(N_BOOKS, OBS_DIM, generator=gen),
        torch.randint(0, 3, (N_BOOKS, N_BRANCHES), generator=gen),
        torch.randn(CAPACITY, OBS_DIM, generator=gen),
    )
    return (*(t.to(device) for t in tensors), 2.0, 1.1, 1, 0, 1)


def _forward_args(device: str, gen: torch.Generator) -> tuple:
    tensors = (
        torch.rand(N_SLOTS, generator=gen) < 0.7, 100 + torch.rand(N_SLOTS, generator=gen),
        torch.randint(0, 10, (N_SLOTS,), generator=gen), torch.tensor([1, -1] * (N_SLOTS // 2)),
        torch.rand(N_SLOTS, generator=gen) * 0.1, torch.ones(N_SLOTS),
        torch.randint(0, N_BOOKS, (N_SLOTS,), generator=gen), torch.randn(N_SLOTS, OBS_DIM, generator=gen),
        torch.randint(0, 3, (N_SLOTS, N_BRANCHES), generator=gen), torch.tensor([5]), torch.tensor([12]),
        100 + torch.randn(N_BOOKS, generator=gen), torch.rand(N_BOOKS, generator=gen) < 0.1,
        torch.rand(N_BOOKS, generator=gen) < 0.3, 100 + torch.rand(N_BOOKS, generator=gen),
        torch.randint(-1, 2, (N_BOOKS,), generator=gen), torch.rand(N_BOOKS, generator=gen),
        torch.ones(N_BOOKS), torch.randn(N_BOOKS, OBS_DIM, generator=gen),
        torch.randint(0, 3, (N_BOOKS, N_BRANCHES), generator=gen),
    )
    return (*(t.to(device) for t in tensors), 4, 1.0, 0.5, 0)


def _relabel_args(device: str, gen: torch.Generator) -> tuple:
    tensors = (
        torch.rand(N_BOOKS, generator=gen) < 0.5, torch.randn(N_BOOKS, OBS_DIM, generator=gen),
        torch.randn(N_BOOKS, OBS_DIM, generator=gen),
        torch.randint(0, 3, (N_BOOKS, N_BRANCHES), generator=gen),
        torch.randn(N_BOOKS, generator=gen), torch.tensor([0.25, 0.5, 1.0]),
    )
    return (*(t.to(device) for t in tensors), 1)


def _relabel_args_all_wanted(device: str, gen: torch.Generator) -> tuple:
    """Every book closes a trade with a valid magnitude, so every row is wanted (see ``CUDA_ARGS``)."""
    args = _relabel_args(device, gen)
    return (torch.ones(N_BOOKS, dtype=torch.bool, device=device), *args[1:])


def _select_args(device: str, gen: torch.Generator) -> tuple:
    shape = (N_BOOKS, N_BRANCHES, 3)
    tensors = (
        torch.randn(shape, generator=gen), torch.rand(shape, generator=gen), torch.rand(shape, generator=gen),
        torch.tensor([3, 3, 2, 3]), torch.tensor([0.1, 0.0, 0.5, 0.2]),
        torch.tensor([True, False, True, False]),
        torch.rand(N_BOOKS, N_BRANCHES, generator=gen), torch.rand(N_BOOKS, N_BRANCHES, generator=gen),
    )
    return (*(t.to(device) for t in tensors), 0.5, 0.25)


def _iqr_args(device: str, gen: torch.Generator) -> tuple:
    return (torch.randn(N_BOOKS, N_BRANCHES, 3, 32, generator=gen).to(device),)


def _iqr_long_args(device: str, gen: torch.Generator) -> tuple:
    return (torch.randn(7, 100, generator=gen).to(device),)


CASES: dict[str, tuple[Callable, Callable]] = {
    "hindsight_track": (lambda: ops.hindsight_track, _track_args),
    "hindsight_inject": (lambda: ops.hindsight_inject, _inject_args),
    "hindsight_forward": (lambda: ops.hindsight_forward, _forward_args),
    "magnitude_relabel": (lambda: ops.magnitude_relabel, _relabel_args),
    "branch_select": (lambda: ops.branch_select, _select_args),
    "quantile_iqr": (lambda: ops.quantile_iqr, _iqr_args),
    "quantile_iqr_long_rows": (lambda: ops.quantile_iqr, _iqr_long_args),
}


#: On CUDA the observation rows of unwanted rows of these ops are unspecified (never written, see
#: cuda_ext/README.md), and opcheck compares whole outputs of separate runs: their CUDA cases want every row.
CUDA_ARGS: dict[str, Callable] = {
    "hindsight_inject": _inject_args_all_wanted,
    "magnitude_relabel": _relabel_args_all_wanted,
}


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_opcheck(case: str, device: str) -> None:
    op, make_args = CASES[case]
    if device == "cuda":
        make_args = CUDA_ARGS.get(case, make_args)
    gen = torch.Generator().manual_seed(7)
    args = make_args(device, gen)
    torch.library.opcheck(op(), args)


@pytest.mark.parametrize("case", sorted(CUDA_ARGS))
def test_all_wanted_cases_want_every_row(case: str) -> None:
    """The CUDA opcheck inputs of the ops with unspecified unwanted rows do make every row wanted."""
    op, _ = CASES[case]
    outputs = op()(*CUDA_ARGS[case]("cpu", torch.Generator().manual_seed(7)))
    wants = outputs[4] if case == "hindsight_inject" else outputs[5]
    assert bool(wants.all()) and int(outputs[-1]) == wants.numel()
