"""BatchedLOB.step_autoreset (the step with same-step autoreset fused in) against the eager path it replaces:
``step``, then ``reset(mask=done)`` and ``torch.where(done, reset_obs, final_obs)``; the vector env on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from foxenv.compiled import PackedOutputs
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.market import MarketData
from foxenv.data.synthetic import generate_synthetic
from foxenv.vector_env import make_vec
from tests.foxenv.fake_market import random_market

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs g++")
#: Short episodes and a tight drawdown limit: books finish often, at different steps, by both causes.
CONFIG = EnvConfig(episode_length=13, max_drawdown=3.0, inventory_penalty=0.1)
# Compiled runs end episodes by truncation only: a drawdown check compares equity built from prices on a
# 0.01 tick grid with the limit, where exact ties are common, and a compiled kernel's different (still
# correct) rounding can break a tie the other way; on the H200 one book of 64 terminated at step 58 in one
# path and not in the other, and the trajectories parted. These tests are about the fused reset.
COMPILED_CONFIG = EnvConfig(episode_length=13, inventory_penalty=0.1)


def eager_autoreset(core: BatchedLOB, action: torch.Tensor, host_sync: bool) -> tuple:
    """The vector env's autoreset before it moved into the core: step, then reset the finished books
    (on every step, or with ``host_sync`` only when one finished) and take their reset observation."""
    final_obs, reward, terminated, truncated, info = core.step(action)
    done = terminated | truncated
    obs = final_obs
    if not host_sync or bool(done.any()):
        obs = torch.where(done[:, None], core.reset(mask=done), final_obs)
    return obs, reward, terminated, truncated, info, final_obs


def assert_same_outputs(got: tuple, want: tuple, exact: bool = True) -> None:
    """``step_autoreset`` outputs equal (``exact``) or within float rounding of a compiled step."""
    names = ("obs", "reward", "terminated", "truncated", "info", "final_obs")
    for name, a, b in zip(names, got, want, strict=True):
        a, b = (x if isinstance(x, dict) else {name: x} for x in (a, b))
        assert set(a) == set(b)
        for key, value in a.items():
            if exact or not value.dtype.is_floating_point:
                assert torch.equal(value, b[key]), key
            else:
                atol = 1e-6 if value.dtype == torch.float32 else 1e-9
                torch.testing.assert_close(value, b[key], rtol=0, atol=atol, msg=key)


def assert_same_state(a: BatchedLOB, b: BatchedLOB) -> None:
    """Same per-book state and the same generator state (so the future draws agree too)."""
    state_a, state_b = a.state_dict(), b.state_dict()
    assert set(state_a) == set(state_b)
    for key, value in state_a.items():
        assert torch.equal(value, state_b[key]), key


def compare_with_eager(
    market: MarketData, host_sync: bool, steps: int, num_books: int = 24, device: str = "cpu",
    compile: bool = False, graph: bool = False, config: EnvConfig = CONFIG,
) -> tuple[int, int]:
    """Step a fused core and an eager-path core side by side; return (episode ends, steps with some but
    not all books finishing)."""
    eager = BatchedLOB(market, num_books, config, device=device, seed=5)
    fused = BatchedLOB(market, num_books, config, device=device, seed=5)
    if compile:
        fused.enable_compile()
    assert torch.equal(eager.reset(seed=7), fused.reset(seed=7))
    if graph:
        fused.enable_cuda_graph()
    generator = torch.Generator().manual_seed(11)
    ends = partial = 0
    for _ in range(steps):
        action = torch.randint(0, 3, (num_books, 4), generator=generator).to(device)
        want = eager_autoreset(eager, action, host_sync)
        got = fused.step_autoreset(action, host_sync=host_sync)
        assert_same_outputs(got, want, exact=not compile)
        done = want[2] | want[3]
        ends += int(done.sum())
        partial += int(bool(done.any()) and not bool(done.all()))
    if not compile:
        assert_same_state(eager, fused)
    return ends, partial


@pytest.fixture(scope="module")
def synthetic() -> MarketData:
    """A small market from foxenv's synthetic generator."""
    return generate_synthetic(700, levels=10, seed=3)


@pytest.mark.parametrize("host_sync", [True, False], ids=["host-sync", "fused"])
def test_step_autoreset_matches_the_eager_path_on_synthetic_data(
    synthetic: MarketData, host_sync: bool
) -> None:
    ends, partial = compare_with_eager(synthetic, host_sync, steps=300)
    assert ends > 300 and partial > 20  # many episode ends, most of them of some books only


