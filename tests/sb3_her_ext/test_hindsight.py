"""Hindsight injection through the replay buffer: scripted trades with hand-worked expected rows.

The scripted long trade (one book, reward_scale 1, threshold 1.5, boost 3, lookahead 3, alpha 0.6):

====  ======  ========  ======  =====  =====================================
step  mid     position  closed  pnl    action (direction, magnitude, ., .)
====  ======  ========  ======  =====  =====================================
0     100.0   10        no             long Full   (opens; tracker entry 100)
1     101.0   10        no             long Full
2     102.0   10        no             long Full   (peak 102: peak row = slot 2)
3     100.5   10        no             long Full
4     100.5   0         yes     5.0    flat Full   (close: realised 5 on 10 lots)
5     100.5   0         no             flat Full
6     100.75  0         no             flat Full
7     101.0   0         no             flat Full   (lookahead 3 after the close)
====  ======  ========  ======  =====  =====================================

Backward: peak PnL = |102 - 100| * 10 = 20 > 1.5 * 5 → one row, reward 20, priority 3 * max (= 3).
Relabel at the close (real reward -0.2, magnitude Full = 1.0): rows with Small (0.25) and Half (0.5),
rewards -0.05 and -0.1, priorities |ΔR| = 0.15 and 0.1.
Forward at step 7: holding on would have made (101 - 100) * 10 = 10 > 7.5 → one row, reward 10,
state = the closing step's obs, action = close action with direction "long" (stay in the trade).
Slots: real rows first, then backward, forward, relabel candidates: step 4 writes real 4, backward 5,
relabel 6, 7; steps 5-7 write 8, 9, 10 and the forward row 11.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from sb3_her_ext.hindsight import HindsightConfig
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

OBS_SPACE = spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACTION_SPACE = spaces.MultiDiscrete([3, 3, 3, 3])
ALPHA = 0.6
LONG, CLOSE = [2, 2, 0, 1], [1, 2, 0, 1]
SHORT = [0, 2, 0, 1]

# mid, position, closed, pnl, lots, entry_mid, action, reward
LONG_TRADE = [
    (100.0, 10.0, False, 0.0, 0.0, 100.0, LONG, -0.1),
    (101.0, 10.0, False, 0.0, 0.0, 100.0, LONG, 10.0),
    (102.0, 10.0, False, 0.0, 0.0, 100.0, LONG, 10.0),
    (100.5, 10.0, False, 0.0, 0.0, 100.0, LONG, -15.0),
    (100.5, 0.0, True, 5.0, 10.0, 100.0, CLOSE, -0.2),
    (100.5, 0.0, False, 0.0, 0.0, 0.0, CLOSE, 0.0),
    (100.75, 0.0, False, 0.0, 0.0, 0.0, CLOSE, 0.0),
    (101.0, 0.0, False, 0.0, 0.0, 0.0, CLOSE, 0.0),
]


def obs_of(t: int) -> list[float]:
    return [float(t), t + 0.5]


def info_of(mid: float, position: float, closed: bool, pnl: float, lots: float, entry: float) -> dict:
    return {"mid": mid, "best_bid": mid - 0.5, "best_ask": mid + 0.5, "position": position,
            "trade_closed": closed, "trade_pnl": pnl, "trade_lots": lots, "entry_mid": entry}


def make_buffer(capacity: int = 64, **hindsight) -> PrioritizedHindsightReplayBuffer:
    config = {"lookahead": 3, "relabel": True}  # the relabel is an option (off by default)
    config.update(hindsight)
    return PrioritizedHindsightReplayBuffer(capacity, OBS_SPACE, ACTION_SPACE, device="cpu", n_envs=1,
                                            alpha=ALPHA, hindsight=config)


def play(buffer: PrioritizedHindsightReplayBuffer, script: list[tuple], start: int = 0) -> None:
    for t, (mid, position, closed, pnl, lots, entry, action, reward) in enumerate(script, start=start):
        buffer.add(np.array([obs_of(t)]), np.array([obs_of(t + 1)]), np.array([action]), np.array([reward]),
                   np.array([False]), [info_of(mid, position, closed, pnl, lots, entry)])


def leaf(buffer: PrioritizedHindsightReplayBuffer, slot: int) -> float:
    return float(buffer.tree[buffer.tree_leaves + slot])


def counts(buffer: PrioritizedHindsightReplayBuffer) -> dict[str, int]:
    return {k: int(v) for k, v in buffer.hindsight_counts.items()}


def test_long_trade_backward_relabel_and_forward_rows():
    buffer = make_buffer()
    play(buffer, LONG_TRADE)
    assert buffer.size() == 12
    assert buffer.kinds[:12].tolist() == [0, 0, 0, 0, 0, 1, 3, 3, 0, 0, 0, 2]
    assert counts(buffer) == {"backward": 1, "forward": 1, "relabel": 2}
    # backward row: closing transition, peak PnL reward, terminal, boosted priority
    assert buffer.rewards[5].item() == pytest.approx(20.0)
    assert buffer.dones[5].item() == 1.0
    assert buffer.observations[5].tolist() == obs_of(4)
    assert buffer.next_observations[5].tolist() == obs_of(5)
    assert buffer.actions[5].tolist() == CLOSE
    assert leaf(buffer, 5) == pytest.approx(3.0 ** ALPHA)
    # relabel rows: other magnitudes, reward ratios, |ΔR| priorities
    assert buffer.actions[6].tolist() == [1, 0, 0, 1] and buffer.actions[7].tolist() == [1, 1, 0, 1]
    assert buffer.rewards[6].item() / -0.2 == pytest.approx(0.25)
    assert buffer.rewards[7].item() / -0.2 == pytest.approx(0.5)
    assert buffer.dones[6:8].tolist() == [1.0, 1.0]
    assert leaf(buffer, 6) == pytest.approx(0.15 ** ALPHA, rel=1e-5)
    assert leaf(buffer, 7) == pytest.approx(0.1 ** ALPHA, rel=1e-5)
    assert buffer.observations[6].tolist() == obs_of(4) and buffer.next_observations[7].tolist() == obs_of(5)
    # forward row, lookahead steps after the close: "stay long" from the closing state
    assert buffer.rewards[11].item() == pytest.approx(10.0)
    assert buffer.dones[11].item() == 1.0
    assert buffer.observations[11].tolist() == obs_of(4)
    assert buffer.next_observations[11].tolist() == obs_of(4)
    assert buffer.actions[11].tolist() == [2, 2, 0, 1]
    assert leaf(buffer, 11) == pytest.approx(1.0)
    # real rows untouched and not terminal
    assert buffer.rewards[4].item() == pytest.approx(-0.2) and buffer.dones[:5].tolist() == [0.0] * 5
    assert not bool(buffer.hindsight_state.slot_valid.any())  # the forward slot fired and was cleared


def test_no_rows_when_hindsight_would_not_have_paid_enough():
    script = [list(row) for row in LONG_TRADE]
    script[4][3] = 15.0  # realised 15: peak PnL 20 is not > 1.5 * 15 = 22.5
    # forward at step 7: holding on would have made (101 - 100) * 10 = 10, not > 22.5
    play(buffer := make_buffer(), [tuple(r) for r in script])
    assert counts(buffer) == {"backward": 0, "forward": 0, "relabel": 2}
    assert 1 not in buffer.kinds[: buffer.size()].tolist() and 2 not in buffer.kinds[: buffer.size()].tolist()
    # the closed trade waits in the forward ring until it expires at 2 * lookahead after the close
    assert int(buffer.hindsight_state.slot_valid.sum()) == 1
    flat = (101.0, 0.0, False, 0.0, 0.0, 0.0, CLOSE, 0.0)
    play(buffer, [flat, flat], start=8)  # ages 4, 5
    assert int(buffer.hindsight_state.slot_valid.sum()) == 1
    play(buffer, [(200.0, 0.0, False, 0.0, 0.0, 0.0, CLOSE, 0.0)], start=10)  # age 6: expired, no row
    assert int(buffer.hindsight_state.slot_valid.sum()) == 0
    assert counts(buffer)["forward"] == 0


@pytest.mark.parametrize("off", ["backward", "forward", "relabel"])
def test_each_kind_switches_off(off):
    buffer = make_buffer(**{off: False})
    play(buffer, LONG_TRADE)
    kinds = buffer.kinds[: buffer.size()].tolist()
    expected = {"backward": 1, "forward": 2, "relabel": 3}
    assert expected[off] not in kinds
    for name, kind in expected.items():
        if name != off:
            assert kind in kinds
    assert counts(buffer)[off] == 0


def test_hindsight_none_writes_only_real_rows_and_needs_no_trade_keys():
    buffer = PrioritizedHindsightReplayBuffer(16, OBS_SPACE, ACTION_SPACE, device="cpu", hindsight=None)
    for t, (*_, action, reward) in enumerate(LONG_TRADE):
        buffer.add(np.array([obs_of(t)]), np.array([obs_of(t + 1)]), np.array([action]), np.array([reward]),
                   np.array([False]), [{}])
    assert buffer.size() == len(LONG_TRADE)
    assert buffer.kinds[:8].tolist() == [0] * 8
    assert counts(buffer) == {"backward": 0, "forward": 0, "relabel": 0}


def test_anchor_peak_uses_the_peak_steps_next_obs_and_the_exit_action():
    buffer = make_buffer(anchor="peak", forward=False, relabel=False)
    script = [list(row) for row in LONG_TRADE[:5]]
    script[4][6] = [0, 2, 0, 1]  # the close is a flip to short: the exit action must still be "flat"
    script[4][1] = -10.0
    play(buffer, [tuple(r) for r in script])
    assert buffer.kinds[:6].tolist() == [0, 0, 0, 0, 0, 1]
    # the peak (mid 102) was seen in step 2's next_obs (slot 2)
    assert buffer.observations[5].tolist() == obs_of(3)
    assert buffer.next_observations[5].tolist() == obs_of(3)
    assert buffer.actions[5].tolist() == [1, 2, 0, 1]
    assert buffer.rewards[5].item() == pytest.approx(20.0)


def test_reward_scale_scales_synthetic_rewards():
    script = [list(row) for row in LONG_TRADE]
    for row in script:
        row[7] *= 2.0  # the env's rewards are in scaled units
    buffer = make_buffer(reward_scale=2.0)
    play(buffer, [tuple(r) for r in script])
    assert buffer.rewards[5].item() == pytest.approx(40.0)  # backward 20 currency
    assert buffer.rewards[11].item() == pytest.approx(20.0)  # forward 10 currency
    assert buffer.rewards[6].item() == pytest.approx(-0.1)  # relabel: 0.25 x real reward -0.4


def test_short_trade_forward_row_stays_short():
    # short 10 at 100, low 98, covered at 99.5 (pnl 5); lookahead 3 later the mid is 99 (holding: 10)
    script = [
        (100.0, -10.0, False, 0.0, 0.0, 100.0, SHORT, 0.0),
        (98.0, -10.0, False, 0.0, 0.0, 100.0, SHORT, 20.0),
        (99.5, -10.0, False, 0.0, 0.0, 100.0, SHORT, -15.0),
        (99.5, 0.0, True, 5.0, 10.0, 100.0, [1, 2, 0, 1], 0.0),
        (99.5, 0.0, False, 0.0, 0.0, 0.0, [1, 2, 0, 1], 0.0),
        (99.5, 0.0, False, 0.0, 0.0, 0.0, [1, 2, 0, 1], 0.0),
        (99.0, 0.0, False, 0.0, 0.0, 0.0, [1, 2, 0, 1], 0.0),
    ]
    buffer = make_buffer(relabel=False)
    play(buffer, script)
    kinds = buffer.kinds[: buffer.size()].tolist()
    assert kinds == [0, 0, 0, 0, 1, 0, 0, 0, 2]
    assert buffer.rewards[4].item() == pytest.approx(20.0)  # |98 - 100| * 10
    assert buffer.rewards[8].item() == pytest.approx(10.0)
    assert buffer.actions[8].tolist() == [0, 2, 0, 1]  # stay short
    assert buffer.observations[8].tolist() == obs_of(3)


def test_closed_direction_comes_from_the_previous_position_on_a_flip():
    buffer = make_buffer(backward=False, relabel=False)
    flip = (100.5, -10.0, True, 5.0, 10.0, 100.0, SHORT, 0.0)  # long 10 -> short 10 closes the long
    play(buffer, LONG_TRADE[:4] + [flip])
    state = buffer.hindsight_state
    slot = int(torch.nonzero(state.slot_valid)[0, 0])
    assert int(state.slot_direction[slot]) == 1
    assert float(state.slot_entry[slot]) == pytest.approx(100.0)
    assert float(state.slot_actual[slot]) == pytest.approx(5.0)
    assert float(state.slot_lots[slot]) == pytest.approx(10.0)
    assert float(state.prev_position[0]) == -10.0


def test_tracker_follows_the_trade_and_resets_at_episode_end():
    buffer = make_buffer()
    play(buffer, LONG_TRADE[:3])
    state = buffer.hindsight_state
    assert int(state.direction[0]) == 1 and float(state.entry_mid[0]) == 100.0
    assert float(state.peak[0]) == 102.0 and int(state.peak_row[0]) == 2
    # the episode is truncated while still long: the tracker must not carry the trade into the next episode
    timeout_info = {**info_of(103.0, 10.0, False, 0.0, 0.0, 100.0), "TimeLimit.truncated": True}
    buffer.add(np.array([obs_of(3)]), np.array([obs_of(4)]), np.array([LONG]), np.array([0.0]),
               np.array([True]), [timeout_info])
    assert int(state.direction[0]) == 0 and int(state.peak_row[0]) == -1
    assert float(state.prev_position[0]) == 0.0 and bool(state.book_reset[0])
    assert buffer.dones[3].item() == 0.0  # a timeout is not terminal
    # next episode: the first step's position starts a fresh trade at its own mid
    play(buffer, [(50.0, 10.0, False, 0.0, 0.0, 50.0, LONG, 0.0)], start=10)
    assert int(state.direction[0]) == 1 and float(state.entry_mid[0]) == 50.0 and int(state.peak_row[0]) == 4
    assert not bool(state.book_reset[0])


def test_missing_info_keys_are_named():
    buffer = make_buffer()
    partial = {"mid": 1.0, "best_bid": 0.5, "best_ask": 1.5, "position": 0.0}
    with pytest.raises(ValueError, match=r"trade_closed.*trade_pnl.*trade_lots.*entry_mid"):
        buffer.add(np.zeros((1, 2)), np.zeros((1, 2)), np.array([LONG]), np.zeros(1), np.zeros(1, bool),
                   [partial])
    tensors = {k: torch.tensor([v]) for k, v in info_of(1.0, 0.0, False, 0.0, 0.0, 0.0).items() if k != "mid"}
    with pytest.raises(ValueError, match=r"\['mid'\]"):
        buffer.add(np.zeros((1, 2)), np.zeros((1, 2)), np.array([LONG]), np.zeros(1), np.zeros(1, bool),
                   tensors)
    assert buffer.size() == 0  # nothing was written


def test_tensor_infos_match_the_numpy_path():
    numpy_buffer = make_buffer()
    play(numpy_buffer, LONG_TRADE)
    tensor_buffer = make_buffer()
    for t, (mid, position, closed, pnl, lots, entry, action, reward) in enumerate(LONG_TRADE):
        info = {k: torch.tensor([v], dtype=torch.float64) for k, v in
                info_of(mid, position, closed, pnl, lots, entry).items()}
        info["trade_closed"] = torch.tensor([closed])
        info["TimeLimit.truncated"] = torch.tensor([False])
        tensor_buffer.add(torch.tensor([obs_of(t)]), torch.tensor([obs_of(t + 1)]), torch.tensor([action]),
                          torch.tensor([reward]), torch.tensor([False]), info)
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "kinds", "tree",
                 "head_size"):
        torch.testing.assert_close(getattr(tensor_buffer, name), getattr(numpy_buffer, name), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("threshold", -1.0), ("priority_boost", 0.0), ("lookahead", 0), ("anchor", "mid"),
     ("forward_capacity", 0), ("reward_scale", 0.0), ("magnitudes", ()), ("magnitude_branch", 0),
     ("flat_action", -1), ("threshold", float("nan")), ("lookahead", float("nan")),
     ("lookahead", float("inf")), ("lookahead", 2.5), ("forward_capacity", "many"), ("lookahead", "50"),
     ("direction_branch", float("nan"))],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        HindsightConfig(**{field: value})


def test_config_from_dict_and_buffer_checks_against_the_action_space():
    assert HindsightConfig.from_value({"threshold": 2.0}).threshold == 2.0
    assert HindsightConfig.from_value(None) is None
    with pytest.raises(ValueError, match="thresold"):
        HindsightConfig.from_value({"thresold": 2.0})
    with pytest.raises(ValueError, match="magnitudes"):
        make_buffer(magnitudes=(0.5, 1.0))
    with pytest.raises(ValueError, match="flat_action"):
        make_buffer(flat_action=3)
    with pytest.raises(ValueError, match="magnitude_branch"):
        make_buffer(magnitude_branch=4)


# ----------------------------------------------------------------------------------------- generic library
@pytest.mark.parametrize("value", [3, np.int64(3), 3.0, -2.0, 3.5, float("nan"), float("inf"), "3", True,
                                   None])
def test_is_whole_has_foxenv_semantics(value: object) -> None:
    from foxenv.config import is_whole as foxenv_is_whole
    from sb3_her_ext.validation import is_whole

    assert is_whole(value) == foxenv_is_whole(value)


def test_replay_and_hindsight_do_not_import_foxenv() -> None:
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "sb3_her_ext"
    for name in ("hindsight.py", "replay.py", "validation.py"):
        tree = ast.parse((package / name).read_text())
        nodes = list(ast.walk(tree))
        imported = [alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names]
        imported += [node.module or "" for node in nodes if isinstance(node, ast.ImportFrom)]
        assert not [m for m in imported if m.split(".")[0] == "foxenv"], name


def test_branch_defaults_are_foxenvs_action_and_every_field_is_an_argument() -> None:
    default = HindsightConfig()
    assert (default.direction_branch, default.magnitude_branch, default.flat_action) == (0, 1, 1)
    assert default.magnitudes == (0.25, 0.5, 1.0)
    other = HindsightConfig(direction_branch=2, magnitude_branch=0, flat_action=0, magnitudes=(1.0, 2.0))
    assert (other.direction_branch, other.magnitude_branch, other.flat_action, other.magnitudes) == (
        2, 0, 0, (1.0, 2.0))
