"""Non-view aten ops dispatched per default CPU gradient step, by section and op (10 steps, 2 vaccine steps).

Usage: PYTHONPATH=. python benchmarks/measured/cpu-2core-2026-12-01/op_census.py
"""

import collections
import functools
import sys

import torch as th

th.set_num_threads(1)
sys.path.insert(0, "benchmarks")
from gymnasium import spaces
from torch.utils._python_dispatch import TorchDispatchMode
from train_step import NVEC, RandomBoxEnv

import sb3_her_ext.algorithm as alg
import sb3_her_ext.policy as pol
from sb3_her_ext import BranchingIQN

stack = ["other"]
counts = collections.Counter()


class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        is_view = func._schema.is_mutable is False and any(
            a.alias_info is not None for a in func._schema.returns
        )
        if not is_view:
            counts[(stack[-1], func.__name__)] += 1
        return func(*args, **(kwargs or {}))


def wrap(obj, name, label):
    f = getattr(obj, name)

    @functools.wraps(f)
    def g(*a, **k):
        stack.append(label)
        try:
            return f(*a, **k)
        finally:
            stack.pop()

    setattr(obj, name, g)


wrap(alg, "_mean_values", "mean_values")
wrap(alg, "quantile_huber_loss", "huber")
wrap(alg, "c51_project", "c51_project")
wrap(alg, "c51_cross_entropy", "c51_ce")
wrap(pol.BranchingQNetwork, "taken_quantiles_and_logits", "taken_pass")
wrap(pol.BranchingQNetwork, "branch_features", "branch_features")
wrap(BranchingIQN, "_vaccinate", "vaccinate")
wrap(th.Tensor, "backward", "backward")
wrap(th.nn.utils, "clip_grad_norm_", "clip")
kw = dict(net_arch=[256, 256], n_quantiles=32, n_quantiles_target=32, n_quantiles_act=32)
m = BranchingIQN(
    "MlpPolicy", RandomBoxEnv(64, spaces.MultiDiscrete(list(NVEC))), policy_kwargs=kw,
    learning_starts=2000, buffer_size=10000, batch_size=256, train_freq=1, gradient_steps=0, seed=0,
    device="cpu", verbose=0,
)
wrap(type(m.policy.optimizer), "step", "optimizer")
m.learn(2000)
m.train(gradient_steps=10, batch_size=256)
with Count():
    m.train(gradient_steps=10, batch_size=256)
by_sec = collections.Counter()
for (sec, _op), c in counts.items():
    by_sec[sec] += c
print(f"total non-view ops/step {sum(counts.values()) / 10:.1f}")
for sec, c in by_sec.most_common():
    print(f"{sec:16s} {c / 10:7.1f}")
    for (s, op), c2 in counts.most_common():
        if s == sec and c2 >= 10:
            print(f"    {op:40s} {c2 / 10:7.1f}")
