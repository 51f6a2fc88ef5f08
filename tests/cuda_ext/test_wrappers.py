"""The typed wrappers: one per registered op, documented, calling the op (torch.compile traces them whole)."""

from __future__ import annotations

import inspect

import torch

import cuda_ext

OP_NAMES = (
    "per_push", "per_tree_rebuild", "per_tree_refresh", "per_sample", "per_sample_philox", "per_update",
    "hindsight_track", "hindsight_inject", "hindsight_forward", "magnitude_relabel", "branch_select",
    "quantile_iqr",
)


def test_every_registered_op_has_a_documented_wrapper() -> None:
    registered = {name for name in dir(torch.ops.cuda_ext) if not name.startswith("_")}
    assert registered >= set(OP_NAMES)
    for name in OP_NAMES:
        wrapper = getattr(cuda_ext, name)
        assert inspect.isfunction(wrapper), name
        assert wrapper.__doc__ and f"cuda_ext::{name}" in wrapper.__doc__, name


def test_hindsight_wrappers_take_keywords_only() -> None:
    for name in ("hindsight_track", "hindsight_inject", "hindsight_forward", "magnitude_relabel"):
        kinds = {p.kind for p in inspect.signature(getattr(cuda_ext, name)).parameters.values()}
        assert kinds == {inspect.Parameter.KEYWORD_ONLY}, name


def _sample_and_relabel(tree: torch.Tensor, head_size: torch.Tensor, uniforms: torch.Tensor) -> tuple:
    indices, weights = cuda_ext.per_sample(tree, head_size, uniforms, beta=0.4)
    rows = cuda_ext.magnitude_relabel(
        trade_closed=torch.ones(2, dtype=torch.bool), obs=torch.zeros(2, 3), next_obs=torch.zeros(2, 3),
        action=torch.zeros(2, 4, dtype=torch.int64), reward=torch.ones(2),
        magnitudes=torch.tensor([0.25, 0.5, 1.0]), magnitude_branch=1,
    )
    return indices, weights, rows.reward, rows.count


def test_wrappers_compile_in_one_graph_and_agree_with_eager() -> None:
    storage = cuda_ext.ReplayStorage.zeros(4, 3, 4)
    storage.tree[4:8] = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    cuda_ext.per_tree_rebuild(storage.tree, torch.arange(4))
    storage.head_size.copy_(torch.tensor([0, 4]))
    uniforms = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    compiled = torch.compile(_sample_and_relabel, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(storage.tree, storage.head_size, uniforms),
                         _sample_and_relabel(storage.tree, storage.head_size, uniforms), strict=True):
        assert torch.equal(got, want)
