"""Environment throughput: book-steps per second of the batched env, and the single-book Gymnasium rate.

Measures, in one run on one machine:

1. ``LOBVectorEnv(return_tensors=True).step`` (the batched core plus same-step autoreset) with uniformly
   random actions, for ``B`` = 1, 16, 256, 4096, 65536 books, on the CPU and (when present) CUDA, on the
   synthetic market and on LOBSTER replay. CUDA timings synchronize before and after; every size
   gets warm-up steps first.
2. The single-book ``gymnasium.Env`` step rate on the CPU: :class:`foxenv.gym_env.LOBEnv` bare and
   through ``gymnasium.make`` (with Gymnasium's checker wrappers) as a user gets it (the lean one-book
   step, :mod:`foxenv.single_book`), on the eager core (``lean=False``) and with ``compile=True``
   (``torch.compile`` of the core's step; the compile is timed apart), the bare core at ``B = 1``
   (the env's own overhead is the difference), next to gym-trading-env's ``TradingEnv`` (a
   popular single-asset trading env) on a price series of the same length. These are timed in blocks
   taken in turn, so load on a shared machine hits them alike; rows give the rate over all blocks and
   the median and best block.

Usage::

    python benchmarks/env_throughput.py                    # everything available
    python benchmarks/env_throughput.py --quick            # small sizes, a few seconds
    python benchmarks/env_throughput.py --sizes 1 --single-steps 5000   # mostly the single-book rows
    python benchmarks/env_throughput.py --device cuda --lobster /path/to/lobster --out results.json
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from foxenv.data import load_market
from foxenv.data.market import MarketData
from foxenv.gym_env import LOBEnv
from foxenv.vector_env import make_vec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
from _common import REPO_ROOT, default_out, machine_info, peer_missing, synchronizer, write_json  # noqa: E402

DEFAULT_OUT = default_out("env_throughput")
DEFAULT_LOBSTER = REPO_ROOT.parent / "shared" / "data" / "lobster"
FULL_SIZES = (1, 16, 256, 4096, 65536)
QUICK_SIZES = (1, 16, 256)

#: (kind, device, num_books) -> target rate, printed beside the measured number.
TARGETS: dict[tuple[str, str, int | None], float] = {
    ("vector", "cuda", 65536): 1e8,
    ("vector", "cpu", 256): 5e5,
    ("single", "cpu", None): 1e4,
}


def time_loop(
    step: Callable[[int], Any], min_seconds: float, min_steps: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Call ``step(i)`` until both ``min_steps`` calls and ``min_seconds`` have passed.

    :param step: one step; gets the running index.
    :param min_seconds: least wall time to measure.
    :param min_steps: least number of calls.
    :param sync: waits for queued device work (a no-op on the CPU).
    :return: ``{"steps": n, "seconds": t}``.
    """
    sync()
    started = time.perf_counter()
    count = 0
    while count < min_steps or time.perf_counter() - started < min_seconds:
        step(count)
        count += 1
        if count % 8 == 0 or count >= min_steps:
            sync()
    sync()
    return {"steps": count, "seconds": time.perf_counter() - started}


def bench_vector(
    market: MarketData, data_name: str, device: str, num_books: int, episode_length: int, quick: bool,
    compiled: bool = False,
    graph: bool = False,
) -> dict[str, Any]:
    """Book-steps per second of the vector env in tensor mode.

    :param market: the market (on the CPU; moved to ``device``).
    :param data_name: label of the data source.
    :param device: ``"cpu"`` or ``"cuda"``.
    :param num_books: ``B``.
    :param episode_length: steps per episode.
    :param quick: shorter timing.
    :param compiled: step the core through ``torch.compile`` (``make_vec(..., compile=True)``).
    :param graph: also capture the step in a CUDA graph (``make_vec(..., cuda_graph=True)``).
    :return: one result row.
    """
    row: dict[str, Any] = {"kind": "vector", "device": device, "data": data_name, "num_books": num_books,
                           "compiled": compiled, "cuda_graph": graph}
    sync = synchronizer(device)
    try:
        env = make_vec(num_books, data=market, device=device, seed=0, return_tensors=True,
                       episode_length=episode_length, compile=compiled, cuda_graph=graph)
        env.reset(seed=0)
        generator = torch.Generator(device=device).manual_seed(0)
        pool = torch.randint(0, 3, (8, num_books, 4), generator=generator, device=device)
        warmup = 20 if compiled else (3 if quick else 5)  # the first compiled steps compile
        for i in range(warmup):
            env.step(pool[i % 8])
        timing = time_loop(lambda i: env.step(pool[i % 8]), 0.2 if quick else 2.0, 3 if quick else 5, sync)
    except (torch.cuda.OutOfMemoryError, MemoryError) as error:
        row["skipped"] = f"out of memory: {str(error).splitlines()[0][:120]}"
        return row
    row.update(timing)
    row["book_steps_per_s"] = num_books * timing["steps"] / timing["seconds"]
    return row


