"""Graphed ops-only replay cycle (push 4096, refresh, sample B, update B; P = 2^20), several variants captured
in one process and timed in interleaved rounds (9 rounds of 200 back-to-back replays, CUDA events).

Run from a tree's root: ``python cycle_ab.py LABEL`` prints ``LABEL variant B=.. median .. us [rounds]``.
Variants: ``philox`` (``per_sample_philox``: the kernel draws the uniforms), ``torch`` (``uniform_`` then
``per_sample``; a tree without ``per_sample_philox`` has only this one), each also captured with
``FOXHUNT_CUDA_PDL=0`` (``-nopdl``). ``VARIANTS=a,b`` keeps some; ``BS=256,1024`` sets the batch sizes.
"""

import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from replay_throughput import Batch, CudaExtPER, _capture_cycle

label = sys.argv[1]
device = torch.device("cuda")
has_philox = hasattr(torch.ops.cuda_ext, "per_sample_philox")
variants = [("philox", True), ("torch", False)] if has_philox else [("torch", None)]
variants = variants + [(name + "-nopdl", philox) for name, philox in variants]
if os.environ.get("VARIANTS"):
    variants = [v for v in variants if v[0] in os.environ["VARIANTS"].split(",")]
batch = Batch(4096, 64, 4, device)
graphs = {}
for name, philox in variants:
    os.environ["FOXHUNT_CUDA_PDL"] = "0" if name.endswith("nopdl") else "1"  # read when a kernel is captured
    for batch_size in [int(x) for x in os.environ.get("BS", "256,1024,4096").split(",")]:
        buffer = CudaExtPER(1 << 20, 64, 4, device)
        uniforms = torch.zeros(batch_size, dtype=torch.float64, device=device)
        td_abs = torch.rand(batch_size, device=device)
        extra = () if philox is None else (philox,)
        graph = _capture_cycle(buffer, batch, uniforms, td_abs, False, *extra)
        for _ in range(20):
            graph.replay()
        graphs[(name, batch_size)] = (graph, buffer, uniforms, td_abs)
torch.cuda.synchronize()
times = {key: [] for key in graphs}
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for _round in range(9):
    for key, (graph, *_) in graphs.items():
        start.record()
        for _ in range(200):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times[key].append(start.elapsed_time(end) * 1000 / 200)
for (name, batch_size), values in times.items():
    rounds = " ".join(f"{x:.1f}" for x in values)
    print(f"{label} {name:13s} B={batch_size:5d} median {statistics.median(values):6.2f} us  [{rounds}]")
