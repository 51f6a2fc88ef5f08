"""BatchedLOB.enable_compile: the torch.compile'd step follows the eager step (CPU; slow: it compiles)."""

from __future__ import annotations

import shutil

import pytest
import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from tests.foxenv.fake_market import random_market

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs g++")


@pytest.mark.slow
@needs_compiler
def test_compiled_step_matches_eager() -> None:
    market = random_market(600, 5, seed=8)
    cfg = EnvConfig(levels=5, episode_length=20, max_drawdown=50.0, inventory_penalty=0.1)
    eager = BatchedLOB(market, 16, cfg, seed=3)
    compiled = BatchedLOB(market, 16, cfg, seed=3)
    compiled.enable_compile()
    compiled.enable_compile()  # a second call keeps the compiled step
    generator = torch.Generator().manual_seed(4)
    fills = 0
    for _ in range(60):
        action = torch.randint(0, 3, (16, 4), generator=generator)
        out_e = eager.step(action)
        out_c = compiled.step(action)
        torch.testing.assert_close(out_e[0], out_c[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(out_e[1], out_c[1], rtol=0, atol=1e-6)
        assert torch.equal(out_e[2], out_c[2]) and torch.equal(out_e[3], out_c[3])
        for key, value in out_e[4].items():
            if value.dtype.is_floating_point:
                torch.testing.assert_close(value, out_c[4][key], rtol=0, atol=1e-9, msg=key)
            else:
                assert torch.equal(value, out_c[4][key]), key
        fills += int((out_e[4]["fees"] != 0).sum())
        done = out_e[2] | out_e[3]
        torch.testing.assert_close(eager.reset(mask=done), compiled.reset(mask=done), rtol=0, atol=1e-6)
    assert fills > 0  # the comparison covered fills, not only idle books
    compiled.load_state_dict(eager.state_dict())
    action = torch.ones(16, 4, dtype=torch.int64)
    torch.testing.assert_close(eager.step(action)[0], compiled.step(action)[0], rtol=0, atol=1e-6)


def test_compile_must_come_before_the_cuda_graph() -> None:
    env = BatchedLOB(random_market(100, 3), 2, EnvConfig(levels=3, episode_length=10), seed=0)
    env._graph = object()  # type: ignore[assignment]  # stands in for a captured graph (no CUDA here)
    with pytest.raises(ValueError, match="before enable_cuda_graph"):
        env.enable_compile()
