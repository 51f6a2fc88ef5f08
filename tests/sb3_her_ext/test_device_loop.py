"""Training blocks on a device env: same replay, parameters, statistics and diagnostics as SB3's loop on
the CPU; callbacks at block ends, progress, save/load; warm-up draws in distribution; on CUDA no host sync
inside a rollout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback, ProgressBarCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.vec_env import VecEnvWrapper, VecFrameStack

from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.collect import CollectorSettings, DeviceCollector, EpisodeStats
from sb3_her_ext.collect.episodes import random_actions, record_steps
from sb3_her_ext.device_vec_env import DeviceStep
from sb3_her_ext.diagnostics import read_diagnostics
from tests.sb3_her_ext._host_vec_env import ToyVecEnv
from tests.sb3_her_ext._op_count import OpCount, ops_of

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


def make_env(cls: type = DeviceLOBVecEnv, n_envs: int = 4, device: str = "cpu", **kwargs) -> LOBVecEnv:
    params = dict(seed=0, data="synthetic", num_steps=1500, episode_length=20)
    return cls(n_envs, device=device, **{**params, **kwargs})


class Recorder(BaseCallback):
    """Counts ``on_step`` calls and the ``num_timesteps`` at each; stops after ``stop_after`` calls."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.stop_after = stop_after
        self.seen: list[int] = []

    def _on_step(self) -> bool:
        self.seen.append(self.num_timesteps)
        return self.stop_after is None or len(self.seen) < self.stop_after


# ---------------------------------------------------------------------- same results as SB3's loop


def run(env_cls: type, tmp_path: Path, total: int = 400, **kwargs) -> BranchingIQN:
    path = tmp_path / f"{env_cls.__name__}.jsonl"
    model = BranchingIQN("MlpPolicy", make_env(env_cls), diagnostics_path=str(path), diagnostics_interval=40,
                         **{**TINY, **kwargs})
    return model.learn(total, log_interval=1)


def test_device_loop_equals_sb3_loop_on_the_cpu(tmp_path: Path) -> None:
    relabel = {"hindsight": {"relabel": True}}  # every hindsight kind, the optional relabel too
    sb3, dev = run(LOBVecEnv, tmp_path, **relabel), run(DeviceLOBVecEnv, tmp_path, **relabel)
    # replay contents, tree, counters and sampling state
    for name in sb3.replay_buffer._tensor_names():
        assert th.equal(getattr(sb3.replay_buffer, name), getattr(dev.replay_buffer, name)), name
    # hindsight counts (the trackers saw the same trajectory)
    counts = {k: int(v) for k, v in dev.replay_buffer.hindsight_counts.items()}
    assert counts == {k: int(v) for k, v in sb3.replay_buffer.hindsight_counts.items()}
    assert counts["relabel"] > 0
    # the same updates: parameters, PopArt statistics, optimizer state, target network
    for a, b in zip(sb3.policy.state_dict().values(), dev.policy.state_dict().values(), strict=True):
        assert th.equal(a, b)
    opt_sb3, opt_dev = sb3.policy.optimizer.state_dict()["state"], dev.policy.optimizer.state_dict()["state"]
    assert opt_sb3.keys() == opt_dev.keys()
    for key in opt_sb3:
        assert all(th.equal(opt_sb3[key][k], opt_dev[key][k]) for k in opt_sb3[key])
    assert sb3._n_updates == dev._n_updates > 0 and sb3.num_timesteps == dev.num_timesteps == 400
    # episode statistics
    assert sb3._episode_num == dev._episode_num == 20
    assert [(e["r"], e["l"]) for e in sb3.ep_info_buffer] == [(e["r"], e["l"]) for e in dev.ep_info_buffer]
    # diagnostics lines: the same points and collection numbers; a block's line comes after its gradient
    # step (SB3's before the rollout's), so it counts one more update
    lines_sb3 = read_diagnostics(tmp_path / "LOBVecEnv.jsonl")
    lines_dev = read_diagnostics(tmp_path / "DeviceLOBVecEnv.jsonl")
    assert len(lines_sb3) == len(lines_dev) == 10
    for a, b in zip(lines_sb3, lines_dev, strict=True):
        for key in COLLECTION_KEYS:
            assert a[key] == b[key], key
        assert a["per"]["beta"] == b["per"]["beta"] and a["per"]["size"] == b["per"]["size"]
        assert b["n_updates"] == a["n_updates"] + 1


