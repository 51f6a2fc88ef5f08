"""``torch.library.opcheck`` for every prioritized-replay op (schema, fake impl, AOT dispatch).

On CPU in CI; the same checks run on CUDA tensors (the compiled kernels) on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

import cuda_ext  # noqa: F401  (defines the ops, loads the kernels with a GPU)
from tests.cuda_ext.per_state import make_rows, make_state

OPS = torch.ops.cuda_ext
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _filled_state(device: str) -> dict:
    state = make_state(10, device=device)
    rows = make_rows(7, wants=torch.tensor([True, True, False, True, True, True, True]))
    rows = {name: value.to(device) for name, value in rows.items()}
    OPS.per_push(*_push_args(state, rows))
    OPS.per_tree_rebuild(state["tree"], torch.arange(10, device=device))
    return state


def _push_args(state: dict, rows: dict) -> tuple:
    return (
        state["obs"], state["next_obs"], state["action"], state["reward"], state["done"], state["kind"],
        state["tree"], state["head_size"], state["max_priority"],
        rows["new_obs"], rows["new_next_obs"], rows["new_action"], rows["new_reward"], rows["new_done"],
        rows["new_kind"], rows["wants"], rows["new_priority"], rows["max_multiplier"], 0.6,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_per_push(device: str) -> None:
    state = _filled_state(device)
    rows = {name: value.to(device) for name, value in make_rows(13).items()}
    torch.library.opcheck(OPS.per_push, _push_args(state, rows))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_per_tree_rebuild(device: str) -> None:
    state = _filled_state(device)
    torch.library.opcheck(OPS.per_tree_rebuild, (state["tree"], torch.tensor([3, -1, 3, 9], device=device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("capacity", [10, 5000])  # unmarked (whole-tree refresh) and marked trees
def test_opcheck_per_tree_refresh(device: str, capacity: int) -> None:
    state = make_state(capacity, device=device)
    rows = {name: value.to(device) for name, value in make_rows(7).items()}
    OPS.per_push(*_push_args(state, rows))
    torch.library.opcheck(OPS.per_tree_refresh, (state["tree"],))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_per_sample(device: str) -> None:
    state = _filled_state(device)
    uniforms = torch.rand(5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    torch.library.opcheck(OPS.per_sample, (state["tree"], state["head_size"], uniforms, 0.4))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_per_sample_philox(device: str) -> None:
    state = _filled_state(device)
    rng_state = torch.tensor([7, 3], device=device)
    torch.library.opcheck(OPS.per_sample_philox, (state["tree"], state["head_size"], rng_state, 5, 0.4))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_per_update(device: str) -> None:
    state = _filled_state(device)
    indices = torch.tensor([1, 4, 1, 9], device=device)
    td_abs = torch.tensor([0.5, 2.0, 3.0, 0.1], device=device)
    torch.library.opcheck(OPS.per_update, (state["tree"], state["max_priority"], indices, td_abs, 0.6, 1e-6))