@pytest.fixture(scope="module")
def lobster_slice(lobster_dir: Path) -> MarketData:
    """400 steps of the real GOOG sample."""
    from foxenv.data import load_market

    return load_market(str(lobster_dir)).slice(200, 600)


@pytest.mark.parametrize("host_sync", [True, False], ids=["host-sync", "fused"])
def test_step_autoreset_matches_the_eager_path_on_a_lobster_slice(
    lobster_slice: MarketData, host_sync: bool
) -> None:
    ends, partial = compare_with_eager(lobster_slice, host_sync, steps=300)
    assert ends > 300 and partial > 20


def test_host_sync_draws_offsets_only_when_a_book_finished(synthetic: MarketData) -> None:
    core = BatchedLOB(synthetic, 4, EnvConfig(episode_length=5), seed=0)
    core.reset(seed=0)
    generator_state = core.state_dict()["generator"]
    action = torch.ones(4, 4, dtype=torch.int64)
    for _ in range(4):
        core.step_autoreset(action, host_sync=True)
    assert torch.equal(core.state_dict()["generator"], generator_state)  # nobody finished: no draw
    obs, _, _, truncated, info, final_obs = core.step_autoreset(action, host_sync=True)
    assert bool(truncated.all()) and not torch.equal(core.state_dict()["generator"], generator_state)
    assert info["step"].tolist() == [5] * 4 and core.state_dict()["step"].tolist() == [0] * 4
    assert bool((obs[:, -1] == 1.0).all()) and not torch.equal(obs, final_obs)  # time_left of a new episode


def test_fused_step_draws_offsets_every_step(synthetic: MarketData) -> None:
    core = BatchedLOB(synthetic, 4, EnvConfig(episode_length=50), seed=0)
    core.reset(seed=0)
    reference = BatchedLOB(synthetic, 4, EnvConfig(episode_length=50), seed=0)
    reference.reset(seed=0)
    obs, *_, final_obs = core.step_autoreset(torch.ones(4, 4, dtype=torch.int64), host_sync=False)
    assert torch.equal(obs, final_obs)  # nobody finished ...
    reference._draw_offsets()
    assert torch.equal(core.state_dict()["generator"], reference.state_dict()["generator"])  # ... one draw


def test_default_host_sync_is_on_for_the_cpu(synthetic: MarketData) -> None:
    core = BatchedLOB(synthetic, 3, EnvConfig(episode_length=20), seed=0)
    core.reset(seed=0)
    generator_state = core.state_dict()["generator"]
    core.step_autoreset(torch.ones(3, 4, dtype=torch.int64))
    assert torch.equal(core.state_dict()["generator"], generator_state)