#: A single-book contestant: ``(step(action_index) -> done, reset())``.
Stepper = tuple[Callable[[int], bool], Callable[[], None]]


def foxenv_steppers(
    market: MarketData, episode_length: int, actions: np.ndarray, compiled: bool
) -> tuple[dict[str, Stepper], dict[str, float]]:
    """The foxenv single-book contestants: the bare core (``B = 1``), :class:`LOBEnv` (by default the
    lean one-book step), the env through ``gymnasium.make`` (with Gymnasium's checker wrappers: the face a
    user gets), ``LOBEnv(lean=False)`` (the eager core's step), and, when ``compiled``, the core and
    ``LOBEnv(compile=True)`` with their step compiled. The difference between the core and
    ``LOBEnv(lean=False)`` is the env's own overhead (numpy in and out, the info as Python scalars).

    :param market: the market.
    :param episode_length: steps per episode.
    :param actions: ``[N, 4]`` int64 actions, used in turn.
    :param compiled: add the compiled contestants (``LOBEnv(compile=True)`` compiles while it is built,
        the compiled core on its first step; timed apart).
        ``LOBEnv(compile=True)`` is what a user gets; the compiled core (``enable_compile``, its outputs
        not packed, the core's own action checks on) shows what the packing and the env's checks save.
    :return: the contestants by row name, and the seconds each compiled one took to compile (the env's
        build and first step, the core's first step).
    """
    import gymnasium

    from foxenv.core import BatchedLOB
    from foxenv.gym_env import split_env_kwargs

    config, _ = split_env_kwargs(None, {"episode_length": episode_length})
    cpu_core = functools.partial(BatchedLOB, market, 1, config=config, device="cpu", seed=0)
    core_actions = [torch.from_numpy(action).view(1, 4) for action in actions]

    def core_stepper(core: BatchedLOB) -> Stepper:
        def step(i: int) -> bool:
            _, _, terminated, truncated, _ = core.step(core_actions[i % len(core_actions)])
            return bool(terminated.item() or truncated.item())

        return step, lambda: core.reset()

    def env_stepper(env: gymnasium.Env) -> Stepper:
        def step(i: int) -> bool:
            _, _, terminated, truncated, _ = env.step(actions[i % len(actions)])
            return terminated or truncated

        return step, lambda: env.reset()

    steppers: dict[str, Stepper] = {
        "foxenv BatchedLOB core, B=1": core_stepper(cpu_core()),
        "foxenv LOBEnv": env_stepper(LOBEnv(data=market, seed=0, episode_length=episode_length)),
        "foxenv via gymnasium.make": env_stepper(
            gymnasium.make("foxenv/LOB-v0", data=market, seed=0, episode_length=episode_length)
        ),
        "foxenv LOBEnv, lean=False": env_stepper(
            LOBEnv(data=market, seed=0, episode_length=episode_length, lean=False)
        ),
    }
    compile_seconds: dict[str, float] = {}
    if compiled:
        core = cpu_core()
        core.enable_compile()
        # Two compiles: LOBEnv(compile=True) compiles the core's step fused with the packing of its outputs
        # (foxenv.gym_env.PackedStep) while it is built, the core its step alone on its first step. Either
        # is fast when inductor's cache on disk already holds the kernels.
        started = time.perf_counter()
        compiled_env = LOBEnv(data=market, seed=0, episode_length=episode_length, compile=True)
        build_seconds = {"foxenv LOBEnv, compile=True": time.perf_counter() - started}
        contestants = {
            "foxenv LOBEnv, compile=True": env_stepper(compiled_env),
            "foxenv BatchedLOB core, B=1, compiled": core_stepper(core),
        }
        for name, (step, reset) in contestants.items():
            reset()
            started = time.perf_counter()
            step(0)  # the core compiles
            compile_seconds[name] = build_seconds.get(name, 0.0) + time.perf_counter() - started
        steppers.update(contestants)
    return steppers, compile_seconds


