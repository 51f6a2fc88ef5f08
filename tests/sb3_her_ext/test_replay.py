"""PrioritizedHindsightReplayBuffer: PER round trips, timeouts, one push per add, stratified sampling,
pickling / SB3 save-load, and an integration run over LOBVecEnv."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import ReplayBuffer

import cuda_ext
from cuda_ext.reference import per as cuda_reference
from cuda_ext.reference.philox import philox_uniforms
from sb3_her_ext.replay import HindsightConfig, PrioritizedHindsightReplayBuffer, PrioritizedReplaySamples
from tests.sb3_her_ext._op_count import ops_of

OBS_SPACE = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACTION_SPACE = spaces.MultiDiscrete([3, 3, 3, 3])


def make_buffer(capacity: int = 8, n_envs: int = 2, **kwargs) -> PrioritizedHindsightReplayBuffer:
    return PrioritizedHindsightReplayBuffer(capacity, OBS_SPACE, ACTION_SPACE, device="cpu", n_envs=n_envs,
                                            **kwargs)


def add_rows(buffer: PrioritizedHindsightReplayBuffer, marker: float, done=None, infos=None,
             actions: np.ndarray | None = None) -> None:
    """Add one step whose obs rows are ``marker + env`` (next_obs: + 0.5), reward = marker + env."""
    n = buffer.n_envs
    base = marker + np.arange(n, dtype=np.float32)
    obs = np.repeat(base[:, None], 3, axis=1)
    if actions is None:
        actions = np.tile(np.array([1, 2, 0, 1]), (n, 1))
    buffer.add(obs, obs + 0.5, actions, base, np.zeros(n, bool) if done is None else np.asarray(done),
               infos if infos is not None else [{} for _ in range(n)])


def leaves(buffer: PrioritizedHindsightReplayBuffer) -> torch.Tensor:
    return buffer.tree[buffer.tree_leaves: buffer.tree_leaves + buffer.buffer_size]


# --------------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"buffer_size": 0}, "buffer_size"), ({"n_envs": 0}, "n_envs"), ({"alpha": -0.1}, "alpha"),
     ({"beta": -1.0}, "beta"), ({"priority_eps": 0.0}, "priority_eps"),
     ({"beta": 1.5}, "beta=1.5"), ({"alpha": float("nan")}, "alpha=nan"),
     ({"alpha": float("inf")}, "alpha=inf"), ({"priority_eps": float("nan")}, "priority_eps=nan"),
     ({"optimize_memory_usage": True}, "optimize_memory_usage"),
     ({"action_space": spaces.Box(0, 1, (2,))}, "action_space"),
     ({"observation_space": spaces.Discrete(4)}, "observation_space"),
     ({"hindsight": "yes"}, "hindsight")],
)
def test_bad_construction_raises_naming_the_field(kwargs, field):
    params = {"buffer_size": 8, "observation_space": OBS_SPACE, "action_space": ACTION_SPACE, "device": "cpu"}
    params.update(kwargs)
    with pytest.raises(ValueError, match=field):
        PrioritizedHindsightReplayBuffer(**params)


@pytest.mark.parametrize(
    ("action_space", "message"),
    [(spaces.MultiDiscrete([3, 3], start=[1, 0]), r"action_space.start=\[1, 0\] must be all 0"),
     (spaces.Discrete(3, start=1), "action_space.start=1 must be 0")],
)
def test_actions_not_starting_at_zero_are_refused(action_space, message):
    with pytest.raises(ValueError, match=message):
        PrioritizedHindsightReplayBuffer(8, OBS_SPACE, action_space, device="cpu")


def test_is_an_sb3_replay_buffer_without_numpy_storage():
    buffer = make_buffer(capacity=5, n_envs=2)
    assert isinstance(buffer, ReplayBuffer)
    assert buffer.buffer_size == 5 and buffer.n_envs == 2 and buffer.device == torch.device("cpu")
    assert isinstance(buffer.observations, torch.Tensor) and buffer.observations.shape == (5, 3)
    assert buffer.actions.dtype == torch.int64 and buffer.actions.shape == (5, 4)
    assert buffer.kinds.dtype == torch.int8 and buffer.head_size.tolist() == [0, 0]
    assert buffer.tree.dtype == torch.float64 and buffer.tree.shape == (16,)  # P = 8 >= 5
    assert buffer.max_priority() == 1.0 and buffer.size() == 0 and buffer.pos == 0 and not buffer.full
    discrete = PrioritizedHindsightReplayBuffer(4, OBS_SPACE, spaces.Discrete(5), device="cpu")
    assert discrete.actions.shape == (4, 1)


# --------------------------------------------------------------------------------------------- push / update
def test_push_wraps_and_priorities_follow_the_running_max():
    buffer = make_buffer(capacity=4, n_envs=2, alpha=0.6, priority_eps=1e-6)
    add_rows(buffer, 10.0)
    assert buffer.head_size.tolist() == [2, 2]
    assert leaves(buffer).tolist() == [1.0, 1.0, 0.0, 0.0]
    add_rows(buffer, 20.0)
    assert buffer.head_size.tolist() == [0, 4] and buffer.full and buffer.pos == 0 and buffer.size() == 4
    assert buffer.observations[:, 0].tolist() == [10.0, 11.0, 20.0, 21.0]
    assert buffer.next_observations[:, 0].tolist() == [10.5, 11.5, 20.5, 21.5]
    assert buffer.rewards.tolist() == [10.0, 11.0, 20.0, 21.0]

    buffer.update_priorities(torch.tensor([1, 3]), torch.tensor([1.0, 3.0]))
    expected = [1.0, (1.0 + 1e-6) ** 0.6, 1.0, (3.0 + 1e-6) ** 0.6]
    assert leaves(buffer).tolist() == pytest.approx(expected, rel=1e-6)  # p = td + eps in float32
    assert buffer.max_priority() == pytest.approx(3.0 + 1e-6)
    assert buffer.tree[1].item() == pytest.approx(sum(expected), rel=1e-6)

    add_rows(buffer, 30.0)  # overwrites slots 0 and 1 with the new running max
    assert buffer.head_size.tolist() == [2, 4] and buffer.pos == 2
    assert buffer.observations[:, 0].tolist() == [30.0, 31.0, 20.0, 21.0]
    new_leaf = float(torch.tensor(3.0 + 1e-6, dtype=torch.float32)) ** 0.6
    expected = [new_leaf, new_leaf, 1.0, (3.0 + 1e-6) ** 0.6]
    assert leaves(buffer).tolist() == pytest.approx(expected, rel=1e-6)
    leaf = leaves(buffer).tolist()  # the sum tree holds exact float64 sums of its children
    assert buffer.tree[2].item() == leaf[0] + leaf[1] and buffer.tree[3].item() == leaf[2] + leaf[3]
    assert buffer.tree[1].item() == (leaf[0] + leaf[1]) + (leaf[2] + leaf[3])


def test_update_priorities_validates_lengths():
    buffer = make_buffer()
    add_rows(buffer, 0.0)
    with pytest.raises(ValueError, match="td_abs"):
        buffer.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0]))


def test_add_validates_shapes():
    buffer = make_buffer(n_envs=2)
    with pytest.raises(ValueError, match="obs"):
        buffer.add(np.zeros((3, 3)), np.zeros((2, 3)), np.ones((2, 4)), np.zeros(2), np.zeros(2), [{}, {}])
    with pytest.raises(ValueError, match="action"):
        buffer.add(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3)), np.zeros(2), np.zeros(2), [{}, {}])
    with pytest.raises(ValueError, match="infos"):
        buffer.add(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 4)), np.zeros(2), np.zeros(2), [{}])


# --------------------------------------------------------------------------------------------- timeouts
@pytest.mark.parametrize("handle", [True, False])
def test_timeouts_are_not_terminal(handle):
    buffer = make_buffer(n_envs=3, handle_timeout_termination=handle)
    infos = [{"TimeLimit.truncated": True}, {"TimeLimit.truncated": False}, {}]
    add_rows(buffer, 0.0, done=[True, True, False], infos=infos)
    assert buffer.dones[:3].tolist() == ([0.0, 1.0, 0.0] if handle else [1.0, 1.0, 0.0])


# --------------------------------------------------------------------------------------------- sampling
def test_sample_is_proportional_with_hand_checked_weights():
    buffer = make_buffer(capacity=8, n_envs=3, alpha=0.5, beta=0.4, priority_eps=1e-6)
    add_rows(buffer, 0.0)  # slots 0, 1, 2; slots 3..7 unwritten
    buffer.update_priorities(torch.tensor([0, 1, 2]), torch.tensor([0.0, 3.0, 1.0]))
    leaf = np.array([1e-6, 3.000001, 1.000001]) ** 0.5
    assert leaves(buffer)[:3].tolist() == pytest.approx(leaf.tolist(), rel=1e-6)
    batch = 6
    uniforms = torch.rand(batch, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).numpy()
    buffer.generator.manual_seed(3)  # the buffer draws from its own generator
    sample = buffer.sample(batch)
    assert isinstance(sample, PrioritizedReplaySamples)
    # stratified descent: row i is the first whose cumulative priority exceeds (i + u_i) / B * total
    targets = (np.arange(batch) + uniforms) / batch * leaf.sum()
    expected_idx = np.searchsorted(np.cumsum(leaf), targets, side="right")
    assert sample.indices.tolist() == expected_idx.tolist()
    assert 0 not in sample.indices.tolist()  # a ~0 priority row is (almost) never drawn
    prob = leaf[expected_idx] / leaf.sum()
    weights = (3 * prob) ** -0.4
    np.testing.assert_allclose(sample.weights.numpy(), weights / weights.max(), rtol=1e-5)
    assert buffer.mean_weight() == pytest.approx(float((weights / weights.max()).mean()), rel=1e-5)
    # rows match the indices; SB3 shapes for dones and rewards
    assert sample.observations.shape == (batch, 3) and sample.actions.shape == (batch, 4)
    assert sample.rewards.shape == (batch, 1) and sample.dones.shape == (batch, 1)
    assert sample.rewards[:, 0].tolist() == expected_idx.astype(np.float32).tolist()
    assert sample.kinds.tolist() == [0] * batch
    buffer.beta = 0.0
    assert buffer.sample(batch).weights.tolist() == [1.0] * batch
    with pytest.raises(ValueError, match="batch_size"):
        buffer.sample(0)


def test_sample_is_deterministic_for_a_seed():
    buffer = make_buffer(capacity=16, n_envs=4)
    for marker in range(3):
        add_rows(buffer, 10.0 * marker)
    buffer.update_priorities(torch.arange(12), torch.linspace(0.1, 2.0, 12))
    buffer.generator.manual_seed(0)
    first = buffer.sample(32)
    buffer.generator.manual_seed(0)
    torch.rand(5)  # the process-wide generator moves: the buffer's samples do not
    second = buffer.sample(32)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def stratified_buffer(values: list[int], capacity: int = 100) -> PrioritizedHindsightReplayBuffer:
    buffer = make_buffer(capacity=capacity, n_envs=len(values))
    actions = np.tile(np.array([1, 0, 0, 1]), (len(values), 1))
    actions[:, 1] = values
    add_rows(buffer, 0.0, actions=actions)
    return buffer


def test_stratified_sampling_takes_equal_shares():
    values = [2] * 40 + [1] * 15 + [0] * 12
    buffer = stratified_buffer(values)
    buffer.generator.manual_seed(0)
    sample = buffer.sample_stratified(30, branch=1, n_values=3)
    assert torch.bincount(sample.actions[:, 1], minlength=3).tolist() == [10, 10, 10]
    assert len(set(sample.indices.tolist())) == 30  # without replacement
    assert max(sample.indices.tolist()) < len(values)  # written rows only
    assert sample.weights.tolist() == [1.0] * 30
    odd = buffer.sample_stratified(31, branch=1, n_values=3)
    assert torch.bincount(odd.actions[:, 1], minlength=3).tolist() == [11, 10, 10]


def test_stratified_sampling_fills_short_strata_from_the_others():
    values = [2] * 40 + [1] * 15 + [0] * 5
    buffer = stratified_buffer(values)
    buffer.generator.manual_seed(1)
    sample = buffer.sample_stratified(30, branch=1, n_values=3)
    counts = torch.bincount(sample.actions[:, 1], minlength=3).tolist()
    assert counts[0] == 5 and sum(counts) == 30 and counts[1] >= 10 and counts[2] >= 10
    assert len(set(sample.indices.tolist())) == 30
    # an empty stratum and fewer written rows than the batch: rows repeat, all written
    tiny = stratified_buffer([2, 2, 1], capacity=8)
    small = tiny.sample_stratified(9, branch=1, n_values=3)
    assert set(small.indices.tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="branch"):
        tiny.sample_stratified(9, branch=4, n_values=3)
    with pytest.raises(ValueError, match="n_values"):
        tiny.sample_stratified(9, branch=1, n_values=0)


# ------------------------------------------------------------------------------------------ one push per add
def trade_infos(rng: np.random.Generator, n: int, truncated: np.ndarray) -> list[dict]:
    mids = rng.uniform(99.0, 101.0, n)
    return [
        {"mid": m, "best_bid": m - 0.01, "best_ask": m + 0.01,
         "position": float(rng.choice([-10.0, 0.0, 10.0])),
         "trade_closed": bool(rng.random() < 0.6), "trade_pnl": float(rng.uniform(-1, 1)),
         "trade_lots": float(rng.choice([0.0, 5.0, 10.0])), "entry_mid": 100.0,
         "TimeLimit.truncated": bool(t)}
        for m, t in zip(mids, truncated, strict=True)
    ]


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 12), n_envs=st.integers(1, 4), steps=st.integers(1, 12),
       seed=st.integers(0, 999))
def test_one_push_per_add_unique_slots_and_bounded_size(capacity, n_envs, steps, seed):
    buffer = make_buffer(capacity=capacity, n_envs=n_envs,
                         hindsight=HindsightConfig(lookahead=2, forward_capacity=4, threshold=0.5))
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = cuda_ext.per_push

    def spy(storage, rows, alpha):
        slots = original(storage, rows, alpha=alpha)
        calls.append((rows.wants.clone(), slots.clone()))
        return slots

    rng = np.random.default_rng(seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cuda_ext, "per_push", spy)
        for step in range(steps):
            head, size = buffer.head_size.tolist()
            before = sum(int(v) for v in buffer.hindsight_counts.values())
            done = rng.random(n_envs) < 0.2
            actions = rng.integers(0, 3, size=(n_envs, 4))
            obs = rng.normal(size=(n_envs, 3)).astype(np.float32)
            buffer.add(obs, obs + 1, actions, rng.normal(size=n_envs), done,
                       trade_infos(rng, n_envs, done & (rng.random(n_envs) < 0.5)))
            assert len(calls) == step + 1  # exactly one per_push per add
            wants, slots = calls[-1]
            wanted = int(wants.sum())
            assert wanted == n_envs + sum(int(v) for v in buffer.hindsight_counts.values()) - before
            written = slots[slots >= 0].tolist()
            assert len(written) == min(wanted, capacity) == len(set(written))
            assert all(0 <= s < capacity for s in written)
            assert buffer.head_size.tolist() == [(head + wanted) % capacity, min(size + wanted, capacity)]
            assert buffer.size() <= capacity


# --------------------------------------------------------------------------------------------- persistence
def filled_hindsight_buffer() -> PrioritizedHindsightReplayBuffer:
    buffer = make_buffer(capacity=64, n_envs=3, hindsight={"lookahead": 2, "threshold": 0.5})
    rng = np.random.default_rng(4)
    for _ in range(12):
        done = rng.random(3) < 0.1
        obs = rng.normal(size=(3, 3)).astype(np.float32)
        buffer.add(obs, obs + 1, rng.integers(0, 3, size=(3, 4)), rng.normal(size=3), done,
                   trade_infos(rng, 3, done))
    buffer.update_priorities(torch.arange(10), torch.linspace(0.0, 3.0, 10))
    return buffer


def state_of(buffer: PrioritizedHindsightReplayBuffer) -> dict[str, torch.Tensor]:
    state = {name: getattr(buffer, name) for name in buffer._tensor_names()}
    state.update({f"hindsight.{k}": v for k, v in buffer.hindsight_state.tensors().items()})
    return state


def assert_same_state(
    a: PrioritizedHindsightReplayBuffer, b: PrioritizedHindsightReplayBuffer, ignore: tuple[str, ...] = ()
) -> None:
    sa, sb = state_of(a), state_of(b)
    assert sa.keys() == sb.keys()
    for name in sa.keys() - set(ignore):
        torch.testing.assert_close(sa[name].cpu(), sb[name].cpu(), rtol=0, atol=0, equal_nan=True, msg=name)


def test_pickle_round_trip_keeps_everything():
    buffer = filled_hindsight_buffer()
    assert sum(int(v) for v in buffer.hindsight_counts.values()) > 0
    loaded = pickle.loads(pickle.dumps(buffer))
    assert_same_state(buffer, loaded)
    assert loaded.hindsight_config == buffer.hindsight_config and loaded.beta == buffer.beta
    assert torch.equal(loaded.generator.get_state(), buffer.generator.get_state())
    first = buffer.sample(16)  # the loaded buffer's generator goes on where the saved one was
    second = loaded.sample(16)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # both keep going identically (trackers, forward ring and counters survived)
    rng = np.random.default_rng(7)
    obs = rng.normal(size=(3, 3)).astype(np.float32)
    infos = trade_infos(rng, 3, np.zeros(3, bool))
    for target in (buffer, loaded):
        target.add(obs, obs + 1, np.ones((3, 4), np.int64), np.ones(3), np.zeros(3, bool), infos)
    assert_same_state(buffer, loaded)


def test_storage_is_one_replay_storage_shown_under_sb3_names():
    buffer = filled_hindsight_buffer()
    assert isinstance(buffer.storage, cuda_ext.ReplayStorage)
    assert buffer.observations is buffer.storage.obs and buffer.tree is buffer.storage.tree
    assert buffer.max_priority_tensor is buffer.storage.max_priority
    assert buffer.tree_leaves == buffer.storage.tree_leaves == 64


def test_pickle_of_the_flat_layout_still_loads():
    buffer = filled_hindsight_buffer()
    state = buffer.__getstate__()
    storage = state.pop("storage")  # a pickle written before ReplayStorage held the tensors as attributes
    for name, field in (("observations", "obs"), ("next_observations", "next_obs"), ("actions", "action"),
                        ("rewards", "reward"), ("dones", "done"), ("kinds", "kind"), ("tree", "tree"),
                        ("head_size", "head_size"), ("max_priority_tensor", "max_priority")):
        state[name] = getattr(storage, field)
    restored = object.__new__(PrioritizedHindsightReplayBuffer)
    restored.__setstate__(state)
    assert isinstance(restored.storage, cuda_ext.ReplayStorage) and "observations" not in vars(restored)
    assert_same_state(buffer, restored)


@pytest.mark.slow
def test_sb3_save_and_load_replay_buffer(tmp_path):
    import gymnasium as gym

    class TinyEnv(gym.Env):
        observation_space = OBS_SPACE
        action_space = spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            return np.zeros(3, np.float32), {}

        def step(self, action):
            return np.zeros(3, np.float32), 0.0, False, False, {}

    model = DQN("MlpPolicy", TinyEnv(), buffer_size=32, replay_buffer_class=PrioritizedHindsightReplayBuffer,
                replay_buffer_kwargs={"alpha": 0.7}, device="cpu")
    buffer = model.replay_buffer
    assert isinstance(buffer, PrioritizedHindsightReplayBuffer) and buffer.alpha == 0.7
    for marker in range(5):
        buffer.add(np.full((1, 3), marker), np.full((1, 3), marker + 1), np.array([marker % 3]),
                   np.array([float(marker)]), np.array([False]), [{}])
    buffer.update_priorities(torch.tensor([1, 3]), torch.tensor([2.0, 0.5]))
    path = tmp_path / "buffer.pkl"
    model.save_replay_buffer(path)
    other = DQN("MlpPolicy", TinyEnv(), buffer_size=32, replay_buffer_class=PrioritizedHindsightReplayBuffer,
                device="cpu")
    other.load_replay_buffer(path)
    loaded = other.replay_buffer
    assert loaded.alpha == 0.7 and loaded.size() == 5 and loaded.device == torch.device("cpu")
    for name in buffer._tensor_names():
        torch.testing.assert_close(getattr(loaded, name), getattr(buffer, name), rtol=0, atol=0,
                                   equal_nan=True)
    first = buffer.sample(8)  # the file carries the buffer's generator: the same rows without reseeding
    second = loaded.sample(8)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_reset_empties_everything():
    buffer = filled_hindsight_buffer()
    buffer.reset()
    assert buffer.size() == 0 and buffer.max_priority() == 1.0 and float(buffer.tree.sum()) == 0.0
    assert all(int(v) == 0 for v in buffer.hindsight_counts.values())
    assert not bool(buffer.hindsight_state.slot_valid.any())


# --------------------------------------------------------------------------------------------- integration
@pytest.mark.slow
def test_lob_vec_env_random_steps_inject_hindsight():
    from foxhunt.envs import LOBVecEnv

    env = LOBVecEnv(4, seed=0, data="synthetic", num_steps=3000, levels=5, episode_length=100,
                    max_position=10.0)
    config = HindsightConfig(lookahead=10, reward_scale=env.reward_scale, magnitudes=env.magnitudes,
                             relabel=True)
    buffer, tensor_buffer = (
        PrioritizedHindsightReplayBuffer(8192, env.observation_space, env.action_space, device="cpu",
                                         n_envs=env.num_envs, hindsight=config)
        for _ in range(2)
    )
    rng = np.random.default_rng(0)
    obs = env.reset()
    for _ in range(300):
        actions = rng.integers(0, 3, size=(env.num_envs, 4))
        next_obs, reward, done, infos = env.step(actions)
        stored_next = next_obs.copy()
        for i in np.flatnonzero(done):
            stored_next[i] = infos[i]["terminal_observation"]
        buffer.add(obs, stored_next, actions, reward, done, infos)  # SB3's path
        tensor_buffer.add(torch.as_tensor(obs), torch.as_tensor(stored_next), torch.as_tensor(actions),
                          torch.as_tensor(reward), torch.as_tensor(done), env.last_info_tensors)
        obs = next_obs
    # the batched-info path stores exactly the same rows (the two buffers' sampling generators were seeded
    # independently when each allocated its storage)
    assert_same_state(buffer, tensor_buffer, ignore=("sample_rng_state",))
    counts = {k: int(v) for k, v in buffer.hindsight_counts.items()}
    assert counts["backward"] > 0 and counts["relabel"] > 0
    kinds = torch.bincount(buffer.kinds[: buffer.size()].long(), minlength=4).tolist()
    assert kinds[0] == 4 * 300
    assert kinds[1] == counts["backward"] and kinds[3] == counts["relabel"] and kinds[2] == counts["forward"]
    assert buffer.size() == 1200 + sum(counts.values())
    sample = buffer.sample(256)
    assert bool((sample.weights > 0).all()) and bool((sample.weights <= 1).all())
    assert bool((sample.dones[sample.kinds != 0] == 1).all())


def _tensor_step(n: int, step: int) -> tuple:
    """One step of ``n`` books as a device env gives it: float32 rows, float64 infos, bool flags."""
    g = torch.Generator().manual_seed(step)
    obs = torch.rand(n, 3, generator=g)
    infos = {k: torch.rand(n, generator=g, dtype=torch.float64) * 100 for k in
             ("mid", "best_bid", "best_ask", "position", "trade_pnl", "trade_lots", "entry_mid")}
    infos["position"] = infos["position"].round() - 50
    infos["trade_closed"] = torch.rand(n, generator=g) < 0.3
    infos["TimeLimit.truncated"] = torch.rand(n, generator=g) < 0.1
    actions = torch.randint(0, 3, (n, 4), generator=g)
    return obs, obs + 0.5, actions, torch.rand(n, generator=g), torch.rand(n, generator=g) < 0.2, infos


@pytest.mark.parametrize(("hindsight", "most_ops"), [(True, 23), (False, 4)])
def test_add_runs_few_ops(hindsight: bool, most_ops: int) -> None:
    """Each op is a GPU kernel in the fused graph: one add of 16 books with every hindsight kind stays at
    <= 23 non-view aten and cuda_ext ops (54 before the constant columns were kept; 9 without hindsight)."""
    buffer = make_buffer(capacity=4096, n_envs=16, hindsight={} if hindsight else None)
    buffer.add(*_tensor_step(16, 0))  # the first add makes the constant columns
    step = _tensor_step(16, 1)
    ops = ops_of(lambda: buffer.add(*step))
    assert len(ops) <= most_ops, ops
    assert "full" not in ops and "ones" not in ops


# --------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_cuda_add_sample_update_do_not_sync():
    device = torch.device("cuda")
    buffer = PrioritizedHindsightReplayBuffer(256, OBS_SPACE, ACTION_SPACE, device=device, n_envs=4,
                                              hindsight={"lookahead": 2, "threshold": 0.5})
    gen = torch.Generator(device=device).manual_seed(0)

    def step_tensors():
        obs = torch.randn(4, 3, device=device, generator=gen)
        info = {k: torch.rand(4, device=device, generator=gen) + 99.5 for k in ("mid", "entry_mid")}
        info["best_bid"], info["best_ask"] = info["mid"] - 0.01, info["mid"] + 0.01
        info["position"] = torch.randint(-1, 2, (4,), device=device, generator=gen).float() * 10
        info["trade_closed"] = torch.rand(4, device=device, generator=gen) < 0.5
        info["trade_pnl"] = torch.rand(4, device=device, generator=gen) - 0.5
        info["trade_lots"] = torch.full((4,), 10.0, device=device)
        info["TimeLimit.truncated"] = torch.zeros(4, dtype=torch.bool, device=device)
        action = torch.randint(0, 3, (4, 4), device=device, generator=gen)
        return obs, obs + 1, action, torch.randn(4, device=device, generator=gen), \
            torch.zeros(4, dtype=torch.bool, device=device), info

    for _ in range(5):
        buffer.add(*step_tensors())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            buffer.add(*step_tensors())
            sample = buffer.sample(32)
            buffer.update_priorities(sample.indices, sample.rewards.abs())
            buffer.sample_stratified(30, branch=1, n_values=3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert buffer.size() >= 40


def test_unpickling_a_buffer_saved_without_a_sampling_generator_state_gives_it_one():
    buffer = filled_hindsight_buffer()
    state = buffer.__getstate__()
    del state["sample_rng_state"]  # as pickled by earlier versions
    loaded = PrioritizedHindsightReplayBuffer.__new__(PrioritizedHindsightReplayBuffer)
    loaded.__setstate__(state)
    assert loaded.sample_rng_state.dtype == torch.int64 and loaded.sample_rng_state.shape == (2,)
    assert int(loaded.sample_rng_state[1]) == 0
    assert_same_state(buffer, loaded, ignore=("sample_rng_state",))
    assert loaded.sample(8).indices.shape == (8,)


@pytest.mark.gpu
def test_cuda_sampling_stream_survives_pickling():
    """A loaded CUDA buffer continues its generator where the saved one was: both draw the same rows."""
    buffer = filled_hindsight_buffer()
    buffer.device = "cuda"
    buffer.sample(16)
    loaded = pickle.loads(pickle.dumps(buffer))
    assert torch.equal(loaded.sample_rng_state.cpu(), buffer.sample_rng_state.cpu())
    for _ in range(3):
        original, restored = buffer.sample(64), loaded.sample(64)
        assert torch.equal(original.indices, restored.indices)
        assert torch.equal(original.weights, restored.weights)
    assert torch.equal(loaded.sample_rng_state.cpu(), buffer.sample_rng_state.cpu())


@pytest.mark.gpu
def test_loading_onto_another_device():
    buffer = filled_hindsight_buffer()
    loaded = pickle.loads(pickle.dumps(buffer))
    loaded.device = "cuda"
    assert loaded.observations.is_cuda and loaded.hindsight_state.ring.is_cuda
    assert_same_state(buffer, loaded)
    back = pickle.loads(pickle.dumps(loaded))
    assert back.device.type == "cuda"
    assert_same_state(buffer, back)


def _sample_with(buffer: PrioritizedHindsightReplayBuffer, uniforms: torch.Tensor,
                 monkeypatch: pytest.MonkeyPatch) -> PrioritizedReplaySamples:
    """``buffer.sample`` with its uniform draws replaced by ``uniforms`` (moved to the buffer's device)."""
    with monkeypatch.context() as patch:
        patch.setattr(torch, "rand", lambda *args, **kwargs: uniforms.to(buffer.device))
        return buffer.sample(uniforms.numel())


@pytest.mark.gpu
def test_cuda_tree_is_refreshed_lazily_before_sampling_and_pickling(monkeypatch):
    """On a GPU the writers mark their subtrees and the tree is refreshed at the next sample: the sampled
    rows and weights, and the refreshed tree, equal a CPU buffer's (which rebuilds right away)."""
    capacity = 5000  # P = 8192: a marked tree
    buffers = {dev: PrioritizedHindsightReplayBuffer(capacity, OBS_SPACE, ACTION_SPACE, device=dev, n_envs=2)
               for dev in ("cpu", "cuda")}
    gen = torch.Generator().manual_seed(0)
    for step in range(300):
        obs = torch.randn(2, 3, generator=gen)
        action = torch.randint(0, 3, (2, 4), generator=gen)
        reward = torch.randn(2, generator=gen)
        for dev, buffer in buffers.items():
            buffer.add(obs.to(dev), (obs + 1).to(dev), action.to(dev), reward.to(dev),
                       torch.zeros(2, dtype=torch.bool, device=dev), {})
        if step % 10 == 9:
            indices = torch.randint(0, 2 * (step + 1), (64,), generator=gen)
            td_abs = torch.rand(64, generator=gen)
            for dev, buffer in buffers.items():
                buffer.update_priorities(indices.to(dev), td_abs.to(dev))
    cpu, cuda = buffers["cpu"], buffers["cuda"]
    assert cuda._tree_stale and not cpu._tree_stale
    assert bool((cuda.tree.view(torch.int64) == cuda_reference.DIRTY_MARKER).any())
    loaded = pickle.loads(pickle.dumps(cuda))  # pickling refreshes first
    assert not cuda._tree_stale and not loaded._tree_stale
    torch.testing.assert_close(cuda.tree.cpu(), cpu.tree, rtol=2e-7, atol=0.0)
    torch.testing.assert_close(loaded.tree.cpu(), cpu.tree, rtol=2e-7, atol=0.0)
    for buffer in (cpu, cuda):
        device = buffer.device
        buffer.update_priorities(torch.arange(8, device=device), torch.full((8,), 5.0, device=device))
    assert cuda._tree_stale
    # on a GPU the sampling kernel draws Philox uniforms from the buffer's generator state: give the CPU
    # buffer the same draws
    uniforms = philox_uniforms(cuda.sample_rng_state.cpu(), 256)
    counter = int(cuda.sample_rng_state[1])
    expected, actual = _sample_with(cpu, uniforms, monkeypatch), cuda.sample(256)
    assert int(cuda.sample_rng_state[1]) == counter + 1  # the next sample draws new numbers
    assert not cuda._tree_stale
    assert torch.equal(actual.indices.cpu(), expected.indices)
    torch.testing.assert_close(actual.weights.cpu(), expected.weights, rtol=2e-7, atol=0.0)
    torch.testing.assert_close(cuda.tree.cpu(), cpu.tree, rtol=2e-7, atol=0.0)


# ---------------------------------------------------------------------- BranchingIQN's buffer files
def _tiny_iqn():
    import gymnasium as gym

    from sb3_her_ext import BranchingIQN

    class TinyEnv(gym.Env):
        observation_space = OBS_SPACE
        action_space = spaces.MultiDiscrete([3, 2])

        def reset(self, *, seed=None, options=None):
            return np.zeros(3, np.float32), {}

        def step(self, action):
            return np.ones(3, np.float32), 1.0, False, False, {}

    policy = dict(net_arch=[8], n_ensemble=2, n_cos=4, n_quantiles=4, n_quantiles_target=4,
                  n_quantiles_act=4, n_atoms=11)
    model = BranchingIQN("MlpPolicy", TinyEnv(), buffer_size=32, batch_size=4, learning_starts=100,
                         policy_kwargs=policy, device="cpu", hindsight=False, seed=0)
    return model.learn(10)


def test_branching_iqn_buffer_files_carry_a_checksum(tmp_path):
    from sb3_her_ext.checksum import TRAILER_MAGIC, ChecksumError, sha256_prefix

    model = _tiny_iqn()
    model.save_replay_buffer(tmp_path / "buffer")  # SB3 adds .pkl
    path = tmp_path / "buffer.pkl"
    data = path.read_bytes()
    body, trailer = data[: -len(TRAILER_MAGIC) - 65], data[-len(TRAILER_MAGIC) - 65 :]
    assert trailer == TRAILER_MAGIC + sha256_prefix(path, len(body)).encode() + b"\n"
    assert pickle.loads(body).size() == pickle.loads(data).size()  # plain pickle readers ignore the trailer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buffer.pkl"]  # no second file
    before = model.replay_buffer
    model.load_replay_buffer(tmp_path / "buffer")
    assert model.replay_buffer is not before and model.replay_buffer.size() == before.size() > 0
    assert torch.equal(model.replay_buffer.observations, before.observations)

    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    kept = model.replay_buffer
    with pytest.raises(ChecksumError, match=r"buffer.pkl is corrupted: SHA-256 [0-9a-f]{64} where the file"):
        model.load_replay_buffer(path)
    assert model.replay_buffer is kept  # nothing loaded
    path.write_bytes(data[:-3] + b"xy\n")  # a flipped byte in the trailer itself
    with pytest.raises(ChecksumError, match=r"buffer.pkl is corrupted: its SHA-256 trailer .* is malformed"):
        model.load_replay_buffer(path)


def test_branching_iqn_refuses_a_buffer_file_with_non_finite_rows(tmp_path):
    from sb3_her_ext.guard import NonFiniteError

    model = _tiny_iqn()
    kept = model.replay_buffer
    bad = pickle.loads(pickle.dumps(kept))
    bad.rewards[3] = float("nan")
    bad.observations[1, 0] = float("inf")
    model.replay_buffer = bad
    model.save_replay_buffer(tmp_path / "bad.pkl")  # a valid checksum of invalid contents
    model.replay_buffer = kept
    message = r"bad.pkl holds invalid values in \['observations', 'rewards'\]: not loaded"
    with pytest.raises(NonFiniteError, match=message):
        model.load_replay_buffer(tmp_path / "bad.pkl")
    assert model.replay_buffer is kept
    bad.actions[0, 1] = 7  # a branch of 2 actions
    bad.rewards[3] = bad.observations[1, 0] = 0.0
    model.replay_buffer = bad
    model.save_replay_buffer(tmp_path / "bad.pkl")
    model.replay_buffer = kept
    with pytest.raises(NonFiniteError, match=r"holds invalid values in \['actions'\]"):
        model.load_replay_buffer(tmp_path / "bad.pkl")


def test_a_buffer_file_without_a_checksum_loads_with_a_warning(tmp_path):
    model = _tiny_iqn()
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

    OffPolicyAlgorithm.save_replay_buffer(model, tmp_path / "old.pkl")  # as SB3 writes it: no trailer
    with pytest.warns(UserWarning, match=r"old.pkl carries no SHA-256 \(saved before checksums\?\)"):
        model.load_replay_buffer(tmp_path / "old.pkl")
    assert model.replay_buffer.size() > 0


def test_a_buffer_larger_than_free_memory_is_refused_before_allocating() -> None:
    """Issue 39.13: ``buffer_size=10**10`` named in one line, not the allocator's error."""
    from gymnasium import spaces as gym_spaces

    from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

    space = gym_spaces.Box(-1, 1, (8,))
    with pytest.raises(ValueError, match=r"buffer_size=10000000000 needs about .* lower buffer_size"):
        PrioritizedHindsightReplayBuffer(10**10, space, gym_spaces.MultiDiscrete([3, 3]))
