"""PrioritizedHindsightReplayBuffer's ``counterfactual_state_dim``: each row's pre-step env state stored from
``infos[STATE_KEY]`` on both add paths, returned with every kind of sample, pickled, checked; and nothing
of it (memory, samples) where it is 0."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from gymnasium import spaces

from cuda_ext import ReplayStorage
from sb3_her_ext.counterfactual import STATE_KEY
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

OBS_SPACE = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACTION_SPACE = spaces.MultiDiscrete([3, 3, 3, 3])
S = 5


def make_buffer(capacity: int = 8, n_envs: int = 2, **kwargs) -> PrioritizedHindsightReplayBuffer:
    return PrioritizedHindsightReplayBuffer(capacity, OBS_SPACE, ACTION_SPACE, device="cpu", n_envs=n_envs,
                                            seed=0, **kwargs)


def expected_states(values: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` float64 state of rows whose obs value is ``values``: the value, then ``2**52 + 8 v + j``
    (exact in float64 only)."""
    values = values.to(torch.float64)
    return torch.cat([values[:, None], 2.0**52 + 8 * values[:, None] + torch.arange(1, S)], dim=1)


def states_of(marker: float, n: int) -> np.ndarray:
    """``[n, S]`` float64 states of one step's rows (obs values ``marker + env``)."""
    return expected_states(marker + torch.arange(n, dtype=torch.float64)).numpy()


def add_step(buffer: PrioritizedHindsightReplayBuffer, marker: float, tensors: bool = False,
             states: bool = True) -> None:
    """One step: obs rows ``marker + env``, actions ``(marker + env) % 3``, states :func:`states_of`."""
    n = buffer.n_envs
    base = marker + np.arange(n, dtype=np.float32)
    obs = np.repeat(base[:, None], 3, axis=1)
    actions = np.tile((base.astype(np.int64) % 3)[:, None], (1, 4))
    rows = states_of(marker, n)
    if tensors:
        infos = {STATE_KEY: torch.from_numpy(rows)} if states else {}
        buffer.add(torch.from_numpy(obs), torch.from_numpy(obs + 0.5), torch.from_numpy(actions),
                   torch.from_numpy(base), torch.zeros(n, dtype=torch.bool), infos)
    else:
        infos = [{STATE_KEY: row} for row in rows] if states else [{} for _ in range(n)]
        buffer.add(obs, obs + 0.5, actions, base, np.zeros(n, bool), infos)


def assert_rows_match(buffer: PrioritizedHindsightReplayBuffer, batch) -> None:
    """Each sampled row's state is its own."""
    assert batch.counterfactual_states.dtype == torch.float64
    assert batch.counterfactual_states.shape == (batch.indices.shape[0], S)
    assert torch.equal(batch.counterfactual_states, expected_states(batch.observations[:, 0]))
    assert torch.equal(batch.counterfactual_states, buffer.counterfactual_states[batch.indices])


@pytest.mark.parametrize("tensors", [False, True], ids=["host-dicts", "tensor-dict"])
def test_states_are_stored_and_sampled_with_their_rows(tensors: bool) -> None:
    buffer = make_buffer(capacity=8, n_envs=2, counterfactual_state_dim=S)
    for marker in range(0, 14, 2):  # 14 rows into 8 slots: the ring wraps
        add_step(buffer, float(marker), tensors=tensors)
    stored = buffer.counterfactual_states
    assert stored.shape == (8, S) and stored.dtype == torch.float64
    assert torch.equal(stored, expected_states(buffer.observations[:, 0]))
    assert_rows_match(buffer, buffer.sample(16))
    assert_rows_match(buffer, buffer.sample_with_beta(16, torch.tensor(0.5, dtype=torch.float64)))
    assert_rows_match(buffer, buffer.sample_stratified(9, branch=1, n_values=3))
    assert buffer.invalid_fields() == []


def test_the_states_keep_their_bits() -> None:
    buffer = make_buffer(capacity=4, n_envs=2, counterfactual_state_dim=S)
    add_step(buffer, 1.0)
    assert torch.equal(buffer.counterfactual_states[:2], torch.from_numpy(states_of(1.0, 2)))
    assert buffer.counterfactual_states[0, 1] == 2.0**52 + 9  # float64, not a float32 rounding


def test_more_rows_than_slots_keep_the_last_ones_with_their_states() -> None:
    buffer = make_buffer(capacity=3, n_envs=5, counterfactual_state_dim=S)
    add_step(buffer, 10.0)  # per_push writes the last 3 of the 5 rows
    assert torch.equal(buffer.counterfactual_states, expected_states(buffer.observations[:, 0]))
    assert sorted(buffer.observations[:, 0].tolist()) == [12.0, 13.0, 14.0]


