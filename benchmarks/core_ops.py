"""Per-step cost of the batched book core: aten ops per ``BatchedLOB.step`` and microseconds per step.

The op count is the noise-free metric (a CPU step is bound by per-op overhead, and wall time on a busy
machine is noisy); the timings are the median and the best of repeated blocks of steps, single-threaded,
after warm-up (``book-steps/s`` is from the median). ``--compile`` adds rows for
``BatchedLOB.enable_compile()`` (its generated kernels are invisible to the op counter).

Each size gets rows for the plain ``step`` and for ``step_autoreset(host_sync=False)``, the step with the
same-step autoreset fused in (the vector env's path on CUDA). Their op counts are split into the ops of
the capturable part (``_advance`` / ``_advance_autoreset``: what ``enable_compile`` fuses and
``enable_cuda_graph`` captures) and the ops left outside it, each of which stays a separate launch on a
GPU even with a compiled, captured step.

Usage::

    python benchmarks/core_ops.py                      # B = 1, 256, 4096 on the CPU
    python benchmarks/core_ops.py --sizes 1 256 --device cuda --out my.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import torch

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.synthetic import generate_synthetic

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
from _common import OpCounter, default_out, load_average, processor_name, synchronizer, write_json  # noqa: E402

DEFAULT_OUT = default_out("core_ops")


def count_ops(
    env: BatchedLOB, action: torch.Tensor, autoreset: bool = False
) -> tuple[int, int, Counter[str]]:
    """Aten ops of one step and of its capturable part alone.

    :param env: the env (stepped twice; reset first so no book is at its episode end).
    :param action: ``[B, 4]`` action.
    :param autoreset: count ``env.step_autoreset(action, host_sync=False)`` and its capturable part
        ``env._advance_autoreset`` instead of ``env.step`` and ``env._advance``.
    :return: ``(ops of the step, ops of its capturable part, counts of the step by op name)``.
    """
    env.reset()
    with OpCounter() as whole:
        if autoreset:
            env.step_autoreset(action, host_sync=False)
        else:
            env.step(action)
    checked = env._check_action(action)
    offsets = env._draw_offsets() if autoreset else None  # drawn outside the capturable part
    with OpCounter() as capturable:
        if offsets is not None:
            env._advance_autoreset(checked, offsets)
        else:
            env._advance(checked)
    return sum(whole.counts.values()), sum(capturable.counts.values()), whole.counts


def time_steps(
    env: BatchedLOB, actions: torch.Tensor, blocks: int, block_steps: int, autoreset: bool = False
) -> tuple[float, float]:
    """Median and best microseconds per step over ``blocks`` blocks of ``block_steps`` steps (the
    best block is the least disturbed by other load on a shared machine).

    :param env: the env.
    :param actions: ``[N, B, 4]`` actions, used in turn.
    :param blocks: timed blocks (after one warm-up block).
    :param block_steps: steps per block; the env is reset between blocks (not timed).
    :param autoreset: time ``env.step_autoreset(action, host_sync=False)`` instead of ``env.step``.
    :return: ``(median, min)`` µs per step.
    """
    sync = synchronizer(env.device)
    step = partial(env.step_autoreset, host_sync=False) if autoreset else env.step
    per_step = []
    for block in range(blocks + 1):
        env.reset()
        sync()
        started = time.perf_counter()
        for i in range(block_steps):
            step(actions[i % len(actions)])
        sync()
        if block > 0:  # block 0 warms up
            per_step.append((time.perf_counter() - started) / block_steps * 1e6)
    return statistics.median(per_step), min(per_step)


def main() -> None:
    """Parse arguments, measure, print a table and write JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 256, 4096])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--block-steps", type=int, default=100)
    parser.add_argument("--compile", action="store_true", help="also time BatchedLOB.enable_compile()")
    parser.add_argument("--label", default="", help="free text stored with the results (e.g. a commit)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    market = generate_synthetic(5000, seed=0)
    config = EnvConfig(episode_length=args.block_steps + 1)
    rows: list[dict[str, Any]] = []
    header = (("B", 6), ("step", 9), ("autoreset", 9), ("ops/step", 9), ("ops/capturable", 14),
              ("ops/outside", 11), ("us/step", 10), ("best", 8))
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'book-steps/s':>13}")
    for num_books in args.sizes:
        generator = torch.Generator().manual_seed(0)
        actions = torch.randint(0, 3, (16, num_books, 4), generator=generator).to(args.device)
        for autoreset in (False, True):
            for compiled in (False, True) if args.compile else (False,):
                env = BatchedLOB(market, num_books, config=config, device=args.device, seed=0)
                row: dict[str, Any] = {"num_books": num_books, "step": "compiled" if compiled else "eager",
                                       "autoreset": autoreset}
                if compiled:  # the dispatch-mode counter does not see inside the generated kernels
                    env.enable_compile()
                    if autoreset:  # compile outside the timing
                        env.step_autoreset(actions[0], host_sync=False)
                    else:
                        env.step(actions[0])
                else:
                    ops, capturable_ops, by_name = count_ops(env, actions[0], autoreset)
                    row.update(ops_per_step=ops, ops_per_advance=capturable_ops,
                               ops_outside=ops - capturable_ops)
                    row["ops_by_name"] = dict(by_name.most_common())
                median, best = time_steps(env, actions, args.blocks, args.block_steps, autoreset)
                row.update(us_per_step=median, us_per_step_best=best)
                row["book_steps_per_s"] = num_books / row["us_per_step"] * 1e6
                ops_text = " ".join(
                    f"{row.get(key, '-'):>{width}}"
                    for key, width in (("ops_per_step", 9), ("ops_per_advance", 14), ("ops_outside", 11))
                )
                rate_text = f"{median:>10.1f} {best:>8.1f} {row['book_steps_per_s']:>13.3g}"
                kind = f"{num_books:>6} {row['step']:>9} {'yes' if autoreset else 'no':>9}"
                print(f"{kind} {ops_text} {rate_text}")
                rows.append(row)
    result = {
        "label": args.label,
        "device": args.device,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": processor_name(),
        "cpu_count": os.cpu_count(),
        "load_average": load_average(),
        "rows": rows,
    }
    print(f"load average {result['load_average']}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
