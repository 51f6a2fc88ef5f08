"""Hypothesis properties of the hindsight references: forward-ring slots never collide under any burst, the
ring keeps exactly the last S entrants, counts equal ``wants.sum()``, and the tracker's invariants hold."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cuda_ext

F32 = torch.float32
I64 = torch.int64
SETTINGS = settings(max_examples=60, deadline=None)
#: The tracker state arguments of ``hindsight_track`` after ``ring``, in order.
TRACKER_STATE = ("ring_len", "entry_mid", "direction", "peak", "peak_row")


@st.composite
def bursts(draw: st.DrawFn) -> dict:
    n_books = draw(st.integers(1, 40))
    n_slots = draw(st.integers(1, 12))
    return {
        "n_books": n_books,
        "n_slots": n_slots,
        "head": draw(st.integers(0, n_slots - 1)),
        "closed": draw(st.lists(st.booleans(), min_size=n_books, max_size=n_books)),
        "direction": draw(st.lists(st.sampled_from([-1, 0, 1]), min_size=n_books, max_size=n_books)),
        "valid": draw(st.lists(st.booleans(), min_size=n_slots, max_size=n_slots)),
        "age": draw(st.lists(st.integers(0, 9), min_size=n_slots, max_size=n_slots)),
        "seed": draw(st.integers(0, 2**16)),
    }


def _run_forward(burst: dict) -> tuple[dict[str, torch.Tensor], tuple]:
    n_books, n_slots = burst["n_books"], burst["n_slots"]
    gen = torch.Generator().manual_seed(burst["seed"])
    step = 20
    ring = {
        "valid": torch.tensor(burst["valid"]),
        "entry": 100 + torch.randn(n_slots, generator=gen),
        "close_step": step - torch.tensor(burst["age"]),
        "direction": torch.tensor([1, -1] * n_slots)[:n_slots],
        "actual": torch.rand(n_slots, generator=gen),
        "lots": torch.ones(n_slots),
        "book": torch.randint(0, n_books, (n_slots,), generator=gen),
        "obs": torch.randn(n_slots, 3, generator=gen),
        "action": torch.randint(0, 3, (n_slots, 4), generator=gen),
        "head": torch.tensor([burst["head"]]),
    }
    out = cuda_ext.hindsight_forward(
        **{f"slot_{name}": value for name, value in ring.items() if name != "head"}, ring_head=ring["head"],
        step=torch.tensor([step]), mid=100 + torch.randn(n_books, generator=gen),
        book_reset=torch.rand(n_books, generator=gen) < 0.2, trade_closed=torch.tensor(burst["closed"]),
        entry_mid=torch.arange(n_books, dtype=F32), closed_direction=torch.tensor(burst["direction"]),
        actual=torch.rand(n_books, generator=gen), lots=torch.ones(n_books),
        obs=torch.arange(n_books, dtype=F32).unsqueeze(1).expand(n_books, 3).contiguous(),
        action=torch.randint(0, 3, (n_books, 4), generator=gen), lookahead=3, threshold=1.0, reward_scale=1.0,
        direction_branch=0,
    )
    return ring, out


@SETTINGS
@given(bursts())
def test_forward_ring_keeps_the_last_entrants_without_collisions(burst: dict) -> None:
    ring, (_, _, _, _, wants, count) = _run_forward(burst)
    n_slots = burst["n_slots"]
    entrants = [b for b in range(burst["n_books"]) if burst["closed"][b] and burst["direction"][b] != 0]
    kept = entrants[-n_slots:]
    positions = [(burst["head"] + p) % n_slots for p in range(len(entrants))][-n_slots:]
    assert len(set(positions)) == len(positions)  # distinct: no two entrants share a slot
    for book, pos in zip(kept, positions, strict=True):
        assert ring["valid"][pos]
        assert ring["book"][pos].item() == book
        assert ring["entry"][pos].item() == float(book)  # entry_mid was the book index
        assert ring["close_step"][pos].item() == 20
        assert ring["obs"][pos].tolist() == [float(book)] * 3
    assert ring["head"].item() == (burst["head"] + len(entrants)) % n_slots
    assert count.item() == int(wants.sum())


@SETTINGS
@given(bursts())
def test_forward_only_mature_live_slots_fire(burst: dict) -> None:
    _, (out_obs, _, out_action, out_reward, wants, _) = _run_forward(burst)
    for i in range(burst["n_slots"]):
        mature = 3 <= burst["age"][i] < 6
        if wants[i]:
            assert burst["valid"][i] and mature
        else:
            assert out_reward[i].item() == 0.0 and not out_obs[i].any() and not out_action[i].any()


@st.composite
def closes(draw: st.DrawFn) -> dict:
    n_books = draw(st.integers(1, 30))
    return {
        "closed": draw(st.lists(st.booleans(), min_size=n_books, max_size=n_books)),
        "magnitude": draw(st.lists(st.integers(-1, 3), min_size=n_books, max_size=n_books)),
        "seed": draw(st.integers(0, 2**16)),
        "anchor": draw(st.sampled_from([0, 1])),
    }


@SETTINGS
@given(closes())
def test_counts_equal_wants_sum(case: dict) -> None:
    n_books = len(case["closed"])
    gen = torch.Generator().manual_seed(case["seed"])
    closed = torch.tensor(case["closed"])
    obs = torch.randn(n_books, 2, generator=gen)
    action = torch.randint(0, 3, (n_books, 4), generator=gen)
    action[:, 1] = torch.tensor(case["magnitude"])
    *_, wants, count = cuda_ext.magnitude_relabel(
        trade_closed=closed, obs=obs, next_obs=obs, action=action, reward=torch.randn(n_books, generator=gen),
        magnitudes=torch.tensor([0.25, 0.5, 1.0]), magnitude_branch=1,
    )
    assert count.item() == int(wants.sum())
    valid = closed & (action[:, 1] >= 0) & (action[:, 1] < 3)
    assert count.item() == 2 * int(valid.sum())

    direction = torch.randint(-1, 2, (n_books,), generator=gen)
    entry = torch.where(direction != 0, 100.0, 0.0)
    peak = entry + direction * torch.rand(n_books, generator=gen) * 4
    peak_row = torch.randint(-1, 5, (n_books,), generator=gen)
    *_, wants, count = cuda_ext.hindsight_inject(
        ring_len=torch.zeros(n_books, dtype=I64), entry_mid=entry, direction=direction, peak=peak,
        peak_row=peak_row, trade_closed=closed, raw_reward=torch.rand(n_books, generator=gen),
        lots=torch.ones(n_books), obs=obs, next_obs=obs, action=action, replay_next_obs=torch.randn(5, 2),
        reward_scale=1.0, threshold=1.0, anchor=case["anchor"], direction_branch=0, flat_action=1,
    )
    assert count.item() == int(wants.sum())
    assert not (wants & ~closed).any()


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([-2.0, -1.0, 0.0, 1.0, 3.0]), st.integers(-3, 3)), min_size=1,
                max_size=30))
def test_tracker_invariants_along_any_path(path: list[tuple[float, int]]) -> None:
    ring = torch.zeros(1, 8)
    state = [torch.zeros(1, dtype=I64), torch.zeros(1), torch.zeros(1, dtype=I64), torch.zeros(1),
             torch.full((1,), -1, dtype=I64)]
    mid = 100.0
    for row, (position, move) in enumerate(path):
        mid += move
        cuda_ext.hindsight_track(
            ring=ring, **dict(zip(TRACKER_STATE, state, strict=True)),
            position=torch.tensor([position]), best_bid=torch.tensor([mid - 0.5]),
            best_ask=torch.tensor([mid + 0.5]), row=torch.tensor([row]),
        )
        ring_len, entry_mid, direction, peak, peak_row = (t.item() for t in state)
        assert direction == (position > 0) - (position < 0)
        if direction == 0:
            assert (ring_len, entry_mid, peak, peak_row) == (0, 0.0, 0.0, -1)
        else:
            assert ring_len >= 1 and 0 <= peak_row <= row
            assert direction * (peak - entry_mid) >= 0  # the peak is never worse than the entry
            assert direction * (peak - mid) >= 0  # nor worse than the current mid
            assert ring[0, (ring_len - 1) % 8].item() == mid