def test_off_stores_nothing_and_samples_the_same_rows() -> None:
    off, on = make_buffer(), make_buffer(counterfactual_state_dim=S)
    assert off.storage.state is None and off.counterfactual_states is None
    assert "counterfactual_states" not in off._tensor_names()
    assert "state" not in off.storage.tensors()
    zeros = ReplayStorage.zeros(8, 3, 4)
    assert {k: (v.shape, v.dtype) for k, v in zeros.tensors().items()} == {
        k: (v.shape, v.dtype) for k, v in off.storage.tensors().items()}
    for marker in range(0, 10, 2):
        add_step(off, float(marker), states=False)  # no key needed
        add_step(on, float(marker))
    a, b = off.sample(12), on.sample(12)
    assert a.counterfactual_states is None
    for name in ("observations", "actions", "next_observations", "dones", "rewards", "weights", "indices"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("tensors", [False, True], ids=["host-dicts", "tensor-dict"])
def test_missing_states_are_refused_naming_the_key(tensors: bool) -> None:
    buffer = make_buffer(counterfactual_state_dim=S)
    with pytest.raises(ValueError, match=rf"lacks? '{STATE_KEY}' \(counterfactual_state_dim=5\)"):
        add_step(buffer, 0.0, tensors=tensors, states=False)
    assert buffer.size() == 0


@pytest.mark.parametrize(("value", "message"), [
    (torch.zeros(2, S, dtype=torch.float32), "dtype torch.float32 must be float64"),
    (torch.zeros(2, S + 1, dtype=torch.float64), "expected 2 rows of 5 values"),
    ([np.zeros(S, np.float32)] * 2, "dtype float32 must be float64"),
])
def test_bad_states_are_refused(value, message: str) -> None:
    buffer = make_buffer(counterfactual_state_dim=S)
    obs = np.zeros((2, 3), np.float32)
    infos = {STATE_KEY: value} if isinstance(value, torch.Tensor) else [{STATE_KEY: v} for v in value]
    with pytest.raises(ValueError, match=message):
        buffer.add(obs, obs, np.zeros((2, 4), np.int64), np.zeros(2, np.float32), np.zeros(2, bool), infos)


@pytest.mark.parametrize("value", [-1, 1.5, True, "17"])
def test_bad_dims_are_named(value) -> None:
    with pytest.raises(ValueError, match="counterfactual_state_dim="):
        make_buffer(counterfactual_state_dim=value)


def test_hindsight_rows_have_no_state_so_the_two_are_refused_together() -> None:
    with pytest.raises(ValueError, match="counterfactual_state_dim=5 with hindsight on"):
        make_buffer(counterfactual_state_dim=S, hindsight={"reward_scale": 1.0})


def test_pickling_keeps_the_states_and_older_pickles_load_without_them() -> None:
    buffer = make_buffer(counterfactual_state_dim=S)
    for marker in range(0, 6, 2):
        add_step(buffer, float(marker))
    restored = pickle.loads(pickle.dumps(buffer))
    assert restored.counterfactual_state_dim == S
    assert torch.equal(restored.counterfactual_states, buffer.counterfactual_states)
    assert torch.equal(restored.sample(6).counterfactual_states, buffer.sample(6).counterfactual_states)
    old = make_buffer()
    state = old.__getstate__()
    del state["counterfactual_state_dim"]  # a pickle made before the field existed
    vars(state["storage"]).pop("state", None)
    older = PrioritizedHindsightReplayBuffer.__new__(PrioritizedHindsightReplayBuffer)
    older.__setstate__(state)
    assert older.counterfactual_state_dim == 0 and older.storage.state is None
    add_step(older, 0.0, states=False)
    assert older.sample(2).counterfactual_states is None


def test_invalid_fields_names_non_finite_states() -> None:
    buffer = make_buffer(counterfactual_state_dim=S)
    add_step(buffer, 0.0)
    buffer.counterfactual_states[1, 3] = float("nan")
    assert buffer.invalid_fields() == ["counterfactual_states"]


def test_write_state_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="stores no state"):
        ReplayStorage.zeros(4, 3, 1).write_state(torch.zeros(2, dtype=torch.int64), torch.zeros(2, 2))
    storage = ReplayStorage.zeros(4, 3, 1, state_dim=2)
    with pytest.raises(ValueError, match=r"values shape \(2, 3\) must be \(2, 2\)"):
        storage.write_state(torch.zeros(2, dtype=torch.int64), torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="state_dim=-1"):
        ReplayStorage.zeros(4, 3, 1, state_dim=-1)
    assert storage.to("cpu").state.shape == (4, 2)


@pytest.mark.gpu
def test_adding_states_inside_a_cuda_graph_with_deterministic_algorithms_equals_eager() -> None:
    """The fused training block adds rows inside a CUDA graph, and a seeded run turns deterministic
    algorithms on (where a checked index_put_ would read its indices on the host)."""
    def make() -> PrioritizedHindsightReplayBuffer:
        return PrioritizedHindsightReplayBuffer(8, OBS_SPACE, ACTION_SPACE, device="cuda", n_envs=3, seed=0,
                                                counterfactual_state_dim=S)

    eager, graphed = make(), make()
    obs = torch.zeros(3, 3, device="cuda")
    actions = torch.zeros(3, 4, dtype=torch.int64, device="cuda")
    reward = torch.zeros(3, device="cuda")
    done = torch.zeros(3, dtype=torch.bool, device="cuda")
    states = torch.zeros(3, S, dtype=torch.float64, device="cuda")

    def feed(step: int) -> None:
        values = step * 3 + torch.arange(3, device="cuda", dtype=torch.float32)
        obs.copy_(values[:, None].expand(-1, 3))
        reward.copy_(values)
        states.copy_(expected_states(values))

    def add(buffer: PrioritizedHindsightReplayBuffer) -> None:
        buffer.add(obs, obs + 0.5, actions, reward, done, {STATE_KEY: states})

    previous = (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        feed(0)
        for buffer in (eager, graphed):  # the warm-up outside the capture
            add(buffer)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            add(graphed)
        for step in range(1, 6):  # wraps the 8-slot ring
            feed(step)
            add(eager)
            graph.replay()
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    for buffer in (eager, graphed):
        buffer.refresh_tree()
    for name in eager._tensor_names():
        assert torch.equal(getattr(eager, name), getattr(graphed, name)), name
    assert torch.equal(graphed.counterfactual_states, expected_states(graphed.observations[:, 0]))