#: what a diagnostics line says of collection (the rest: of the gradient steps since the last line)
COLLECTION_KEYS = ("step", "eps", "action_mix", "iqr_mean", "ens_std", "hindsight", "iqr_bonus",
                   "ep_rew_mean")


def test_the_hook_dispatches_on_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = DeviceCollector.run_rollout

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(DeviceCollector, "run_rollout", spy)
    BranchingIQN("MlpPolicy", make_env(LOBVecEnv, 2), **TINY).learn(20)
    assert calls == []
    BranchingIQN("MlpPolicy", make_env(DeviceLOBVecEnv, 2), **TINY).learn(20)
    assert len(calls) == 5  # 20 steps / 2 envs / train_freq 2


def test_supports_only_what_it_can_run() -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY)
    steps = TrainFreq(2, TrainFrequencyUnit.STEP)
    supports = model.collector.supports
    assert supports(model.env, steps)
    assert not supports(make_env(LOBVecEnv), steps)
    assert not supports(VecFrameStack(model.env, 2), steps)  # forwards step_tensors, but is a wrapper
    assert not supports(model.env, TrainFreq(1, TrainFrequencyUnit.EPISODE))
    assert not supports(model.env, steps, action_noise=object())


class ToyDeviceEnv(ToyVecEnv):
    """A contextual bandit with both faces, no foxhunt: reward 1 when branch 0's action is 2 where
    ``obs[0] > 0`` and 0 elsewhere; episodes of ``horizon`` steps (timeouts). The numpy face runs on the
    tensor face, so both loops see the same trajectory for the same actions."""

    def __init__(self, n_envs: int, device: str = "cpu", seed: int = 0, horizon: int = 8) -> None:
        self.render_mode = None
        super().__init__(n_envs, spaces.Box(-1.0, 1.0, (4,), np.float32), spaces.MultiDiscrete([3, 3]))
        self.device = th.device(device)
        self.generator = th.Generator(device=self.device).manual_seed(seed)
        self.horizon = horizon
        self._t = th.zeros(n_envs, dtype=th.int64, device=self.device)
        self._return = th.zeros(n_envs, dtype=th.float64, device=self.device)
        self._obs = self._draw()
        self._actions: th.Tensor | None = None

    def _draw(self) -> th.Tensor:
        return th.rand((self.num_envs, 4), generator=self.generator, device=self.device) * 2 - 1

    def current_obs(self) -> th.Tensor:
        return self._obs

    def step_tensors(self, actions: th.Tensor) -> DeviceStep:
        target = th.where(self._obs[:, 0] > 0, 2, 0)
        reward = (actions[:, 0] == target).float()
        self._obs = self._draw()
        length = self._t + 1
        episode_return = self._return + reward.double()
        done = length >= self.horizon
        self._t, self._return = length.masked_fill(done, 0), episode_return.masked_fill(done, 0.0)
        return DeviceStep(self._obs, reward, done, self._obs, {"TimeLimit.truncated": done}, episode_return,
                          length)

    def reset(self) -> np.ndarray:
        self._t.zero_()
        self._return.zero_()
        self._obs = self._draw()
        return self._obs.cpu().numpy().copy()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = th.as_tensor(actions, device=self.device)

    def step_wait(self) -> tuple:
        step = self.step_tensors(self._actions)
        done = step.done.cpu().numpy()
        infos: list[dict] = [{} for _ in range(self.num_envs)]
        for i in np.flatnonzero(done):
            infos[i] = {"terminal_observation": step.final_obs[i].cpu().numpy(), "TimeLimit.truncated": True,
                        "episode": {"r": float(step.episode_return[i]), "l": int(step.episode_length[i]),
                                    "t": 0.0}}
        return step.obs.cpu().numpy().copy(), step.reward.cpu().numpy().copy(), done, infos


