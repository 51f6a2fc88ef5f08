"""Many seeds on one GPU: the wall seconds of K seeds trained at once against one seed alone (issue 24.2).

Every row trains runs of one ``foxhunt.runs.RunConfig`` (the default agent on the planted market), seeds
0..K-1, with :func:`foxhunt.runs.train_concurrently` (training, the final held-out evaluation and the run
folder, as ``foxhunt train`` makes them):

* ``threads``: seed 0 alone in this process (after an untimed warm-up run that loads CUDA, cuBLAS and
  ``cuda_ext``), then the K seeds at once in this process, a thread and a CUDA stream each;
* ``processes``: seed 0 alone in one fresh process, then the K seeds in K fresh processes at once (each
  process's start, CUDA context and imports counted, in both).

The ratio is the batch's wall over the lone wall of the same mode (the target: 5 seeds in <= 2x one seed's
wall). Each batch's seed 0 is compared with the lone seed 0, parameter for parameter (``identical``).

Usage::

    python benchmarks/concurrent_seeds.py --device cuda --seeds 5 --steps 131072
    python benchmarks/concurrent_seeds.py --quick      # a CPU smoke run

Prints the table and writes ``benchmarks/results/concurrent_seeds.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages
from _common import default_out, machine_info, write_json  # noqa: E402

from foxhunt.runs import RunConfig, train, train_concurrently  # noqa: E402

MODES = ("threads", "processes")


def same_parameters(first: Path, second: Path) -> bool:
    """Whether two run folders' models hold equal parameters and buffers, bit for bit."""
    from sb3_her_ext import BranchingIQN

    a = BranchingIQN.load(first / "model.zip", device="cpu").policy.state_dict()
    b = BranchingIQN.load(second / "model.zip", device="cpu").policy.state_dict()
    return list(a) == list(b) and all(th.equal(a[name], b[name]) for name in a)


def measure(mode: str, config: RunConfig, seeds: int, root: Path) -> dict[str, Any]:
    """Seed 0 alone, then ``seeds`` seeds at once, in ``mode``; their walls, ratio and seed 0's identity."""
    processes = mode == "processes"

    def configs(name: str, count: int) -> list[RunConfig]:
        return [dataclasses.replace(config, seed=seed, out=str(root / mode / name / f"seed{seed}"))
                for seed in range(count)]

    if not processes:  # load CUDA, cuBLAS and cuda_ext outside the clock (a process row counts them)
        train(dataclasses.replace(config, steps=min(config.steps, 4 * config.n_envs * 64),
                                  out=str(root / mode / "warmup")))
    start = time.perf_counter()
    alone = train_concurrently(configs("alone", 1), processes=processes)
    alone_s = time.perf_counter() - start
    start = time.perf_counter()
    batch = train_concurrently(configs("batch", seeds), processes=processes)
    batch_s = time.perf_counter() - start
    return {"mode": mode, "seeds": seeds, "alone_s": alone_s, "batch_s": batch_s, "ratio": batch_s / alone_s,
            "seed0_identical": same_parameters(alone[0], batch[0])}


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the rows."""
    lines = ["| mode | seeds | one seed alone, s | seeds at once, s | ratio (target <= 2) "
             "| seed 0 as alone |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['mode']} | {row['seeds']} | {row['alone_s']:.1f} | {row['batch_s']:.1f} | "
                     f"**{row['ratio']:.2f}** | {'yes' if row['seed0_identical'] else 'NO'} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seeds", type=int, default=5, help="seeds trained at once")
    parser.add_argument("--steps", type=int, default=131_072, help="env steps per run (summed over books)")
    parser.add_argument("--n-envs", type=int, default=64, help="books per run")
    parser.add_argument("--signal-strength", type=float, default=2.0, help="the planted signal's strength")
    parser.add_argument("--signal-horizon", type=int, default=5, help="the planted signal's horizon")
    parser.add_argument("--market-steps", type=int, default=100_000, help="steps of each synthetic market")
    parser.add_argument("--eval-steps", type=int, default=200, help="vector steps of each run's evaluation")
    parser.add_argument("--modes", default=",".join(MODES), help="comma separated: threads, processes")
    parser.add_argument("--out", type=Path, default=default_out("concurrent_seeds"))
    parser.add_argument("--quick", action="store_true", help="a tiny CPU smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.seeds, args.steps, args.n_envs, args.market_steps = "cpu", 2, 256, 2, 2_000
        args.eval_steps = 20
    modes = args.modes.split(",")
    if args.seeds < 1 or any(mode not in MODES for mode in modes):
        parser.error(f"--seeds {args.seeds} must be >= 1 and --modes {args.modes!r} a list of {MODES}")
    args.modes = modes
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure every mode; print the table; write the JSON."""
    args = parse_args(argv)
    small = {"learning_starts": 100, "batch_size": 16, "buffer_size": 1_000} if args.quick else {}
    config = RunConfig(steps=args.steps, n_envs=args.n_envs, device=args.device, eval_steps=args.eval_steps,
                       progress=False, checkpoint_every=0, synthetic_market_steps=args.market_steps,
                       env={"market": {"signal_strength": args.signal_strength,
                                       "signal_horizon": args.signal_horizon}},
                       model_kwargs=small or None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="concurrent_seeds-") as root:
        for mode in args.modes:
            rows.append(measure(mode, config, args.seeds, Path(root)))
            print(f"{mode}: {args.seeds} seeds at once {rows[-1]['batch_s']:.1f} s, one alone "
                  f"{rows[-1]['alone_s']:.1f} s, ratio {rows[-1]['ratio']:.2f}", flush=True)
    markdown = table(rows)
    print(f"\n{args.steps:,} env steps x {args.n_envs} books per run on {args.device}, planted market "
          f"strength {args.signal_strength:g}\n\n{markdown}")
    write_json(args.out, {"benchmark": "concurrent_seeds", "args": {**vars(args), "out": str(args.out)},
                          "config": config.to_dict(), "machine": machine_info(), "rows": rows,
                          "table": markdown})
    return {"rows": rows, "table": markdown}


if __name__ == "__main__":
    main()