def gym_trading_env_stepper(num_prices: int, steps: int) -> Stepper | str:
    """gym-trading-env's ``TradingEnv`` on a random-walk price series, as a contestant.

    :param num_prices: length of the price series.
    :param steps: number of random actions to cycle through.
    :return: the contestant, or why it is skipped (the package is not importable).
    """
    saved_filters = list(warnings.filters)
    try:
        import pandas as pd
        from gym_trading_env.environments import TradingEnv
    except ImportError as error:
        return peer_missing("gym-trading-env", error)
    finally:
        # gym_trading_env turns every warning into an error at import; undo that for everyone else.
        warnings.filters[:] = saved_filters
    rng = np.random.default_rng(0)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 1e-3, num_prices)))
    frame = pd.DataFrame(
        {"open": close, "high": close * 1.001, "low": close * 0.999, "close": close,
         "volume": rng.integers(1, 1000, num_prices).astype(float)},
        index=pd.date_range("2024-01-01", periods=num_prices, freq="1min"),
    )
    frame["feature_return"] = frame["close"].pct_change().fillna(0.0)
    frame["feature_volume"] = np.log1p(frame["volume"])
    env = TradingEnv(frame, positions=[-1, 0, 1], verbose=0)
    actions = rng.integers(0, 3, steps).tolist()

    def step(i: int) -> bool:
        _, _, terminated, truncated, _ = env.step(actions[i % len(actions)])
        return terminated or truncated

    return step, lambda: env.reset(seed=0)


