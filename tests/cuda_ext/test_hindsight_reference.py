"""Hand-worked cases for the hindsight ops' pure-PyTorch references (through the ``cuda_ext`` wrappers,
CPU)."""

from __future__ import annotations

import math

import pytest
import torch

import cuda_ext

F32 = torch.float32
I64 = torch.int64


class Tracker:
    """Tracker state of ``n_books`` books, as the replay buffer holds it."""

    def __init__(self, n_books: int, ring_size: int = 512) -> None:
        self.ring = torch.zeros(n_books, ring_size)
        self.ring_len = torch.zeros(n_books, dtype=I64)
        self.entry_mid = torch.zeros(n_books)
        self.direction = torch.zeros(n_books, dtype=I64)
        self.peak = torch.zeros(n_books)
        self.peak_row = torch.full((n_books,), -1, dtype=I64)

    def trade(self) -> dict[str, torch.Tensor]:
        """The state ``hindsight_inject`` reads and resets, by argument name."""
        return {"ring_len": self.ring_len, "entry_mid": self.entry_mid, "direction": self.direction,
                "peak": self.peak, "peak_row": self.peak_row}

    def track(self, position: list[float], mid: list[float], row: list[int]) -> None:
        mids = torch.tensor(mid, dtype=F32)
        cuda_ext.hindsight_track(
            ring=self.ring, **self.trade(), position=torch.tensor(position, dtype=F32), best_bid=mids - 0.5,
            best_ask=mids + 0.5, row=torch.tensor(row, dtype=I64),
        )

    def state(self) -> tuple:
        return (self.ring_len.tolist(), self.entry_mid.tolist(), self.direction.tolist(), self.peak.tolist(),
                self.peak_row.tolist())


# --------------------------------------------------------------------------- hindsight_track


def test_track_long_peak_rises_monotonically_on_rising_prices() -> None:
    tracker = Tracker(1, ring_size=8)
    mids = [100.0, 100.5, 101.0, 102.25, 103.0]
    peaks = []
    for step, mid in enumerate(mids):
        tracker.track([2.0], [mid], [10 + step])
        peaks.append(tracker.peak.item())
        assert tracker.peak_row.item() == 10 + step
    assert peaks == mids
    assert all(b > a for a, b in zip(peaks, peaks[1:], strict=False))
    assert tracker.entry_mid.item() == 100.0
    assert tracker.direction.item() == 1
    assert tracker.ring_len.item() == 5
    assert tracker.ring[0, :5].tolist() == mids


def test_track_short_peak_falls_on_falling_prices_and_holds_on_rebound() -> None:
    tracker = Tracker(1, ring_size=8)
    for step, mid in enumerate([100.0, 99.0, 97.5, 98.0, 99.5]):
        tracker.track([-1.0], [mid], [step])
    assert tracker.direction.item() == -1
    assert tracker.entry_mid.item() == 100.0
    assert tracker.peak.item() == 97.5  # the lowest mid: the best for a short
    assert tracker.peak_row.item() == 2
    assert tracker.ring_len.item() == 5


def test_track_long_peak_does_not_move_on_worse_prices() -> None:
    tracker = Tracker(1)
    for step, mid in enumerate([100.0, 102.0, 101.0, 99.0]):
        tracker.track([1.0], [mid], [step])
    assert tracker.peak.item() == 102.0
    assert tracker.peak_row.item() == 1


def test_track_flip_starts_new_trade_with_new_entry() -> None:
    tracker = Tracker(1)
    tracker.track([1.0], [100.0], [0])
    tracker.track([1.0], [103.0], [1])
    tracker.track([-1.0], [104.0], [2])  # flip long -> short
    assert tracker.state() == ([1], [104.0], [-1], [104.0], [2])
    assert tracker.ring[0, 0].item() == 104.0
    tracker.track([-1.0], [101.0], [3])
    assert tracker.state() == ([2], [104.0], [-1], [101.0], [3])


def test_track_flat_resets_everything() -> None:
    tracker = Tracker(2)
    tracker.track([1.0, -3.0], [100.0, 50.0], [0, 1])
    tracker.track([0.0, float("nan")], [101.0, 51.0], [2, 3])  # NaN position counts as flat
    assert tracker.state() == ([0, 0], [0.0, 0.0], [0, 0], [0.0, 0.0], [-1, -1])


