"""The training block (sb3_her_ext.collect.block) on the CPU: the function a CUDA graph captures, run eagerly,
gives SB3's loop's results across settings (past ``learning_starts``: SB3's warm-up here draws from the
block's warm-up generator); the schedules it computes on the device from its counters are SB3's host values
bit for bit; it changes its state only in place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.utils import LinearSchedule

from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.collect.episodes import random_actions
from sb3_her_ext.diagnostics import read_diagnostics
from sb3_her_ext.exploration import branch_epsilons, linear_anneal, select_actions
from tests.sb3_her_ext._op_count import ops_of

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


def make_env(cls: type = DeviceLOBVecEnv, n_envs: int = 4, **kwargs) -> LOBVecEnv:
    params = dict(seed=0, data="synthetic", num_steps=1500, episode_length=20)
    return cls(n_envs, device="cpu", **{**params, **kwargs})


class DeviceWarmUp(BranchingIQN):
    """SB3's loop with the warm-up's random actions drawn as the training block draws them (its warm-up
    generator, seeded ``seed + 1``), so that the two loops can be compared past ``learning_starts``."""

    def _sample_action(self, learning_starts: int, action_noise=None, n_envs: int = 1):
        if self.num_timesteps >= learning_starts:
            return super()._sample_action(learning_starts, action_noise, n_envs)
        if getattr(self, "_warm_up", None) is None:
            self._warm_up = th.Generator().manual_seed(self.seed + 1)
        actions = random_actions(th.tensor(self.action_dims), self._warm_up, n_envs).numpy()
        return actions, actions


def run(tmp_path: Path, blocks: bool, total: int = 400, **kwargs) -> BranchingIQN:
    name = "blocks" if blocks else "sb3"
    cls = BranchingIQN if blocks else DeviceWarmUp
    model = cls("MlpPolicy", make_env(DeviceLOBVecEnv if blocks else LOBVecEnv),
                diagnostics_path=str(tmp_path / f"{name}.jsonl"), diagnostics_interval=40,
                **{**TINY, **kwargs})
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
    assert a._current_progress_remaining == b._current_progress_remaining
    assert a._episode_num == b._episode_num
    assert [(e["r"], e["l"]) for e in a.ep_info_buffer] == [(e["r"], e["l"]) for e in b.ep_info_buffer]
    if a.guard is not None:
        assert th.equal(a.guard.first, b.guard.first) and th.equal(a.guard.steps, b.guard.steps)


def assert_block_state_is_the_hosts(model: BranchingIQN) -> None:
    """The block's device counters and carried schedule values are the host's (computed apart)."""
    block = model.collector.block
    assert block.counters.tolist() == [model.num_timesteps, model._n_calls]
    assert block.carried.tolist() == [model.exploration_rate, model.iqr_bonus]


@pytest.mark.parametrize("kwargs", [
    {},
    dict(tau=0.3, target_update_interval=4),  # Polyak updates, two in each block (50 // 4 envs = 1 call)
    dict(train_freq=3, gradient_steps=2, vaccine_interval=3, nan_guard=False, exploration_fraction=0.37),
    dict(gradient_steps=-1, vaccine_interval=0, learning_starts=40, per_beta=0.7),
    dict(learning_starts=44),  # the rollout from 40 acts randomly at 40, then explores: two blocks
    dict(learning_starts=39),  # the rollout from 32 acts randomly only, and trains: a random block with g
    dict(learning_starts=1, iqr_bonus=0.2),  # random then exploring steps, then the normalizer's fit, then g
])
def test_the_block_equals_sb3s_loop_across_settings(tmp_path: Path, kwargs: dict) -> None:
    sb3 = run(tmp_path, blocks=False, total=240, **kwargs)
    blocks = run(tmp_path, blocks=True, total=240, **kwargs)
    assert_same_training(sb3, blocks)
    assert_block_state_is_the_hosts(blocks)
    assert blocks.collector.block.eager_blocks >= 240 // (4 * blocks.train_freq.frequency)
    # diagnostics lines: the same points and the same collection numbers (a block's line comes after its
    # gradient steps), where the interval (40) is a whole number of rollouts (else a line due inside a
    # rollout is written at its end)
    if 40 % (4 * blocks.train_freq.frequency):
        return
    lines_sb3 = read_diagnostics(tmp_path / "sb3.jsonl")
    lines_blocks = read_diagnostics(tmp_path / "blocks.jsonl")
    assert len(lines_sb3) == len(lines_blocks) > 0
    for a, b in zip(lines_sb3, lines_blocks, strict=True):
        for key in ("step", "eps", "action_mix", "iqr_mean", "ens_std", "hindsight", "iqr_bonus",
                    "ep_rew_mean"):
            assert a[key] == b[key], key


def test_learn_again_without_reset_continues_as_sb3s_loop(tmp_path: Path) -> None:
    """A second learn (reset_num_timesteps=False, another total): the carried ε and bonus and the counters
    go on from where the first left them, as in SB3's loop."""
    models = []
    for blocks in (False, True):
        model = run(tmp_path, blocks=blocks, total=120, exploration_fraction=0.5)
        model.learn(200, reset_num_timesteps=False)
        models.append(model)
    assert_same_training(*models)
    assert_block_state_is_the_hosts(models[1])
    assert models[1].num_timesteps == 320


