"""The execute task (foxenv.execution): shortfall accounting against a hand-computed window, the child order
semantics, buys and sells symmetric, both action faces, config errors, and CUDA equal to the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxenv.config import EnvConfig, config_settings
from foxenv.core import BatchedLOB
from foxenv.execution import EXECUTION_FEATURES, ExecutionGrid
from tests.foxenv.fake_market import make_market, random_market

# Execute-task action values: child size (in TWAP slices), order type, urgency (default grid).
NONE, HALF_SLICE, ONE_SLICE, TWO_SLICES = 0, 1, 2, 3
MARKET, MAKER, IOC = 0, 1, 2
PASSIVE, NORMAL, AGGRESSIVE = 0, 1, 2

BID = [(100.00, 10.0), (99.99, 20.0), (99.98, 30.0)]
ASK = [(100.02, 10.0), (100.03, 20.0), (100.04, 30.0)]
# The book at the window's end (snapshot 3): 9 shares offered, then nothing visible.
END_ASK = [(100.03, 5.0), (100.05, 4.0)]


def execute_env(market, **config) -> BatchedLOB:
    """One book whose window spans the whole market (offset 0, rows equal steps), a buy of 30 over 3 steps."""
    settings = {"levels": market.num_levels, "episode_length": market.num_steps - 1, "task": "execute",
                "exec_side": "buy", "exec_quantity": 30.0, **config}
    return BatchedLOB(market, 1, EnvConfig(**settings), seed=0)


def act(env: BatchedLOB, size: int, order: int, urgency: int):
    action = torch.tensor([[size, 0, order, urgency]]).repeat(env.num_books, 1)
    return env.step(action)


def hand_market():
    """Snapshots 0-2 the same book, snapshot 3 a thin ask side; 15 shares trade at the bid 100.00 in step 2's
    flow (row 2) and 4 in step 3's (row 3)."""
    return make_market([BID] * 4, [ASK] * 3 + [END_ASK], num_levels=3,
                       exec_bid={2: {100.00: 15.0}, 3: {100.00: 4.0}})


def test_hand_computed_window_fees_partial_fills_and_the_final_cross() -> None:
    env = execute_env(hand_market(), maker_fee_bps=-0.2, taker_fee_bps=0.5)
    arrival, quantity = 100.01, 30.0
    notional = quantity * arrival
    obs = env.reset()
    assert obs.shape[1] == env.observation_dim == env.n_market_features + 8 + len(EXECUTION_FEATURES)
    assert obs[0, -3:].tolist() == [1.0, 1.0, 0.0]  # a buy, all of it left, no drift

    # Step 0: one slice (10) with a Market order, 10 @ 100.02, taker fee 0.5 bps.
    _, reward, terminated, _, info = act(env, ONE_SLICE, MARKET, NORMAL)
    cost0 = 10 * 100.02 * (1 + 0.5e-4) - 10 * arrival
    assert info["position"].item() == 10.0
    assert reward.item() == pytest.approx(-1e4 * cost0 / notional, rel=1e-6)
    assert not terminated.item()

    # Step 1: two slices (20) post-only at the bid 100.00 behind the 10 shown; row 2 trades 15 there: 5 fill
    # (the conservative fill model) at 100.00 with the maker rebate 0.2 bps.
    _, reward, _, _, info = act(env, TWO_SLICES, MAKER, NORMAL)
    cost1 = 5 * 100.00 * (1 - 0.2e-4) - 5 * arrival
    assert info["position"].item() == 15.0
    assert info["order_remaining"].item() == 15.0 and info["order_queue_ahead"].item() == 0.0
    assert reward.item() == pytest.approx(-1e4 * cost1 / notional, rel=1e-6)

    # Step 2 (the last): the same child keeps the order and its queue (15 left <= 15 wanted); row 3 trades
    # 4 at 100.00, which fill it. The 11 left cross snapshot 3's asks: 5 @ 100.03 and 4 @ 100.05 visible, the
    # 2 the book cannot show are charged at its deepest level's price, 100.06 (an empty level one tick
    # beyond the last); taker fee on all of it.
    obs, reward, terminated, truncated, info = act(env, TWO_SLICES, MAKER, NORMAL)
    maker = 4 * 100.00 * (1 - 0.2e-4) - 4 * arrival
    cross_notional = 5 * 100.03 + 4 * 100.05 + 2 * 100.06
    cross = cross_notional * (1 + 0.5e-4) - 11 * arrival
    assert info["position"].item() == 30.0
    assert info["fees"].item() == pytest.approx(4 * 100.00 * -0.2e-4 + cross_notional * 0.5e-4, abs=1e-12)
    assert not info["order_active"].item() and info["order_remaining"].item() == 0.0
    assert reward.item() == pytest.approx(-1e4 * (maker + cross) / notional, rel=1e-6)
    assert terminated.item() and not truncated.item()
    assert obs[0, -2].item() == 0.0  # nothing left

    # The episode's return is minus the implementation shortfall in bps of the parent's notional.
    paid = -info["cash"].item()
    shortfall_bps = 1e4 * (paid - quantity * arrival) / notional
    assert shortfall_bps == pytest.approx(1e4 * (cost0 + cost1 + maker + cross) / notional, rel=1e-9)
    assert shortfall_bps == pytest.approx(1.523293, abs=1e-5)  # 0.4570335 currency over 3000.3


