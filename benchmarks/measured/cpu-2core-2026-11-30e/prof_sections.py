import functools
import sys
import time

import torch as th

th.set_num_threads(1)
sys.path.insert(0, "benchmarks")
from gymnasium import spaces
from torch.profiler import ProfilerActivity, profile, record_function
from train_step import NVEC, RandomBoxEnv

import sb3_her_ext.algorithm as alg
import sb3_her_ext.policy as pol
import sb3_her_ext.replay as rep
from sb3_her_ext import BranchingIQN


def wrap(obj, name, label):
    f = getattr(obj, name)

    @functools.wraps(f)
    def g(*a, **k):
        with record_function("SEC:" + label):
            return f(*a, **k)

    setattr(obj, name, g)


wrap(alg, "_mean_values", "target.mean_values")
wrap(alg, "quantile_huber_loss", "huber.fwd")
wrap(alg, "c51_project", "c51_project")
wrap(alg, "c51_cross_entropy", "c51_ce")
wrap(pol.BranchingQNetwork, "taken_quantiles_and_logits", "taken_pass")
wrap(pol.BranchingQNetwork, "branch_features", "branch_features")
wrap(
    rep.PrioritizedReplayBuffer
    if hasattr(rep, "PrioritizedReplayBuffer")
    else rep.__dict__[[k for k in rep.__dict__ if k.endswith("Buffer")][0]],
    "sample",
    "replay.sample",
)
for cls in [v for v in rep.__dict__.values() if isinstance(v, type) and hasattr(v, "update_priorities")]:
    wrap(cls, "update_priorities", "replay.update")
    wrap(cls, "sample_stratified", "replay.sample_strat")
    break
wrap(BranchingIQN, "_vaccinate", "vaccinate")
wrap(BranchingIQN, "_distributional_loss", "dist_loss(fwd)")
wrap(th.nn.utils, "clip_grad_norm_", "clip")
wrap(th.Tensor, "backward", "backward")
widths = [256, 256]
nq = 32
fill = 2000
common = dict(
    learning_starts=fill,
    buffer_size=10_000,
    batch_size=256,
    train_freq=1,
    gradient_steps=0,
    seed=0,
    device="cpu",
    verbose=0,
)
pk = dict(net_arch=widths, n_quantiles=nq, n_quantiles_target=nq, n_quantiles_act=nq)
m = BranchingIQN("MlpPolicy", RandomBoxEnv(64, spaces.MultiDiscrete(list(NVEC))), policy_kwargs=pk, **common)
wrap(type(m.policy.optimizer), "step", "optimizer.step")
m.learn(fill)
m.train(gradient_steps=10, batch_size=256)
t = time.thread_time()
m.train(gradient_steps=20, batch_size=256)
print("thread ms/step", (time.thread_time() - t) / 20 * 1e3)
with profile(activities=[ProfilerActivity.CPU]) as p:
    m.train(gradient_steps=20, batch_size=256)
ev = p.key_averages()
rows = [
    (e.key, e.cpu_time_total / 20 / 1e3, e.count / 20)
    for e in ev
    if e.key.startswith("SEC:")
    or "Backward" in e.key
    and e.key[0].isupper()
    or e.key.startswith("autograd::engine::evaluate_function: _")
]
for k, ms, c in sorted(rows, key=lambda r: -r[1])[:40]:
    print(f"{ms:8.2f} ms/step {c:6.1f}/step  {k}")
