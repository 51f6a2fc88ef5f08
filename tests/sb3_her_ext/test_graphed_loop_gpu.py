"""The fused collect + train CUDA graph (sb3_her_ext.collect.fused) on a GPU: graph replays equal the same
blocks run eagerly, no recapture after warm-up while ε, the learning rate and β change, no host sync inside
a replay, ``model.learn()`` on ``DeviceLOBVecEnv`` with hindsight, and a failed capture falls back.

Run on a CUDA machine: ``python3 -m pytest -m gpu -q tests/sb3_her_ext/test_graphed_loop_gpu.py``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit

from foxhunt.device_env import DeviceLOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.collect import RANDOM, FusedBlock
from sb3_her_ext.diagnostics import read_diagnostics

pytestmark = pytest.mark.gpu

#: the block-count tests run without the observation normalizer (with learning_starts=0 its fit makes the
#: first rollout unfused); the learn test below runs with it
TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11, normalize_observations=False)
#: every schedule changes from block to block: ε (over the whole run), the IQR bonus, PER β, the learning rate
CHANGING = dict(learning_starts=0, batch_size=32, buffer_size=20_000, train_freq=2, gradient_steps=3,
                target_update_interval=64, policy_kwargs=TINY_POLICY, seed=0, device="cuda", cuda_graph=True,
                vaccine_interval=2, exploration_fraction=1.0, learning_rate=lambda p: 1e-4 + 9e-4 * p,
                per_beta=(0.4, 1.0), iqr_bonus=(0.3, 0.05), tau=0.5, diagnostics_interval=10**9)


def make_env(n_envs: int = 64, **kwargs) -> DeviceLOBVecEnv:
    params = dict(seed=0, data="synthetic", num_steps=1500, episode_length=20, device="cuda", cuda_graph=True)
    return DeviceLOBVecEnv(n_envs, **{**params, **kwargs})


def fused_model(eager: bool, stride: int = 2, **kwargs) -> BranchingIQN:
    model = BranchingIQN("MlpPolicy", make_env(), **{**CHANGING, **kwargs})
    model.collector.configure(callback_stride=stride, stats_interval=10**9, eager=eager)
    return model


def test_graph_replays_equal_the_same_blocks_run_eagerly() -> None:
    total = 64 * 2 * 40  # 40 blocks
    graphed = fused_model(eager=False).learn(total)
    block = graphed.collector.block
    assert block is not None and block.captures == 2  # vaccine patterns (F, T, F) and (T, F, T)
    assert block.replays == 40 - 2 * block.WARMUP_BLOCKS and block.eager_blocks == 2 * block.WARMUP_BLOCKS
    eager = fused_model(eager=True).learn(total)  # made after: torch's global stream is seeded again
    assert eager.collector.block.captures == 0
    # a sum tree may be left stale (subtrees marked for a rebuild that the next sample does first): the
    # captured and the eager paths leave it so at different points (seen on the H200 with no capture at all)
    graphed.replay_buffer.refresh_tree()
    eager.replay_buffer.refresh_tree()
    for name in graphed.replay_buffer._tensor_names():
        a, b = getattr(graphed.replay_buffer, name), getattr(eager.replay_buffer, name)
        if name == "tree":  # inner nodes may be re-summed in another order
            th.testing.assert_close(a, b, rtol=1e-12, atol=0.0, msg=name)
            leaves = graphed.replay_buffer.tree_leaves
            assert th.equal(a[-leaves:], b[-leaves:]), "tree leaves"
        else:
            assert th.equal(a, b), name
    for (name, a), b in zip(graphed.policy.state_dict().items(), eager.policy.state_dict().values(),
                            strict=True):
        assert th.equal(a, b), name
    opt_g = graphed.policy.optimizer.state_dict()["state"]
    opt_e = eager.policy.optimizer.state_dict()["state"]
    for key in opt_g:
        assert all(th.equal(opt_g[key][k], opt_e[key][k]) for k in opt_g[key])
    assert graphed._n_updates == eager._n_updates == 40 * 3
    assert graphed._episode_num == eager._episode_num == total // 20
    assert [e["r"] for e in graphed.ep_info_buffer] == [e["r"] for e in eager.ep_info_buffer]
    for kind, count in graphed.replay_buffer.hindsight_counts.items():
        assert int(count) == int(eager.replay_buffer.hindsight_counts[kind])


def test_random_blocks_replay_the_warm_up_with_the_device_loops_results() -> None:
    """learning_starts over 12 rollouts: with ``fuse_random_rollouts`` they are random blocks (2 eager, one
    capture, 9 replays after it), and the run ends with the device loop's replay rows, parameters and episodes
    (the device loop runs the warm-up eagerly; both fuse the learning blocks)."""
    total, starts = 64 * 2 * 30, 64 * 2 * 12

    def model(random_blocks: bool) -> BranchingIQN:
        built = BranchingIQN("MlpPolicy", make_env(), **{**CHANGING, "learning_starts": starts})
        built.collector.configure(callback_stride=2, stats_interval=10**9, fuse_random_rollouts=random_blocks)
        return built.learn(total)

    fused = model(True)
    block = fused.collector.block
    assert block is not None and RANDOM in block.graphs
    # three keys (random; the vaccine patterns (F, T, F) and (T, F, T)), each eager twice, then captured
    assert block.captures == 3 and block.eager_blocks == 3 * block.WARMUP_BLOCKS
    assert block.replays == 30 - 3 * block.WARMUP_BLOCKS
    loop = model(False)  # made after: torch's global stream is seeded again
    assert loop.collector.block is not None and RANDOM not in loop.collector.block.graphs
    assert loop.collector.block.captures == 2
    for buffer in (fused.replay_buffer, loop.replay_buffer):
        buffer.refresh_tree()
    for name in fused.replay_buffer._tensor_names():
        a, b = getattr(fused.replay_buffer, name), getattr(loop.replay_buffer, name)
        if name == "tree":
            th.testing.assert_close(a, b, rtol=1e-12, atol=0.0, msg=name)
        else:
            assert th.equal(a, b), name
    states = zip(fused.policy.state_dict().items(), loop.policy.state_dict().values(), strict=True)
    for (name, a), b in states:
        assert th.equal(a, b), name
    assert fused._n_updates == loop._n_updates and fused._episode_num == loop._episode_num


class ScheduleWatch(BaseCallback):
    """Records ε, PER β and the learning rate the host wrote for each block (at block ends)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, float, float]] = []

    def _on_step(self) -> bool:
        lr = float(self.model.policy.optimizer.param_groups[0]["lr"])  # a tensor: a sync, outside replays
        self.seen.append((self.model.exploration_rate, self.model.replay_buffer.beta, lr))
        return True


