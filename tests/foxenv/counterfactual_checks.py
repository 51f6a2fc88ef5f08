"""The clone-exactness driver shared by the CPU and GPU tests of :mod:`foxenv.counterfactual`.

A sticky random policy (it mostly repeats its last action, so LimitMaker orders rest, keep their queue
place and fill) steps a vector env; before every step the books' agent state is exported and every
candidate action is cloned from it; the clone of the logged action must give the logged transition bit for
bit: observation (the step's own, ``final_obs``), reward, terminated, truncated, every info key, and the
next state (read from the core after a plain step, or after the vector env's step where no book reset).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch

from foxenv.counterfactual import AgentState, CounterfactualStep, export_state
from foxenv.data import load_market
from foxenv.data.market import MarketData
from foxenv.spec import INFO_KEYS, LIMIT_MAKER
from foxenv.vector_env import make_vec

#: Candidate actions cloned per state on the wide grid (the default grid clones all 81).
WIDE_CLONES = 24


def small_market(halt_every: int = 0) -> MarketData:
    """A short synthetic market; with ``halt_every`` every such row is halted."""
    market = load_market("synthetic", num_steps=2_000, seed=3)
    if halt_every:
        halted = torch.zeros(market.num_steps, dtype=torch.bool)
        halted[::halt_every] = True
        market = dataclasses.replace(market, halted=halted)
    return market


def bits(value: torch.Tensor) -> torch.Tensor:
    """A tensor's bit pattern (floats as integers, so NaN == NaN and -0.0 != 0.0), on the CPU."""
    value = value.detach().cpu()
    if value.dtype == torch.float64:
        return value.view(torch.int64)
    if value.dtype == torch.float32:
        return value.view(torch.int32)
    return value


def assert_same(name: str, clone: torch.Tensor, logged: torch.Tensor) -> None:
    """Bit-for-bit equality with a message naming the quantity and the first differing index."""
    assert clone.dtype == logged.dtype, f"{name}: dtype {clone.dtype} != {logged.dtype}"
    assert clone.shape == logged.shape, f"{name}: shape {tuple(clone.shape)} != {tuple(logged.shape)}"
    differ = bits(clone) != bits(logged)
    if bool(differ.any()):
        first = tuple(int(i) for i in differ.nonzero()[0])
        raise AssertionError(f"{name} differs at {first}: clone {clone.cpu()[first]!r} logged "
                             f"{logged.cpu()[first]!r}")


class StickyPolicy:
    """Random actions that repeat the last one with probability ``stay`` (CPU generator: the same actions on
    every device)."""

    def __init__(self, nvec: tuple[int, ...], num_books: int, seed: int, stay: float = 0.7) -> None:
        self.nvec, self.stay = nvec, stay
        self.generator = torch.Generator().manual_seed(seed)
        self.last = self.draw(num_books)

    def draw(self, num_books: int) -> torch.Tensor:
        """Fresh random actions, half of them LimitMaker orders."""
        draws = [torch.randint(0, n, (num_books,), generator=self.generator) for n in self.nvec]
        action = torch.stack(draws, 1)
        maker = torch.rand(num_books, generator=self.generator) < 0.5
        action[:, 2] = torch.where(maker, torch.full_like(action[:, 2], LIMIT_MAKER), action[:, 2])
        return action

    def __call__(self) -> torch.Tensor:
        keep = torch.rand(self.last.shape[0], generator=self.generator) < self.stay
        self.last = torch.where(keep[:, None], self.last, self.draw(self.last.shape[0]))
        return self.last.clone()


def candidates(cf: CounterfactualStep, action: torch.Tensor, generator: torch.Generator) -> tuple[
    torch.Tensor | None, torch.Tensor
]:
    """The actions to clone for each book and the column holding the logged action: every joint code on
    the default grid; on a wider grid ``WIDE_CLONES`` random codes with the logged one at a random column."""
    codes = cf.encode(action.to(cf.device))
    if cf.num_actions <= 81:
        return None, codes
    num_books = action.shape[0]
    drawn = torch.randint(0, cf.num_actions, (num_books, WIDE_CLONES), generator=generator).to(cf.device)
    column = torch.randint(0, WIDE_CLONES, (num_books,), generator=generator).to(cf.device)
    drawn[torch.arange(num_books, device=cf.device), column] = codes
    return drawn, column


def check_clones(device: str, num_books: int, steps: int, *, data: Any = None, seed: int = 0,
                 vector: bool = True, **config: Any) -> Counter:
    """Run the sticky policy for ``steps`` steps and check every logged transition against its clone.

    :param vector: step the ``LOBVectorEnv`` (same-step autoreset; the next state is checked where no book
        reset) or its core with plain steps and manual resets (the next state is checked everywhere).
    :return: counts of the situations covered (so a test can assert the run was not vacuous).
    """
    config.setdefault("episode_length", 25)
    env = make_vec(num_books, data=small_market() if data is None else data, device=device, seed=seed,
                   return_tensors=True, **config)
    env.reset(seed=seed)
    core = env.core
    cf = CounterfactualStep(env)
    policy = StickyPolicy(tuple(core.ACTION_NVEC), num_books, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    books = torch.arange(num_books, device=core.device)
    seen: Counter = Counter()
    for _ in range(steps):
        before = export_state(env)
        action = policy()
        clone_actions, column = candidates(cf, action, generator)
        out = cf(before, clone_actions)
        if vector:
            _, reward, terminated, truncated, info = env.step(action.to(core.device))
            obs = info["final_obs"]
        else:
            obs, reward, terminated, truncated, info = core.step(action.to(core.device))
        after = export_state(env)
        done = terminated | truncated
        assert set(out.info) == set(INFO_KEYS)
        assert_same("actions", out.actions[books, column], action.to(core.device))
        assert_same("obs", out.obs[books, column], obs)
        assert_same("reward", out.reward[books, column], reward)
        assert_same("terminated", out.terminated[books, column], terminated)
        assert_same("truncated", out.truncated[books, column], truncated)
        for key in INFO_KEYS:
            assert_same(f"info[{key!r}]", out.info[key][books, column], info[key])
        kept = ~done if vector else torch.ones_like(done)
        clone_state = out.state.index((books, column))
        assert_same("next books", clone_state.books[kept], after.books[kept])
        assert_same("next counters", clone_state.counters[kept], after.counters[kept])
        if not vector and bool(done.any()):
            core.reset(mask=done)
        tally(seen, before, action, info, done, terminated)
    return seen


def tally(seen: Counter, before: AgentState, action: torch.Tensor, info: dict[str, torch.Tensor],
          done: torch.Tensor, terminated: torch.Tensor) -> None:
    """Count what the step covered: order types filled, resting orders kept with a queue, pending ones."""
    action = action.to(done.device)
    moved = info["position"] != before.column("ledger.position")
    order = action[:, 2]
    resting = before.column("order_side") != 0
    seen["market_fills"] += int((moved & (order == 0)).sum())
    seen["maker_fills"] += int((moved & (order == LIMIT_MAKER) & resting).sum())
    seen["ioc_fills"] += int((moved & (order == 2)).sum())
    seen["queued"] += int((resting & (before.column("order_ahead") > 0)).sum())
    seen["pending"] += int((before.column("order_ahead") < 0).sum())
    seen["partial_maker"] += int((info["order_active"] & moved).sum())
    seen["done"] += int(done.sum())
    seen["terminated"] += int(terminated.sum())