class NumpyOnly(VecEnvWrapper):
    """The toy env's numpy face only (SB3's loop)."""

    def reset(self) -> np.ndarray:
        return self.venv.reset()

    def step_wait(self) -> tuple:
        return self.venv.step_wait()


TOY = dict(learning_starts=256, batch_size=64, buffer_size=20_000, train_freq=1, target_update_interval=200,
           gamma=0.5, learning_rate=1e-3, policy_kwargs=dict(TINY_POLICY, net_arch=[32]), seed=0,
           device="cpu", exploration_fraction=0.2, vaccine_interval=0)


def greedy_accuracy(model: BranchingIQN) -> float:
    obs = np.random.default_rng(1).uniform(-1, 1, (2000, 4)).astype(np.float32)
    actions = model.predict(obs, deterministic=True)[0]
    return float(np.mean(actions[:, 0] == np.where(obs[:, 0] > 0, 2, 0)))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_toy_device_env_learns_as_well_as_through_sb3s_loop(device: str) -> None:
    # the protocol without foxhunt; learning_starts > 0, so the warm-up actions (and all after) differ
    kwargs = {**TOY, "device": device}
    device_model = BranchingIQN("MlpPolicy", ToyDeviceEnv(16, device), **kwargs).learn(6144)
    numpy_model = BranchingIQN("MlpPolicy", NumpyOnly(ToyDeviceEnv(16, device)), **kwargs).learn(6144)
    assert device_model.collector.supports(device_model.env, device_model.train_freq)
    assert not numpy_model.collector.supports(numpy_model.env, numpy_model.train_freq)
    device_accuracy, numpy_accuracy = greedy_accuracy(device_model), greedy_accuracy(numpy_model)
    assert device_accuracy > 0.9 and numpy_accuracy > 0.9
    # both loops count the same episodes and see the same mean return range
    assert device_model._episode_num == numpy_model._episode_num == 6144 // 8
    assert abs(np.mean([e["r"] for e in device_model.ep_info_buffer])
               - np.mean([e["r"] for e in numpy_model.ep_info_buffer])) < 1.0


def test_a_toy_device_env_gives_sb3s_replay_without_warm_up() -> None:
    kwargs = {**TOY, "learning_starts": 0}
    device_model = BranchingIQN("MlpPolicy", ToyDeviceEnv(8), **kwargs).learn(400)
    numpy_model = BranchingIQN("MlpPolicy", NumpyOnly(ToyDeviceEnv(8)), **kwargs).learn(400)
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "tree"):
        assert th.equal(getattr(device_model.replay_buffer, name), getattr(numpy_model.replay_buffer, name))
    for a, b in zip(device_model.policy.parameters(), numpy_model.policy.parameters(), strict=True):
        assert th.equal(a, b)


# ---------------------------------------------------------------------- warm-up, statistics, settings


def test_warm_up_actions_are_uniform_per_branch() -> None:
    # SB3 draws warm-up actions with action_space.sample() (numpy); the loop draws them on the device: the
    # same distribution (independent uniform per branch), other numbers
    generator = th.Generator()
    generator.manual_seed(0)
    draws = th.cat([random_actions(th.tensor([3, 2, 5]), generator, 1000) for _ in range(30)])
    assert draws.dtype == th.int64 and draws.shape == (30_000, 3)
    for branch, n in enumerate((3, 2, 5)):
        counts = th.bincount(draws[:, branch], minlength=n).double()
        assert counts.numel() == n
        expected = draws.shape[0] / n
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 25.0  # far beyond the 0.9999 quantile of chi2 with <= 4 degrees of freedom


def test_learning_starts_runs_warm_up_then_policy_actions(tmp_path: Path) -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **{**TINY, "learning_starts": 80})
    model.learn(200)
    assert model.num_timesteps == 200 and model._n_updates > 0
    actions = model.replay_buffer.actions[: model.replay_buffer.size()]
    assert int(actions.min()) >= 0 and int(actions.max()) <= 2