def test_track_ring_wraps_modulo_its_width() -> None:
    tracker = Tracker(1, ring_size=4)
    mids = [100.0 + i for i in range(6)]
    for step, mid in enumerate(mids):
        tracker.track([1.0], [mid], [step])
    assert tracker.ring_len.item() == 6
    assert tracker.ring[0].tolist() == [104.0, 105.0, 102.0, 103.0]


def test_track_mid_is_the_float32_average_of_bid_and_ask() -> None:
    tracker = Tracker(1)
    cuda_ext.hindsight_track(
        ring=tracker.ring, **tracker.trade(), position=torch.tensor([1.0]), best_bid=torch.tensor([100.25]),
        best_ask=torch.tensor([100.5]), row=torch.tensor([7]),
    )
    assert tracker.entry_mid.item() == 100.375


def test_track_rejects_bad_shapes_and_dtypes() -> None:
    tracker = Tracker(2)
    with pytest.raises(ValueError, match="position.shape"):
        tracker.track([1.0, 1.0, 1.0], [1.0, 1.0], [0, 0])
    with pytest.raises(ValueError, match="row.dtype"):
        cuda_ext.hindsight_track(
            ring=tracker.ring, **tracker.trade(), position=torch.ones(2), best_bid=torch.ones(2),
            best_ask=torch.ones(2), row=torch.zeros(2),
        )


# --------------------------------------------------------------------------- hindsight_inject


def _inject(tracker: Tracker, closed: list[bool], raw_reward: list[float], lots: list[float], *,
            obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor, replay_next_obs: torch.Tensor,
            reward_scale: float = 0.5, threshold: float = 1.5, anchor: int = 0) -> tuple:
    return cuda_ext.hindsight_inject(
        **tracker.trade(), trade_closed=torch.tensor(closed), raw_reward=torch.tensor(raw_reward, dtype=F32),
        lots=torch.tensor(lots, dtype=F32), obs=obs, next_obs=next_obs, action=action,
        replay_next_obs=replay_next_obs, reward_scale=reward_scale, threshold=threshold, anchor=anchor,
        direction_branch=0, flat_action=1,
    )


def _long_trades(n_books: int) -> Tracker:
    """Every book long from 100, peak 104 at replay row 3, now at 101."""
    tracker = Tracker(n_books)
    for step, mid in enumerate([100.0, 102.0, 103.0, 104.0, 101.0]):
        tracker.track([1.0] * n_books, [mid] * n_books, [step] * n_books)
    return tracker


@pytest.fixture()
def rows() -> dict[str, torch.Tensor]:
    n_books, obs_dim, capacity = 4, 3, 6
    return {
        "obs": torch.arange(n_books * obs_dim, dtype=F32).reshape(n_books, obs_dim),
        "next_obs": -torch.arange(n_books * obs_dim, dtype=F32).reshape(n_books, obs_dim) - 1,
        "action": torch.tensor([[0, 1, 2, 0], [2, 2, 1, 1], [2, 0, 0, 2], [2, 1, 1, 0]]),
        "replay_next_obs": 1000 + torch.arange(capacity * obs_dim, dtype=F32).reshape(capacity, obs_dim),
    }


def test_inject_fires_only_when_closed_and_peak_beats_threshold(rows: dict[str, torch.Tensor]) -> None:
    # peak_pnl = |104 - 100| * 2 lots = 8. actual = |raw_reward| / 0.5. threshold 1.5.
    # book 0: actual 4 -> 8 > 6 fires; book 1: actual 16/3 -> 8 > 8 is false (equal: no row);
    # book 2: not closed; book 3: actual 6 -> 8 > 9 false.
    tracker = _long_trades(4)
    out_obs, out_next_obs, out_action, reward, wants, count = _inject(
        tracker, [True, True, False, True], [2.0, 8.0 / 3.0, 2.0, 3.0], [2.0] * 4, **rows
    )
    assert wants.tolist() == [True, False, False, False]
    assert count.tolist() == [1]
    assert count.dtype == I64
    assert reward.tolist() == [4.0, 0.0, 0.0, 0.0]  # 8 * 0.5
    assert torch.equal(out_obs[0], rows["obs"][0])
    assert torch.equal(out_next_obs[0], rows["next_obs"][0])
    assert torch.equal(out_action[0], rows["action"][0])
    assert not out_obs[1:].any() and not out_next_obs[1:].any() and not out_action[1:].any()


