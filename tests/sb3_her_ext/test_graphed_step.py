"""``BranchingIQN(cuda_graph=True)``: the gradient step as one CUDA graph replay (``graphed_step``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch as th

from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN
from tests.sb3_her_ext.test_algorithm import TINY, TINY_POLICY, TinyEnv


def test_cuda_graph_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="cuda_graph=1"):
        BranchingIQN("MlpPolicy", TinyEnv(), cuda_graph=1, **TINY)


def test_cuda_graph_needs_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device, got device=cpu"):
        BranchingIQN("MlpPolicy", TinyEnv(), cuda_graph=True, **TINY)


def test_eager_model_has_no_graph_and_a_plain_optimizer() -> None:
    model = BranchingIQN("MlpPolicy", TinyEnv(), **TINY)
    assert model._graphed_step is None and model._graphed_vaccine_step is None
    assert not model.policy.optimizer.param_groups[0].get("capturable", False)


def _lob_run(tmp_path: Path, cuda_graph: bool, steps: int = 600) -> tuple[BranchingIQN, LOBVecEnv]:
    env = LOBVecEnv(4, device="cuda", seed=0, data="synthetic", num_steps=1500, episode_length=100)
    # the eager twin gets the same capturable optimizer, so that both run the same optimizer arithmetic
    policy = {**TINY_POLICY, "optimizer_kwargs": {"capturable": True}}
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "device": "cuda", "policy_kwargs": policy},
                         vaccine_interval=5, cuda_graph=cuda_graph, diagnostics_interval=100,
                         diagnostics_path=str(tmp_path / f"diag_{cuda_graph}.jsonl"))
    model.learn(steps)
    return model, env


@pytest.mark.gpu
def test_graphed_training_follows_the_eager_training(tmp_path: Path) -> None:
    """Same seed: the graphed steps (plain and vaccine graphs, every step after the warm-ups a replay) give
    the eager run's parameters, PER priorities and diagnostics, up to the float32 learning-rate tensor's
    rounding."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphed, env_g = _lob_run(tmp_path, cuda_graph=True)
    # no autograd graph outlives a step (a kept one made the vaccine steps warn of an AccumulateGrad stream)
    assert not [str(w.message) for w in caught if "AccumulateGrad" in str(w.message)]
    eager, env_e = _lob_run(tmp_path, cuda_graph=False)
    plain, vaccine = graphed._graphed_step, graphed._graphed_vaccine_step
    assert plain is not None and vaccine is not None
    assert plain.replays > 50 and vaccine.replays > 10
    warmups = plain.WARMUP_STEPS + vaccine.WARMUP_STEPS
    assert graphed._n_updates == eager._n_updates == plain.replays + vaccine.replays + warmups
    for (name, a), b in zip(graphed.policy.named_parameters(), eager.policy.parameters(), strict=True):
        th.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    graphed.replay_buffer.refresh_tree()
    eager.replay_buffer.refresh_tree()
    th.testing.assert_close(graphed.replay_buffer.tree, eager.replay_buffer.tree, rtol=1e-4, atol=1e-6)
    lines_g = (tmp_path / "diag_True.jsonl").read_text().splitlines()
    lines_e = (tmp_path / "diag_False.jsonl").read_text().splitlines()
    assert len(lines_g) == len(lines_e) > 0
    for line_g, line_e in zip(lines_g, lines_e, strict=True):
        record_g, record_e = json.loads(line_g), json.loads(line_e)
        for key in ("l_q", "l_c51", "loss"):
            assert record_g[key] == pytest.approx(record_e[key], rel=1e-3, abs=1e-5, nan_ok=True), key
        assert record_g["vaccine"] == pytest.approx(record_e["vaccine"], rel=1e-3, abs=1e-5, nan_ok=True)
    obs = env_g.reset()
    greedy_g = graphed.predict(obs, deterministic=True)[0]
    assert np.array_equal(greedy_g, eager.predict(obs, deterministic=True)[0])


@pytest.mark.gpu
def test_graphed_model_saves_and_loads(tmp_path: Path) -> None:
    model, env = _lob_run(tmp_path, cuda_graph=True, steps=300)
    model.save(tmp_path / "model")
    loaded = BranchingIQN.load(tmp_path / "model", env=env, device="cuda")
    assert loaded.cuda_graph and loaded._graphed_step is not None
    obs = env.reset()
    greedy = model.predict(obs, deterministic=True)[0]
    assert np.array_equal(greedy, loaded.predict(obs, deterministic=True)[0])
    loaded.learn(200, reset_num_timesteps=False)  # trains on (a new graph is captured)
    assert loaded._graphed_step.replays > 0
    with pytest.warns(UserWarning, match="cuda_graph=True needs a CUDA device"):  # a CPU load steps eagerly
        on_cpu = BranchingIQN.load(tmp_path / "model", device="cpu")
    assert not on_cpu.cuda_graph and on_cpu._graphed_step is None


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_nan_guard_on_the_gpu_undoes_the_steps_and_raises_at_the_sync_point(tmp_path: Path,
                                                                            cuda_graph: bool) -> None:
    """The guard's masked mode inside graph replays (and eager GPU steps): a step that meets a NaN target
    changes no parameter, optimizer state or PopArt statistic; the error comes at the diagnostics line."""
    from sb3_her_ext.guard import NonFiniteError

    model, _ = _lob_run(tmp_path, cuda_graph=cuda_graph, steps=300)
    assert model.guard is not None and not model.guard.immediate
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    optimizer = [v.clone() for s in model.policy.optimizer.state.values() for v in s.values()
                 if isinstance(v, th.Tensor) and v.is_cuda]
    buffer = model.replay_buffer
    buffer.rewards[: buffer.size()] = float("nan")
    model.train(12, model.batch_size)  # plain and vaccine steps, replays when graphed
    if cuda_graph:
        assert model._graphed_step.replays > 0
    after = model.policy.state_dict()
    for key, value in before.items():
        assert th.equal(value, after[key]), key
    now = [v for s in model.policy.optimizer.state.values() for v in s.values()
           if isinstance(v, th.Tensor) and v.is_cuda]
    assert all(th.equal(a, b) for a, b in zip(optimizer, now, strict=True))
    with pytest.raises(NonFiniteError, match="non-finite loss at gradient step"):
        model.log_diagnostics()
