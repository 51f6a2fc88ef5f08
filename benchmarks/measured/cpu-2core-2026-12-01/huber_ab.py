"""The quantile-Huber loss of the training step, base (a checkout at $BASE) against the working tree.

Checks values and the network output's gradient bit for bit, then alternates the two forward + backward
(thread time, one thread). Usage: BASE=/tmp/fh_base PYTHONPATH=. python huber_ab.py [reps]
"""

import importlib.util
import os
import statistics
import sys
import time

import torch as th

import sb3_her_ext.losses as new_losses

th.set_num_threads(1)
BASE = os.environ.get("BASE", "/tmp/fh_base")
spec = importlib.util.spec_from_file_location("base_losses", f"{BASE}/sb3_her_ext/losses.py")
base_losses = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base_losses)
E, B, NB, N = 5, 256, 4, 32
gen = th.Generator().manual_seed(0)
out = (th.randn(B, NB * E, N, generator=gen) * 1.5).requires_grad_()
y = th.randn(E, B, N, generator=gen) * 1.5
taus = th.rand(B, N, generator=gen)
upstream = th.rand(B, generator=gen)


def run(mod):
    z = out.view(B, NB, E, N).permute(2, 0, 1, 3)
    target = y[:, :, None, :].expand(-1, -1, NB, -1)
    loss = mod.quantile_huber_loss(z, target, taus[None, :, None, :].expand_as(z))
    l_q = loss.mean(dim=(0, 2))
    (grad,) = th.autograd.grad((l_q * upstream).mean(), out)
    return loss, l_q, grad


a, b = run(base_losses), run(new_losses)
print("bitwise equal (loss, l_q, grad):", [th.equal(x, y) for x, y in zip(a, b, strict=True)])
res = {0: [], 1: []}
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 40):
    for w in (0, 1) if i % 2 == 0 else (1, 0):
        t = time.thread_time()
        run((base_losses, new_losses)[w])
        res[w].append((time.thread_time() - t) * 1e3)
d = [y - x for x, y in zip(res[0], res[1], strict=True)]
print(f"base {statistics.median(res[0]):.2f} new {statistics.median(res[1]):.2f} ms; "
      f"median paired {statistics.median(d):+.2f} ms (n={len(d)})")
