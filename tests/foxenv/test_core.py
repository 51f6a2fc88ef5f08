"""BatchedLOB lifecycle: shapes, truncation, drawdown termination, masked reset, determinism, checkpoints,
and bad inputs."""

from __future__ import annotations

import pytest
import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from tests.foxenv.fake_market import flat_market, random_market
from tests.foxenv.test_matching import AGGRESSIVE, ASK, BID, FULL, HALF, LONG, MARKET, act, make_env

INFO_KEYS = {
    "mid", "best_bid", "best_ask", "position", "trade_closed", "trade_pnl", "trade_lots", "entry_mid",
    "equity", "fees", "cash", "realized_pnl", "unrealized_pnl", "order_active", "order_price",
    "order_queue_ahead", "order_remaining", "step",
}


def random_actions(num_books: int, steps: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 3, (num_books, 4), generator=gen) for _ in range(steps)]


def test_shapes_dtypes_and_info_keys() -> None:
    env = BatchedLOB(random_market(300, 5), 7, EnvConfig(levels=4, episode_length=50), seed=1)
    obs = env.reset()
    assert obs.shape == (7, env.observation_dim) and obs.dtype == torch.float32
    assert env.observation_dim == env.n_market_features + 8
    assert env.n_market_features == 4 * 4 + 2 + 4 + 2
    obs, reward, terminated, truncated, info = env.step(torch.ones(7, 4, dtype=torch.int32))
    assert obs.shape == (7, env.observation_dim) and obs.dtype == torch.float32
    assert reward.shape == (7,) and reward.dtype == torch.float32
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert set(info) >= INFO_KEYS
    for key, value in info.items():
        assert value.shape == (7,), key
    assert info["trade_closed"].dtype == torch.bool and info["order_active"].dtype == torch.bool
    assert info["step"].tolist() == [1] * 7


def test_observation_reads_the_books_own_time_offset() -> None:
    market = random_market(400, 5, seed=2)
    env = BatchedLOB(market, 16, EnvConfig(levels=5, episode_length=100), seed=4)
    obs = env.reset()
    offsets = env.state_dict()["offset"]
    assert len(set(offsets.tolist())) > 1  # books start at different times
    assert bool((offsets >= 0).all()) and bool((offsets + 100 <= 399).all())
    mids = (market.bid_price[offsets, 0] + market.ask_price[offsets, 0]) / 2
    # The first market feature is the best bid's distance from mid in ticks.
    expected = (market.bid_price[offsets, 0] - mids) / market.tick_size
    assert torch.allclose(obs[:, 0].double(), expected, atol=1e-4)
    _, _, _, _, info = env.step(torch.ones(16, 4, dtype=torch.int64))
    assert torch.allclose(info["best_bid"], market.bid_price[offsets + 1, 0])


def test_truncation_at_episode_length() -> None:
    env = make_env(flat_market(4, BID, ASK))  # episode_length 3
    for step in range(1, 4):
        _, _, terminated, truncated, info = act(env, LONG, HALF, MARKET, AGGRESSIVE)
        assert truncated.item() == (step == 3)
        assert not terminated.item()
        assert info["step"].item() == step
    with pytest.raises(ValueError, match="episode_length"):
        act(env, LONG, HALF, MARKET, AGGRESSIVE)  # stepping a finished book without reset


def test_drawdown_termination() -> None:
    env = make_env(flat_market(4, BID, ASK), max_drawdown=1.0, taker_fee_bps=0.5)
    _, _, terminated, truncated, info = act(env, LONG, HALF, MARKET, AGGRESSIVE)
    assert info["equity"].item() == pytest.approx(-1.35008, abs=1e-9)  # 1.35 below the peak of 0
    assert terminated.item() and not truncated.item()
    env = make_env(flat_market(4, BID, ASK), max_drawdown=1.5, taker_fee_bps=0.5)
    _, _, terminated, _, _ = act(env, LONG, HALF, MARKET, AGGRESSIVE)
    assert not terminated.item()


def test_reset_mask_resets_only_masked_books() -> None:
    env = BatchedLOB(random_market(500, 5, seed=3), 3, EnvConfig(levels=5, episode_length=100), seed=0)
    env.reset()
    for _ in range(3):
        _, _, _, _, info = env.step(torch.tensor([[2, 2, 0, 2]] * 3))
    before = env.state_dict()
    assert bool((info["position"] != 0).all())
    env.reset(mask=torch.tensor([True, False, True]))
    after = env.state_dict()
    assert after["ledger.position"].tolist()[0::2] == [0.0, 0.0]
    assert after["ledger.cash"].tolist()[0::2] == [0.0, 0.0]
    assert after["step"].tolist() == [0, 3, 0]
    for key in ("offset", "ledger.position", "ledger.cash", "equity"):
        assert after[key][1] == before[key][1], key
    _, _, _, _, info = env.step(torch.tensor([[1, 0, 0, 0]] * 3))
    assert info["step"].tolist() == [1, 4, 1]