def test_no_recapture_after_warm_up_while_the_schedules_change() -> None:
    model = fused_model(eager=False)
    model.learn(64 * 2 * 12)
    block = model.collector.block
    assert block is not None
    captures, replays = block.captures, block.replays
    watch = ScheduleWatch()
    model.learn(64 * 2 * 60, callback=watch, reset_num_timesteps=False)
    assert model.collector.block is block and block.captures == captures  # zero recaptures
    assert block.replays == replays + 60 and len(watch.seen) == 60
    for values in zip(*watch.seen, strict=True):  # ε, β and the learning rate moved block after block
        assert len(set(values)) > 50
    # and the graph read them: the last block's values in its device tensors are the host's
    lr = model.policy.optimizer.param_groups[0]["lr"]
    assert float(lr) == pytest.approx(model.lr_schedule(model._current_progress_remaining), rel=1e-6)
    k = block.steps
    schedule = block.schedule.cpu().tolist()
    assert schedule[3 * k] == model.replay_buffer.beta
    assert schedule[3 * k + 1] == model.num_timesteps - k * 64


def test_no_host_sync_inside_a_replay() -> None:
    model = fused_model(eager=False)
    model.learn(64 * 2 * 10)  # warm-up and captures
    block = model.collector.block
    assert block is not None and block.captures > 0
    env, freq = model.get_env(), TrainFreq(2, TrainFrequencyUnit.STEP)
    model._total_timesteps = 10**9  # no end-of-training flush inside the checked blocks
    callback = model._init_callback(None)
    replays = block.replays
    th.cuda.synchronize()
    th.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(6):
            rollout = model.collector.collect_and_train(env, callback, freq, model.replay_buffer, 0, None)
            assert rollout is not None and rollout.continue_training
            model.train(gradient_steps=3, batch_size=model.batch_size)  # skipped: the graph trained
    finally:
        th.cuda.set_sync_debug_mode("default")
    assert block.replays == replays + 6 and block.captures == 2