def test_a_partly_filled_order_keeps_its_queue_while_the_child_is_no_smaller() -> None:
    market = make_market([BID] * 4, [ASK] * 4, num_levels=3, exec_bid={1: {100.00: 15.0}, 2: {100.00: 10.0}})
    env = execute_env(market)
    env.reset()
    _, _, _, _, info = act(env, TWO_SLICES, MAKER, NORMAL)  # 20 behind 10; row 1 trades 15: 5 fill
    assert info["position"].item() == 5.0 and info["order_queue_ahead"].item() == 0.0
    # two slices again: 15 left <= 20 wanted, so the order stays first in the queue; row 2's 10 fill it
    _, _, _, _, info = act(env, TWO_SLICES, MAKER, NORMAL)
    assert info["position"].item() == 15.0 and info["order_remaining"].item() == 5.0


def test_a_smaller_child_replaces_the_order_and_size_zero_cancels_it() -> None:
    env = execute_env(hand_market())
    env.reset()
    act(env, TWO_SLICES, MAKER, NORMAL)  # 20 resting at 100.00, 10 ahead; row 1 has no flow
    _, _, _, _, info = act(env, ONE_SLICE, MAKER, NORMAL)  # 20 > 10 wanted: a new order of 10, a new queue
    # the new order queues behind the 10 visible at 100.00; row 2 trades 15 there: 5 fill
    assert info["position"].item() == 5.0 and info["order_remaining"].item() == 5.0
    env.reset()
    act(env, TWO_SLICES, MAKER, NORMAL)
    _, _, _, _, info = act(env, NONE, MAKER, NORMAL)  # size 0 cancels: nothing meets row 2's flow
    assert info["position"].item() == 0.0 and not info["order_active"].item()


def test_ioc_child_takes_up_to_its_limit_and_a_child_never_overfills() -> None:
    env = execute_env(hand_market(), taker_fee_bps=0.0)
    env.reset()
    _, _, _, _, info = act(env, TWO_SLICES, IOC, PASSIVE)  # 20 wanted, limit the ask 100.02: 10 there
    assert info["position"].item() == 10.0 and not info["order_active"].item()
    _, _, terminated, _, info = act(env, TWO_SLICES, MARKET, NORMAL)  # 20 wanted, 20 left: all of it
    assert info["position"].item() == 30.0 and terminated.item()


def mirrored(market):
    """The market reflected around its first mid: bids become asks, buys sells (fees make it asymmetric only
    through the price level, so the symmetry test runs without fees)."""
    center = 2 * 100.01
    bids = [[(round(center - p, 2), s) for p, s in levels] for levels in ([ASK] * 3 + [END_ASK])]
    asks = [[(round(center - p, 2), s) for p, s in levels] for levels in [BID] * 4]
    return make_market(bids, asks, num_levels=3, exec_ask={2: {100.02: 15.0}, 3: {100.02: 4.0}})