def test_inject_threshold_equality_and_strictness(rows: dict[str, torch.Tensor]) -> None:
    tracker = _long_trades(4)
    # peak_pnl 8, threshold 2: actual 4 -> 8 > 8 is false (equality never fires); actual 3.5 -> 8 > 7 fires.
    _, _, _, _, wants, count = _inject(
        tracker, [True] * 4, [2.0, 1.75, 2.0, 1.75], [2.0] * 4, threshold=2.0, **rows
    )
    assert wants.tolist() == [False, True, False, True]
    assert count.item() == 2


def test_inject_peak_anchor_uses_peak_row_and_exit_action(rows: dict[str, torch.Tensor]) -> None:
    tracker = _long_trades(4)
    tracker.peak_row[1] = -1  # no known peak row: falls back to the close anchor
    out_obs, out_next_obs, out_action, reward, wants, count = _inject(
        tracker, [True, True, False, False], [0.0, 0.0, 0.0, 0.0], [1.0] * 4, anchor=1, **rows
    )
    assert wants.tolist() == [True, True, False, False]
    assert torch.equal(out_obs[0], rows["replay_next_obs"][3])
    assert torch.equal(out_next_obs[0], rows["replay_next_obs"][3])
    assert out_action[0].tolist() == [1, 1, 2, 0]  # direction branch 0 set to flat_action 1
    assert torch.equal(out_obs[1], rows["obs"][1])
    assert torch.equal(out_next_obs[1], rows["next_obs"][1])
    assert out_action[1].tolist() == [2, 2, 1, 1]
    assert reward.tolist() == [2.0, 2.0, 0.0, 0.0]  # 4 * 1 lot * 0.5


def test_inject_resets_every_closed_tracker_fired_or_not(rows: dict[str, torch.Tensor]) -> None:
    tracker = _long_trades(4)
    _inject(tracker, [True, True, False, True], [2.0, 100.0, 2.0, 100.0], [2.0] * 4, **rows)
    assert tracker.ring_len.tolist() == [0, 0, 5, 0]
    assert tracker.direction.tolist() == [0, 0, 1, 0]
    assert tracker.entry_mid.tolist() == [0.0, 0.0, 100.0, 0.0]
    assert tracker.peak.tolist() == [0.0, 0.0, 104.0, 0.0]
    assert tracker.peak_row.tolist() == [-1, -1, 3, -1]


def test_inject_needs_an_open_trade(rows: dict[str, torch.Tensor]) -> None:
    tracker = Tracker(4)  # all flat
    tracker.peak[:] = 10.0  # stale numbers must not fire without a direction
    _, _, _, _, wants, count = _inject(tracker, [True] * 4, [0.0] * 4, [1.0] * 4, **rows)
    assert not wants.any() and count.item() == 0


def test_inject_short_trade_peak_pnl() -> None:
    tracker = Tracker(1)
    for step, mid in enumerate([100.0, 96.0, 99.0]):
        tracker.track([-1.0], [mid], [step])
    obs = torch.zeros(1, 2)
    _, _, _, reward, wants, _ = cuda_ext.hindsight_inject(
        **tracker.trade(), trade_closed=torch.tensor([True]), raw_reward=torch.tensor([1.0]),
        lots=torch.tensor([3.0]), obs=obs, next_obs=obs, action=torch.zeros(1, 4, dtype=I64),
        replay_next_obs=torch.zeros(3, 2), reward_scale=1.0, threshold=2.0, anchor=0, direction_branch=0,
        flat_action=1,
    )
    assert wants.tolist() == [True]  # |96 - 100| * 3 = 12 > 2 * 1
    assert reward.tolist() == [12.0]