def test_schedule_settings_changed_between_learns_make_a_new_block(tmp_path: Path) -> None:
    models = []
    for blocks in (False, True):
        model = run(tmp_path, blocks=blocks, total=80)
        first = model.collector.block
        model.per_beta_range, model.iqr_bonus_range = (0.5, 0.9), (0.2, 0.1)
        model.learn(80, reset_num_timesteps=False)
        assert not blocks or model.collector.block is not first
        models.append(model)
    assert_same_training(*models)
    model = models[1]
    model.exploration_schedule = lambda progress: 0.1
    with pytest.raises(ValueError, match="exploration_schedule=.*LinearSchedule"):
        model.learn(8, reset_num_timesteps=False)


@pytest.mark.parametrize("n_envs,k", [(4, 1), (4, 3), (7, 5), (64, 2)])
def test_schedules_from_the_counter_are_sb3s_host_values_bit_for_bit(n_envs: int, k: int) -> None:
    """ε (LinearSchedule), the IQR bonus and PER β (linear_anneal) at every step, and the due target
    updates, computed on the device from the counters, equal SB3's host arithmetic for many counters and
    totals (float64, compared exactly)."""
    model = BranchingIQN("MlpPolicy", make_env(n_envs=n_envs), **{
        **TINY, "exploration_fraction": 0.37, "exploration_initial_eps": 0.9, "exploration_final_eps": 0.03,
        "iqr_bonus": (0.3, 0.05), "per_beta": (0.4, 1.0), "target_update_interval": 3 * n_envs + 1})
    model.learn(n_envs * 2)
    block = model.collector.block
    rng = np.random.default_rng(0)
    interval = max(model.target_update_interval // n_envs, 1)
    for total in (1000, 12_345, 10**7 + 3, 2**40 + 1):
        for first in rng.integers(0, total, 20).tolist() + [0, total - n_envs]:
            model.num_timesteps, model._total_timesteps = first, total
            model._n_calls = int(rng.integers(0, 10**6))
            model.exploration_rate, model.iqr_bonus = 0.123456789, 0.0987654321  # carried from before
            block.load(model)
            calls = model._n_calls
            _, rates, beta, due = block.schedules(k)
            expected_eps, expected_bonus = [model.exploration_rate], [model.iqr_bonus]
            for _ in range(k):  # SB3's _on_step after each vector step
                model.num_timesteps += n_envs
                model.update_progress()
                model.advance_schedules()
                expected_eps.append(model.exploration_rate)
                expected_bonus.append(model.iqr_bonus)
            assert rates[0].tolist() == np.float32(expected_eps[:k]).tolist()
            assert rates[1].tolist() == np.float32(expected_bonus[:k]).tolist()
            assert block.carried.tolist() == [expected_eps[k], expected_bonus[k]]  # float64: exact
            assert float(beta) == model.replay_buffer.beta
            count = sum((calls + j) % interval == 0 for j in range(1, k + 1))
            assert int(due[0]) == count and (k > interval or int(due[1]) == 1 - count)
            assert block.counters.tolist() == [model.num_timesteps, model._n_calls]


def test_the_schedules_cost_few_ops() -> None:
    """Each op is a kernel of a captured block: the schedules of a block, computed from the counters (one
    H2D copy of a host-made schedule and 6 ops before, in the fused block of issue 14)."""
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)
    model.learn(8)
    block = model.collector.block
    block.schedules(4)  # its constants made once
    ops = ops_of(lambda: block.schedules(4))
    assert len(ops) <= 12, ops
    assert len(ops_of(lambda: block.schedules(4, acting=False))) == len(ops) - 1


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