def test_episode_stats_keep_the_last_window_in_order() -> None:
    stats = EpisodeStats(4, th.device("cpu"))
    done = th.tensor([True, False, True])
    stats.add(done, th.tensor([1.0, 9.0, 2.0]), th.tensor([10, 90, 20]))
    assert stats.read()[:2] == ([(1.0, 10), (2.0, 20)], 2)
    assert stats.read()[:2] == ([], 0)
    # six episodes end in one step: the window keeps the last four, the count all six
    stats.add(th.ones(6, dtype=th.bool), th.arange(3.0, 9.0), th.arange(30, 90, 10))
    stats.add(th.tensor([False, True, False]), th.tensor([0.0, 9.0, 0.0]), th.tensor([0, 90, 0]))
    episodes, n_new, also = stats.read(also=th.tensor([[3, 4], [5, 6]]))
    assert also.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert n_new == 7 and episodes == [(6.0, 60), (7.0, 70), (8.0, 80), (9.0, 90)]
    with pytest.raises(ValueError, match="window"):
        EpisodeStats(0, th.device("cpu"))


def test_episode_stats_match_a_python_reference() -> None:
    rng = np.random.default_rng(0)
    stats, reference = EpisodeStats(5, th.device("cpu")), []
    for step in range(40):
        n = int(rng.integers(1, 9))
        done = rng.random(n) < rng.choice([0.0, 0.3, 1.0])
        returns, lengths = rng.normal(size=n), rng.integers(1, 100, n)
        stats.add(th.from_numpy(done), th.from_numpy(returns), th.from_numpy(lengths))
        new = [(float(returns[i]), int(lengths[i])) for i in np.flatnonzero(done)]
        reference += new
        if step % 3 == 0:
            episodes, n_new, _ = stats.read()
            pending = reference[len(reference) - n_new:] if n_new else []
            assert episodes == pending[-5:]
    assert int(stats.count) == len(reference)


def test_episode_stats_add_runs_few_ops() -> None:
    """Each op is a GPU kernel of a vector step: <= 11 non-view ops per add (20 before)."""
    stats = EpisodeStats(100, th.device("cpu"))
    done, returns, lengths = th.arange(16) % 3 == 0, th.rand(16, dtype=th.float64), th.arange(16)
    ops = ops_of(lambda: stats.add(done, returns, lengths))
    assert len(ops) <= 11, ops
    assert stats.read()[:2] == ([(float(returns[i]), int(i)) for i in range(0, 16, 3)], 6)


def test_explore_with_per_branch_rates_made_for_several_steps_acts_the_same() -> None:
    """explore(branch_rates=row of branch_epsilons(rates[:, None], mults)): the actions and diagnostics of
    explore(exploration_rate=rate) step by step, without the two ops per step that make the rates."""
    from sb3_her_ext.exploration import branch_epsilons

    env = make_env()
    rates, bonus = th.tensor([0.9, 0.3, 0.0], dtype=th.float32), th.tensor(0.1)
    acted = []
    for per_branch in (False, True):
        th.manual_seed(1)
        model = BranchingIQN("MlpPolicy", env, **{**TINY, "exploration_mults": [1.0, 2.5, 0.5, 1.0]})
        env.reset()
        obs = env.current_obs()
        table = branch_epsilons(rates[:, None], model._mults)  # [3, NB], once
        steps, n_ops = [], []
        for i, rate in enumerate(rates):
            with OpCount() as count:
                if per_branch:
                    steps.append(model.explore(obs, iqr_bonus=bonus, branch_rates=table[i]))
                else:
                    steps.append(model.explore(obs, rate, bonus))
            n_ops.append(len(count.ops))
        sums = {k: float(v) for k, v in model.diagnostics._select_sums.items()}
        acted.append((th.stack(steps), sums, n_ops))
    (plain, plain_sums, plain_ops), (rows, rows_sums, rows_ops) = acted
    assert th.equal(plain, rows) and plain_sums == rows_sums
    assert [a - b for a, b in zip(plain_ops, rows_ops, strict=True)] == [2, 2, 2]