def test_inject_rejects_bad_arguments(rows: dict[str, torch.Tensor]) -> None:
    tracker = _long_trades(4)
    with pytest.raises(ValueError, match="anchor=2"):
        _inject(tracker, [True] * 4, [1.0] * 4, [1.0] * 4, anchor=2, **rows)
    with pytest.raises(ValueError, match="reward_scale=0"):
        _inject(tracker, [True] * 4, [1.0] * 4, [1.0] * 4, reward_scale=0.0, **rows)
    with pytest.raises(ValueError, match="lots.shape"):
        _inject(tracker, [True] * 4, [1.0] * 4, [1.0] * 3, **rows)


# --------------------------------------------------------------------------- hindsight_forward


class ForwardRing:
    """Forward-hindsight slot ring of ``n_slots`` slots."""

    def __init__(self, n_slots: int, obs_dim: int = 2, n_branches: int = 4) -> None:
        self.valid = torch.zeros(n_slots, dtype=torch.bool)
        self.entry = torch.zeros(n_slots)
        self.close_step = torch.zeros(n_slots, dtype=I64)
        self.direction = torch.zeros(n_slots, dtype=I64)
        self.actual = torch.zeros(n_slots)
        self.lots = torch.zeros(n_slots)
        self.book = torch.zeros(n_slots, dtype=I64)
        self.obs = torch.zeros(n_slots, obs_dim)
        self.action = torch.zeros(n_slots, n_branches, dtype=I64)
        self.head = torch.zeros(1, dtype=I64)

    def step(self, step: int, mid: list[float], *, reset: list[bool] | None = None,
             closed: list[bool] | None = None, entry: list[float] | None = None,
             direction: list[int] | None = None, actual: list[float] | None = None,
             lots: list[float] | None = None, obs: torch.Tensor | None = None,
             action: torch.Tensor | None = None, lookahead: int = 2, threshold: float = 1.0,
             reward_scale: float = 0.5) -> tuple:
        n_books = len(mid)
        obs_dim, n_branches = self.obs.shape[1], self.action.shape[1]
        return cuda_ext.hindsight_forward(
            slot_valid=self.valid, slot_entry=self.entry, slot_close_step=self.close_step,
            slot_direction=self.direction, slot_actual=self.actual, slot_lots=self.lots, slot_book=self.book,
            slot_obs=self.obs, slot_action=self.action, ring_head=self.head, step=torch.tensor([step]),
            mid=torch.tensor(mid, dtype=F32), book_reset=torch.tensor(reset or [False] * n_books),
            trade_closed=torch.tensor(closed or [False] * n_books),
            entry_mid=torch.tensor(entry or [0.0] * n_books, dtype=F32),
            closed_direction=torch.tensor(direction or [0] * n_books),
            actual=torch.tensor(actual or [0.0] * n_books, dtype=F32),
            lots=torch.tensor(lots or [1.0] * n_books, dtype=F32),
            obs=obs if obs is not None else torch.zeros(n_books, obs_dim),
            action=action if action is not None else torch.zeros(n_books, n_branches, dtype=I64),
            lookahead=lookahead, threshold=threshold, reward_scale=reward_scale, direction_branch=0,
        )


def test_forward_fires_only_after_lookahead_and_above_threshold() -> None:
    ring = ForwardRing(4)
    obs = torch.tensor([[1.0, 2.0]])
    action = torch.tensor([[1, 2, 0, 1]])
    # Long trade closed at step 10 (entry 100, 2 lots, actual 3 currency). lookahead 2, threshold 1.
    ring.step(10, [100.0], closed=[True], entry=[100.0], direction=[1], actual=[3.0], lots=[2.0],
              obs=obs, action=action)
    assert ring.valid.tolist() == [True, False, False, False]
    *_, wants, count = ring.step(11, [110.0])  # age 1 < lookahead: no row, though profitable
    assert not wants.any() and count.item() == 0
    *_, wants, _ = ring.step(12, [101.5])  # fwd = 1.5 * 2 = 3, not > 3
    assert not wants.any()
    assert ring.valid[0]
    out_obs, out_next_obs, out_action, reward, wants, count = ring.step(13, [102.0])  # fwd 4 > 3
    assert wants.tolist() == [True, False, False, False]
    assert count.tolist() == [1]
    assert reward.tolist() == [2.0, 0.0, 0.0, 0.0]  # 4 * 0.5
    assert out_obs[0].tolist() == [1.0, 2.0] and out_next_obs[0].tolist() == [1.0, 2.0]
    assert out_action[0].tolist() == [2, 2, 0, 1]  # stay long
    assert not out_obs[1:].any() and not out_action[1:].any()
    assert not ring.valid.any()  # fired slots clear