def bench_single_book(
    market: MarketData, episode_length: int, steps: int, blocks: int, compiled: bool
) -> list[dict[str, Any]]:
    """Steps per second of one book: the foxenv contestants (:func:`foxenv_steppers`) beside
    gym-trading-env's ``TradingEnv`` (a popular single-asset trading env) on a price series of the same
    length, all in this process. Each contestant is warmed up, then timed in ``blocks`` blocks taken in
    turn (a burst of load on a shared machine hits them alike); a finished episode is reset inside the
    timing.

    :param market: the market.
    :param episode_length: steps per episode.
    :param steps: steps timed per contestant (split into the blocks).
    :param blocks: timed blocks per contestant.
    :param compiled: add the compiled foxenv contestants.
    :return: one row per contestant: ``steps``, ``seconds``, ``steps_per_s`` (over all blocks),
        ``steps_per_s_median`` and ``steps_per_s_best`` (over blocks), and ``compile_seconds`` (a
        compiled one's compile, see :func:`foxenv_steppers`).
    """
    actions = np.random.default_rng(0).integers(0, 3, size=(steps, 4))
    steppers, compile_seconds = foxenv_steppers(market, episode_length, actions, compiled)
    rows: dict[str, dict[str, Any]] = {}
    trading_env = gym_trading_env_stepper(market.num_steps, steps)
    if isinstance(trading_env, str):
        rows["gym-trading-env TradingEnv"] = {"skipped": trading_env}
    else:
        steppers["gym-trading-env TradingEnv"] = trading_env
    block_steps = max(1, steps // blocks)
    rates: dict[str, list[float]] = {name: [] for name in steppers}
    seconds: dict[str, float] = dict.fromkeys(steppers, 0.0)
    for step, reset in steppers.values():  # warm up
        reset()
        for i in range(min(20, block_steps)):
            step(i)
        reset()
    for block in range(blocks):
        for name, (step, reset) in steppers.items():
            started = time.perf_counter()
            for i in range(block * block_steps, (block + 1) * block_steps):
                if step(i):
                    reset()
            elapsed = time.perf_counter() - started
            seconds[name] += elapsed
            rates[name].append(block_steps / elapsed)
    for name in steppers:
        rows[name] = {
            "steps": block_steps * blocks,
            "seconds": seconds[name],
            "steps_per_s": block_steps * blocks / seconds[name],
            "steps_per_s_median": float(np.median(rates[name])),
            "steps_per_s_best": max(rates[name]),
        }
        if name in compile_seconds:
            rows[name]["compile_seconds"] = compile_seconds[name]
    return [{"kind": "single", "device": "cpu", "env": name, **row} for name, row in rows.items()]


def target_for(row: dict[str, Any]) -> float | None:
    """The target rate for a result row, if one is set.

    :param row: a result row.
    :return: the target or ``None``.
    """
    if row["kind"] == "vector":
        return TARGETS.get(("vector", row["device"], row["num_books"]))
    if row.get("env") in ("foxenv LOBEnv", "foxenv via gymnasium.make", "foxenv LOBEnv, compile=True"):
        return TARGETS.get(("single", "cpu", None))
    return None


def print_table(rows: list[dict[str, Any]]) -> None:
    """Print the results as a fixed-width table.

    :param rows: result rows.
    """
    print(f"{'what':<38} {'device':<6} {'books':>7} {'rate (steps/s)':>16} {'target':>10}  note")
    for row in rows:
        what = f"vector env, {row['data']}" if row["kind"] == "vector" else row["env"]
        what += ", compiled" if row.get("compiled") else ""
        what += " + graph" if row.get("cuda_graph") else ""
        books = str(row.get("num_books", 1))
        rate = row.get("book_steps_per_s", row.get("steps_per_s"))
        target = target_for(row)
        rate_text = f"{rate:16.4g}" if rate is not None else f"{'-':>16}"
        target_text = f"{target:10.0e}" if target is not None else f"{'':>10}"
        notes = [row["skipped"]] if "skipped" in row else []
        if target is not None and rate is not None:
            notes.append("meets target" if rate >= target else f"{rate / target:.2g}x of target")
        if "steps_per_s_median" in row:
            notes.append(f"median block {row['steps_per_s_median']:.3g}, best {row['steps_per_s_best']:.3g}")
        if "compile_seconds" in row:
            notes.append(f"compile {row['compile_seconds']:.1f} s")
        note = "; ".join(notes)
        print(f"{what:<38} {row['device']:<6} {books:>7} {rate_text} {target_text}  {note}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and write the JSON.

    :param argv: command-line arguments (``None``: ``sys.argv``).
    :return: the results dict that was written.
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and short timings (seconds)")
    parser.add_argument("--device", choices=("all", "cpu", "cuda"), default="all",
                        help="devices for the batched rows (default: cpu, plus cuda when available)")
    parser.add_argument("--lobster", type=Path, default=None,
                        help="LOBSTER folder (default: $FOXHUNT_LOBSTER_DIR, else ../shared/data/lobster)")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="numbers of books to measure")
    parser.add_argument("--single-steps", type=int, default=None,
                        help="steps timed per single-book row (default 300 quick, 3000 full)")
    parser.add_argument("--single-blocks", type=int, default=5,
                        help="blocks the single-book steps are timed in, taken in turn (default 5)")
    parser.add_argument("--single-compile", choices=("auto", "on", "off"), default="auto",
                        help="add the compiled single-book rows (LOBEnv(compile=True) and the compiled core; "
                             "each compiles for seconds first); auto: on unless --quick")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: the step's ops are small; OpenMP threads of a "
                             "compiled step stall on a busy machine)")
    parser.add_argument("--compile", action="store_true",
                        help="also time the vector env with its step compiled (make_vec(..., compile=True))")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch.cuda.is_available() is False")
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    sizes = tuple(args.sizes) if args.sizes else (QUICK_SIZES if args.quick else FULL_SIZES)
    episode_length = 200 if args.quick else 1000
    markets: dict[str, MarketData] = {
        "synthetic": load_market("synthetic", num_steps=2000 if args.quick else None, seed=0)
    }
    notes: list[str] = []
    lobster = args.lobster or (Path(os.environ["FOXHUNT_LOBSTER_DIR"]) if "FOXHUNT_LOBSTER_DIR" in os.environ
                               else DEFAULT_LOBSTER)
    if lobster.is_dir() and any(lobster.glob("*_message_*.csv")):
        markets["lobster"] = load_market(lobster)
    else:
        notes.append(f"no LOBSTER files at {lobster}: replay rows skipped")

    rows: list[dict[str, Any]] = []
    for device in devices:
        for data_name, market in markets.items():
            for num_books in sizes:
                rows.append(bench_vector(market, data_name, device, num_books, episode_length, args.quick))
                if args.compile:
                    rows.append(bench_vector(market, data_name, device, num_books, episode_length,
                                             args.quick, compiled=True))
                    if device == "cuda":
                        rows.append(bench_vector(market, data_name, device, num_books, episode_length,
                                                 args.quick, compiled=True, graph=True))
    single_steps = args.single_steps or (300 if args.quick else 3000)
    if args.single_blocks < 1:
        parser.error(f"--single-blocks={args.single_blocks} must be >= 1")
    single_compile = args.single_compile == "on" or (args.single_compile == "auto" and not args.quick)
    rows += bench_single_book(markets["synthetic"], episode_length, single_steps, args.single_blocks,
                              single_compile)

    print_table(rows)
    load = machine_info()["load_average_1min"]
    print(f"machine: {os.cpu_count()} CPUs, load average {load}, torch {torch.__version__}, "
          f"GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    for note in notes:
        print(f"note: {note}")
    results = {
        "benchmark": "env_throughput",
        "quick": args.quick,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "episode_length": episode_length,
        "markets": {name: {"name": m.name, "steps": m.num_steps, "levels": m.num_levels} for name, m in
                    markets.items()},
        "targets": {"vector_cuda_65536": 1e8, "vector_cpu_256": 5e5, "single_book_cpu": 1e4},
        "notes": notes,
        "rows": rows,
    }
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