def test_buys_and_sells_are_symmetric() -> None:
    buy = execute_env(hand_market(), maker_fee_bps=0.0, taker_fee_bps=0.0)
    sell = execute_env(mirrored(hand_market()), maker_fee_bps=0.0, taker_fee_bps=0.0, exec_side="sell")
    obs_buy, obs_sell = buy.reset(), sell.reset()
    assert obs_sell[0, -3].item() == -1.0
    for size, order, urgency in ((ONE_SLICE, MARKET, NORMAL), (TWO_SLICES, MAKER, NORMAL),
                                 (TWO_SLICES, MAKER, NORMAL)):
        obs_buy, reward_buy, done_buy, _, info_buy = act(buy, size, order, urgency)
        obs_sell, reward_sell, done_sell, _, info_sell = act(sell, size, order, urgency)
        assert reward_sell.item() == pytest.approx(reward_buy.item(), rel=1e-6, abs=1e-9)
        assert info_sell["position"].item() == -info_buy["position"].item()
        assert obs_sell[0, -2:].tolist() == pytest.approx(obs_buy[0, -2:].tolist(), abs=1e-5)
        assert done_sell.item() == done_buy.item()
    assert done_buy.item()


def test_returns_are_minus_the_shortfall_on_a_random_market_both_sides() -> None:
    market = random_market(300, 5, seed=3)
    config = EnvConfig(levels=5, episode_length=20, task="execute", exec_side="both", exec_quantity=200.0)
    env = BatchedLOB(market, 32, config, seed=5)
    env.reset()
    state = env.state_dict()
    offsets = state["offset"]
    side = env._execution.side[offsets]
    assert set(side.tolist()) == {-1.0, 1.0}  # "both": buys and sells
    arrival = market.mid_price()[offsets].double()
    gen = torch.Generator().manual_seed(0)
    total = torch.zeros(32, dtype=torch.float64)
    cash = torch.zeros(32, dtype=torch.float64)
    alive = torch.ones(32, dtype=torch.bool)
    for _ in range(20):
        action = torch.stack([torch.randint(0, n, (32,), generator=gen) for n in env.ACTION_NVEC], dim=1)
        _, reward, terminated, truncated, info = env.step(action)
        total += reward.double() * alive
        cash = torch.where(alive, info["cash"], cash)
        alive = alive & ~terminated
        assert not truncated.any()
        if not alive.any():
            break
    assert not alive.any()  # every parent done by T
    shortfall = 1e4 * (-cash - side * 200.0 * arrival) / (200.0 * arrival)
    torch.testing.assert_close(total, -shortfall, rtol=1e-4, atol=1e-4)


def test_volume_quantity_is_a_share_of_the_window_volume() -> None:
    market = random_market(200, 5, seed=1)
    config = EnvConfig(levels=5, episode_length=10, task="execute", exec_quantity=0.05,
                       exec_quantity_unit="volume")
    env = BatchedLOB(market, 4, config, seed=0)
    offsets = env.state_dict()["offset"]
    volume = market.exec_bid.double().sum(1) + market.exec_ask.double().sum(1)
    for book, offset in enumerate(offsets.tolist()):
        expected = max(0.05 * float(volume[offset + 1:offset + 11].sum()), 1.0)
        assert env._execution.quantity[offset].item() == pytest.approx(expected)
        assert book >= 0


@pytest.mark.parametrize("face", ["branched", "joint"])
def test_both_action_faces_run_the_execute_task(face: str) -> None:
    from foxhunt.envs import LOBVecEnv, encode_joint

    market = random_market(300, 5, seed=4)
    kwargs = {"levels": 5, "episode_length": 15, "task": "execute", "exec_quantity": 60.0}
    env = LOBVecEnv(4, data=market, seed=2, action_face=face, **kwargs)
    reference = LOBVecEnv(4, data=market, seed=2, action_face="branched", **kwargs)
    grid = env.grid
    assert isinstance(grid, ExecutionGrid) and grid.nvec == (4, 1, 3, 3)
    assert env.action_space.shape == ((4,) if face == "branched" else ())
    if face == "joint":
        assert env.action_space.n == 36
    obs, ref_obs = env.reset(), reference.reset()
    gen = np.random.default_rng(0)
    for _ in range(30):
        branches = np.stack([gen.integers(0, n, 4) for n in grid.nvec], axis=1)
        actions = branches if face == "branched" else encode_joint(branches, grid)
        env.step_async(actions)
        reference.step_async(branches)
        obs, reward, done, _ = env.step_wait()
        ref_obs, ref_reward, ref_done, _ = reference.step_wait()
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(reward, ref_reward)
        np.testing.assert_array_equal(done, ref_done)