def test_step_autoreset_checks_actions(synthetic: MarketData) -> None:
    core = BatchedLOB(synthetic, 3, EnvConfig(episode_length=20), seed=0)
    with pytest.raises(ValueError, match="action shape"):
        core.step_autoreset(torch.ones(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="out of range"):
        core.step_autoreset(torch.full((3, 4), 3), host_sync=False)


def test_fused_vector_env_matches_a_core_reset_every_step(synthetic: MarketData) -> None:
    """The vector env on its no-host-sync path (the one CUDA tensors take), forced on the CPU."""
    env = make_vec(6, data=synthetic, seed=2, return_tensors=True, config=CONFIG)
    env._may_sync = False  # as on CUDA with return_tensors
    core = BatchedLOB(synthetic, 6, CONFIG, seed=2)
    assert torch.equal(env.reset(seed=4)[0], core.reset(seed=4))
    generator = torch.Generator().manual_seed(1)
    for _ in range(60):
        action = torch.randint(0, 3, (6, 4), generator=generator)
        obs, reward, terminated, truncated, info = env.step(action)
        want = eager_autoreset(core, action, host_sync=False)
        assert_same_outputs((obs, reward, terminated, truncated, info["final_info"], info["final_obs"]), want)
        assert torch.equal(info["_final_obs"], terminated | truncated)
        assert all(torch.equal(info[key], value) for key, value in want[4].items())


def test_packed_outputs_hand_out_independent_copies() -> None:
    generator = torch.Generator().manual_seed(0)
    outputs = (
        torch.rand(5, 3, generator=generator),
        torch.rand(5, generator=generator),
        torch.rand(5, generator=generator) > 0.5,
        {"a": torch.rand(5, generator=generator, dtype=torch.float64),
         "b": torch.randint(0, 9, (5,), generator=generator),
         "c": torch.rand(5, generator=generator) > 0.5,
         "d": torch.rand(5, generator=generator, dtype=torch.float64)},
        torch.rand(5, 3, generator=generator),
    )
    packed = PackedOutputs(outputs)
    assert len(packed.buffers) == 4  # float32, bool, float64, int64
    first = packed.copies()
    for buffer in packed.buffers:  # a later replay overwrites the buffers ...
        buffer.zero_()
    second = packed.copies()
    assert isinstance(first[3], dict) and list(first[3]) == ["a", "b", "c", "d"]
    for got, zeros, want in zip(first, second, outputs, strict=True):
        got, zeros, want = (
            [x] if isinstance(x, torch.Tensor) else list(x.values()) for x in (got, zeros, want)
        )
        for g, z, w in zip(got, zeros, want, strict=True):
            assert torch.equal(g, w) and g.is_contiguous()  # ... but not the copies handed out before
            assert g.dtype == w.dtype and g.shape == w.shape and not bool(z.any())


@pytest.mark.slow
@needs_compiler
def test_compiled_fused_step_autoreset_follows_the_eager_path() -> None:
    """The step and the reset compiled as one function (the host-sync path compiles the step alone, as
    test_vector_env's compiled test covers)."""
    ends, _ = compare_with_eager(random_market(400, 10, seed=1), False, steps=40, num_books=8, compile=True)
    assert ends > 8


@pytest.mark.gpu
@pytest.mark.parametrize("market", ["synthetic", "lobster_slice"])
@pytest.mark.parametrize("host_sync", [True, False], ids=["host-sync", "fused"])
def test_cuda_step_autoreset_matches_the_eager_path(
    request: pytest.FixtureRequest, market: str, host_sync: bool
) -> None:
    ends, partial = compare_with_eager(request.getfixturevalue(market), host_sync, steps=300, device="cuda")
    assert ends > 300 and partial > 20


@pytest.mark.gpu
@pytest.mark.parametrize("market", ["synthetic", "lobster_slice"])
@pytest.mark.parametrize("host_sync", [True, False], ids=["host-sync", "fused"])
def test_cuda_graph_step_autoreset_matches_the_eager_path(
    request: pytest.FixtureRequest, market: str, host_sync: bool
) -> None:
    """Both captured graphs (step, and step with the fused reset) against the eager path, bit for bit."""
    ends, partial = compare_with_eager(
        request.getfixturevalue(market), host_sync, steps=300, device="cuda", graph=True
    )
    assert ends > 300 and partial > 20


@pytest.mark.gpu
@pytest.mark.slow
def test_compiled_cuda_graph_step_autoreset_follows_the_eager_path(synthetic: MarketData) -> None:
    ends, _ = compare_with_eager(synthetic, False, steps=100, num_books=64, device="cuda", compile=True,
                                 graph=True, config=COMPILED_CONFIG)
    assert ends > 64


@pytest.mark.gpu
def test_cuda_graph_outputs_are_copies(synthetic: MarketData) -> None:
    core = BatchedLOB(synthetic, 16, CONFIG, device="cuda", seed=0)
    core.reset(seed=0)
    core.enable_cuda_graph()
    action = torch.ones(16, 4, dtype=torch.int64, device="cuda")
    first = core.step_autoreset(action, host_sync=False)
    kept = first[4]["step"].clone()
    for _ in range(3):
        core.step_autoreset(action, host_sync=False)
    assert torch.equal(first[4]["step"], kept)


@pytest.mark.gpu
def test_cuda_vector_env_matches_a_core_reset_every_step(synthetic: MarketData) -> None:
    env = make_vec(64, data=synthetic, device="cuda", seed=2, return_tensors=True, config=CONFIG,
                   cuda_graph=True)
    core = BatchedLOB(synthetic, 64, CONFIG, device="cuda", seed=2)
    assert torch.equal(env.reset(seed=4)[0], core.reset(seed=4))
    generator = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(100):
        action = torch.randint(0, 3, (64, 4), generator=generator, device="cuda")
        obs, reward, terminated, truncated, info = env.step(action)
        want = eager_autoreset(core, action, host_sync=False)
        assert_same_outputs((obs, reward, terminated, truncated, info["final_info"], info["final_obs"]), want)
    np.testing.assert_array_equal(env.core.state_dict()["offset"].cpu(), core.state_dict()["offset"].cpu())