def test_forward_short_trade_stays_short() -> None:
    ring = ForwardRing(2)
    ring.step(0, [100.0], closed=[True], entry=[100.0], direction=[-1], actual=[1.0], lots=[1.0],
              action=torch.tensor([[1, 0, 2, 2]]))
    _, _, out_action, reward, wants, _ = ring.step(3, [97.0], lookahead=3)
    assert wants.tolist() == [True, False]
    assert reward.tolist() == [1.5, 0.0]  # -(97 - 100) * 1 * 0.5
    assert out_action[0].tolist() == [0, 0, 2, 2]


def test_forward_expired_slots_never_fire() -> None:
    ring = ForwardRing(2)
    ring.step(0, [100.0], closed=[True], entry=[100.0], direction=[1], actual=[1.0])
    *_, wants, _ = ring.step(1, [100.0])  # too young
    assert not wants.any() and ring.valid[0]
    *_, wants, count = ring.step(4, [200.0])  # age 4 = 2 * lookahead: expired, though hugely profitable
    assert not wants.any() and count.item() == 0
    assert not ring.valid.any()
    *_, wants, _ = ring.step(5, [300.0])
    assert not wants.any()


def test_forward_book_reset_clears_slots() -> None:
    ring = ForwardRing(4)
    ring.step(0, [100.0, 100.0], closed=[True, True], entry=[100.0, 100.0], direction=[1, 1],
              actual=[1.0, 1.0])
    *_, wants, _ = ring.step(2, [150.0, 150.0], reset=[True, False])
    assert wants.tolist() == [False, True, False, False]
    assert not ring.valid.any()


def test_forward_ring_insertion_by_prefix_sum() -> None:
    ring = ForwardRing(4)
    ring.head[0] = 3
    closed = [True, False, True, True, True, True]
    direction = [1, 1, -1, 0, 1, -1]  # book 3 closed flat: does not enter
    ring.step(7, [1.0] * 6, closed=closed, direction=direction, entry=[10.0, 11, 12, 13, 14, 15],
              actual=[0.5] * 6, obs=torch.arange(12, dtype=F32).reshape(6, 2))
    # entrants: books 0, 2, 4, 5 at prefix 0..3 -> slots 3, 0, 1, 2
    assert ring.book.tolist() == [2, 4, 5, 0]
    assert ring.direction.tolist() == [-1, 1, -1, 1]
    assert ring.entry.tolist() == [12.0, 14.0, 15.0, 10.0]
    assert ring.close_step.tolist() == [7] * 4
    assert ring.obs[3].tolist() == [0.0, 1.0] and ring.obs[0].tolist() == [4.0, 5.0]
    assert ring.valid.all()
    assert ring.head.tolist() == [3]  # (3 + 4) % 4


def test_forward_more_entrants_than_slots_keeps_the_last() -> None:
    ring = ForwardRing(3)
    ring.head[0] = 1
    ring.step(0, [1.0] * 5, closed=[True] * 5, direction=[1] * 5, entry=[0.0, 1, 2, 3, 4])
    # 5 entrants at prefix 0..4, the last 3 (books 2, 3, 4) at (1 + p) % 3 = 0, 1, 2
    assert ring.book.tolist() == [2, 3, 4]
    assert ring.entry.tolist() == [2.0, 3.0, 4.0]
    assert ring.head.tolist() == [0]  # (1 + 5) % 3


def test_forward_rejects_bad_lookahead() -> None:
    ring = ForwardRing(2)
    with pytest.raises(ValueError, match="lookahead=0"):
        ring.step(0, [1.0], lookahead=0)


# --------------------------------------------------------------------------- magnitude_relabel