@pytest.mark.parametrize("window", [3, 100])
def test_recording_a_block_of_steps_at_once_equals_step_by_step(window: int) -> None:
    """record_steps of k stacked steps: the ring, count and action counts of k one-step records (a block
    of the fused graph can record once instead of once per step), in the ops of one step."""
    g = th.Generator().manual_seed(0)
    k, n, values = 8, 5, th.arange(3)
    done = th.rand(k, n, generator=g) < 0.4
    returns, lengths = th.randn(k, n, generator=g, dtype=th.float64), th.randint(1, 50, (k, n), generator=g)
    actions = th.randint(0, 3, (k, n, 4), generator=g)
    one, block = (EpisodeStats(window, th.device("cpu")) for _ in range(2))
    one_counts, block_counts = (th.zeros(4, 3, dtype=th.int64) for _ in range(2))
    for i in range(k):
        record_steps(one, one_counts, done[i], returns[i], lengths[i], actions[i], values)
    ops = ops_of(lambda: record_steps(block, block_counts, done, returns, lengths, actions, values))
    assert len(ops) <= 14, ops
    assert th.equal(one.returns, block.returns) and th.equal(one.lengths, block.lengths)
    assert int(one.count) == int(block.count) == int(done.sum())
    assert th.equal(one_counts, block_counts) and int(block_counts.sum()) == k * n * 4
    assert one.read()[:2] == block.read()[:2]


@pytest.mark.parametrize("kwargs,field", [({"stats_interval": 0}, "stats_interval"),
                                          ({"stats_interval": 1.5}, "stats_interval"),
                                          ({"stats_interval": True}, "stats_interval")])
