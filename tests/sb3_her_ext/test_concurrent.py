"""Several models trained at once in one process (sb3_her_ext.concurrent): each ends bit for bit as it ends
trained alone, on SB3's loop, the device loop and the fused block (run eagerly on the CPU); a failure is
re-raised naming the model and stops the others; nothing in ``learn`` draws from a process-wide generator."""

from __future__ import annotations

import math
import operator
import random
import threading
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN, ConcurrentTrainingError, learn_concurrently
from sb3_her_ext.concurrent import run_concurrently, run_in_processes

TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)
TINY = dict(learning_starts=0, batch_size=16, buffer_size=2000, train_freq=2, target_update_interval=50,
            policy_kwargs=TINY_POLICY, device="cpu", vaccine_interval=2, diagnostics_interval=10**9)
#: three agents: two seeds, and the first seed with another hyperparameter (a study's trials)
AGENTS = [dict(seed=0), dict(seed=1), dict(seed=0, learning_rate=3e-3, gamma=0.9)]
STEPS = 160  # 40 vector steps of 4 books


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks run faster on one thread, above all on a shared 2-core CI machine."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def build(path: str, agent: dict[str, Any], device: str = "cpu", **kwargs: Any) -> BranchingIQN:
    """A tiny model on its own env (``path``: ``sb3`` SB3's loop, ``blocks`` training blocks on a device
    env)."""
    cls = LOBVecEnv if path == "sb3" else DeviceLOBVecEnv
    env = cls(4, seed=agent["seed"], data="synthetic", num_steps=1500, episode_length=20, device=device)
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "device": device, **kwargs, **agent})
    return model


def state_of(model: BranchingIQN) -> dict[str, th.Tensor]:
    """Everything training changed: replay contents (tree and sampler state included), parameters, optimizer
    state, the generators, counters."""
    buffer = model.replay_buffer
    buffer.refresh_tree()
    state = {f"buffer.{name}": getattr(buffer, name) for name in buffer._tensor_names()}
    state.update({f"policy.{k}": v for k, v in model.policy.state_dict().items()})
    for index, values in model.policy.optimizer.state_dict()["state"].items():
        state.update({f"optimizer.{index}.{k}": v for k, v in values.items() if isinstance(v, th.Tensor)})
    state["model.generator"] = model.generator.get_state()
    state["buffer.generator"] = buffer.generator.get_state()
    state["counters"] = th.tensor([model.num_timesteps, model._n_updates, model._episode_num])
    return {k: v.detach().cpu() for k, v in state.items()}


def assert_same(a: dict[str, th.Tensor], b: dict[str, th.Tensor], label: str) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert th.equal(a[key], b[key]), f"{label}: {key}"


def alone(path: str, device: str = "cpu", **kwargs: Any) -> list[dict[str, th.Tensor]]:
    """Each agent built and trained by itself, one after another."""
    return [state_of(build(path, agent, device, **kwargs).learn(STEPS)) for agent in AGENTS]


@pytest.mark.parametrize("path", ["sb3", "blocks"])
def test_models_trained_at_once_equal_each_trained_alone(path: str) -> None:
    reference = alone(path)
    # the seeds and the hyperparameter make three different trainings
    weights = [th.cat([v.flatten() for k, v in state.items() if k.startswith("policy.q_net.")])
               for state in reference]
    assert not th.equal(weights[0], weights[1]) and not th.equal(weights[0], weights[2])
    models = [build(path, agent) for agent in AGENTS]  # built first: the global generators end at the last's
    th.rand(3)
    np.random.rand(3)
    random.random()  # moved again: learn must not read them
    trained = learn_concurrently(models, STEPS)
    assert [m is t for m, t in zip(models, trained, strict=True)] == [True] * 3
    if path == "blocks":
        assert all(model.collector.block is not None and model.collector.block.eager_blocks > 0
                   for model in models)
    for i, model in enumerate(models):
        assert model.num_timesteps == STEPS
        assert_same(state_of(model), reference[i], f"{path} agent {AGENTS[i]}")