def test_fused_autoreset_gives_the_start_observation_of_the_new_window() -> None:
    market = random_market(300, 5, seed=6)
    config = EnvConfig(levels=5, episode_length=5, task="execute", exec_quantity=40.0)
    fused = BatchedLOB(market, 8, config, seed=1)
    plain = BatchedLOB(market, 8, config, seed=1)
    fused.reset()
    gen = torch.Generator().manual_seed(2)
    finished = 0
    for _ in range(12):
        plain.load_state_dict(fused.state_dict())
        action = torch.stack([torch.randint(0, n, (8,), generator=gen) for n in fused.ACTION_NVEC], dim=1)
        obs, reward, terminated, _, _, final = fused.step_autoreset(action, host_sync=False)
        p_obs, p_reward, p_terminated, _, _ = plain.step(action)
        torch.testing.assert_close(final, p_obs)
        torch.testing.assert_close(reward, p_reward)
        torch.testing.assert_close(terminated, p_terminated)
        # the observation handed out is the one a reset computes for the new windows (an all-False mask
        # observes every book without changing it)
        plain.load_state_dict(fused.state_dict())
        torch.testing.assert_close(obs, plain.reset(mask=torch.zeros(8, dtype=torch.bool)))
        finished += int(terminated.sum())
    assert finished >= 8


