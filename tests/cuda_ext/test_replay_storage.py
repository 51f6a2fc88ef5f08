"""ReplayStorage allocates the layout of cuda_ext/README.md; PushRows builds and joins incoming rows."""

from __future__ import annotations

import pytest
import torch

import cuda_ext
from cuda_ext import PushRows, ReplayStorage


def test_zeros_has_the_readme_layout() -> None:
    storage = ReplayStorage.zeros(capacity=5, obs_dim=3, n_branches=4)
    expected = {
        "obs": ((5, 3), torch.float32), "next_obs": ((5, 3), torch.float32), "action": ((5, 4), torch.int64),
        "reward": ((5,), torch.float32), "done": ((5,), torch.float32), "kind": ((5,), torch.int8),
        "tree": ((16,), torch.float64), "head_size": ((2,), torch.int64),
        "max_priority": ((1,), torch.float32),
    }
    assert {name: (tuple(t.shape), t.dtype) for name, t in storage.tensors().items()} == expected
    assert storage.capacity == 5 and storage.tree_leaves == 8
    assert storage.max_priority.tolist() == [1.0] and storage.head_size.tolist() == [0, 0]
    assert float(storage.tree.abs().sum()) == 0.0


@pytest.mark.parametrize(("field", "kwargs"), [
    ("capacity", {"capacity": 0}), ("capacity", {"capacity": 2.5}), ("obs_dim", {"obs_dim": -1}),
    ("n_branches", {"n_branches": 0}), ("capacity", {"capacity": True}),
])
def test_zeros_refuses_bad_sizes(field: str, kwargs: dict) -> None:
    sizes = {"capacity": 4, "obs_dim": 3, "n_branches": 2, **kwargs}
    with pytest.raises(ValueError, match=field):
        ReplayStorage.zeros(**sizes)


def test_to_moves_every_tensor_and_push_uses_the_storage() -> None:
    storage = ReplayStorage.zeros(4, 2, 1).to("cpu")
    rows = PushRows.make(torch.ones(3, 2), torch.ones(3, 2) * 2, torch.zeros(3, 1), torch.arange(3.0),
                         torch.tensor([True, False, True]), kind=0, done=0.0, priority=0.0,
                         max_multiplier=1.0)
    slots = cuda_ext.per_push(storage, rows, alpha=0.5)
    assert slots.tolist() == [0, -1, 1] and storage.head_size.tolist() == [2, 2]
    assert storage.reward[:2].tolist() == [0.0, 2.0] and storage.next_obs[1].tolist() == [2.0, 2.0]
    cuda_ext.per_tree_rebuild(storage.tree, slots)
    assert storage.tree[1].item() == pytest.approx(2.0)  # two leaves of 1 ** 0.5


def test_push_rows_make_broadcasts_and_concat_joins() -> None:
    a = PushRows.make(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.int32),
                      torch.zeros(2, dtype=torch.float64), torch.ones(2), kind=1, done=torch.tensor([0, 1]),
                      priority=0.5, max_multiplier=3.0)
    assert a.action.dtype == torch.int64 and a.reward.dtype == torch.float32 and a.wants.dtype == torch.bool
    assert a.kind.tolist() == [1, 1] and a.done.tolist() == [0.0, 1.0] and a.priority.tolist() == [0.5, 0.5]
    assert a.max_multiplier.tolist() == [3.0, 3.0]
    joined = PushRows.concat([a, a])
    assert isinstance(joined, PushRows) and joined.obs.shape == (4, 3) and joined.kind.tolist() == [1] * 4


def test_push_joiner_gives_concat_of_make_and_keeps_its_constant_columns() -> None:
    from cuda_ext.replay_storage import PushBlock, PushJoiner

    def blocks(seed: int) -> list[PushBlock]:
        g = torch.Generator().manual_seed(seed)
        def rows(n: int) -> tuple:
            return (torch.rand(n, 3, generator=g, dtype=torch.float64), torch.rand(n, 3, generator=g),
                    torch.randint(0, 3, (n, 2), generator=g, dtype=torch.int32), torch.rand(n, generator=g))
        t = torch.tensor
        return [  # block = (rows, wants, kind, done, priority, max_multiplier)
            PushBlock(*rows(2), None, 0, t([True, False]), 0.0, 1.0),
            PushBlock(*rows(3), t([1.0, 0.0, 1.0]), 1, 1.0, 0.0, 3.0),
            PushBlock(*rows(1), t([True]), 2, 1.0, 0.25, 1.0),
            PushBlock(*rows(2), t([False, True]), 3, 1.0, t([0.5, 0.75]), 0.0),
        ]

    def made(block: PushBlock) -> PushRows:
        wants = torch.ones(block.reward.shape[0], dtype=torch.bool) if block.wants is None else block.wants
        return PushRows.make(block.obs, block.next_obs, block.action, block.reward, wants, block.kind,
                             done=block.done, priority=block.priority, max_multiplier=block.max_multiplier)

    joiner = PushJoiner()
    first, second = joiner.join(blocks(0)), joiner.join(blocks(1))
    for joined, seed in ((first, 0), (second, 1)):
        expected = PushRows.concat([made(block) for block in blocks(seed)])
        for name, want in expected._asdict().items():
            got = getattr(joined, name)
            assert got.dtype == want.dtype and torch.equal(got, want) and got.is_contiguous(), name
    # the columns of one value per block are made once: the same tensors in every push of the layout
    assert first.kind is second.kind and first.max_multiplier is second.max_multiplier
    single = joiner.join(blocks(2)[:1])  # one block: its own tensors, cast where needed
    assert single.wants.tolist() == [True, True] and single.done.tolist() == [1.0, 0.0]
    assert single.obs.dtype == torch.float32 and single.kind.tolist() == [0, 0]
    with pytest.raises(ValueError, match="blocks"):
        joiner.join([])
