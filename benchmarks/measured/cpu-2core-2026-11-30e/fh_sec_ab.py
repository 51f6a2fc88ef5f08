"""In-process A/B of the CPU gradient step: the start code (a checkout at $BASE) against the installed code.

Swaps in the base versions of the BranchingQNetwork methods named in argv[1] (comma-separated) and of the
loss functions named in argv[2], alternating base and new step by step, and records thread time of the whole
step and of sections (taken head forward with and without autograd, head backward, quantile-Huber forward).
Usage: BASE=/tmp/fh_base python fh_sec_ab.py taken_quantiles_and_logits,mean_values quantile_huber_loss
"""

import collections
import importlib.util
import os
import statistics
import sys
import time

import torch as th

sys.path.insert(0, "/work/main/benchmarks")
from gymnasium import spaces
from train_step import NVEC, RandomBoxEnv

import sb3_her_ext.algorithm as new_alg
import sb3_her_ext.losses as new_losses
import sb3_her_ext.policy as new_policy
from sb3_her_ext import BranchingIQN

BASE = os.environ.get("BASE", "/tmp/fh_base")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


base_policy = load("base_policy", f"{BASE}/sb3_her_ext/policy.py")
base_losses = load("base_losses", f"{BASE}/sb3_her_ext/losses.py")
acc = collections.defaultdict(float)


def timed(f, label):
    def g(*a, **k):
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.thread_time() - t

    return g


for mod in (base_policy, new_policy):
    cls = mod._TakenQuantileHead
    fwd, bwd = cls.forward, cls.backward

    def f2(ctx, *a, _f=fwd):
        t = time.thread_time()
        try:
            return _f(ctx, *a)
        finally:
            acc["head fwd " + ("G" if any(ctx.needs_input_grad) else "N")] += time.thread_time() - t

    cls.forward = staticmethod(f2)
    cls.backward = staticmethod(timed(bwd, "head bwd"))
for mod in (base_losses, new_losses):
    mod._QuantileHuber.forward = staticmethod(timed(mod._QuantileHuber.forward, "huber fwd"))
SWAPS = {}
if os.environ.get("NEW_ROWS"):
    new_policy.CPU_EMBEDDING_ROWS_PER_BLOCK = int(os.environ["NEW_ROWS"])
if os.environ.get("NEW_CHUNK"):
    new_losses.CPU_PAIRS_PER_CHUNK = int(os.environ["NEW_CHUNK"])
for n in [n for n in sys.argv[1].split(",") if n]:
    SWAPS[(new_policy.BranchingQNetwork, n)] = (
        getattr(base_policy.BranchingQNetwork, n),
        getattr(new_policy.BranchingQNetwork, n),
    )
for n in [n for n in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if n]:
    SWAPS[(new_alg, n)] = (getattr(base_losses, n), getattr(new_alg, n))
SWAPS = {k: tuple(timed(f, "swapped " + k[1]) for f in v) for k, v in SWAPS.items()}


def use(which):
    for (owner, n), pair in SWAPS.items():
        setattr(owner, n, pair[which])


th.set_num_threads(1)
kw = dict(net_arch=[256, 256], n_quantiles=32, n_quantiles_target=32, n_quantiles_act=32)
m = BranchingIQN(
    "MlpPolicy",
    RandomBoxEnv(64, spaces.MultiDiscrete(list(NVEC))),
    policy_kwargs=kw,
    learning_starts=2000,
    buffer_size=10000,
    batch_size=256,
    train_freq=1,
    gradient_steps=0,
    seed=0,
    device="cpu",
    verbose=0,
)
m.learn(2000)
for w in (0, 1, 0, 1):
    use(w)
    m.train(gradient_steps=5, batch_size=256)
res = {0: [], 1: []}
sec = {0: [], 1: []}
loads = []
STEPWISE = os.environ.get("STEPWISE", "1") == "1"
for i in range(int(os.environ.get("BLOCKS", 20))):
    if STEPWISE:  # 10 steps, the variants alternating step by step (each gets one of the two vaccine steps)
        tot = {0: 0.0, 1: 0.0}
        s = {0: collections.Counter(), 1: collections.Counter()}
        for j in range(10):
            w = (j + i) % 2
            use(w)
            acc.clear()
            a = time.thread_time()
            m.train(gradient_steps=1, batch_size=256)
            tot[w] += time.thread_time() - a
            s[w].update(acc)
        for w in (0, 1):
            res[w].append(tot[w] / 5 * 1e3)
            sec[w].append({k: v / 5 * 1e3 for k, v in s[w].items()})
    else:
        for w in (0, 1) if i % 2 == 0 else (1, 0):
            use(w)
            acc.clear()
            a = time.thread_time()
            m.train(gradient_steps=5, batch_size=256)
            res[w].append((time.thread_time() - a) / 5 * 1e3)
            sec[w].append({k: v / 5 * 1e3 for k, v in acc.items()})
    loads.append(os.getloadavg()[0])
diffs = [b - a for a, b in zip(res[0], res[1], strict=True)]
q = statistics.quantiles(diffs, n=4)
print(
    f"swapped {[n for _, n in SWAPS]}: step base {statistics.median(res[0]):.2f} "
    f"new {statistics.median(res[1]):.2f} ms/step; median paired diff {statistics.median(diffs):+.2f} "
    f"(IQR {q[0]:+.2f}..{q[2]:+.2f}, n={len(diffs)}); load1 {min(loads):.2f}-{max(loads):.2f}"
)
for k in sorted(sec[0][0]):
    a = [d.get(k, 0) for d in sec[0]]
    b = [d.get(k, 0) for d in sec[1]]
    d = [y - x for x, y in zip(a, b, strict=True)]
    q = statistics.quantiles(d, n=4)
    print(
        f"  {k:12s} base {statistics.median(a):6.2f} new {statistics.median(b):6.2f} ms/step  "
        f"paired {statistics.median(d):+.2f} (IQR {q[0]:+.2f}..{q[2]:+.2f})"
    )
