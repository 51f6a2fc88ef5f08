import sys
import time

import torch as th

th.set_num_threads(1)
sys.path.insert(0, "benchmarks")
from gymnasium import spaces
from sb3_contrib import QRDQN
from train_step import NVEC, RandomBoxEnv

from sb3_her_ext import BranchingIQN

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
which = sys.argv[1] if len(sys.argv) > 1 else "iqn"
if which == "iqn":
    m = BranchingIQN(
        "MlpPolicy", RandomBoxEnv(64, spaces.MultiDiscrete(list(NVEC))), policy_kwargs=pk, **common
    )
else:
    m = QRDQN(
        "MlpPolicy",
        RandomBoxEnv(64, spaces.Discrete(81)),
        policy_kwargs=dict(net_arch=widths, n_quantiles=nq),
        **common,
    )
m.learn(fill)
m.train(gradient_steps=10, batch_size=256)
t = time.thread_time()
m.train(gradient_steps=20, batch_size=256)
print("thread ms/step", (time.thread_time() - t) / 20 * 1e3)
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CPU]) as p:
    m.train(gradient_steps=10, batch_size=256)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=35))
