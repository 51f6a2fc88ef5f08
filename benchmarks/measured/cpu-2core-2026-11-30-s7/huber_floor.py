"""The default step's quantile-Huber loss alone: forward + backward of ``[5, 256, 4, 32]`` quantiles (a
permuted view, as in training) against ``N' = 32`` targets, eager (the fused autograd function) and
``torch.compile``'d.

Usage: PYTHONPATH=. python benchmarks/measured/cpu-2core-2026-11-30-s7/huber_floor.py THREADS
"""

import sys
import time

import torch as th

from sb3_her_ext.losses import quantile_huber_loss

th.set_num_threads(int(sys.argv[1]))
gen = th.Generator().manual_seed(0)
out = th.randn(256, 20, 32, generator=gen).requires_grad_()
current = out.view(256, 4, 5, 32).permute(2, 0, 1, 3)
target = th.randn(5, 256, 1, 32, generator=gen).expand(-1, -1, 4, -1)
taus = th.rand(256, 32, generator=gen)[None, :, None, :].expand_as(current)
weights = th.rand(256, generator=gen)


def run(compiled: bool) -> None:
    loss = quantile_huber_loss(current, target, taus, compiled=compiled)
    (loss.mean(0).sum(-1) * weights).mean().backward()


for compiled in (False, True):
    for _ in range(5):  # warm-up (and the compile)
        run(compiled)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(10):
            run(compiled)
        times.append((time.perf_counter() - start) / 10 * 1e3)
    times.sort()
    print(f"threads={sys.argv[1]} compiled={compiled}: forward + backward {times[3]:.2f} ms (median, 7 x 10)")
