"""A/B of the graphed ops-only replay cycle: kernel order (and, on that build, the fused op), per build.

Run from a checkout's root: ``python ab_order.py refresh_first,uniform_first,draw_first`` (the fused mode
needs the build of commit 9cb38c2, reverted since).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from replay_throughput import ALPHA, BETA, EPS, OPS, Batch, Timer, new_tree  # noqa: E402


class Cycle:
    def __init__(self, mode, device):
        cap, obs_dim, nb = 1 << 20, 64, 4
        self.mode = mode
        self.obs = torch.zeros(cap, obs_dim, device=device)
        self.next_obs = torch.zeros(cap, obs_dim, device=device)
        self.action = torch.zeros(cap, nb, dtype=torch.int64, device=device)
        self.reward = torch.zeros(cap, device=device)
        self.done = torch.zeros(cap, device=device)
        self.kind = torch.zeros(cap, dtype=torch.int8, device=device)
        self.tree = new_tree(cap, device)
        self.head_size = torch.zeros(2, dtype=torch.int64, device=device)
        self.max_priority = torch.ones(1, device=device)

    def __call__(self, b, uniforms, td_abs):
        if self.mode == "draw_first":
            uniforms.uniform_()
        OPS.per_push(
            self.obs,
            self.next_obs,
            self.action,
            self.reward,
            self.done,
            self.kind,
            self.tree,
            self.head_size,
            self.max_priority,
            b.obs,
            b.next_obs,
            b.action,
            b.reward,
            b.done,
            b.kind,
            b.wants,
            b.priority,
            b.multiplier,
            ALPHA,
        )
        if self.mode == "fused":
            uniforms.uniform_()
            idx, w = OPS.per_refresh_sample(self.tree, self.head_size, uniforms, BETA)
        elif self.mode == "uniform_first":
            uniforms.uniform_()
            OPS.per_tree_refresh(self.tree)
            idx, w = OPS.per_sample(self.tree, self.head_size, uniforms, BETA)
        elif self.mode == "draw_first":
            OPS.per_tree_refresh(self.tree)
            idx, w = OPS.per_sample(self.tree, self.head_size, uniforms, BETA)
        else:  # "refresh_first": the previous session's order
            OPS.per_tree_refresh(self.tree)
            uniforms.uniform_()
            idx, w = OPS.per_sample(self.tree, self.head_size, uniforms, BETA)
        OPS.per_update(self.tree, self.max_priority, idx, td_abs, ALPHA, EPS)


def graph_of(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


dev = torch.device("cuda")
modes = sys.argv[1].split(",")
timer = Timer(dev, 15, 200)
batch = Batch(4096, 64, 4, dev)
for B in (256, 1024, 4096):
    uniforms = torch.zeros(B, dtype=torch.float64, device=dev)
    td = torch.rand(B, device=dev)
    row = []
    for mode in modes:
        c = Cycle(mode, dev)
        g = graph_of(lambda c=c, u=uniforms, t=td: c(batch, u, t))
        row.append(f"{mode}={timer(g.replay):.1f}")
    print(f"PDL={os.environ.get('FOXHUNT_CUDA_PDL', '1')} B={B}: " + "  ".join(row), flush=True)