@pytest.mark.parametrize("value", ["yes", 1])
def test_bad_graph_collect_names_field_and_value(value: object) -> None:
    with pytest.raises(ValueError, match="graph_collect"):
        BranchingIQN("MlpPolicy", make_env(), **{**TINY, "graph_collect": value})


def test_graph_collect_true_needs_cuda_graph() -> None:
    with pytest.raises(ValueError, match="graph_collect=True needs cuda_graph=True"):
        BranchingIQN("MlpPolicy", make_env(), **{**TINY, "graph_collect": True})


def test_graph_collect_true_warns_once_when_the_blocks_run_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)
    assert model.collector.capture_reason() == "device=cpu: CUDA graphs need a CUDA device"
    monkeypatch.setattr(model, "graph_collect", True)  # the CPU model cannot ask for it at construction
    with pytest.warns(RuntimeWarning, match="graph_collect=True, but the training blocks run") as warned:
        model.learn(40)
        model.learn(40)
    assert len([w for w in warned if "graph_collect=True" in str(w.message)]) == 1
    model.graph_collect = False
    assert model.collector.capture_reason() == "graph_collect=False"


def _state_tensors(model: BranchingIQN) -> dict[str, th.Tensor]:
    """Every tensor a block reads and writes as state (what a CUDA graph must find at the same address)."""
    buffer, env = model.replay_buffer, model.get_env()
    block = model.collector.block
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
                    "diag.select_pair": diagnostics._select_pair})
    tensors.update({"stats.returns": block.stats.returns, "stats.lengths": block.stats.lengths,
                    "stats.count": block.stats.count, "action_counts": block.action_counts})
    tensors.update({f"env.{k}": v for k, v in env.lob._state_tensors().items()})
    tensors.update({"env.ep_return": env._ep_return_t, "env.ep_length": env._ep_length_t})
    tensors.update({"block.obs": block.obs, "block.counters": block.counters, "block.total": block.total,
                    "block.carried": block.carried})
    return tensors


def test_a_block_changes_its_state_only_in_place(tmp_path: Path) -> None:
    """What a graph replay needs: every state tensor a block reads is the one it writes (a block that made a
    new tensor would leave its graph reading the old one). Vaccine and plain steps, Polyak updates, episode
    ends, hindsight rows, a diagnostics flush between blocks and a new learn (its load)."""
    model = BranchingIQN("MlpPolicy", make_env(), diagnostics_interval=16,
                         **{**TINY, "tau": 0.5, "target_update_interval": 4})
    model.collector.configure(stats_interval=16)
    model.learn(8 * 3)  # optimizer state and the guard's copies exist after the first blocks
    before = _state_tensors(model)
    pointers = {k: v.data_ptr() for k, v in before.items()}
    block = model.collector.block
    model.learn(8 * 30, reset_num_timesteps=False)
    after = _state_tensors(model)
    assert after.keys() == before.keys() and model.collector.block is block
    moved = [k for k in before if after[k] is not before[k] or after[k].data_ptr() != pointers[k]]
    assert not moved
    # 3 + 30 rollouts of 8 steps; the first (learning_starts=0: an empty buffer) fits the normalizer between
    # its steps and its gradient step: two blocks
    assert block.eager_blocks == 33 + 1


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
