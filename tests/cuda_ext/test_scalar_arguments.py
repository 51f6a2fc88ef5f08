"""Float scalar arguments of the ops: NaN, infinities and out-of-range values raise a ``ValueError`` naming
the argument (a NaN threshold or exponent would switch a kernel's comparisons off without a word)."""

from __future__ import annotations

import pytest
import torch

import cuda_ext  # noqa: F401  (defines the ops)
from tests.cuda_ext.per_state import make_rows, make_state, push
from tests.cuda_ext.test_opcheck_hindsight_select import _forward_args, _inject_args, _select_args

OPS = torch.ops.cuda_ext
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("alpha", [NAN, INF, -0.1])
def test_per_push_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha="):
        push(make_state(8), make_rows(4), alpha=alpha)


def _filled_state() -> dict:
    state = make_state(16)
    OPS.per_tree_rebuild(state["tree"], push(state, make_rows(6)))
    return state


@pytest.mark.parametrize("beta", [NAN, -INF, -0.1, 1.5])
def test_per_sample_beta(beta: float) -> None:
    state = _filled_state()
    with pytest.raises(ValueError, match="beta="):
        OPS.per_sample(state["tree"], state["head_size"], torch.rand(4, dtype=torch.float64), beta)


@pytest.mark.parametrize(("alpha", "eps", "name"), [
    (NAN, 1e-6, "alpha"), (-1.0, 1e-6, "alpha"), (0.6, NAN, "eps"), (0.6, -1e-3, "eps"), (0.6, INF, "eps"),
])
def test_per_update_alpha_and_eps(alpha: float, eps: float, name: str) -> None:
    state = _filled_state()
    before = state["tree"].clone()
    with pytest.raises(ValueError, match=f"{name}="):
        OPS.per_update(state["tree"], state["max_priority"], torch.tensor([0, 1]), torch.tensor([0.5, 0.2]),
                       alpha, eps)
    assert torch.equal(state["tree"], before)  # refused before anything was written


@pytest.mark.parametrize(("position", "name", "value"), [
    (12, "reward_scale", NAN), (12, "reward_scale", 0.0), (12, "reward_scale", INF),
    (13, "threshold", NAN), (13, "threshold", -INF),
])
def test_hindsight_inject_scalars(position: int, name: str, value: float) -> None:
    args = list(_inject_args("cpu", torch.Generator().manual_seed(0)))
    args[position] = value
    with pytest.raises(ValueError, match=f"{name}="):
        OPS.hindsight_inject(*args)


@pytest.mark.parametrize(("position", "name", "value"), [
    (21, "threshold", NAN), (21, "threshold", INF), (22, "reward_scale", NAN), (22, "reward_scale", -1.0),
])
def test_hindsight_forward_scalars(position: int, name: str, value: float) -> None:
    args = list(_forward_args("cpu", torch.Generator().manual_seed(0)))
    args[position] = value
    with pytest.raises(ValueError, match=f"{name}="):
        OPS.hindsight_forward(*args)


@pytest.mark.parametrize(("position", "name"), [(8, "alpha"), (9, "beta")])
@pytest.mark.parametrize("value", [NAN, INF])
def test_branch_select_bonus_weights(position: int, name: str, value: float) -> None:
    args = list(_select_args("cpu", torch.Generator().manual_seed(0)))
    args[position] = value
    with pytest.raises(ValueError, match=f"{name}="):
        OPS.branch_select(*args)


def test_good_scalars_still_pass() -> None:
    state = _filled_state()
    OPS.per_sample(state["tree"], state["head_size"], torch.rand(4, dtype=torch.float64), 1.0)
    OPS.per_update(state["tree"], state["max_priority"], torch.tensor([0]), torch.tensor([0.5]), 0.0, 0.0)
    OPS.hindsight_inject(*_inject_args("cpu", torch.Generator().manual_seed(0)))
    OPS.hindsight_forward(*_forward_args("cpu", torch.Generator().manual_seed(0)))
    assert OPS.branch_select(*_select_args("cpu", torch.Generator().manual_seed(0))).shape[1] == 4
