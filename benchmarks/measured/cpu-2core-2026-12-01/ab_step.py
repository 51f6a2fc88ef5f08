"""In-process A/B of the default CPU gradient step: the code at $BASE (a `git archive` of sb3_her_ext) against
the working tree, alternating step by step in one process (thread time, one torch thread).

The base versions of ``sb3_her_ext.losses``, ``policy`` and ``algorithm`` are loaded from $BASE (each base
module's imports of the other two resolve to the base copies); the base variant swaps in every function
that the base ``BranchingIQN`` and ``BranchingQNetwork`` classes define, so the whole step runs the base
code on the same model, buffer and draws. 10-step blocks, the variants alternating step by step, each
getting 5 steps and one vaccine step per block (the order flips every block).

Usage: BASE=/tmp/fh_base BLOCKS=60 PYTHONPATH=. python benchmarks/measured/cpu-2core-2026-12-01/ab_step.py
"""

import importlib.util
import os
import statistics
import sys
import time

import torch as th

sys.path.insert(0, "benchmarks")
from gymnasium import spaces
from train_step import NVEC, RandomBoxEnv

import sb3_her_ext.algorithm as new_alg
import sb3_her_ext.policy as new_policy

BASE = os.environ.get("BASE", "/tmp/fh_base")


def load_base(name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"base_{name}", f"{BASE}/sb3_her_ext/{name}.py")
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules[f"sb3_her_ext.{name}"]
    sys.modules[f"sb3_her_ext.{name}"] = module  # the later base modules import this copy
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules[f"sb3_her_ext.{name}"] = saved
    return module


saved_modules = {n: sys.modules[f"sb3_her_ext.{n}"] for n in ("losses", "policy")}
base_losses = load_base("losses")
sys.modules["sb3_her_ext.losses"] = base_losses
base_policy = load_base("policy")
sys.modules["sb3_her_ext.policy"] = base_policy
base_alg = load_base("algorithm")
for n, module in saved_modules.items():
    sys.modules[f"sb3_her_ext.{n}"] = module

def calls_super(fn: object) -> bool:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is not None and "__class__" in code.co_freevars


PAIRS = [
    (new_alg.BranchingIQN, base_alg.BranchingIQN),
    (new_policy.BranchingQNetwork, base_policy.BranchingQNetwork),
]
VARIANTS = []
for new_cls, base_cls in PAIRS:
    names = set(vars(new_cls)) | set(vars(base_cls))
    names = {n for n in names if callable(vars(new_cls).get(n)) or callable(vars(base_cls).get(n))}
    names.discard("__init__")
    # methods calling super() (their __class__ cell is the base class) stay new: setup and SB3 plumbing
    names = {n for n in names if not calls_super(vars(new_cls).get(n))}
    VARIANTS.append(
        (new_cls, {n: vars(base_cls).get(n) for n in names}, {n: vars(new_cls).get(n) for n in names})
    )


def use(which: int) -> None:
    for cls, base, new in VARIANTS:
        for name, value in (base if which == 0 else new).items():
            if value is None:
                if name in vars(cls):
                    delattr(cls, name)
            else:
                setattr(cls, name, value)


th.set_num_threads(1)
kw = dict(net_arch=[256, 256], n_quantiles=32, n_quantiles_target=32, n_quantiles_act=32)
m = new_alg.BranchingIQN(
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
vaccine = {0: [], 1: []}  # each variant's vaccine step of the block
loads = []
for i in range(int(os.environ.get("BLOCKS", 40))):
    tot = {0: 0.0, 1: 0.0}
    for j in range(10):
        w = (j + i) % 2
        use(w)
        a = time.thread_time()
        m.train(gradient_steps=1, batch_size=256)
        elapsed = time.thread_time() - a
        tot[w] += elapsed
        if m._vaccine_due():
            vaccine[w].append(elapsed * 1e3)
    for w in (0, 1):
        res[w].append(tot[w] / 5 * 1e3)
    loads.append(os.getloadavg()[0])
use(1)
diffs = [b - a for a, b in zip(res[0], res[1], strict=True)]
q = statistics.quantiles(diffs, n=4)
print(
    f"step base {statistics.median(res[0]):.2f} new {statistics.median(res[1]):.2f} ms/step; "
    f"median paired diff {statistics.median(diffs):+.2f} (IQR {q[0]:+.2f}..{q[2]:+.2f}, n={len(diffs)}); "
    f"load1 {min(loads):.2f}-{max(loads):.2f}"
)
vaccine_diffs = [b - a for a, b in zip(vaccine[0], vaccine[1], strict=True)]
print(
    f"vaccine steps alone: base {statistics.median(vaccine[0]):.2f} "
    f"new {statistics.median(vaccine[1]):.2f} ms; "
    f"median paired diff {statistics.median(vaccine_diffs):+.2f} (n={len(vaccine_diffs)})"
)
