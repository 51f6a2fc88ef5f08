"""The vector env: spaces, same-step autoreset against a hand-driven core, tensor mode, errors, wrappers."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import foxenv
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.market import MarketData
from foxenv.vector_env import LOBVectorEnv, make_vec, tensors_to_numpy
from tests.foxenv.fake_market import random_market


@pytest.fixture(scope="module")
def market() -> MarketData:
    """A random-walk 10-level market of 600 steps."""
    return random_market(600, num_levels=10, seed=2)


def action_batches(steps: int, num_envs: int, seed: int) -> np.ndarray:
    """``[steps, num_envs, 4]`` uniformly random int64 actions."""
    return np.random.default_rng(seed).integers(0, 3, size=(steps, num_envs, 4))


def test_spaces_metadata_and_reset(market: MarketData) -> None:
    env = make_vec(5, data=market, seed=0, episode_length=30)
    assert isinstance(env, LOBVectorEnv) and env.num_envs == 5
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert env.single_action_space == spaces.MultiDiscrete([3, 3, 3, 3])
    dim = env.core.observation_dim
    assert env.single_observation_space == spaces.Box(-np.inf, np.inf, (dim,), np.float32)
    assert env.observation_space.shape == (5, dim)
    assert env.action_space.shape == (5, 4)
    assert env.n_market_features == env.core.n_market_features
    obs, info = env.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.shape == (5, dim) and obs.dtype == np.float32
    assert info == {}
    assert env.observation_space.contains(obs)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert obs.shape == (5, dim) and reward.shape == (5,) and reward.dtype == np.float32
    assert terminated.dtype == np.bool_ and truncated.dtype == np.bool_
    for key in ("mid", "position", "trade_closed", "trade_pnl", "equity", "fees", "entry_mid"):
        assert isinstance(info[key], np.ndarray) and info[key].shape == (5,)
    assert info["trade_closed"].dtype == np.bool_ and info["step"].dtype == np.int64


def test_same_step_autoreset_matches_a_hand_driven_core(market: MarketData) -> None:
    """Episodes of 7 steps plus drawdown terminations, so books finish at different steps."""
    config = EnvConfig(episode_length=7, max_drawdown=2.0)
    env = make_vec(6, data=market, seed=3, config=config)
    core = BatchedLOB(market, 6, config=config, seed=3)
    obs, _ = env.reset(seed=3)
    np.testing.assert_array_equal(obs, core.reset(seed=3).numpy())
    saw_partial = saw_truncation = False
    for actions in action_batches(20, 6, seed=9):
        obs, reward, terminated, truncated, info = env.step(actions)
        want_obs, want_reward, want_term, want_trunc, want_info = core.step(torch.from_numpy(actions))
        done = (want_term | want_trunc).numpy()
        want_info = {key: value.clone() for key, value in want_info.items()}
        np.testing.assert_array_equal(reward, want_reward.numpy())
        np.testing.assert_array_equal(terminated, want_term.numpy())
        np.testing.assert_array_equal(truncated, want_trunc.numpy())
        np.testing.assert_array_equal(info["final_obs"], want_obs.numpy())
        np.testing.assert_array_equal(info["_final_obs"], done)
        np.testing.assert_array_equal(info["_final_info"], done)
        for key, value in want_info.items():
            np.testing.assert_array_equal(info["final_info"][key], value.numpy(), err_msg=key)
            np.testing.assert_array_equal(info[key], value.numpy(), err_msg=key)
        if done.any():
            reset_obs = core.reset(mask=torch.from_numpy(done)).numpy()
            np.testing.assert_array_equal(obs[done], reset_obs[done])
            # a reset book is flat at step 0: its 'time_left' portfolio feature (the last) is 1
            np.testing.assert_array_equal(obs[done, -1], 1.0)
            saw_partial |= bool((~done).any())
            saw_truncation |= bool(want_trunc.any())
        np.testing.assert_array_equal(obs[~done], want_obs.numpy()[~done])
    assert saw_partial and saw_truncation


def test_numpy_info_is_not_changed_by_later_steps(market: MarketData) -> None:
    env = make_vec(3, data=market, seed=0, episode_length=2)
    env.reset(seed=0)
    _, _, _, _, first = env.step(np.full((3, 4), 2))
    kept = {key: first[key].copy() for key in ("position", "cash", "equity")}
    _, _, _, truncated, second = env.step(np.full((3, 4), 2))
    assert truncated.all()
    env.step(np.zeros((3, 4), dtype=np.int64))
    for key, value in kept.items():
        np.testing.assert_array_equal(first[key], value)
    # the final info of the finished step survives the reset of the books
    np.testing.assert_allclose(second["final_info"]["position"], 100.0)


def test_same_seed_same_trajectory(market: MarketData) -> None:
    def run(seed: int) -> list[np.ndarray]:
        env = make_vec(4, data=market, seed=seed, episode_length=10)
        out = [env.reset(seed=seed)[0]]
        for actions in action_batches(25, 4, seed=1):
            obs, reward, _, _, info = env.step(actions)
            out += [obs, reward, info["equity"]]
        return out

    first, second, other = run(5), run(5), run(6)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_return_tensors_mode_uses_tensors_throughout(market: MarketData) -> None:
    env = make_vec(4, data=market, seed=0, return_tensors=True, episode_length=3)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and obs.device == env.device and obs.dtype == torch.float32
    for _ in range(3):
        # full long, Market, aggressive: 100 lots
        obs, reward, terminated, truncated, info = env.step(torch.tensor([[2, 2, 0, 2]] * 4))
    assert isinstance(reward, torch.Tensor) and reward.dtype == torch.float32
    assert truncated.dtype == torch.bool and bool(truncated.all())
    assert isinstance(info["final_obs"], torch.Tensor) and info["final_obs"].shape == obs.shape
    assert isinstance(info["final_info"]["equity"], torch.Tensor)
    assert torch.equal(info["_final_obs"], truncated)
    assert bool((obs[:, -1] == 1.0).all())  # all books were reset: time_left = 1
    # the reset made the books flat, but the info of the finished step still shows their position
    assert torch.equal(info["final_info"]["position"], torch.full((4,), 100.0, dtype=torch.float64))
    assert torch.equal(info["position"], info["final_info"]["position"])
    assert torch.equal(env.core.state_dict()["ledger.position"], torch.zeros(4, dtype=torch.float64))


@pytest.mark.gpu
def test_return_tensors_on_cuda_stay_on_device(market: MarketData) -> None:
    env = make_vec(64, data=market, device="cuda", seed=0, return_tensors=True, episode_length=5)
    obs, _ = env.reset(seed=0)
    assert obs.device.type == "cuda"
    for _ in range(6):
        action = torch.randint(0, 3, (64, 4), device="cuda")
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.device.type == "cuda" and reward.device.type == "cuda"
        assert info["final_obs"].device.type == "cuda" and info["equity"].device.type == "cuda"
    cpu = make_vec(64, data=market, device="cpu", seed=0, episode_length=5)
    numpy_on_cuda = make_vec(64, data=market, device="cuda", seed=0, episode_length=5)
    cpu.reset(seed=0)
    numpy_on_cuda.reset(seed=0)
    actions = np.full((64, 4), 2)
    got, want = numpy_on_cuda.step(actions), cpu.step(actions)
    assert isinstance(got[0], np.ndarray) and got[0].dtype == np.float32
    assert got[4]["step"].dtype == np.int64 and got[4]["trade_closed"].dtype == np.bool_
    np.testing.assert_array_equal(got[4]["step"], want[4]["step"])


@pytest.mark.parametrize(
    "actions",
    [
        np.zeros((3, 4), dtype=np.int64),
        np.zeros((4, 3), dtype=np.int64),
        np.zeros((4, 4), dtype=np.float32),
        np.full((4, 4), 3),
        -np.ones((4, 4), dtype=np.int64),
        torch.zeros((4, 4), dtype=torch.float32),
        torch.zeros((4,), dtype=torch.int64),
    ],
    ids=["few-books", "few-branches", "float", "too-high", "negative", "float-tensor", "flat-tensor"],
)
def test_bad_actions_raise_value_error_naming_action(market: MarketData, actions: object) -> None:
    env = make_vec(4, data=market, seed=0, episode_length=10)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(actions)


def test_bad_arguments_raise_value_error(market: MarketData) -> None:
    with pytest.raises(ValueError, match="num_envs=0"):
        make_vec(0, data=market)
    for bad in (float("nan"), float("inf"), "4", 2.5):
        with pytest.raises(ValueError, match="num_envs="):
            make_vec(bad, data=market)
    with pytest.raises(ValueError, match="bogus=1"):
        make_vec(2, data=market, bogus=1)
    with pytest.raises(ValueError, match="episode_length=0"):
        make_vec(2, data=market, episode_length=0)


def test_gymnasium_make_vec_and_standard_wrappers(market: MarketData) -> None:
    from gymnasium.wrappers.vector import DictInfoToList, RecordEpisodeStatistics

    env = gymnasium.make_vec(foxenv.ENV_ID, num_envs=3, data=market, seed=0, episode_length=4)
    assert isinstance(env, LOBVectorEnv)
    wrapped = DictInfoToList(RecordEpisodeStatistics(env))
    wrapped.reset(seed=0)
    for _ in range(4):
        _, reward, _, truncated, infos = wrapped.step(np.ones((3, 4), dtype=np.int64))
    assert truncated.all()
    assert len(infos) == 3 and infos[0]["episode"]["l"] == 4
    assert infos[1]["final_obs"].shape == (env.core.observation_dim,)


@pytest.mark.parametrize("pack", [False, True])
def test_tensors_to_numpy_keeps_dtypes_and_values(pack: bool) -> None:
    tensors = {
        "f": torch.tensor([1.5, -2.25]),
        "d": torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64),
        "b": torch.tensor([True, False]),
        "i": torch.tensor([7, 2**40], dtype=torch.int64),
    }
    arrays = tensors_to_numpy(tensors, pack=pack)
    for key, value in tensors.items():
        assert arrays[key].dtype == value.numpy().dtype
        np.testing.assert_array_equal(arrays[key], value.numpy())
    arrays["f"][0] = 99.0
    assert tensors["f"][0].item() == 1.5  # a copy, not a view


@pytest.mark.slow
def test_env_throughput_benchmark_quick_smoke(tmp_path: Path) -> None:
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "env_throughput.py"
    spec = importlib.util.spec_from_file_location("env_throughput", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "env_throughput.json"
    results = module.main(["--quick", "--device", "cpu", "--sizes", "1", "8", "--single-steps", "50",
                           "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    vector_rows = [row for row in results["rows"] if row["kind"] == "vector"]
    assert {(row["data"], row["num_books"]) for row in vector_rows} >= {("synthetic", 1), ("synthetic", 8)}
    for row in vector_rows:
        assert row["book_steps_per_s"] > 0 and row["steps"] >= 3
    single = {row["env"]: row for row in results["rows"] if row["kind"] == "single"}
    assert single["foxenv LOBEnv"]["steps_per_s"] > 0
    assert "gym-trading-env TradingEnv" in single


@pytest.mark.slow
def test_compiled_vector_env_follows_the_eager_one() -> None:
    """``make_vec(..., compile=True)`` compiles the core's step and gives the eager results (to rounding)."""
    from foxenv.data import load_market

    market = load_market("synthetic", num_steps=600, seed=4)
    eager = make_vec(8, data=market, seed=1, return_tensors=True, episode_length=40)
    compiled = make_vec(8, data=market, seed=1, return_tensors=True, episode_length=40, compile=True)
    assert compiled.core._compiled_advance is not None
    torch.testing.assert_close(eager.reset(seed=1)[0], compiled.reset(seed=1)[0])
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):  # crosses an autoreset at step 40
        action = torch.randint(0, 3, (8, 4), generator=gen)
        out_e, out_c = eager.step(action), compiled.step(action)
        for a, b in zip(out_e[:4], out_c[:4], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_cuda_graph_needs_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="cuda_graph"):
        make_vec(2, data=random_market(80), cuda_graph=True, episode_length=20, levels=5)


@pytest.mark.gpu
def test_cuda_graph_vector_env_follows_the_eager_one() -> None:
    """``make_vec(..., cuda_graph=True)`` replays one captured step and gives the eager results."""
    market = random_market(400)
    eager = make_vec(8, data=market, device="cuda", seed=1, return_tensors=True, episode_length=40, levels=5)
    graphed = make_vec(8, data=market, device="cuda", seed=1, return_tensors=True, episode_length=40,
                       levels=5, cuda_graph=True)
    torch.testing.assert_close(eager.reset(seed=1)[0], graphed.reset(seed=1)[0])
    assert graphed.core._graph is not None
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(60):  # crosses an autoreset at step 40
        action = torch.randint(0, 3, (8, 4), generator=gen, device="cuda")
        out_e, out_g = eager.step(action), graphed.step(action)
        for a, b in zip(out_e[:4], out_g[:4], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