@pytest.mark.parametrize(("field", "value"), [
    ("task", "hedge"), ("exec_side", "long"), ("exec_quantity", 0.0), ("exec_quantity", float("nan")),
    ("exec_quantity_unit", "lots"), ("exec_child_sizes", (0.0,)), ("exec_child_sizes", (1.0, 0.5)),
    ("exec_child_sizes", (-1.0, 1.0)),
])
def test_bad_execution_config_names_the_field(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        EnvConfig(task="execute", **{field: value}) if field != "task" else EnvConfig(task=value)


def test_trading_only_settings_are_refused_and_reward_scale_scales_the_bps() -> None:
    with pytest.raises(ValueError, match="inventory_penalty=0.1 is the trading task's"):
        EnvConfig(task="execute", inventory_penalty=0.1)
    with pytest.raises(ValueError, match="max_drawdown=5.0"):
        EnvConfig(task="execute", max_drawdown=5.0)
    rewards = []
    for scale in (1.0, 0.5):
        env = execute_env(hand_market(), reward_scale=scale)
        env.reset()
        rewards.append(act(env, ONE_SLICE, MARKET, NORMAL)[1].item())
    assert rewards[1] == pytest.approx(rewards[0] / 2) and rewards[0] < 0


def test_volume_share_above_one_is_refused_and_trade_settings_are_unchanged() -> None:
    with pytest.raises(ValueError, match="exec_quantity=2"):
        EnvConfig(task="execute", exec_quantity=2.0, exec_quantity_unit="volume")
    assert "task" not in config_settings(EnvConfig())
    assert config_settings(EnvConfig(task="execute"))["task"] == "execute"
    assert EnvConfig().grid.nvec == (3, 3, 3, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_cpu_and_the_cuda_graph_equals_eager_cuda() -> None:
    market = random_market(400, 5, seed=7)
    config = EnvConfig(levels=5, episode_length=12, task="execute", exec_quantity=120.0)
    gen = torch.Generator().manual_seed(1)

    def actions(books: int) -> torch.Tensor:
        return torch.stack([torch.randint(0, n, (books,), generator=gen) for n in (4, 1, 3, 3)], dim=1)

    # one episode on both devices from the same windows (the generators differ: no reset in between)
    cpu = BatchedLOB(market, 16, config, device="cpu", seed=3)
    cuda = BatchedLOB(market, 16, config, device="cuda", seed=3)
    state = cpu.state_dict()
    state["generator"] = cuda.state_dict()["generator"]
    cuda.load_state_dict(state)
    torch.testing.assert_close(cuda.reset(mask=torch.zeros(16, dtype=torch.bool, device="cuda")).cpu(),
                               cpu.reset(mask=torch.zeros(16, dtype=torch.bool)), rtol=1e-6, atol=1e-5)
    for _ in range(12):
        action = actions(16)
        out_c, out_g = cpu.step(action), cuda.step(action.cuda())
        torch.testing.assert_close(out_g[0].cpu(), out_c[0], rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(out_g[1].cpu(), out_c[1], rtol=1e-6, atol=1e-5)
        assert torch.equal(out_g[2].cpu(), out_c[2]) and torch.equal(out_g[3].cpu(), out_c[3])
        for key in ("position", "cash", "fees", "order_remaining"):
            torch.testing.assert_close(out_g[4][key].cpu(), out_c[4][key], rtol=1e-12, atol=1e-9)
    assert bool(out_c[2].all())  # every parent done at T

    # the captured step with its fused autoreset replays the eager CUDA step
    eager = BatchedLOB(market, 16, config, device="cuda", seed=4)
    graphed = BatchedLOB(market, 16, config, device="cuda", seed=4)
    graphed.enable_cuda_graph()
    for _ in range(40):
        action = actions(16).cuda()
        out_e = eager.step_autoreset(action, host_sync=False)
        out_g = graphed.step_autoreset(action, host_sync=False)
        for a, b in zip(out_e[:4] + out_e[5:], out_g[:4] + out_g[5:], strict=True):
            assert torch.equal(a, b)
        for key in out_e[4]:
            assert torch.equal(out_e[4][key], out_g[4][key]), key


def test_a_state_dict_resumes_an_execute_episode_exactly() -> None:
    market = random_market(300, 5, seed=11)
    config = EnvConfig(levels=5, episode_length=10, task="execute", exec_quantity=80.0)
    env = BatchedLOB(market, 8, config, seed=2)
    env.reset()
    gen = torch.Generator().manual_seed(3)
    actions = [torch.stack([torch.randint(0, n, (8,), generator=gen) for n in env.ACTION_NVEC], dim=1)
               for _ in range(25)]
    for action in actions[:6]:
        env.step_autoreset(action)
    resumed = BatchedLOB(market, 8, config, seed=99)
    resumed.load_state_dict(env.state_dict())
    for action in actions[6:]:
        first, second = env.step_autoreset(action), resumed.step_autoreset(action)
        for a, b in zip(first[:4], second[:4], strict=True):
            assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="torch.compile on CPU needs g++")
def test_compiled_execute_step_matches_eager() -> None:
    market = random_market(400, 5, seed=12)
    config = EnvConfig(levels=5, episode_length=8, task="execute", exec_quantity=90.0)
    eager = BatchedLOB(market, 8, config, seed=3)
    compiled = BatchedLOB(market, 8, config, seed=3)
    compiled.enable_compile()
    gen = torch.Generator().manual_seed(5)
    for _ in range(20):
        action = torch.stack([torch.randint(0, n, (8,), generator=gen) for n in eager.ACTION_NVEC], dim=1)
        out_e = eager.step_autoreset(action, host_sync=False)
        out_c = compiled.step_autoreset(action, host_sync=False)
        for a, b in zip(out_e[:4], out_c[:4], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("face", ["branched", "joint"])
def test_the_device_envs_static_step_equals_its_step_on_the_execute_task(face: str) -> None:
    from foxhunt.device_lob_env import DeviceLOBVecEnv

    market = random_market(300, 5, seed=13)
    params = {"levels": 5, "episode_length": 6, "task": "execute", "exec_quantity": 30.0, "action_face": face}
    plain, static = (DeviceLOBVecEnv(5, seed=7, data=market, **params) for _ in range(2))
    plain.reset(), static.reset()
    gen = np.random.default_rng(0)
    nvec = plain.grid.nvec
    for _ in range(20):  # episodes of at most 6 steps: resets included
        branches = np.stack([gen.integers(0, n, 5) for n in nvec], axis=1)
        if face == "joint":
            branches = branches @ np.asarray(plain.grid.code_weights)
        actions = torch.from_numpy(branches)
        a, b = plain.step_tensors(actions), static.step_tensors_static(actions)
        for name in ("obs", "reward", "done", "final_obs", "episode_return", "episode_length"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert bool((a.obs[:, -2] <= 1).all())


def test_the_execution_grid_answers_as_a_grid_and_survives_pickling() -> None:
    import pickle

    grid = EnvConfig(task="execute", action_grid="wide").grid
    assert isinstance(grid, ExecutionGrid) and grid.nvec == (4, 1, 3, 12) and grid.joint_actions == 144
    assert grid.code_weights == (36, 36, 12, 1)
    assert grid.at_touch == 10 and grid.maker_offsets[grid.at_touch] == 0  # the base grid's fields
    labels = grid.labels()
    assert list(labels) == ["direction", "magnitude", "order", "urgency"]
    assert labels["direction"] == ("0x", "0.5x", "1x", "2x") and len(labels["urgency"]) == 12
    assert pickle.loads(pickle.dumps(grid)) == grid
    assert grid.to_dict()["child_sizes"] == [0.0, 0.5, 1.0, 2.0] and grid.name == "execute-wide"
    with pytest.raises(AttributeError):
        grid.no_such_field  # noqa: B018
