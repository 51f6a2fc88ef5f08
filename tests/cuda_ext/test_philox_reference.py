"""The Philox4x32-10 reference and ``per_sample_philox`` on CPU: known-answer vectors, the draw layout,
and the op as ``per_sample`` of those draws with a counter that advances once per call."""

from __future__ import annotations

import pytest
import torch

import cuda_ext
from cuda_ext.ops_per import new_tree
from cuda_ext.reference import per as reference
from cuda_ext.reference.philox import philox4x32_10, philox_uniforms
from tests.cuda_ext.per_state import full_rebuild

MASK32 = 0xFFFFFFFF

#: Random123's published known-answer vectors (its tests/kat_vectors): counter, key, output words.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK32,) * 4, (MASK32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_philox_matches_random123_known_answers(counter: tuple, key: tuple, expected: tuple) -> None:
    out = philox4x32_10(torch.tensor(counter), torch.tensor(key))
    assert out.tolist() == list(expected)


def test_philox_broadcasts_over_rows() -> None:
    counters = torch.tensor([c for c, _, _ in KNOWN_ANSWERS])
    keys = torch.tensor([k for _, k, _ in KNOWN_ANSWERS])
    assert philox4x32_10(counters, keys).tolist() == [list(e) for _, _, e in KNOWN_ANSWERS]


def _tree_from_leaves(leaves: list[float], capacity: int) -> torch.Tensor:
    tree = new_tree(capacity)
    n_leaves = tree.shape[0] // 2
    tree[n_leaves : n_leaves + len(leaves)] = torch.tensor(leaves, dtype=torch.float64)
    return full_rebuild(tree)


def _uniform_from_words(x0: int, x1: int) -> float:
    return ((x0 >> 5) * 2**26 + (x1 >> 6)) / 2**53  # exact: a 53-bit integer over a power of two


def test_first_draw_of_seed_0_counter_0_is_the_zero_vector_answer() -> None:
    u = philox_uniforms(torch.tensor([0, 0]), 1)
    assert u.dtype == torch.float64
    assert u.item() == _uniform_from_words(0x6627E8D5, 0xE169C58D)


@pytest.mark.parametrize("seed", [0, 12345, -1, -(2**63), 2**63 - 1])
@pytest.mark.parametrize("counter", [0, 7, 2**32 - 1, 2**32, -5])
def test_draw_layout_index_and_counter_words(seed: int, counter: int) -> None:
    """Draw ``i`` = Philox of words (lo(i), hi(i), lo(counter), hi(counter)) under (lo(seed), hi(seed)),
    as two's complement words of the int64 values."""
    n = 5
    draws = philox_uniforms(torch.tensor([seed, counter]), n)
    seed_u, counter_u = seed & (2**64 - 1), counter & (2**64 - 1)
    for i in range(n):
        words = philox4x32_10(
            torch.tensor([i & MASK32, i >> 32, counter_u & MASK32, counter_u >> 32]),
            torch.tensor([seed_u & MASK32, seed_u >> 32]),
        ).tolist()
        assert draws[i].item() == _uniform_from_words(words[0], words[1])


def test_draws_look_uniform_and_distinct() -> None:
    draws = philox_uniforms(torch.tensor([42, 3]), 200_000)
    assert 0.0 <= draws.min().item() and draws.max().item() < 1.0
    # mean 1/2 and variance 1/12 within 5 standard errors
    assert abs(draws.mean().item() - 0.5) < 5 * (1 / 12 / 200_000) ** 0.5
    assert abs(draws.var().item() - 1 / 12) < 5 * (1 / 180 / 200_000) ** 0.5
    assert torch.unique(draws).numel() == draws.numel()
    other = philox_uniforms(torch.tensor([42, 4]), 200_000)  # the next counter: different numbers
    assert not torch.isin(draws, other).any()


def test_per_sample_philox_is_per_sample_of_the_draws_and_advances_the_counter() -> None:
    tree = _tree_from_leaves([0.5, 0.0, 2.0, 1.0, 0.25, 3.0], capacity=6)
    head_size = torch.tensor([0, 6])
    rng_state = torch.tensor([2024, 9])
    for call in range(3):
        draws = philox_uniforms(torch.tensor([2024, 9 + call]), 7)
        expected = reference.per_sample(tree, head_size, draws, 0.4)
        indices, weights = cuda_ext.per_sample_philox(tree, head_size, rng_state, 7, 0.4)
        assert torch.equal(indices, expected[0])
        assert torch.equal(weights, expected[1])
        assert rng_state.tolist() == [2024, 10 + call]
        assert (indices != 1).all()  # the zero-priority leaf is never drawn


def test_per_sample_philox_batch_0_returns_empty_and_still_advances() -> None:
    tree = _tree_from_leaves([1.0, 2.0], capacity=2)
    rng_state = torch.tensor([1, 1])
    indices, weights = cuda_ext.per_sample_philox(tree, torch.tensor([0, 2]), rng_state, 0, 0.4)
    assert indices.shape == (0,) and indices.dtype == torch.int64
    assert weights.shape == (0,) and weights.dtype == torch.float32
    assert rng_state.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("rng_state", "batch_size", "beta", "match"),
    [
        (torch.tensor([1.0, 2.0]), 3, 0.4, "rng_state.dtype"),
        (torch.tensor([1, 2, 3]), 3, 0.4, "rng_state.shape"),
        (torch.tensor([1, 2]), -1, 0.4, "batch_size=-1"),
        (torch.tensor([1, 2]), 3, 1.5, "beta"),
    ],
)
def test_per_sample_philox_bad_arguments_name_the_field(
    rng_state: torch.Tensor, batch_size: int, beta: float, match: str
) -> None:
    tree = _tree_from_leaves([1.0, 2.0], capacity=2)
    with pytest.raises(ValueError, match=match):
        cuda_ext.per_sample_philox(tree, torch.tensor([0, 2]), rng_state, batch_size, beta)
