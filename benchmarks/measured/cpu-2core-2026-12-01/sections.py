"""Thread time per default CPU gradient step by section (inclusive), no profiler: wrappers around functions.

Usage: PYTHONPATH=. python benchmarks/measured/cpu-2core-2026-12-01/sections.py [steps]
"""

import collections
import functools
import sys
import time

import torch as th

th.set_num_threads(1)
sys.path.insert(0, "benchmarks")
from gymnasium import spaces
from train_step import NVEC, RandomBoxEnv

import sb3_her_ext.algorithm as alg
import sb3_her_ext.policy as pol
from sb3_her_ext import BranchingIQN

acc = collections.Counter()


def wrap(obj, name, label, static=False):
    f = getattr(obj, name)

    @functools.wraps(f)
    def g(*a, **k):
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.thread_time() - t

    setattr(obj, name, staticmethod(g) if static else g)


wrap(alg, "_mean_values", "mean_values (no grad)")
wrap(alg, "quantile_huber_loss", "huber fwd")
wrap(alg, "c51_project", "c51_project")
wrap(alg, "c51_cross_entropy", "c51_ce")
wrap(pol.BranchingQNetwork, "taken_quantiles_and_logits", "taken_pass (both)")
wrap(pol.BranchingQNetwork, "branch_features", "branch_features (all)")
wrap(pol.BranchingQNetwork, "_c51_from_features", "c51 logits (all)")
wrap(pol._TakenQuantileHead, "backward", "head bwd", static=True)
wrap(BranchingIQN, "_vaccinate", "vaccinate (incl its loss+bwd)")
wrap(BranchingIQN, "_distributional_loss", "dist_loss fwd (all)")
wrap(th.Tensor, "backward", "backward (all)")
wrap(th.nn.utils, "clip_grad_norm_", "clip")
wrap(alg, "flat_grad", "flat_grad")
wrap(alg, "assign_flat_grad", "assign_flat_grad")
kw = dict(net_arch=[256, 256], n_quantiles=32, n_quantiles_target=32, n_quantiles_act=32)
m = BranchingIQN(
    "MlpPolicy", RandomBoxEnv(64, spaces.MultiDiscrete(list(NVEC))), policy_kwargs=kw,
    learning_starts=2000, buffer_size=10000, batch_size=256, train_freq=1, gradient_steps=0, seed=0,
    device="cpu", verbose=0,
)
wrap(type(m.policy.optimizer), "step", "optimizer")
wrap(type(m.replay_buffer), "sample", "replay sample")
wrap(type(m.replay_buffer), "update_priorities", "replay update")
wrap(type(m.policy.popart), "update", "popart update")
wrap(type(m.diagnostics), "add_train_step", "diag add_train_step")
m.learn(2000)
m.train(gradient_steps=10, batch_size=256)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
acc.clear()
t = time.thread_time()
m.train(gradient_steps=steps, batch_size=256)
total = time.thread_time() - t
print(f"step {total / steps * 1e3:.2f} ms (thread time, {steps} steps)")
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"  {k:32s} {v / steps * 1e3:7.2f} ms/step")
