"""Environment steps per second WITH learning: BranchingIQN's device loop against SB3's numpy loop and peers.

Rows, at each number of books and device:

* ``BranchingIQN device loop``: ``DeviceLOBVecEnv`` (tensor face; on CUDA its step CUDA-graphed with the
  autoreset, and the model's gradient steps graphed, ``cuda_graph=True``), collected by
  :mod:`sb3_her_ext.collect`;
* ``BranchingIQN one graph``: the device loop's model and env with ``graph_collect=True`` and callbacks every
  ``train_freq`` vector steps: each rollout and its gradient steps are one CUDA graph replay
  (:mod:`sb3_her_ext.collect.block`; CUDA only, its warm-up covers every graph it captures);
* ``BranchingIQN one graph, no NaN guard``: the same with ``nan_guard=False``, the price of the guard's
  device-side check of every gradient step (:mod:`sb3_her_ext.guard`);
* ``BranchingIQN SB3 loop``: the same model on ``LOBVecEnv`` (SB3's numpy ``collect_rollouts``);
* ``SB3 DQN`` and ``sb3-contrib QR-DQN``: on the same ``LOBVecEnv`` with the 81 joint actions of
  ``MultiDiscrete([3, 3, 3, 3])`` as ``Discrete(81)`` (``LOBVecEnv(action_face="joint")``).

Every row: the same market data, hidden widths (``--widths``), batch size and replay ratio (samples trained
per env step, ``--replay-ratio``): ``gradient_steps / train_freq = ratio * books / batch`` (``train_freq`` in
vector steps; the realised ratio is recorded). QR-DQN gets BranchingIQN's quantile count. BranchingIQN keeps
its other defaults (5 ensemble heads, IQN + C51, GradVac, prioritized hindsight replay). Logging is out of
the way alike for all (``log_interval`` beyond the run; BranchingIQN's diagnostics line every
``--diagnostics-interval`` env steps).

Timing: a warm-up ``learn`` past ``learning_starts`` (compiles, graph captures and the first gradient steps
fall there), a short pilot ``learn`` that sizes the timed one to about ``--seconds``, then the timed
``learn(reset_num_timesteps=False)``, synchronised on CUDA. ``env_steps_per_s`` is its env steps over its wall
time; ``over_sb3_dqn`` divides it by SB3 DQN's at the same books, device and replay ratio. Then the same
model collects alone (``gradient_steps=0``): ``collect_only_env_steps_per_s`` is the loop's own rate, and
``ms_per_gradient_step`` what each gradient step added on top (the learner's share of the wall time).

Usage::

    python benchmarks/train_throughput.py --device cpu --books 16 256
    python benchmarks/train_throughput.py --device cuda --books 16 256 4096 65536
    python benchmarks/train_throughput.py --quick      # small widths, batch and times (a smoke run)

Prints a table and writes ``benchmarks/results/train_throughput.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages
from _common import default_out, machine_info, peer_missing, report, synchronizer  # noqa: E402

from foxhunt.config import PolicySettings  # noqa: E402

RESULTS = default_out("train_throughput")
NVEC = (3, 3, 3, 3)
ONE_GRAPH = "BranchingIQN one graph"
#: The one-graph row with ``nan_guard=False``: what the NaN guard's per-step device check costs.
UNGUARDED = "BranchingIQN one graph, no NaN guard"
ROWS = ("BranchingIQN device loop", ONE_GRAPH, UNGUARDED, "BranchingIQN SB3 loop", "SB3 DQN",
        "sb3-contrib QR-DQN")
#: The rows a run without ``--rows`` times: every row but the NaN guard's price (asked for by name).
DEFAULT_ROWS = tuple(row for row in ROWS if row != UNGUARDED)
#: BranchingIQN's head sizes (``--iqn-sizes``): the algorithm's generic defaults, or foxhunt's presets (what
#: ``foxhunt train`` builds: 3 ensemble heads, 16 quantiles each way, cosine embedding 32).
IQN_SIZES: dict[str, dict[str, int]] = {
    "generic": {},
    "foxhunt": {k: v for k, v in PolicySettings().kwargs().items() if k != "net_arch"},
}


def schedule(books: int, batch: int, replay_ratio: float) -> tuple[int, int, float]:
    """``(train_freq, gradient_steps, realised ratio)`` for ``ratio * books / batch`` gradient steps per
    vector step.

    :param books: envs per vector step.
    :param batch: samples per gradient step.
    :param replay_ratio: samples trained per env step; > 0.
    :return: vector steps per train call, gradient steps per call, and the ratio they give.
    """
    if not replay_ratio > 0:
        raise ValueError(f"replay_ratio={replay_ratio} must be > 0")
    per_vector_step = replay_ratio * books / batch
    if per_vector_step >= 1:
        train_freq, gradient_steps = 1, round(per_vector_step)
    else:
        train_freq, gradient_steps = round(1 / per_vector_step), 1
    return train_freq, gradient_steps, gradient_steps * batch / (train_freq * books)


def make_model(row: str, books: int, device: str, market: Any, args: argparse.Namespace,
               train_freq: int, gradient_steps: int) -> Any:
    """The model of one row, on its env (see the module docstring)."""
    from foxhunt.device_lob_env import DeviceLOBVecEnv
    from foxhunt.envs import LOBVecEnv
    from sb3_her_ext import BranchingIQN

    env_kwargs = dict(seed=0, data=market, levels=args.levels, episode_length=args.episode_length)
    learning_starts = max(args.batch, books)
    common = dict(learning_starts=learning_starts, buffer_size=args.buffer_size, batch_size=args.batch,
                  train_freq=train_freq, gradient_steps=gradient_steps, seed=0, device=device, verbose=0)
    iqn = dict(**common, diagnostics_interval=args.diagnostics_interval,
               policy_kwargs=dict(net_arch=list(args.widths), **IQN_SIZES[args.iqn_sizes]))
    cuda = th.device(device).type == "cuda"
    if row == "BranchingIQN device loop":
        env = DeviceLOBVecEnv(books, device=device, cuda_graph=cuda, compile=args.compile_env, **env_kwargs)
        # the device loop alone: the fused graph (the next row) would otherwise take qualifying rollouts
        return BranchingIQN("MlpPolicy", env, cuda_graph=cuda, graph_collect=False, **iqn)
    if row in (ONE_GRAPH, UNGUARDED):
        env = DeviceLOBVecEnv(books, device=device, cuda_graph=True, compile=args.compile_env, **env_kwargs)
        model = BranchingIQN("MlpPolicy", env, cuda_graph=True, graph_collect=True,
                             nan_guard=row == ONE_GRAPH, **iqn)
        return model
    if row == "BranchingIQN SB3 loop":
        return BranchingIQN("MlpPolicy", LOBVecEnv(books, device=device, **env_kwargs), **iqn)
    env = LOBVecEnv(books, device=device, action_face="joint", **env_kwargs)
    if row == "SB3 DQN":
        from stable_baselines3 import DQN

        return DQN("MlpPolicy", env, policy_kwargs=dict(net_arch=list(args.widths)), **common)
    from sb3_contrib import QRDQN

    n_quantiles = 32  # BranchingIQN's n_quantiles
    return QRDQN("MlpPolicy", env, policy_kwargs=dict(net_arch=list(args.widths), n_quantiles=n_quantiles),
                 **common)


def _fused_warmup_cycles(model: Any) -> int:
    """Rollouts the one-graph row needs before every graph of it is captured: each vaccine pattern of the
    gradient steps is its own graph (at most ``vaccine_interval`` of them), captured after its warm-up."""
    from sb3_her_ext.collect import TrainBlock

    return max(model.vaccine_interval, 1) * (TrainBlock.WARMUP_BLOCKS + 1)


def _graph_counts(model: Any) -> tuple[int, int, int]:
    """``(captures, replays, eager blocks)`` of the model's fused block so far (zeros before it exists)."""
    block = model.collector.block
    return (0, 0, 0) if block is None else (block.captures, block.replays, block.eager_blocks)