def test_bad_settings_name_field_and_value(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CollectorSettings(**kwargs)


def test_callbacks_at_block_ends_and_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[int] = []
    end = ProgressBarCallback._on_training_end

    def record_then_end(self: ProgressBarCallback) -> None:
        counts.append(self.pbar.n)
        end(self)

    monkeypatch.setattr(ProgressBarCallback, "_on_training_end", record_then_end)
    model = BranchingIQN("MlpPolicy", make_env(), **{**TINY, "train_freq": 3})
    recorder = Recorder()
    model.learn(120, callback=recorder, progress_bar=True)  # 10 blocks of 3 vector steps of 4 books
    assert recorder.n_calls == 10 and recorder.seen == list(range(12, 121, 12))
    model = BranchingIQN("MlpPolicy", make_env(), **{**TINY, "train_freq": 7})
    recorder = Recorder()
    model.learn(120, callback=recorder, progress_bar=True)  # 120 is no multiple of 28: one block more
    assert recorder.n_calls == 5 and recorder.seen == [28, 56, 84, 112, 140]
    assert counts == [120, 140]


class EpisodeWatcher(BaseCallback):
    """Records ``(num_timesteps, _episode_num)`` at each ``on_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def _on_step(self) -> bool:
        self.seen.append((self.num_timesteps, self.model._episode_num))
        return True


def test_episode_stats_reach_the_host_only_at_flush_points() -> None:
    model = BranchingIQN("MlpPolicy", make_env(episode_length=5), **{**TINY, "diagnostics_interval": 10**6})
    model.collector.configure(stats_interval=40)  # every 10 vector steps of 4 books
    watcher = EpisodeWatcher()
    model.learn(200, callback=watcher)
    # the callback runs before the step's flush: it sees the counts of the flush 10 steps before
    for timesteps, episodes in watcher.seen:
        flushed_at = (timesteps - 4) // 40 * 40  # the last flush before this step's bookkeeping
        assert episodes == 4 * (flushed_at // 4 // 5), (timesteps, episodes)
    assert model._episode_num == 40 and len(model.ep_info_buffer) == 40  # the end of training flushes


def test_logs_are_dumped_with_the_episode_statistics(tmp_path: Path) -> None:
    from stable_baselines3.common.logger import configure as configure_logger

    model = BranchingIQN("MlpPolicy", make_env(episode_length=5), **{**TINY, "diagnostics_interval": 40})
    model.set_logger(configure_logger(str(tmp_path), ["csv"]))
    model.learn(200, log_interval=8)
    lines = (tmp_path / "progress.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    assert len(rows) == 5  # 40 episodes, a dump each time the count crosses a multiple of 8 at a flush
    last = rows[-1]
    mean_return = np.mean([e["r"] for e in model.ep_info_buffer])
    assert float(last["rollout/ep_rew_mean"]) == pytest.approx(mean_return)
    assert float(last["rollout/ep_len_mean"]) == 5.0 and int(last["time/episodes"]) == 40


def test_a_callback_can_stop_training_at_a_block_end() -> None:
    # SB3 stores nothing of the step at which a callback stopped; a block is stored and trained already: the
    # device env's run equals SB3's stopped one block later
    sb3 = BranchingIQN("MlpPolicy", make_env(LOBVecEnv), **TINY)
    sb3.learn(400, callback=Recorder(stop_after=7))  # stops at 28: rows of 24 env steps, 3 rollouts trained
    model = BranchingIQN("MlpPolicy", make_env(DeviceLOBVecEnv), **TINY)
    recorder = Recorder(stop_after=3)
    model.learn(400, callback=recorder)
    assert recorder.seen == [8, 16, 24] and model.num_timesteps == 24
    assert model._n_updates == sb3._n_updates == 3
    for name in sb3.replay_buffer._tensor_names():
        assert th.equal(getattr(sb3.replay_buffer, name), getattr(model.replay_buffer, name)), name
    for a, b in zip(sb3.policy.state_dict().values(), model.policy.state_dict().values(), strict=True):
        assert th.equal(a, b)


def test_save_load_evaluate_and_continue(tmp_path: Path) -> None:
    model = BranchingIQN("MlpPolicy", make_env(), **TINY).learn(80)
    model.save(tmp_path / "model.zip")
    loaded = BranchingIQN.load(tmp_path / "model.zip", env=make_env(seed=1))
    obs = model.env.reset()
    expected = model.predict(obs, deterministic=True)[0]
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], expected)
    mean, _ = evaluate_policy(loaded, loaded.env, n_eval_episodes=4)
    assert np.isfinite(mean)
    loaded.learn(40, reset_num_timesteps=False)
    assert loaded.num_timesteps == 120


# ---------------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_no_host_sync_inside_a_vector_step_on_cuda(cuda_graph: bool) -> None:
    env = make_env(n_envs=64, device="cuda", cuda_graph=True)
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "device": "cuda", "cuda_graph": cuda_graph,
                                              "diagnostics_interval": 10**9, "buffer_size": 10_000})
    model.collector.configure(stats_interval=10**9)
    model.learn(64 * 20)  # warm-up: buffers, graphs (env and gradient steps) captured
    assert model._n_updates > 0
    if cuda_graph:
        assert model.collector.block.replays > 0
    else:
        assert model.collector.block.captures == 0 and model.collector.capture_reason() == "cuda_graph=False"
    if not cuda_graph:  # an eager optimizer step may read its step count on the host: vector steps only
        model.gradient_steps = 0
    updates = model._n_updates
    th.cuda.synchronize()
    th.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):  # rollouts of 2 vector steps (and, captured, their gradient step)
            model.collector.run_rollout()
    finally:
        th.cuda.set_sync_debug_mode("default")
    assert model.num_timesteps == 64 * 30 and model._n_updates == updates + (5 if cuda_graph else 0)


@pytest.mark.gpu
def test_device_loop_on_cuda_learns_and_logs(tmp_path: Path) -> None:
    env = make_env(n_envs=256, device="cuda", cuda_graph=True)
    model = BranchingIQN("MlpPolicy", env, **{**TINY, "device": "cuda", "cuda_graph": True,
                                              "buffer_size": 50_000, "batch_size": 64},
                         diagnostics_path=str(tmp_path / "diag.jsonl"), diagnostics_interval=256 * 50)
    model.learn(256 * 200, log_interval=10)
    assert model.collector.block.replays > 0 and model._episode_num == 256 * 200 // 20
    assert len(model.ep_info_buffer) == 100 and all(e["l"] == 20 for e in model.ep_info_buffer)
    lines = read_diagnostics(tmp_path / "diag.jsonl")
    assert len(lines) == 4 and all(np.isfinite(line["loss"]) for line in lines)
    for line in lines:  # the device-side action counts reached every line
        assert all(sum(mix) == pytest.approx(1.0, abs=1e-5) for mix in line["action_mix"].values())