def test_same_seed_same_trajectory_and_different_seed_differs() -> None:
    market = random_market(600, 5, seed=5)
    actions = random_actions(8, 60, seed=9)

    def rollout(seed: int) -> list[torch.Tensor]:
        env = BatchedLOB(market, 8, EnvConfig(levels=5, episode_length=30), seed=seed)
        out = [env.reset()]
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
            out += [obs, reward, info["equity"]]
            done = terminated | truncated
            if bool(done.any()):
                out.append(env.reset(mask=done))
        return out

    first, second, other = rollout(11), rollout(11), rollout(12)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_reset_seed_restarts_the_stream() -> None:
    env = BatchedLOB(random_market(600, 5), 8, EnvConfig(levels=5, episode_length=30), seed=1)
    first = env.reset(seed=42)
    env.reset()
    assert torch.equal(env.reset(seed=42), first)


def test_state_dict_round_trip_resumes_exactly() -> None:
    market = random_market(600, 5, seed=6)
    env = BatchedLOB(market, 5, EnvConfig(levels=5, episode_length=200), seed=3)
    env.reset()
    actions = random_actions(5, 40, seed=1)
    for action in actions[:20]:
        env.step(action)
    saved = env.state_dict()
    expected = [env.step(a)[0] for a in actions[20:]] + [env.reset(mask=torch.ones(5, dtype=torch.bool))]
    clone = BatchedLOB(market, 5, EnvConfig(levels=5, episode_length=200), seed=99)
    clone.load_state_dict(saved)
    resumed = [clone.step(a)[0] for a in actions[20:]] + [clone.reset(mask=torch.ones(5, dtype=torch.bool))]
    assert all(torch.equal(a, b) for a, b in zip(expected, resumed, strict=True))
    with pytest.raises(ValueError, match="state"):
        clone.load_state_dict({"offset": saved["offset"]})


def test_load_state_dict_rejects_a_cast_or_an_offset_off_the_market() -> None:
    market = random_market(600, 5, seed=6)
    env = BatchedLOB(market, 3, EnvConfig(levels=5, episode_length=200), seed=3)
    saved = env.state_dict()
    before = env.state_dict()["offset"]
    with pytest.raises(ValueError, match=r"state\['offset'\] dtype torch.float64 must be torch.int64"):
        env.load_state_dict({**saved, "offset": saved["offset"].double() + 0.5})
    # 600 steps, episodes of 200: an offset must lie in [0, 400)
    with pytest.raises(ValueError, match=r"state\['offset'\] values in \[0, 400\] must lie in \[0, 400\)"):
        env.load_state_dict({**saved, "offset": torch.tensor([0, 400, 7])})
    assert torch.equal(env.state_dict()["offset"], before)  # a rejected state changes nothing


# ---------------------------------------------------------------------------- bad inputs


@pytest.fixture
def env() -> BatchedLOB:
    return BatchedLOB(random_market(200, 3), 2, EnvConfig(levels=3, episode_length=50), seed=0)