def time_row(model: Any, books: int, train_freq: int, gradient_steps: int, device: str,
             seconds: float, fused: bool = False) -> dict[str, Any]:
    """Warm up, size, then time one ``learn``.

    :param fused: the one-graph row (its warm-ups cover its graph captures).
    :return: env steps, gradient steps, wall seconds and rates of the timed ``learn``.
    """
    sync = synchronizer(device)
    cycle = train_freq * books  # env steps per train call
    # past learning_starts, then enough train calls for compiles and graph captures (25 gradient steps)
    warm_cycles = max(2, math.ceil(25 / gradient_steps)) if th.device(device).type == "cuda" else 2
    extra = _fused_warmup_cycles(model) if fused else 0
    warm = math.ceil(model.learning_starts / cycle) * cycle + (warm_cycles + extra) * cycle
    start = time.perf_counter()
    model.learn(warm, log_interval=10**9)
    sync()
    warm_seconds = time.perf_counter() - start
    pilot = 2 * cycle
    start = time.perf_counter()
    model.learn(pilot, reset_num_timesteps=False, log_interval=10**9)
    sync()
    pilot_rate = pilot / max(time.perf_counter() - start, 1e-9)
    timed = max(2, math.ceil(seconds * pilot_rate / cycle)) * cycle
    updates = model._n_updates
    counts = _graph_counts(model) if fused else None
    start = time.perf_counter()
    model.learn(timed, reset_num_timesteps=False, log_interval=10**9)
    sync()
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {}
    if fused:  # the timed learn's graphs: captures during it (0 when warmed up), replays, eager blocks
        after = _graph_counts(model)
        result["fused_graphs"] = {
            "captures_before": counts[0], "captures_during": after[0] - counts[0],
            "replays_during": after[1] - counts[1], "eager_blocks_during": after[2] - counts[2]}
    grad_steps = model._n_updates - updates
    # the same loop without its gradient steps: what collecting alone costs (the rest is the learner's)
    gradient_steps_before, model.gradient_steps = model.gradient_steps, 0
    try:
        if fused:  # the collect-only graph: its warm-up and capture before the pilot
            from sb3_her_ext.collect import TrainBlock

            model.learn((TrainBlock.WARMUP_BLOCKS + 1) * cycle, reset_num_timesteps=False, log_interval=10**9)
        start = time.perf_counter()
        model.learn(pilot, reset_num_timesteps=False, log_interval=10**9)
        sync()
        collect_pilot_rate = pilot / max(time.perf_counter() - start, 1e-9)
        collect_timed = max(2, math.ceil(seconds * collect_pilot_rate / cycle)) * cycle
        start = time.perf_counter()
        model.learn(collect_timed, reset_num_timesteps=False, log_interval=10**9)
        sync()
        collect_rate = collect_timed / (time.perf_counter() - start)
    finally:
        model.gradient_steps = gradient_steps_before
    return {**result, "env_steps": timed, "timed_gradient_steps": grad_steps, "seconds": elapsed,
            "warmup_seconds": warm_seconds, "env_steps_per_s": timed / elapsed,
            "grad_steps_per_s": grad_steps / elapsed, "collect_only_env_steps_per_s": collect_rate,
            # wall time per gradient step once collecting is taken out: the learner's share
            "ms_per_gradient_step": (
                1e3 * (elapsed - timed / collect_rate) / grad_steps if grad_steps else None
            )}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every row at every books count and device.

    :return: the JSON result (``rows`` and the settings).
    """
    from foxenv.data import load_market

    rows: list[dict[str, Any]] = []
    for device in args.device:
        market = load_market(args.data, levels=args.levels, device=device,
                             **({"num_steps": args.num_steps} if args.data == "synthetic" else {}))
        for books in args.books:
            train_freq, gradient_steps, ratio = schedule(books, args.batch, args.replay_ratio)
            for row in args.rows:
                base = {"row": row, "device": device, "books": books, "batch": args.batch,
                        "widths": list(args.widths), "iqn_sizes": args.iqn_sizes, "train_freq": train_freq,
                        "gradient_steps": gradient_steps, "replay_ratio": ratio}
                deterministic = th.are_deterministic_algorithms_enabled()
                warn_only = th.is_deterministic_algorithms_warn_only_enabled()
                fill = th.utils.deterministic.fill_uninitialized_memory
                try:
                    if row in (ONE_GRAPH, UNGUARDED) and th.device(device).type != "cuda":
                        rows.append({**base, "skipped": "CUDA only (a CUDA graph)"})
                        print(f"{device:5s} {books:6d} {row:26s} skipped: CUDA only", flush=True)
                        continue
                    th.manual_seed(0)
                    model = make_model(row, books, device, market, args, train_freq, gradient_steps)
                    result = time_row(model, books, train_freq, gradient_steps, device, args.seconds,
                                      fused=row in (ONE_GRAPH, UNGUARDED))
                except ImportError as error:
                    result = {"skipped": peer_missing("sb3-contrib", error)}
                finally:  # a seeded BranchingIQN on CUDA turns deterministic algorithms on process-wide
                    th.use_deterministic_algorithms(deterministic, warn_only=warn_only)
                    th.utils.deterministic.fill_uninitialized_memory = fill
                rows.append({**base, **result})
                print(f"{device:5s} {books:6d} {row:26s} "
                      + (f"{result['env_steps_per_s']:12,.0f} env-steps/s" if "env_steps_per_s" in result
                         else result["skipped"]), flush=True)
    for row in rows:
        peer = next((r for r in rows if r["row"] == "SB3 DQN" and r["device"] == row["device"]
                     and r["books"] == row["books"] and "env_steps_per_s" in r), None)
        rate = row.get("env_steps_per_s")
        row["over_sb3_dqn"] = rate / peer["env_steps_per_s"] if peer is not None and rate else None
    return {"benchmark": "train_throughput", "machine": machine_info(), "settings": vars(args) | {
        "books": list(args.books), "widths": list(args.widths), "device": list(args.device)}, "rows": rows}


def print_table(result: dict[str, Any]) -> None:
    """The rows as a Markdown table."""
    print("\n| device | books | row | env-steps/s | / SB3 DQN | collect only | ms / grad step | "
          "train_freq x grad steps | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        if "env_steps_per_s" not in row:
            print(f"| {row['device']} | {row['books']} | {row['row']} | skipped | | | | | |")
            continue
        over = f"{row['over_sb3_dqn']:.2f}x" if row["over_sb3_dqn"] is not None else "-"
        grad_ms = f"{row['ms_per_gradient_step']:.1f}" if row["ms_per_gradient_step"] is not None else "-"
        print(f"| {row['device']} | {row['books']} | {row['row']} | {row['env_steps_per_s']:,.0f} | {over} | "
              f"{row['collect_only_env_steps_per_s']:,.0f} | {grad_ms} | "
              f"{row['train_freq']} x {row['gradient_steps']} | {row['replay_ratio']:.3f} |")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the arguments, run, print and write the JSON.

    :param argv: command-line arguments (None: ``sys.argv``).
    :return: the result.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", nargs="+", default=None, help="cpu and/or cuda (default: cpu, and cuda)")
    parser.add_argument("--books", nargs="+", type=int, default=[16, 256, 4096, 65536])
    parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), choices=ROWS)
    parser.add_argument("--widths", nargs="+", type=int, default=[128, 128])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--iqn-sizes", choices=list(IQN_SIZES), default="generic",
                        help="BranchingIQN's head sizes: generic defaults or foxhunt's presets")
    parser.add_argument("--replay-ratio", type=float, default=0.25)
    parser.add_argument("--buffer-size", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="wall time of each timed learn")
    parser.add_argument("--diagnostics-interval", type=int, default=1_000_000)
    parser.add_argument("--data", default="synthetic", help="'synthetic' or a LOBSTER folder")
    parser.add_argument("--levels", type=int, default=5)
    parser.add_argument("--num-steps", type=int, default=20_000, help="synthetic market length")
    parser.add_argument("--episode-length", type=int, default=1000)
    parser.add_argument("--compile-env", action="store_true", help="torch.compile the device loop's env step")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--quick", action="store_true",
                        help="widths 32, batch 32, 2 s rows, 200-step episodes")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = ["cpu", "cuda"] if th.cuda.is_available() else ["cpu"]
    if args.quick:
        args.widths, args.batch, args.seconds, args.episode_length = [32], 32, 2.0, 200
        args.buffer_size = min(args.buffer_size, 100_000)
    if args.threads is not None:
        th.set_num_threads(args.threads)
    return report(run(args), print_table, args.out)


if __name__ == "__main__":
    main()
