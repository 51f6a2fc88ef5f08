"""The clairvoyant bound (:mod:`foxenv.bound`): equal to brute force over every action sequence on tiny
windows, at least every policy's PnL on each window, and a floor flagged as such where states are capped."""

from __future__ import annotations

import pytest
import torch

from foxenv.bound import clairvoyant_bound
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data import load_market
from foxenv.data.synthetic import wave_schedule
from foxhunt.evaluation.baselines import OraclePolicy, RandomPolicy, WaveOraclePolicy, make_baseline
from foxhunt.evaluation.recorder import record

STEPS = 2_000
WAVES = {"wave_rate": 0.05}


def brute_force(market, config: EnvConfig, offset: int, length: int, device: str = "cpu") -> float:
    """The most equity of every one of the ``A ** length`` action sequences, each a book of one core."""
    actions = config.grid.joint_actions
    books = actions**length
    core = BatchedLOB(market, books, config, device=device, seed=0)
    state = core.state_dict()
    state["offset"] = torch.full((books,), offset, dtype=torch.int64)
    core.load_state_dict(state)
    sequence = torch.arange(books, device=device)
    weights = torch.tensor(config.grid.code_weights, device=device)
    nvec = torch.tensor(config.grid.nvec, device=device)
    for t in range(length):
        code = (sequence // actions ** (length - 1 - t)) % actions
        core.step((code[:, None] // weights) % nvec)
    return float(core.state_dict()["equity"].max())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("settings", "offset"),
    [
        pytest.param({}, 40, id="conservative"),
        pytest.param({"fill_model": "optimistic", "order_latency": 1, "maker_fee_bps": -2.0}, 700,
                     id="optimistic"),
    ],
)
def test_bound_equals_brute_force_on_a_tiny_window(settings: dict, offset: int) -> None:
    market = load_market("synthetic", num_steps=STEPS, seed=1)
    config = EnvConfig(episode_length=10, **settings)
    result = clairvoyant_bound(market, [offset, 1_500], 3, config=config)  # a second window beside it
    assert bool(result.exact.all())
    assert result.states.shape == (2, 3) and bool((result.states[:, -1] > result.states[:, 0]).all())
    assert result.pnl[0].item() == brute_force(market, config, offset, 3)


@pytest.mark.slow
def test_bound_equals_brute_force_on_the_wide_grid() -> None:
    market = load_market("synthetic", num_steps=STEPS, seed=1)
    config = EnvConfig(episode_length=10, action_grid="wide")
    result = clairvoyant_bound(market, [123], 2, config=config)
    assert bool(result.exact.all())
    assert result.pnl[0].item() == brute_force(market, config, 123, 2)


def test_merging_on_cash_changes_nothing_but_the_state_count() -> None:
    market = load_market("synthetic", num_steps=STEPS, seed=1)
    config = EnvConfig(episode_length=10)
    merged = clairvoyant_bound(market, [40, 900], 3, config=config)
    full = clairvoyant_bound(market, [40, 900], 3, config=config, merge=False)
    assert torch.equal(merged.pnl, full.pnl)
    assert bool((merged.states <= full.states).all()) and bool((merged.states < full.states).any())


def policies(market_kwargs: dict, config: EnvConfig) -> list:
    """Flat, random (two seeds) and the market's oracle."""
    found = [make_baseline("flat"), RandomPolicy(seed=0), RandomPolicy(seed=1), make_baseline("buy_and_hold")]
    if "wave_rate" in market_kwargs:
        found.append(WaveOraclePolicy(wave_schedule(STEPS, 2, **market_kwargs).hold, grid=config.grid))
    else:
        found.append(OraclePolicy(market_kwargs["signal_strength"], market_kwargs["signal_horizon"],
                                  levels=config.levels, taker_fee_bps=config.taker_fee_bps))
    return found


@pytest.mark.parametrize(
    ("market_kwargs", "settings"),
    [
        pytest.param(WAVES, {}, id="waves"),
        pytest.param({"signal_strength": 2.0, "signal_horizon": 5}, {"max_drawdown": 1.0},
                     id="signal-drawdown"),
    ],
)
def test_bound_is_at_least_every_policy_on_every_window(market_kwargs: dict, settings: dict) -> None:
    market = load_market("synthetic", num_steps=STEPS, seed=2, **market_kwargs)
    config = EnvConfig(episode_length=3, **settings)
    offsets = torch.arange(6) * 311 + 17
    result = clairvoyant_bound(market, offsets, config=config)
    assert bool(result.exact.all()) and result.anytime == ("max_drawdown" in settings)
    env_kwargs = {"episode_length": 3, **settings}
    for policy in policies(market_kwargs, config):
        recording = record(policy, market, num_books=6, offsets=offsets[None], env_kwargs=env_kwargs)
        pnl = recording.series["equity"][-1]
        assert bool((pnl <= result.pnl).all()), (policy.name, pnl.tolist(), result.pnl.tolist())
    assert bool((result.pnl > 0).all())  # every window has some move a clairvoyant agent can take


def test_a_capped_search_is_a_floor_flagged_inexact() -> None:
    market = load_market("synthetic", num_steps=STEPS, seed=1)
    config = EnvConfig(episode_length=10)
    exact = clairvoyant_bound(market, [40], 3, config=config)
    capped = clairvoyant_bound(market, [40], 3, config=config, max_states=20)
    assert not bool(capped.exact.any()) and bool(exact.exact.all())
    assert capped.states[0, 0] == exact.states[0, 0] > 20 and capped.states[0, 1] <= 20 * 81
    assert capped.pnl[0] <= exact.pnl[0]
    # a cap that binds only on the last step drops nothing that counts
    last = clairvoyant_bound(market, [40], 3, config=config, max_states=int(exact.states[0, :2].max()))
    assert bool(last.exact.all()) and last.pnl[0] == exact.pnl[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"length": 11}, "length=11"),
        ({"length": 0}, "length=0"),
        ({"max_states": 0}, "max_states=0"),
        ({"chunk": 1.5}, "chunk=1.5"),
        ({"offsets": [[1, 2]]}, "offsets shape"),
        ({"offsets": [5, STEPS - 10]}, "offsets values in \\[5, 1990\\]"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict, match: str) -> None:
    market = load_market("synthetic", num_steps=STEPS, seed=1)
    offsets = kwargs.pop("offsets", [5])
    with pytest.raises(ValueError, match=match):
        clairvoyant_bound(market, offsets, config=EnvConfig(episode_length=10), **kwargs)


@pytest.mark.gpu
def test_bound_on_cuda_equals_brute_force_on_cuda() -> None:
    market = load_market("synthetic", num_steps=STEPS, seed=1)
    config = EnvConfig(episode_length=10)
    cpu = clairvoyant_bound(market, [40, 700], 3, config=config)
    cuda = clairvoyant_bound(market.to("cuda"), [40, 700], 3, config=config, chunk=100_000)
    assert bool(cuda.exact.all()) and cuda.pnl.device.type == "cuda"
    for window, offset in enumerate((40, 700)):
        assert cuda.pnl[window].item() == brute_force(market, config, offset, 3, device="cuda")
    # the CPU and a GPU may round a fused multiply-add differently: equal up to the last bits
    torch.testing.assert_close(cuda.pnl.cpu(), cpu.pnl, rtol=1e-12, atol=1e-9)
