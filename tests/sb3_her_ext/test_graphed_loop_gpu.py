"""The training block's CUDA graphs (sb3_her_ext.collect.block) on a GPU: graph replays equal the same
blocks run eagerly (learning and random blocks), no recapture after warm-up while ε, the learning rate and β
change (computed on the device from the counters), no host sync inside a rollout, ``model.learn()`` on
``DeviceLOBVecEnv`` with hindsight, and a failed capture falls back to eager blocks.

Run on a CUDA machine: ``python3 -m pytest -m gpu -q tests/sb3_her_ext/test_graphed_loop_gpu.py``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from foxhunt.device_lob_env import DeviceLOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.collect import TrainBlock
from sb3_her_ext.diagnostics import read_diagnostics

pytestmark = pytest.mark.gpu

#: the block-count tests run without the observation normalizer (with learning_starts=0 its fit splits the
#: first rollout in two blocks); the learn test below runs with it
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


def fused_model(eager: bool, **kwargs) -> BranchingIQN:
    """Blocks captured (``graph_collect=None``) or run eagerly (``graph_collect=False``)."""
    model = BranchingIQN("MlpPolicy", make_env(), **{**CHANGING, "graph_collect": False if eager else None,
                                                      **kwargs})
    model.collector.configure(stats_interval=10**9)
    return model


def assert_same_replay_and_parameters(a: BranchingIQN, b: BranchingIQN) -> None:
    # a sum tree may be left stale (subtrees marked for a rebuild that the next sample does first): the
    # captured and the eager paths leave it so at different points (seen on the H200 with no capture at all)
    a.replay_buffer.refresh_tree()
    b.replay_buffer.refresh_tree()
    for name in a.replay_buffer._tensor_names():
        x, y = getattr(a.replay_buffer, name), getattr(b.replay_buffer, name)
        if name == "tree":  # inner nodes may be re-summed in another order
            th.testing.assert_close(x, y, rtol=1e-12, atol=0.0, msg=name)
            leaves = a.replay_buffer.tree_leaves
            assert th.equal(x[-leaves:], y[-leaves:]), "tree leaves"
        else:
            assert th.equal(x, y), name
    for (name, x), y in zip(a.policy.state_dict().items(), b.policy.state_dict().values(), strict=True):
        assert th.equal(x, y), name
    opt_a, opt_b = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    for key in opt_a:
        assert all(th.equal(opt_a[key][k], opt_b[key][k]) for k in opt_a[key])
    x, y = a.collector.block, b.collector.block
    assert th.equal(x.counters, y.counters) and th.equal(x.carried, y.carried)
    assert a.num_timesteps == b.num_timesteps and a._n_updates == b._n_updates
    assert a._episode_num == b._episode_num
    assert [e["r"] for e in a.ep_info_buffer] == [e["r"] for e in b.ep_info_buffer]
    for kind, count in a.replay_buffer.hindsight_counts.items():
        assert int(count) == int(b.replay_buffer.hindsight_counts[kind])


def test_graph_replays_equal_the_same_blocks_run_eagerly() -> None:
    total = 64 * 2 * 40  # 40 blocks
    graphed = fused_model(eager=False).learn(total)
    block = graphed.collector.block
    assert block is not None and block.captures == 2  # vaccine patterns (F, T, F) and (T, F, T)
    assert block.replays == 40 - 2 * block.WARMUP_BLOCKS and block.eager_blocks == 2 * block.WARMUP_BLOCKS
    eager = fused_model(eager=True).learn(total)  # made after: torch's global stream is seeded again
    assert eager.collector.block.captures == 0 and eager.collector.block.eager_blocks == 40
    assert eager.collector.capture_reason() == "graph_collect=False"
    assert graphed.collector.capture_reason() is None
    assert_same_replay_and_parameters(graphed, eager)
    assert graphed._n_updates == 40 * 3 and graphed._episode_num == total // 20


def test_random_blocks_replay_the_warm_up_as_the_same_blocks_run_eagerly() -> None:
    """learning_starts over 12 rollouts: they are random blocks (2 eager, one capture, 9 replays after it);
    the learning blocks after them (two vaccine patterns) too; all equal to the same blocks run eagerly."""
    total, starts = 64 * 2 * 30, 64 * 2 * 12
    graphed = fused_model(eager=False, learning_starts=starts).learn(total)
    block = graphed.collector.block
    assert block is not None and (2, True, ()) in block.graphs
    # three keys (random; the vaccine patterns (F, T, F) and (T, F, T)), each eager twice, then captured
    assert block.captures == 3 and block.eager_blocks == 3 * block.WARMUP_BLOCKS
    assert block.replays == 30 - 3 * block.WARMUP_BLOCKS
    eager = fused_model(eager=True, learning_starts=starts).learn(total)  # made after: global stream reseeded
    assert eager.collector.block.captures == 0
    assert_same_replay_and_parameters(graphed, eager)
    assert graphed._n_updates == 18 * 3


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
    # and the graphs computed them from the counters: the device state after the last block is the host's,
    # bit for bit (float64 on the device, the same operations as the host's Python)
    lr = model.policy.optimizer.param_groups[0]["lr"]
    assert float(lr) == pytest.approx(model.lr_schedule(model._current_progress_remaining), rel=1e-6)
    assert block.counters.tolist() == [model.num_timesteps, model._n_calls]
    assert block.carried.tolist() == [model.exploration_rate, model.iqr_bonus]
    _, _, beta, _ = block.schedules(0)  # PER β at the counters (k = 0 advances nothing)
    assert float(beta) == model.replay_buffer.beta


def test_no_host_sync_inside_a_replay() -> None:
    model = fused_model(eager=False)
    model.learn(64 * 2 * 10)  # warm-up and captures
    model._total_timesteps *= 10  # rollouts past learn's end would anneal the learning rate below 0
    block = model.collector.block
    assert block is not None and block.captures > 0
    replays = block.replays
    th.cuda.synchronize()
    th.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(6):  # a rollout: the host counters, the learning rate (in place), one replay
            model.collector.run_rollout()
    finally:
        th.cuda.set_sync_debug_mode("default")
    assert block.replays == replays + 6 and block.captures == 2 and model._n_updates == 16 * 3


def test_learn_on_the_lob_env_with_hindsight_runs_through_the_graph(tmp_path: Path) -> None:
    env = make_env(n_envs=256)
    model = BranchingIQN("MlpPolicy", env, **{
        **CHANGING, "buffer_size": 50_000, "batch_size": 64, "train_freq": 1, "gradient_steps": 2,
        "learning_starts": 256 * 10, "diagnostics_interval": 256 * 50, "hindsight": {"relabel": True},
        "policy_kwargs": {**TINY_POLICY, "normalize_observations": True},
        "diagnostics_path": str(tmp_path / "diag.jsonl")})
    assert model.hindsight_config is not None and model.graph_collect is None
    model.learn(256 * 200, log_interval=10)
    assert model.policy.q_net.observation_normalizer_fitted  # fitted on the host before the first capture
    block = model.collector.block
    # the random block's and the learning block's graphs (gradient steps 1, 2: the pattern (F, T) only)
    assert block is not None and block.captures == 2 and block.replays > 150
    assert int(model.replay_buffer.hindsight_counts["relabel"]) > 0  # trade closes made hindsight rows
    assert model._episode_num == 256 * 200 // 20 and all(e["l"] == 20 for e in model.ep_info_buffer)
    lines = read_diagnostics(tmp_path / "diag.jsonl")
    assert len(lines) == 4 and all(np.isfinite(line["loss"]) for line in lines)
    for line in lines:  # the device-side action counts reached every line
        assert all(sum(mix) == pytest.approx(1.0, abs=1e-5) for mix in line["action_mix"].values())
    model.check_finite()


def test_a_capture_that_syncs_falls_back_to_eager_blocks_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = TrainBlock.block

    def syncing(self, model, key):  # a host read inside the block: legal eagerly, refused by a capture
        outputs = original(self, model, key)
        float(self.counters[0])
        return outputs

    monkeypatch.setattr(TrainBlock, "block", syncing)
    model = fused_model(eager=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(64 * 2 * 20)
    fallbacks = [w for w in caught if "training block's CUDA graph is off" in str(w.message)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    block = model.collector.block
    assert block is not None and block.captures == 0 and block.eager_blocks == 20
    assert model.num_timesteps == 64 * 2 * 20 and model._n_updates == 20 * 3
    assert "capture failed" in model.collector.capture_reason()
    model.check_finite()


def test_the_nan_guard_inside_replays_undoes_the_steps_and_raises_at_the_sync_point() -> None:
    """The guard's device flags and masked restore inside the fused graph: once the sampled targets turn
    NaN, no gradient step of any later replay changes the online network, PopArt or the optimizer, and the
    error comes at the next sync point (a diagnostics line)."""
    from sb3_her_ext.guard import NonFiniteError

    model = fused_model(eager=False)
    model.learn(64 * 2 * 10)  # warm-up and captures
    model._total_timesteps *= 10  # rollouts past learn's end would anneal the learning rate below 0
    block = model.collector.block
    assert block is not None and block.captures == 2 and model.guard is not None
    buffer = model.replay_buffer
    buffer.rewards[: buffer.size()] = float("nan")  # every stored row: the next batches meet NaN targets
    online = {k: v.clone() for k, v in model.q_net.state_dict().items()}
    popart = {k: v.clone() for k, v in model.policy.popart.state_dict().items()}
    optimizer = [v.clone() for s in model.policy.optimizer.state.values() for v in s.values()
                 if isinstance(v, th.Tensor) and v.is_cuda]
    replays = block.replays
    for _ in range(4):
        model.collector.run_rollout()
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
