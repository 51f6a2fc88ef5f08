import sys
import time

import torch as th

sys.path.insert(0, "benchmarks")
from gymnasium import spaces
from torch.profiler import ProfilerActivity, profile
from train_step import NVEC, RandomBoxEnv

from sb3_her_ext import BranchingIQN

pk = dict(net_arch=[256, 256], n_quantiles=32, n_quantiles_target=32, n_quantiles_act=32)


def prof(det):
    m = BranchingIQN(
        "MlpPolicy",
        RandomBoxEnv(56, spaces.MultiDiscrete(list(NVEC))),
        policy_kwargs=pk,
        learning_starts=2000,
        buffer_size=10000,
        batch_size=256,
        train_freq=1,
        gradient_steps=0,
        seed=0,
        device="cuda",
        verbose=0,
    )
    m.learn(2000)
    th.use_deterministic_algorithms(det)
    m.train(gradient_steps=25, batch_size=256)
    th.cuda.synchronize()
    t = time.perf_counter()
    m.train(gradient_steps=50, batch_size=256)
    th.cuda.synchronize()
    print(f"det={det} steps/s={50 / (time.perf_counter() - t):.1f}", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        m.train(gradient_steps=10, batch_size=256)
        th.cuda.synchronize()
    return {
        e.key: (e.count, e.self_cpu_time_total, e.cpu_time_total, e.self_device_time_total)
        for e in p.key_averages()
    }


a = prof(False)
b = prof(True)
rows = []
for k in set(a) | set(b):
    ca, sa, ta, da = a.get(k, (0, 0, 0, 0))
    cb, sb, tb, db = b.get(k, (0, 0, 0, 0))
    rows.append((tb - ta, k, ca, cb, ta / 1e3, tb / 1e3, da / 1e3, db / 1e3))
rows.sort(reverse=True)
print("delta_total_ms key count_off count_on total_off_ms total_on_ms dev_off_ms dev_on_ms (per 10 steps)")
for r in rows[:30]:
    print(
        f"{r[0] / 1e3:8.2f} {r[1][:70]:70s} {r[2]:5d} {r[3]:5d} "
        f"{r[4]:8.2f} {r[5]:8.2f} {r[6]:7.2f} {r[7]:7.2f}"
    )