def test_learn_on_the_lob_env_with_hindsight_runs_through_the_graph(tmp_path: Path) -> None:
    env = make_env(n_envs=256)
    model = BranchingIQN("MlpPolicy", env, **{
        **CHANGING, "buffer_size": 50_000, "batch_size": 64, "train_freq": 1, "gradient_steps": 2,
        "learning_starts": 256 * 10, "diagnostics_interval": 256 * 50,
        "policy_kwargs": {**TINY_POLICY, "normalize_observations": True},
        "diagnostics_path": str(tmp_path / "diag.jsonl")})
    assert model.hindsight_config is not None and model.graph_collect is None
    model.learn(256 * 200, log_interval=10)
    assert model.policy.q_net.observation_normalizer_fitted  # fitted on the host before the first capture
    block = model.collector.block
    assert block is not None and block.captures == 1 and block.replays > 150  # train_freq 1: default stride
    assert int(model.replay_buffer.hindsight_counts["relabel"]) > 0  # trade closes made hindsight rows
    assert model._episode_num == 256 * 200 // 20 and all(e["l"] == 20 for e in model.ep_info_buffer)
    lines = read_diagnostics(tmp_path / "diag.jsonl")
    assert len(lines) == 4 and all(np.isfinite(line["loss"]) for line in lines)
    for line in lines:  # the device-side action counts reached every line
        assert all(sum(mix) == pytest.approx(1.0, abs=1e-5) for mix in line["action_mix"].values())
    model.check_finite()


def test_a_capture_that_syncs_falls_back_to_the_device_loop_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = FusedBlock.block

    def syncing(self, model, key):  # a host read inside the block: legal eagerly, refused by a capture
        outputs = original(self, model, key)
        float(self.schedule[0])
        return outputs

    monkeypatch.setattr(FusedBlock, "block", syncing)
    model = fused_model(eager=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(64 * 2 * 20)
    fallbacks = [w for w in caught if "fused collect + train CUDA graph is off" in str(w.message)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    block = model.collector.block
    assert block is not None and block.captures == 0
    assert model.num_timesteps == 64 * 2 * 20 and model._n_updates == 20 * 3
    assert "capture failed" in model.collector.unsupported_reason(
        model.get_env(), TrainFreq(2, TrainFrequencyUnit.STEP), 0)
    model.check_finite()


def test_the_nan_guard_inside_replays_undoes_the_steps_and_raises_at_the_sync_point() -> None:
    """The guard's device flags and masked restore inside the fused graph: once the sampled targets turn
    NaN, no gradient step of any later replay changes the online network, PopArt or the optimizer, and the
    error comes at the next sync point (a diagnostics line)."""
    from sb3_her_ext.guard import NonFiniteError

    model = fused_model(eager=False)
    model.learn(64 * 2 * 10)  # warm-up and captures
    block = model.collector.block
    assert block is not None and block.captures == 2 and model.guard is not None
    buffer = model.replay_buffer
    buffer.rewards[: buffer.size()] = float("nan")  # every stored row: the next batches meet NaN targets
    online = {k: v.clone() for k, v in model.q_net.state_dict().items()}
    popart = {k: v.clone() for k, v in model.policy.popart.state_dict().items()}
    optimizer = [v.clone() for s in model.policy.optimizer.state.values() for v in s.values()
                 if isinstance(v, th.Tensor) and v.is_cuda]
    env, freq = model.get_env(), TrainFreq(2, TrainFrequencyUnit.STEP)
    model._total_timesteps = 10**9
    callback = model._init_callback(None)
    replays = block.replays
    for _ in range(4):
        assert model.collector.collect_and_train(env, callback, freq, buffer, 0, None) is not None
        model.train(gradient_steps=3, batch_size=model.batch_size)
    assert block.replays == replays + 4
    for key, value in model.q_net.state_dict().items():
        assert th.equal(value, online[key]), key
    for key, value in model.policy.popart.state_dict().items():
        assert th.equal(value, popart[key]), key
    now = [v for s in model.policy.optimizer.state.values() for v in s.values()
           if isinstance(v, th.Tensor) and v.is_cuda]
    assert all(th.equal(a, b) for a, b in zip(optimizer, now, strict=True))
    with pytest.raises(NonFiniteError, match="non-finite"):
        model.log_diagnostics()