@pytest.mark.parametrize("shape", [(2, 3), (3, 4), (8,), (2, 4, 1)])
def test_wrong_action_shape_raises(env: BatchedLOB, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"action shape"):
        env.step(torch.zeros(shape, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_wrong_action_dtype_raises(env: BatchedLOB, dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match=r"action dtype"):
        env.step(torch.zeros(2, 4, dtype=dtype))


@pytest.mark.parametrize(("book", "branch", "value"), [(0, 0, 3), (1, 3, -1), (1, 1, 7), (0, 2, 3)])
def test_action_out_of_range_raises(env: BatchedLOB, book: int, branch: int, value: int) -> None:
    action = torch.ones(2, 4, dtype=torch.int8)
    action[book, branch] = value
    with pytest.raises(ValueError, match=rf"action\[{book}, {branch}\]={value}"):
        env.step(action)


def test_any_integer_dtype_is_accepted(env: BatchedLOB) -> None:
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        env.step(torch.ones(2, 4, dtype=dtype))


def test_non_tensor_action_raises(env: BatchedLOB) -> None:
    with pytest.raises(ValueError, match="action"):
        env.step([[1, 1, 1, 1], [1, 1, 1, 1]])


def test_bad_reset_mask_raises(env: BatchedLOB) -> None:
    with pytest.raises(ValueError, match="mask"):
        env.reset(mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        env.reset(mask=torch.ones(2, dtype=torch.int64))


def test_levels_beyond_market_raises() -> None:
    with pytest.raises(ValueError, match=r"levels=4 must be <= market.num_levels=3"):
        BatchedLOB(random_market(100, 3), 1, EnvConfig(levels=4, episode_length=10))


def test_market_shorter_than_an_episode_raises() -> None:
    with pytest.raises(ValueError, match=r"episode_length=100"):
        BatchedLOB(random_market(100, 3), 1, EnvConfig(levels=3, episode_length=100))


def test_bad_num_books_raises() -> None:
    with pytest.raises(ValueError, match=r"num_books=0"):
        BatchedLOB(random_market(100, 3), 0, EnvConfig(levels=3, episode_length=10))


@pytest.mark.parametrize(("field", "value"), [
    ("max_position", 0.0), ("max_position", -1.0), ("max_position", float("nan")),
    ("episode_length", 0), ("levels", 0), ("reward_scale", 0.0), ("inventory_penalty", -0.1),
    ("max_drawdown", -5.0), ("queue_power", -1.0), ("taker_fee_bps", -0.1), ("return_horizons", ()),
    ("return_horizons", (1, 0)), ("vol_window", 1), ("flow_window", 0), ("maker_fee_bps", float("inf")),
    ("episode_length", float("nan")), ("episode_length", float("inf")), ("episode_length", "10"),
    ("levels", 2.5), ("levels", True), ("vol_window", float("nan")), ("flow_window", float("inf")),
    ("reward_scale", "1"), ("max_position", True), ("max_drawdown", float("nan")), ("queue_power", "2"),
    ("return_horizons", 5), ("return_horizons", "15"), ("return_horizons", (1, float("nan"))),
])
def test_bad_config_raises_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"{field}="):
        EnvConfig(**{field: value})


def test_validate_actions_defaults() -> None:
    env = BatchedLOB(random_market(100, 3), 1, EnvConfig(levels=3, episode_length=10))
    assert env.validate_actions is True
    env = BatchedLOB(random_market(100, 3), 1, EnvConfig(levels=3, episode_length=10), validate_actions=False)
    assert env.validate_actions is False


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    market = random_market(600, 5, seed=8)
    cfg = EnvConfig(levels=5, episode_length=100)
    cpu = BatchedLOB(market, 32, cfg, device="cpu", seed=0)
    gpu = BatchedLOB(market, 32, cfg, device="cuda", seed=0)
    assert gpu.validate_actions is False
    state = cpu.state_dict()
    state["generator"] = gpu.state_dict()["generator"]
    gpu.load_state_dict(state)  # same offsets on both devices
    for action in random_actions(32, 50, seed=2):
        obs_c, rew_c, _, _, info_c = cpu.step(action)
        obs_g, rew_g, _, _, info_g = gpu.step(action)
        assert torch.allclose(obs_c, obs_g.cpu(), atol=1e-4)
        assert torch.allclose(rew_c, rew_g.cpu(), atol=1e-4)
        assert torch.allclose(info_c["equity"], info_g["equity"].cpu(), atol=1e-8)


def test_cuda_graph_needs_cuda(env: BatchedLOB) -> None:
    with pytest.raises(ValueError, match="device=cpu"):
        env.enable_cuda_graph()


@pytest.mark.gpu
def test_cuda_graph_matches_eager() -> None:
    market = random_market(600, 5, seed=8)
    cfg = EnvConfig(levels=5, episode_length=20, max_drawdown=50.0)
    eager = BatchedLOB(market, 64, cfg, device="cuda", seed=3)
    graphed = BatchedLOB(market, 64, cfg, device="cuda", seed=3)
    graphed.enable_cuda_graph()
    kept = []
    for action in random_actions(64, 70, seed=4):
        out_e = eager.step(action.cuda())
        out_g = graphed.step(action.cuda())
        kept.append(out_g[0])
        for a, b in zip(out_e[:4], out_g[:4], strict=True):
            assert torch.equal(a, b)
        for key in out_e[4]:
            assert torch.equal(out_e[4][key], out_g[4][key]), key
        done = out_e[2] | out_e[3]
        torch.testing.assert_close(eager.reset(mask=done), graphed.reset(mask=done), rtol=0, atol=0)
    assert not torch.equal(kept[0], kept[-1])  # returned observations are copies, not the graph's buffers
    saved = eager.state_dict()
    graphed.load_state_dict(saved)
    action = torch.ones(64, 4, dtype=torch.int64, device="cuda")
    assert torch.equal(eager.step(action)[0], graphed.step(action)[0])


def test_full_long_position_is_capped_at_max_position() -> None:
    env = make_env(flat_market(4, [(100.00, 1000.0)], [(100.02, 1000.0)]), max_position=70.0)
    for _ in range(3):
        _, _, _, _, info = act(env, LONG, FULL, MARKET, AGGRESSIVE)
        assert info["position"].item() == 70.0
