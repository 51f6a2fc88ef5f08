"""The fused collect + train block (sb3_her_ext.collect.fused) on the CPU: the function a CUDA graph captures,
run eagerly, gives the device loop's results; schedule values read from device tensors equal the Python
schedules; configurations that do not qualify keep the device loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.utils import LinearSchedule

from foxhunt.device_env import DeviceLOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.collect import NORMALIZER_PENDING, RANDOM, CaptureError, FusedBlock
from sb3_her_ext.diagnostics import read_diagnostics
from sb3_her_ext.exploration import branch_epsilons, linear_anneal, select_actions

TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)
TINY = dict(learning_starts=0, batch_size=16, buffer_size=2000, train_freq=2, target_update_interval=50,
            policy_kwargs=TINY_POLICY, seed=0, device="cpu", vaccine_interval=2)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks run faster on one thread, above all on a shared 2-core CI machine."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def make_env(n_envs: int = 4, device: str = "cpu", **kwargs) -> DeviceLOBVecEnv:
    params = dict(seed=0, data="synthetic", num_steps=1500, episode_length=20)
    return DeviceLOBVecEnv(n_envs, device=device, **{**params, **kwargs})


def run(tmp_path: Path, fused: bool, total: int = 400, stride: int = 2, random_blocks: bool = False,
        **kwargs) -> BranchingIQN:
    name = ("random" if random_blocks else "fused") if fused else "loop"
    model = BranchingIQN("MlpPolicy", make_env(), diagnostics_path=str(tmp_path / f"{name}.jsonl"),
                         diagnostics_interval=40, **{**TINY, **kwargs})
    model.collector.configure(callback_stride=stride, eager=fused, fuse_random_rollouts=random_blocks)
    return model.learn(total, log_interval=1)


def assert_same_training(a: BranchingIQN, b: BranchingIQN) -> None:
    for name in a.replay_buffer._tensor_names():
        assert th.equal(getattr(a.replay_buffer, name), getattr(b.replay_buffer, name)), name
    for key in ("backward", "forward", "relabel"):
        assert int(a.replay_buffer.hindsight_counts[key]) == int(b.replay_buffer.hindsight_counts[key])
    for (name, x), y in zip(a.policy.state_dict().items(), b.policy.state_dict().values(), strict=True):
        assert th.equal(x, y), name
    opt_a, opt_b = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    assert opt_a.keys() == opt_b.keys()
    for key in opt_a:
        assert all(th.equal(opt_a[key][k], opt_b[key][k]) for k in opt_a[key])
    assert a._n_updates == b._n_updates > 0 and a._n_gradient_steps == b._n_gradient_steps
    assert a.num_timesteps == b.num_timesteps and a._n_calls == b._n_calls
    assert a.exploration_rate == b.exploration_rate and a.iqr_bonus == b.iqr_bonus
    assert a.replay_buffer.beta == b.replay_buffer.beta
    assert a._episode_num == b._episode_num
    assert [(e["r"], e["l"]) for e in a.ep_info_buffer] == [(e["r"], e["l"]) for e in b.ep_info_buffer]
    if a.guard is not None:
        assert th.equal(a.guard.first, b.guard.first) and th.equal(a.guard.steps, b.guard.steps)


def test_the_fused_block_run_eagerly_equals_the_device_loop(tmp_path: Path) -> None:
    loop, fused = run(tmp_path, fused=False), run(tmp_path, fused=True)
    block = fused.collector.block
    # learning_starts=0: the first rollout finds an empty buffer, so the observation normalizer is fitted by
    # that rollout's train() and only the later rollouts are fused
    assert block is not None and block.eager_blocks == 400 // 8 - 1 and block.captures == 0
    assert loop.collector.block is None
    assert_same_training(loop, fused)
    assert fused._episode_num == 20 and int(fused.replay_buffer.hindsight_counts["relabel"]) > 0
    # diagnostics lines: the same points and the same collection numbers (a line comes after its block's
    # gradient steps in the fused path, so the loss means may differ)
    lines_loop = read_diagnostics(tmp_path / "loop.jsonl")
    lines_fused = read_diagnostics(tmp_path / "fused.jsonl")
    assert len(lines_loop) == len(lines_fused) == 10
    for a, b in zip(lines_loop, lines_fused, strict=True):
        for key in ("step", "eps", "action_mix", "iqr_mean", "ens_std", "hindsight", "iqr_bonus",
                    "ep_rew_mean"):
            assert a[key] == b[key], key


def test_without_the_normalizer_every_rollout_is_fused(tmp_path: Path) -> None:
    policy = {**TINY["policy_kwargs"], "normalize_observations": False}
    fused = run(tmp_path, fused=True, policy_kwargs=policy)
    block = fused.collector.block
    assert block is not None and block.eager_blocks == 400 // 8


@pytest.mark.parametrize("kwargs", [
    dict(tau=0.3, target_update_interval=4),  # Polyak updates, two in each block (50 // 4 envs = 1 call)
    dict(train_freq=3, gradient_steps=2, vaccine_interval=3, nan_guard=False),
    dict(gradient_steps=-1, vaccine_interval=0, learning_starts=40, per_beta=0.7),
])
def test_the_fused_block_equals_the_device_loop_across_settings(tmp_path: Path, kwargs: dict) -> None:
    stride = kwargs.get("train_freq", 2)
    loop = run(tmp_path, fused=False, total=240, stride=stride, **kwargs)
    fused = run(tmp_path, fused=True, total=240, stride=stride, **kwargs)
    assert_same_training(loop, fused)
    block = fused.collector.block
    assert block is not None and block.eager_blocks > 0


@pytest.mark.parametrize("learning_starts", [40, 44])
def test_random_rollouts_as_fused_random_blocks_give_the_device_loops_results(tmp_path: Path,
                                                                             learning_starts: int) -> None:
    """Rollouts of 2 vector steps x 4 envs: the five before 40 env steps run as random blocks; with 44 the
    rollout from 40 reaches past it and runs through the device loop (random, then exploring actions)."""
    loop = run(tmp_path, fused=False, total=240, learning_starts=learning_starts)
    fused = run(tmp_path, fused=True, total=240, learning_starts=learning_starts)
    randomised = run(tmp_path, fused=True, total=240, learning_starts=learning_starts, random_blocks=True)
    assert_same_training(loop, randomised)
    assert fused.collector.block is not None and randomised.collector.block is not None
    assert randomised.collector.block.eager_blocks == fused.collector.block.eager_blocks + 5
    assert randomised.collector.block.random_generator is randomised.collector.warmup_generator
    assert fused.collector.block.random_generator is None


def test_random_blocks_qualify_only_wholly_before_learning_starts() -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)  # observation normalizer on, not fitted yet
    freq, env = TrainFreq(2, TrainFrequencyUnit.STEP), model.get_env()
    model.collector.configure(callback_stride=2, eager=True)
    assert "learning_starts=8 (random actions)" in model.collector.unsupported_reason(env, freq, 8)
    model.collector.configure(callback_stride=2, eager=True, fuse_random_rollouts=True)
    assert model.collector.unsupported_reason(env, freq, 8) is None  # 2 steps x 4 envs: all before 8
    assert "reaches past learning_starts" in model.collector.unsupported_reason(env, freq, 7)
    assert model.collector.unsupported_reason(env, freq, 0) == NORMALIZER_PENDING  # it acts through it
    with pytest.raises(ValueError, match="fuse_random_rollouts='yes' must be a bool"):
        model.collector.configure(fuse_random_rollouts="yes")  # type: ignore[arg-type]


def test_a_failed_random_block_capture_turns_off_only_the_random_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = FusedBlock.run

    def refuse_random(self, model, key):
        if key is RANDOM:
            raise CaptureError("RuntimeError: operation not permitted when stream is capturing")
        return real_run(self, model, key)

    monkeypatch.setattr(FusedBlock, "run", refuse_random)
    with pytest.warns(RuntimeWarning, match="random rollouts' CUDA graph is off") as warned:
        model = run(tmp_path, fused=True, total=240, learning_starts=40, random_blocks=True)
    assert len([w for w in warned if issubclass(w.category, RuntimeWarning)]) == 1
    assert model.collector.failed is None and "capture failed" in model.collector.random_failed
    assert model.collector.block is not None and model.collector.block.eager_blocks > 0  # learning: fused
    monkeypatch.setattr(FusedBlock, "run", real_run)
    assert_same_training(run(tmp_path, fused=False, total=240, learning_starts=40), model)


def test_schedule_values_read_from_device_tensors_equal_the_python_schedules() -> None:
    schedule = LinearSchedule(1.0, 0.05, 0.1)
    mults = th.tensor([1.0, 0.5, 2.0, 0.3])
    generator = th.Generator()
    for progress in np.linspace(1.0, 0.0, 37):
        eps = schedule(float(progress))
        as_tensor = th.tensor(eps, dtype=th.float64).float()
        assert th.equal(branch_epsilons(eps, mults), branch_epsilons(as_tensor, mults))
        bonus = linear_anneal(0.3, 0.05, float(progress))
        q, iqr, std = (th.randn(64, 4, 3) for _ in range(3))
        n_actions, boltzmann = th.tensor([3, 3, 3, 2]), th.tensor([False, True, False, False])
        generator.manual_seed(1)
        by_number = select_actions(q, iqr, std, n_actions, branch_epsilons(eps, mults), boltzmann, bonus, 0.2,
                                   generator)
        generator.manual_seed(1)
        by_tensor = select_actions(q, iqr, std, n_actions, branch_epsilons(as_tensor, mults), boltzmann,
                                   th.tensor(bonus, dtype=th.float64).float(), 0.2, generator)
        assert th.equal(by_number, by_tensor)


def test_the_fused_blocks_schedule_tensor_holds_the_device_loops_values(tmp_path: Path) -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **{**TINY, "train_freq": 3})
    model.collector.configure(callback_stride=3, eager=True)
    model.learn(12 * 5)
    block = model.collector.block
    assert block is not None
    # what prepare wrote for the next block equals what the device loop's _on_step would give step by step
    start, calls = model.num_timesteps, model._n_calls
    eps0, bonus0 = model.exploration_rate, model.iqr_bonus
    model._total_timesteps = 12 * 40
    key = block.prepare(model)
    values = block.schedule.tolist()
    expected_eps, expected_bonus, t = [eps0], [bonus0], start
    for _ in range(2):
        t += 4
        progress = 1.0 - t / (12 * 40)
        expected_eps.append(model.exploration_schedule(progress))
        expected_bonus.append(linear_anneal(*model.iqr_bonus_range, progress))
    assert values[:3] == expected_eps and values[3:6] == expected_bonus
    assert values[6:9] == [float((calls + i) % 12 == 0) for i in (1, 2, 3)]  # 50 // 4 = 12 calls
    assert values[9] == linear_anneal(*model.per_beta_range, 1.0 - (start + 12) / (12 * 40))
    assert values[10] == start and model.num_timesteps == start + 12
    assert key == ((model._n_gradient_steps + 1) % 2 == 0,)  # one gradient step: a vaccine step when even


def test_configurations_that_do_not_qualify_keep_the_device_loop() -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)
    freq = TrainFreq(2, TrainFrequencyUnit.STEP)
    env = model.get_env()
    unsupported_reason = model.collector.unsupported_reason
    assert "CUDA" in unsupported_reason(env, freq, 0)  # CPU without eager
    model.collector.configure(eager=True)
    assert "callback_stride=1" in unsupported_reason(env, freq, 0)
    model.collector.configure(callback_stride=4, eager=True)
    assert unsupported_reason(env, freq, 0) == NORMALIZER_PENDING
    model.policy.fit_observation_normalizer(th.randn(8, model.observation_space.shape[0]))
    assert unsupported_reason(env, freq, 0) is None
    assert "learning_starts" in unsupported_reason(env, freq, 10)
    # a rollout of another length than the model's train_freq is not the learn loop's (no train follows)
    assert "not the learn loop's" in unsupported_reason(env, TrainFreq(4, TrainFrequencyUnit.STEP), 0)
    model.graph_collect = False
    assert unsupported_reason(env, freq, 0) == "graph_collect=False"


@pytest.mark.parametrize("value", ["yes", 1])
def test_bad_graph_collect_names_field_and_value(value: object) -> None:
    with pytest.raises(ValueError, match="graph_collect"):
        BranchingIQN("MlpPolicy", make_env(), **{**TINY, "graph_collect": value})


def test_graph_collect_true_needs_cuda_graph() -> None:
    with pytest.raises(ValueError, match="graph_collect=True needs cuda_graph=True"):
        BranchingIQN("MlpPolicy", make_env(), **{**TINY, "graph_collect": True})


class StopAt(BaseCallback):
    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls = calls
        self.seen: list[int] = []

    def _on_step(self) -> bool:
        self.seen.append(self.num_timesteps)
        return len(self.seen) < self.calls


def test_callbacks_run_at_block_ends_and_can_stop_training() -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)
    model.collector.configure(callback_stride=4, eager=True)
    callback = StopAt(3)
    model.learn(400, callback=callback)
    # every 4 vector steps (2 blocks of 2) of 4 envs; the stopping block is stored and trained (documented)
    assert callback.seen == [16, 32, 48] and model.num_timesteps == 48
    assert model._n_updates == 48 // 8


def test_a_failed_capture_warns_once_and_the_device_loop_takes_over(monkeypatch: pytest.MonkeyPatch) -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)
    model.collector.configure(callback_stride=2, eager=True)

    def refuse(self, model, key):  # what a capture meeting a host sync does: raise, nothing of it ran
        raise CaptureError("RuntimeError: operation not permitted when stream is capturing")

    monkeypatch.setattr(FusedBlock, "run", refuse)
    with pytest.warns(RuntimeWarning, match="not permitted when stream is capturing") as warned:
        model.learn(80)
    assert len([w for w in warned if issubclass(w.category, RuntimeWarning)]) == 1
    assert "capture failed" in model.collector.unsupported_reason(
        model.get_env(), TrainFreq(2, TrainFrequencyUnit.STEP), 0)
    # the host counters the failed block had advanced were put back: the device loop's run, step for step
    reference = BranchingIQN("MlpPolicy", make_env(), **TINY)  # made after: torch's global stream is seeded
    reference.collector.configure(callback_stride=2)
    reference.learn(80)
    assert_same_training(reference, model)


def _state_tensors(model: BranchingIQN) -> dict[str, th.Tensor]:
    """Every tensor a block reads and writes as state (what a CUDA graph must find at the same address)."""
    buffer, env = model.replay_buffer, model.get_env()
    loop = model.collector
    tensors = {f"policy.{k}": v for k, v in model.policy.state_dict(keep_vars=True).items()}
    tensors.update({f"vaccine.{k}": v for k, v in model.vaccine.state_dict(keep_vars=True).items()})
    for i, state in enumerate(model.policy.optimizer.state.values()):
        tensors.update({f"optimizer.{i}.{k}": v for k, v in state.items() if isinstance(v, th.Tensor)})
    tensors.update({f"storage.{k}": v for k, v in vars(buffer.storage).items() if isinstance(v, th.Tensor)})
    tensors["buffer.sample_rng_state"] = buffer.sample_rng_state
    tensors.update({f"hindsight.{k}": v for k, v in buffer.hindsight_state.tensors().items()})
    tensors.update({"guard.first": model.guard.first, "guard.steps": model.guard.steps})
    diagnostics = model.diagnostics
    tensors.update({"diag.train_sums": diagnostics._train_sums,
                    "diag.train_counts": diagnostics._train_counts,
                    "diag.select_count": diagnostics._select_count,
                    **{f"diag.{k}": v for k, v in diagnostics._select_sums.items()}})
    tensors.update({"stats.returns": loop.stats.returns, "stats.lengths": loop.stats.lengths,
                    "stats.count": loop.stats.count, "action_counts": loop.action_counts})
    tensors.update({f"env.{k}": v for k, v in env.lob._state_tensors().items()})
    tensors.update({"env.ep_return": env._ep_return_t, "env.ep_length": env._ep_length_t})
    block = model.collector.block
    tensors.update({"block.obs": block.obs, "block.schedule": block.schedule})
    return tensors


def test_a_block_changes_its_state_only_in_place(tmp_path: Path) -> None:
    """What a graph replay needs: every state tensor a block reads is the one it writes (a block that made a
    new tensor would leave its graph reading the old one). Vaccine and plain steps, Polyak updates, episode
    ends, hindsight rows and a diagnostics flush between blocks."""
    model = BranchingIQN("MlpPolicy", make_env(), diagnostics_interval=16,
                         **{**TINY, "tau": 0.5, "target_update_interval": 4})
    model.collector.configure(callback_stride=2, stats_interval=16, eager=True)
    model.learn(8 * 3)  # optimizer state and the guard's copies exist after the first blocks
    before = _state_tensors(model)
    pointers = {k: v.data_ptr() for k, v in before.items()}
    model.learn(8 * 30, reset_num_timesteps=False)
    after = _state_tensors(model)
    assert after.keys() == before.keys()
    moved = [k for k in before if after[k] is not before[k] or after[k].data_ptr() != pointers[k]]
    assert not moved
    # 3 + 30 rollouts of 8 steps; the first (learning_starts=0: an empty buffer) fits the normalizer unfused
    assert model.collector.block.eager_blocks == 33 - 1


def test_fused_blocks_and_device_loop_rollouts_mix(tmp_path: Path) -> None:
    """The fused path hands the env, the statistics and the counters to the device loop (and the numpy
    face) and back."""

    def three_learns(fused: bool) -> BranchingIQN:
        model = BranchingIQN("MlpPolicy", make_env(), **TINY)
        model.collector.configure(callback_stride=2, eager=True)
        for collect in (None, False, None):
            model.graph_collect = collect if fused else False
            model.learn(120, reset_num_timesteps=False)
            env = model.get_env()  # the numpy face steps the same books in between (statistics hand over)
            env.step(np.ones((env.num_envs, 4), dtype=np.int64))
        return model

    mixed = three_learns(fused=True)
    loop = three_learns(fused=False)
    # the first rollout (learning_starts=0: an empty buffer) fits the normalizer unfused
    assert mixed.collector.block.eager_blocks == 2 * 120 // 8 - 1
    assert loop.collector.block is None
    assert_same_training(loop, mixed)
    assert th.equal(mixed.get_env().current_obs(), loop.get_env().current_obs())


def test_graph_collect_true_warns_once_when_a_rollout_does_not_qualify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)
    monkeypatch.setattr(model, "graph_collect", True)  # the CPU model cannot ask for it at construction
    model.collector.configure(eager=True)  # qualifies but for the callback stride (1, train_freq 2)
    with pytest.warns(RuntimeWarning, match="callback_stride=1 is not a multiple of train_freq=2") as warned:
        model.learn(40)
    assert len([w for w in warned if "graph_collect=True" in str(w.message)]) == 1
    assert model.collector.block is None


@pytest.mark.parametrize("beta", [0.0, 0.4, 0.5, 0.77, 1.0])
def test_sampling_with_beta_as_a_tensor_equals_sample(beta: float) -> None:
    from gymnasium import spaces

    from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

    rng = np.random.default_rng(0)
    buffer = PrioritizedHindsightReplayBuffer(100, spaces.Box(-1, 1, (3,)), spaces.MultiDiscrete([3, 3]),
                                              device="cpu", n_envs=4)
    for _ in range(10):
        buffer.add(rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.integers(0, 3, (4, 2)),
                   rng.normal(size=4), np.zeros(4), [{}] * 4)
    buffer.update_priorities(th.arange(40), th.rand(40, generator=th.Generator().manual_seed(1)))
    buffer.beta = beta
    buffer.generator.manual_seed(3)
    by_number = buffer.sample(32)
    buffer.generator.manual_seed(3)
    by_tensor = buffer.sample_with_beta(32, th.tensor(beta, dtype=th.float64))
    assert th.equal(by_number.indices, by_tensor.indices)
    th.testing.assert_close(by_tensor.weights, by_number.weights, rtol=1e-6, atol=0)
    assert th.equal(by_tensor.weights, by_number.weights)  # on the CPU the same numbers