def test_magnitude_relabel_rewards_and_priorities_by_hand() -> None:
    obs = torch.tensor([[1.0], [2.0], [3.0]])
    next_obs = -obs
    action = torch.tensor([[2, 0, 1, 0], [2, 1, 1, 0], [0, 2, 0, 1]])
    reward = torch.tensor([1.0, 7.0, 2.0])
    magnitudes = torch.tensor([0.25, 0.5, 1.0])
    out_obs, out_next_obs, out_action, out_reward, priority, wants, count = cuda_ext.magnitude_relabel(
        trade_closed=torch.tensor([True, False, True]), obs=obs, next_obs=next_obs, action=action,
        reward=reward, magnitudes=magnitudes, magnitude_branch=1,
    )
    # book 0 (mag 0.25, R 1): k=1 -> 2, k=2 -> 4. book 2 (mag 1.0, R 2): k=0 -> 0.5, k=1 -> 1.
    # rows j * B + b: j=0 -> [b0 k1, b1 -, b2 k0], j=1 -> [b0 k2, b1 -, b2 k1]
    assert wants.tolist() == [True, False, True, True, False, True]
    assert count.tolist() == [4]
    assert out_reward.tolist() == [2.0, 0.0, 0.5, 4.0, 0.0, 1.0]
    assert priority.tolist() == [1.0, 0.0, 1.5, 3.0, 0.0, 1.0]
    assert out_action[:, 1].tolist() == [1, 0, 0, 2, 0, 1]
    assert out_action[0].tolist() == [2, 1, 1, 0] and out_action[5].tolist() == [0, 1, 0, 1]
    assert out_obs[:, 0].tolist() == [1.0, 0.0, 3.0, 1.0, 0.0, 3.0]
    assert out_next_obs[:, 0].tolist() == [-1.0, 0.0, -3.0, -1.0, 0.0, -3.0]


def test_magnitude_relabel_negative_reward_scales_and_priority_is_absolute() -> None:
    _, _, _, out_reward, priority, _, _ = cuda_ext.magnitude_relabel(
        trade_closed=torch.tensor([True]), obs=torch.zeros(1, 1), next_obs=torch.zeros(1, 1),
        action=torch.tensor([[0, 1]]), reward=torch.tensor([-3.0]), magnitudes=torch.tensor([0.25, 0.5, 1.0]),
        magnitude_branch=1,
    )
    assert out_reward.tolist() == [-1.5, -6.0]
    assert priority.tolist() == [1.5, 3.0]


def test_magnitude_relabel_out_of_range_index_wants_no_rows() -> None:
    *_, wants, count = cuda_ext.magnitude_relabel(
        trade_closed=torch.tensor([True, True]), obs=torch.zeros(2, 1), next_obs=torch.zeros(2, 1),
        action=torch.tensor([[5], [-1]]), reward=torch.ones(2), magnitudes=torch.tensor([0.5, 1.0]),
        magnitude_branch=0,
    )
    assert not wants.any() and count.item() == 0


def test_magnitude_relabel_rejects_bad_arguments() -> None:
    rows = {"trade_closed": torch.tensor([True]), "obs": torch.zeros(1, 1), "next_obs": torch.zeros(1, 1),
            "action": torch.tensor([[0, 1]]), "reward": torch.ones(1)}
    with pytest.raises(ValueError, match="magnitudes.shape"):
        cuda_ext.magnitude_relabel(**rows, magnitudes=torch.tensor([1.0]), magnitude_branch=1)
    with pytest.raises(ValueError, match="magnitude_branch=2"):
        cuda_ext.magnitude_relabel(**rows, magnitudes=torch.tensor([0.5, 1.0]), magnitude_branch=2)


def test_fake_tensor_shapes_match_reference() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = {"trade_closed": torch.tensor([True, False]), "obs": torch.zeros(2, 3),
            "next_obs": torch.zeros(2, 3), "action": torch.zeros(2, 4, dtype=I64), "reward": torch.ones(2),
            "magnitudes": torch.tensor([0.25, 0.5, 1.0]), "magnitude_branch": 1}
    real = cuda_ext.magnitude_relabel(**args)
    with FakeTensorMode() as mode:
        fake_args = {k: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for k, a in args.items()}
        fake = cuda_ext.magnitude_relabel(**fake_args)
    assert [tuple(t.shape) for t in fake] == [tuple(t.shape) for t in real]
    assert [t.dtype for t in fake] == [t.dtype for t in real]
    assert math.prod(real[0].shape) == 2 * 2 * 3