def test_models_built_and_trained_in_threads_equal_each_trained_alone() -> None:
    """Built inside the threads too: the build lock keeps each build's global seeding and draws together."""
    reference = alone("blocks")
    states = run_concurrently([lambda agent=agent: state_of(build("blocks", agent).learn(STEPS))
                               for agent in AGENTS])
    for i, state in enumerate(states):
        assert_same(state, reference[i], f"built in a thread, agent {AGENTS[i]}")


class FailAt(BaseCallback):
    """Raises at call ``calls``, after letting the others go on."""

    def __init__(self, calls: int, release: threading.Event) -> None:
        super().__init__()
        self.calls, self.release = calls, release

    def _on_step(self) -> bool:
        if self.n_calls == self.calls:
            self.release.set()
            raise RuntimeError("boom")
        return True


class WaitFor(BaseCallback):
    """Waits at each step until ``release`` is set (so the others are still training when one fails)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def _on_step(self) -> bool:
        self.release.wait(timeout=30)
        return True


def test_a_failure_is_reraised_naming_the_model_and_stops_the_others() -> None:
    models = [build("blocks", agent) for agent in AGENTS]
    release = threading.Event()
    callbacks = [WaitFor(release), FailAt(3, release), WaitFor(release)]
    message = r"model 1 \(seed 1\) failed: RuntimeError: boom"
    with pytest.raises(ConcurrentTrainingError, match=message) as info:
        learn_concurrently(models, 10**6, callbacks=callbacks)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert all(model.num_timesteps < 10**5 for model in models)  # the others stopped soon after


def test_tasks_in_processes_return_in_order_and_a_failure_names_its_task() -> None:
    assert run_in_processes(math.sqrt, [(4.0,), (9.0,), (16.0,)], processes=2) == [2.0, 3.0, 4.0]
    with pytest.raises(ConcurrentTrainingError, match=r"^b failed: ZeroDivisionError: .*\(1 other task\(s\) "
                                                      r"failed too\)") as caught:
        run_in_processes(operator.truediv, [(1, 2), (1, 0), (2, 0)], names=["a", "b", "c"])
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    with pytest.raises(ValueError, match=r"processes=0 must be >= 1"):
        run_in_processes(math.sqrt, [(1.0,)], processes=0)
    with pytest.raises(ValueError, match=r"names \(1\) must have one entry per task \(2\)"):
        run_in_processes(math.sqrt, [(1.0,), (2.0,)], names=["x"])


def test_bad_arguments_are_refused_naming_them() -> None:
    model = build("sb3", AGENTS[0])
    with pytest.raises(ValueError, match="each model must appear once"):
        learn_concurrently([model, model], 8)
    with pytest.raises(ValueError, match="total_timesteps"):
        learn_concurrently([model], [8, 8])


@pytest.mark.gpu
def test_models_trained_at_once_on_cuda_equal_each_trained_alone() -> None:
    """On a GPU with the fused block captured as CUDA graphs: three models on three streams end bit for bit
    as each alone (seeded CUDA runs are deterministic: BranchingIQN turns deterministic algorithms on)."""
    settings = dict(cuda_graph=True, batch_size=32, buffer_size=20_000)
    total = 64 * 2 * 12  # 12 blocks of 64 books: warm-up, capture and replays

    def gpu_build(agent: dict[str, Any]) -> BranchingIQN:
        env = DeviceLOBVecEnv(64, seed=agent["seed"], data="synthetic", num_steps=1500, episode_length=20,
                              device="cuda")
        model = BranchingIQN("MlpPolicy", env, **{**TINY, **settings, "device": "cuda", **agent})
        return model

    reference = [state_of(gpu_build(agent).learn(total)) for agent in AGENTS]
    models = [gpu_build(agent) for agent in AGENTS]
    learn_concurrently(models, total)
    for i, model in enumerate(models):
        block = model.collector.block
        assert block is not None and block.captures > 0 and block.replays > 0
        assert_same(state_of(model), reference[i], f"cuda agent {AGENTS[i]}")
