"""The counterfactual step (:mod:`foxenv.counterfactual`): clone exactness on the CPU and on CUDA, the
state export and restore, and its argument checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from foxenv.counterfactual import (
    AgentState,
    CounterfactualStep,
    export_state,
    restore_state,
    start_state,
)
from foxenv.data import load_market
from foxenv.state import BOOK_ROWS, COUNTER_ROWS
from foxenv.vector_env import make_vec
from tests.foxenv.counterfactual_checks import assert_same, check_clones, small_market

CONFIGS = [
    pytest.param({"fill_model": "conservative", "order_latency": 0}, id="conservative"),
    pytest.param({"fill_model": "optimistic", "order_latency": 0}, id="optimistic"),
    pytest.param({"fill_model": "conservative", "order_latency": 2}, id="conservative-latency"),
    pytest.param({"fill_model": "optimistic", "order_latency": 1}, id="optimistic-latency"),
]


def assert_covered(seen, config: dict) -> None:
    """The run met every situation the clone must reproduce (a partial maker fill: conservative fills only;
    an order in flight: with latency only)."""
    keys = ["market_fills", "maker_fills", "ioc_fills", "queued", "done"]
    keys += ["partial_maker"] if config.get("fill_model", "conservative") == "conservative" else []
    keys += ["pending"] if config.get("order_latency", 0) else []
    for key in keys:
        assert seen[key] > 0, f"the run never covered {key}: {dict(seen)}"


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("num_books", [1, 9, 32])
def test_clone_reproduces_the_vector_env_step(config: dict, num_books: int) -> None:
    steps = 120 if num_books == 1 else 60
    seen = check_clones("cpu", num_books, steps, seed=num_books, **config)
    if num_books > 1:
        assert_covered(seen, config)


@pytest.mark.parametrize("config", CONFIGS)
def test_clone_reproduces_the_core_step_and_state_at_episode_ends(config: dict) -> None:
    seen = check_clones("cpu", 16, 60, vector=False, seed=5, max_drawdown=40.0, inventory_penalty=0.01,
                        **config)
    assert_covered(seen, config)
    assert seen["terminated"] > 0, dict(seen)


def test_clone_on_the_wide_grid_and_halted_rows() -> None:
    seen = check_clones("cpu", 12, 60, data=small_market(halt_every=7), seed=2, action_grid="wide",
                        order_latency=1)
    assert_covered(seen, {"order_latency": 1})


def test_clone_on_goog(lobster_dir: Path) -> None:
    market = load_market(str(lobster_dir))
    seen = check_clones("cpu", 16, 60, data=market, seed=4)
    assert seen["maker_fills"] > 0 and seen["market_fills"] > 0, dict(seen)


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS)
def test_clone_reproduces_the_step_on_cuda(config: dict) -> None:
    for vector in (True, False):
        seen = check_clones("cuda", 32, 60, vector=vector, seed=7, max_drawdown=40.0, **config)
        assert_covered(seen, config)
    seen = check_clones("cuda", 12, 40, data=small_market(halt_every=7), seed=2, action_grid="wide",
                        **config)
    assert seen["done"] > 0


@pytest.mark.gpu
def test_counterfactual_step_does_not_sync_on_cuda() -> None:
    env = make_vec(8, data=small_market(), device="cuda", seed=0, return_tensors=True, episode_length=25)
    env.reset(seed=0)
    cf = CounterfactualStep(env)
    state = export_state(env)
    cf(state)  # warm up
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = cf(state)
        cf(out.state.index((slice(None), 0)))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_export_restore_round_trip_and_env_unchanged() -> None:
    env = make_vec(6, data=small_market(), seed=0, return_tensors=True, episode_length=25)
    env.reset(seed=0)
    for _ in range(7):
        env.step(torch.tensor([[2, 1, 1, 1]] * 6))
    saved = export_state(env)
    assert saved.books.shape == (6, len(BOOK_ROWS)) and saved.counters.shape == (6, len(COUNTER_ROWS))
    cf = CounterfactualStep(env)
    cf(saved)
    assert_same("books after a counterfactual step", export_state(env).books, saved.books)
    logged = env.step(torch.tensor([[0, 2, 0, 2]] * 6))
    restore_state(env, saved)
    assert_same("restored", export_state(env).books, saved.books)
    again = env.step(torch.tensor([[0, 2, 0, 2]] * 6))
    for name, a, b in zip(("obs", "reward", "terminated", "truncated"), again[:4], logged[:4], strict=True):
        assert_same(name, a, b)


def test_start_state_is_a_fresh_book() -> None:
    env = make_vec(3, data=small_market(), seed=0, return_tensors=True, episode_length=25)
    obs, _ = env.reset(seed=0)
    fresh = start_state(export_state(env).column("offset"))
    assert_same("fresh books", fresh.books, export_state(env).books)
    assert_same("fresh counters", fresh.counters, export_state(env).counters)
    flat = torch.tensor([1, 0, 0, 0])
    out = CounterfactualStep(env)(fresh, torch.tensor([27]))  # one code for every state: flat, Market
    logged = env.step(flat.expand(3, 4))
    assert_same("flat obs", out.obs[:, 0], logged[0])


def test_all_actions_by_default_and_codes_decode() -> None:
    env = make_vec(2, data=small_market(), seed=0, return_tensors=True, action_grid="wide", episode_length=25)
    env.reset(seed=0)
    cf = CounterfactualStep(env)
    assert cf.num_actions == 1080
    codes = torch.arange(1080)
    assert torch.equal(cf.encode(cf.decode(codes)), codes)
    out = cf(export_state(env))
    assert out.reward.shape == (2, 1080) and out.obs.shape[:2] == (2, 1080)
    assert torch.equal(out.actions[0], cf.decode(codes))


@pytest.mark.parametrize(
    ("state", "actions", "match"),
    [
        (lambda s: AgentState(s.books.float(), s.counters), None, "state.books dtype"),
        (lambda s: AgentState(s.books[:, :5], s.counters), None, "state.books shape"),
        (lambda s: AgentState(s.books, s.counters[:1]), None, "same leading dimensions"),
        (lambda s: (s.books,), None, "AgentState"),
        (lambda s: s, torch.tensor([81]), "joint code in \\[0, 81\\)"),
        (lambda s: s, torch.tensor([[[0, 3, 0, 0]]] * 4), "branch nvec"),
        (lambda s: s, torch.zeros(3, 2, dtype=torch.int64), "actions shape"),
        (lambda s: s, torch.zeros(4, 2), "actions dtype"),
        (lambda s: AgentState(s.books, s.counters + torch.tensor([0, 25, 0])), None, "'step'"),
    ],
)
def test_bad_arguments_name_the_field(state, actions, match: str) -> None:
    env = make_vec(4, data=small_market(), seed=0, return_tensors=True, episode_length=25)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        CounterfactualStep(env)(state(export_state(env)), actions)


def test_restore_checks_the_number_of_books() -> None:
    env = make_vec(4, data=small_market(), seed=0, return_tensors=True, episode_length=25)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="one row per book"):
        restore_state(env, export_state(env).index(slice(0, 2)))
    with pytest.raises(ValueError, match="must be a BatchedLOB"):
        export_state(object())


def test_clone_of_the_sb3_vec_env_on_the_joint_face() -> None:
    from foxhunt.envs import LOBVecEnv

    env = LOBVecEnv(5, seed=0, data=small_market(), action_face="joint", episode_length=25)
    env.reset()
    cf = CounterfactualStep(env)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        before = export_state(env)
        codes = torch.randint(0, 81, (5,), generator=generator)
        out = cf(before)
        obs, reward, done, _ = env.step(codes.numpy())
        books = torch.arange(5)
        assert_same("reward", out.reward[books, codes], torch.from_numpy(reward))
        assert_same("obs", out.obs[books, codes][~torch.from_numpy(done)], torch.from_numpy(obs)[~done])
