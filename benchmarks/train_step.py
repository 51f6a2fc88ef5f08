"""Gradient steps per second of BranchingIQN beside sb3-contrib's QR-DQN, in the same run.

Both algorithms see the same observations (a ``Box`` of ``--obs-dim`` float32 features, like the LOB
env's), the same batch size and the same hidden widths. QR-DQN needs a ``Discrete`` space, so it gets
``Discrete(81)``: the joint space of BranchingIQN's ``MultiDiscrete([3, 3, 3, 3])``, i.e. the same set
of actions. Both buffers are filled with random transitions first (``learn`` with ``learning_starts``
equal to the fill size, so no training happens there); then ``model.train(gradient_steps=k,
batch_size=b)`` is timed (after a warm-up), with a CUDA synchronize around it on the GPU.

Every model is seeded (``seed=0``); a seeded BranchingIQN on CUDA runs with
``torch.use_deterministic_algorithms`` on (its same-seed-same-result setting), which the benchmark switches
back after each row, so the QR-DQN row runs without it; each row records ``deterministic_algorithms``.

Each row also counts the aten ops dispatched per gradient step (``aten_ops_per_step``, views included;
``kernel_ops_per_step`` without the view ops, which launch no kernel), over ``OP_COUNT_STEPS`` more steps:
noise-free, and what predicts the step's cost on a GPU, where it is launch-bound. On the CPU the
quantile-Huber loss and the taken-action IQN head run in blocks of rows (more ops than the one block of the
GPU path). And it counts the matrix-product GFLOP per step (``matmul_gflop_per_step``,
``torch.utils.flop_counter``, forward and backward) and their ratio to QR-DQN's (``gflop_over_qrdqn``): the
arithmetic each step cannot avoid. That ratio is not a floor under the speed ratio, because QR-DQN's step is
not all matrix products: on the CPU about half of it is elementwise work and dispatch
(``benchmarks/RESULTS.md``, "The CPU gradient step's floor").

The products' share is measured per row: the matrix products a step dispatched are recorded (op, shapes,
strides) and replayed alone on random inputs of the same layouts (``matmul_only_ms_per_step``, the median of
``MATMUL_REPLAY_PASSES`` passes over ``OP_COUNT_STEPS`` steps); ``matmul_only_over_qrdqn_step`` divides it by
the peer's whole step. It is what this row's step would cost if everything but its matrix products were
free: a floor under ``qrdqn_over_this`` for any implementation that keeps the products and the BLAS library.

Rows: BranchingIQN with its defaults (5 ensemble heads, IQN + C51, GradVac every 5 steps, PER),
the same with ``compile_loss=True`` (the compile falls in the warm-up), on CUDA the same with
``cuda_graph=True`` (each step one graph replay, the vaccine steps from a second graph; both captures
fall in the warm-up; its op count is what Python still dispatches per step), BranchingIQN "lean" (1 head,
vaccine off) to show what the extras cost, QR-DQN with ``n_quantiles`` = BranchingIQN's quantile count (the
peer: every ratio is against it), and QR-DQN with sb3-contrib's own default of 200 quantiles (what a user
gets from ``QRDQN("MlpPolicy", env)`` at these widths; context only).
Without sb3-contrib (the ``bench`` extra) the QR-DQN rows are skipped with a note and every ratio is empty.

Usage::

    python benchmarks/train_step.py            # CPU, and CUDA when present
    python benchmarks/train_step.py --quick    # small widths / batch / step counts (a smoke run)
    python benchmarks/train_step.py --device cuda

Prints a table and writes ``benchmarks/results/train_step.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
from _common import OpCounter, default_out, machine_info, peer_missing, synchronizer, write_json  # noqa: E402

RESULTS = default_out("train_step")
#: sb3-contrib's ``QRDQNPolicy`` default ``n_quantiles`` (its own row, for context; the peer matches ours).
QRDQN_DEFAULT_QUANTILES = 200
NVEC = (3, 3, 3, 3)
#: Gradient steps whose ops are counted (a multiple of BranchingIQN's default vaccine interval, 5).
OP_COUNT_STEPS = 10
#: Untimed gradient steps before the timed ones: with ``cuda_graph`` the vaccine graph (every 5th step) is
#: captured after 3 eager warm-up steps of its kind, at step 20, so the timed steps are all replays.
WARMUP_STEPS = 25
#: Passes over the recorded matrix products when they are replayed alone (the median pass is kept).
MATMUL_REPLAY_PASSES = 5


@dataclass(frozen=True)
class _Layout:
    """A tensor argument's layout: what a replay needs to rebuild an input of the same shape and strides (a
    leaf for ``tree_map``, unlike a named tuple)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: th.dtype
    device: th.device


def _layout_of(value: Any) -> Any:
    """``value``'s :class:`_Layout` when it is a tensor, else ``value`` (scalars such as ``beta`` stay)."""
    if isinstance(value, th.Tensor):
        return _Layout(tuple(value.shape), tuple(value.stride()), value.dtype, value.device)
    return value


class MatmulRecorder(TorchDispatchMode):
    """Records the matrix products dispatched inside the ``with`` block (the ops ``torch.utils.flop_counter``
    counts: ``mm``, ``bmm``, ``addmm``, ``baddbmm``, their ``out=`` forms, convolutions), with the layouts
    of their tensor arguments, for :func:`replay_matmuls`.

    :param calls: ``(op, args, kwargs)`` per product, tensors replaced by their :class:`_Layout`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, Any, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket in flop_registry:
            self.calls.append((func, tree_map(_layout_of, args), tree_map(_layout_of, kwargs)))
        return func(*args, **kwargs)


def replay_matmuls(calls: list[tuple[Any, Any, Any]], passes: int = MATMUL_REPLAY_PASSES) -> float:
    """Seconds one pass of the recorded matrix products takes when they run alone: the median of ``passes``
    passes, after one untimed pass.

    Each product gets random inputs of its recorded shapes and strides (expanded and strided views too; one
    buffer per layout, shared by the products, so nothing else is allocated in a pass) and writes its
    ``out=`` tensor to separate buffers, so the inputs never change. This is the time of the step's matrix
    products at the BLAS library's rate with nothing else running: what the step would take if everything
    else in it were free.

    :param calls: :attr:`MatmulRecorder.calls`.
    :param passes: timed passes.
    :return: seconds per pass.
    """
    buffers: dict[tuple[str, _Layout], th.Tensor] = {}

    def build(layout: _Layout, role: str) -> th.Tensor:
        key = (role, layout)
        if key not in buffers:
            dims = zip(layout.shape, layout.stride, strict=True)
            extent = 1 + sum((size - 1) * step for size, step in dims)
            storage = th.randn(extent if all(layout.shape) else 0, dtype=layout.dtype, device=layout.device)
            buffers[key] = storage.as_strided(layout.shape, layout.stride)
        return buffers[key]

    def materialise(value: Any, role: str) -> Any:
        return tree_map(lambda v: build(v, role) if isinstance(v, _Layout) else v, value)

    prepared = []
    for func, args, kwargs in calls:
        out = kwargs.get("out")
        inputs = materialise({k: v for k, v in kwargs.items() if k != "out"}, "in")
        outputs = {"out": materialise(out, "out")} if out is not None else {}
        prepared.append((func, materialise(args, "in"), {**inputs, **outputs}))
    devices = {layout.device for role, layout in buffers if layout.device.type == "cuda"}
    times = []
    for index in range(passes + 1):
        for device in devices:
            th.cuda.synchronize(device)
        start = time.perf_counter()
        for func, args, kwargs in prepared:
            func(*args, **kwargs)
        for device in devices:
            th.cuda.synchronize(device)
        if index > 0:  # the first pass is a warm-up
            times.append(time.perf_counter() - start)
    return float(np.median(times))


class RandomBoxEnv(gym.Env):
    """Random ``obs_dim`` observations and rewards; the action space is given (only shapes matter)."""

    def __init__(self, obs_dim: int, action_space: spaces.Space, episode_length: int = 200) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = action_space
        self.episode_length = episode_length
        self.t = 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.standard_normal(self.observation_space.shape).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        obs = self.np_random.standard_normal(self.observation_space.shape).astype(np.float32)
        return obs, float(self.np_random.standard_normal()), False, self.t >= self.episode_length, {}


def _time_train(model: Any, fill: int, steps: int, batch: int, device: th.device) -> float:
    """Fill the buffer, warm up, then time ``model.train``; return gradient steps per second."""
    sync = synchronizer(device)
    model.learn(fill)
    model.train(gradient_steps=WARMUP_STEPS, batch_size=batch)  # allocations, lazy init, graph captures
    sync()
    start = time.perf_counter()
    model.train(gradient_steps=steps, batch_size=batch)
    sync()
    return steps / (time.perf_counter() - start)


def _count_ops(model: Any, steps: int, batch: int) -> tuple[float, float, float | None, float | None]:
    """Aten ops per gradient step of ``model.train`` (all, and without views), its matrix-product GFLOP and
    the seconds its matrix products take alone (:func:`replay_matmuls`), over ``steps`` steps.

    The FLOPs are ``torch.utils.flop_counter``'s (matrix products and convolutions only, forward and
    backward): the arithmetic a step cannot avoid, whatever its elementwise overhead. The last two are None
    for a graphed model, whose replays dispatch no ops to count.
    """
    counter = OpCounter()
    flops = FlopCounterMode(display=False)
    recorder = MatmulRecorder()
    with counter, flops, recorder:
        model.train(gradient_steps=steps, batch_size=batch)
    if getattr(model, "cuda_graph", False):
        return counter.count / steps, counter.kernel_count / steps, None, None
    gflop = flops.get_total_flops() / steps / 1e9
    return counter.count / steps, counter.kernel_count / steps, gflop, replay_matmuls(recorder.calls) / steps


def bench_device(device: str, widths: list[int], batch: int, steps: int, fill: int, obs_dim: int,
                 n_quantiles: int) -> list[dict[str, Any]]:
    """Time the rows on ``device``.

    :param device: ``"cpu"`` or ``"cuda"``.
    :param widths: hidden widths of both networks.
    :param batch: batch size.
    :param steps: timed gradient steps.
    :param fill: transitions in the buffer before timing.
    :param obs_dim: observation features.
    :param n_quantiles: quantiles per sample (IQN current and target; QR-DQN's ``n_quantiles``).
    :return: one dict per row; a QR-DQN row without sb3-contrib has ``skipped`` (why) and no numbers, and
        then every ratio to the peer is None.
    """
    from sb3_her_ext import BranchingIQN

    try:
        from sb3_contrib import QRDQN
    except ImportError as error:
        QRDQN, qrdqn_missing = None, peer_missing("sb3-contrib", error)
    else:
        qrdqn_missing = None

    dev = th.device(device)
    common = dict(learning_starts=fill, buffer_size=max(fill * 2, 10_000), batch_size=batch, train_freq=1,
                  gradient_steps=0, seed=0, device=device, verbose=0)
    iqn_policy = dict(net_arch=widths, n_quantiles=n_quantiles, n_quantiles_target=n_quantiles,
                      n_quantiles_act=n_quantiles)
    md_env = RandomBoxEnv(obs_dim, spaces.MultiDiscrete(list(NVEC)))
    rows = []
    # the peer of the target (every ratio is against it): QR-DQN with BranchingIQN's quantile count
    peer_label = f"QR-DQN (Discrete({int(np.prod(NVEC))}), {n_quantiles} quantiles): the peer"
    setups = [
        ("BranchingIQN (defaults: 5 heads, IQN+C51, GradVac/5, PER)", "BranchingIQN",
         lambda: BranchingIQN("MlpPolicy", md_env, policy_kwargs=iqn_policy, **common)),
        ("BranchingIQN defaults + compile_loss (torch.compile'd quantile-Huber)", "BranchingIQN",
         lambda: BranchingIQN("MlpPolicy", md_env, compile_loss=True, policy_kwargs=iqn_policy, **common)),
        ("BranchingIQN lean (1 head, no vaccine)", "BranchingIQN",
         lambda: BranchingIQN("MlpPolicy", md_env, vaccine_interval=0,
                              policy_kwargs={**iqn_policy, "n_ensemble": 1}, **common)),
        (peer_label, "QRDQN",
         lambda: QRDQN("MlpPolicy", RandomBoxEnv(obs_dim, spaces.Discrete(int(np.prod(NVEC)))),
                       policy_kwargs=dict(net_arch=widths, n_quantiles=n_quantiles), **common)),
        (f"QR-DQN (Discrete({int(np.prod(NVEC))}), its default {QRDQN_DEFAULT_QUANTILES} quantiles)", "QRDQN",
         lambda: QRDQN("MlpPolicy", RandomBoxEnv(obs_dim, spaces.Discrete(int(np.prod(NVEC)))),
                       policy_kwargs=dict(net_arch=widths), **common)),
    ]
    if dev.type == "cuda":  # the gradient step as one CUDA graph replay (vaccine steps: a second graph)
        setups.insert(2, ("BranchingIQN defaults + cuda_graph (graph replay per step)", "BranchingIQN",
                          lambda: BranchingIQN("MlpPolicy", md_env, cuda_graph=True, policy_kwargs=iqn_policy,
                                               **common)))
    for label, algo, make in setups:
        if algo == "QRDQN" and qrdqn_missing is not None:
            rows.append({"row": label, "algorithm": algo, "device": device, "skipped": qrdqn_missing,
                         **dict.fromkeys(("grad_steps_per_s", "deterministic_algorithms", "aten_ops_per_step",
                                          "kernel_ops_per_step", "matmul_gflop_per_step",
                                          "matmul_only_ms_per_step"))})
            continue
        th.manual_seed(0)
        # A seeded BranchingIQN on CUDA turns on deterministic algorithms process-wide: restore the switch
        # after each row so that it does not slow the rows after it (recorded per row).
        deterministic = th.are_deterministic_algorithms_enabled()
        warn_only = th.is_deterministic_algorithms_warn_only_enabled()
        try:
            model = make()
            rate = _time_train(model, fill, steps, batch, dev)
            row_deterministic = th.are_deterministic_algorithms_enabled()
            ops, kernel_ops, gflop, matmul_seconds = _count_ops(model, OP_COUNT_STEPS, batch)
        finally:
            th.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        rows.append({"row": label, "algorithm": algo, "device": device, "grad_steps_per_s": rate,
                     "deterministic_algorithms": row_deterministic, "aten_ops_per_step": ops,
                     "kernel_ops_per_step": kernel_ops, "matmul_gflop_per_step": gflop,
                     "matmul_only_ms_per_step": None if matmul_seconds is None else matmul_seconds * 1e3})
    peer_row = next(row for row in rows if row["row"] == peer_label)
    peer, peer_gflop = peer_row["grad_steps_per_s"], peer_row["matmul_gflop_per_step"]
    peer_step_ms = None if peer is None else 1e3 / peer
    for row in rows:
        row["peer"] = row is peer_row
        rate = row["grad_steps_per_s"]
        row["qrdqn_over_this"] = peer / rate if peer is not None and rate is not None else None
        gflop, matmul_ms = row["matmul_gflop_per_step"], row["matmul_only_ms_per_step"]
        row["gflop_over_qrdqn"] = gflop / peer_gflop if gflop is not None and peer_gflop else None
        # this row's matrix products alone, against the peer's whole step: a floor under qrdqn_over_this
        # for an implementation whose other work were free
        row["matmul_only_over_qrdqn_step"] = (
            None if matmul_ms is None or peer_step_ms is None else matmul_ms / peer_step_ms
        )
    return rows


def _fmt(value: float | None, width: int, digits: int) -> str:
    """``value`` right-aligned in ``width`` with ``digits`` decimals, or ``-`` when None."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def main() -> None:
    """Parse arguments, run the benchmark, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small widths, batch and step counts")
    parser.add_argument("--device", default="all", help="cpu, cuda, or all (cpu + cuda when present)")
    parser.add_argument("--out", default=str(RESULTS), help=f"JSON file (default: {RESULTS})")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads={args.threads} must be >= 1")
        th.set_num_threads(args.threads)
    if args.quick:
        config = dict(widths=[64, 64], batch=64, steps=20, fill=500, obs_dim=56, n_quantiles=16)
    else:
        config = dict(widths=[256, 256], batch=256, steps=100, fill=5_000, obs_dim=56, n_quantiles=32)
    if args.device == "all":
        devices = ["cpu"] + (["cuda"] if th.cuda.is_available() else [])
    elif args.device.startswith("cuda") and not th.cuda.is_available():
        raise ValueError(f"--device={args.device}: no CUDA device available")
    elif args.device in ("cpu",) or args.device.startswith("cuda"):
        devices = [args.device]
    else:
        raise ValueError(f"--device={args.device!r} must be cpu, cuda or all")

    load_before = os.getloadavg()[0]  # other processes on the machine skew CPU rates: recorded alongside
    rows = []
    for device in devices:
        rows += bench_device(device, **config)
    load_after = os.getloadavg()[0]
    print(f"\ntrain-step throughput  (batch {config['batch']}, widths {config['widths']}, "
          f"obs dim {config['obs_dim']}, {config['n_quantiles']} quantiles, {config['steps']} timed steps)")
    print(f"{'device':<7} {'row':<72} {'grad steps/s':>12} {'QR-DQN / this':>14} {'ops/step':>9} "
          f"{'non-view':>9} {'GFLOP/step':>10} {'GFLOP / QR-DQN':>14} {'matmul ms':>10} "
          f"{'matmul / QR-DQN step':>21}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['device']:<7} {row['row']:<72} skipped: {row['skipped']}")
            continue
        print(f"{row['device']:<7} {row['row']:<72} {_fmt(row['grad_steps_per_s'], 12, 1)} "
              f"{_fmt(row['qrdqn_over_this'], 14, 2)} "
              f"{row['aten_ops_per_step']:>9.0f} {row['kernel_ops_per_step']:>9.0f} "
              f"{_fmt(row['matmul_gflop_per_step'], 10, 3)} {_fmt(row['gflop_over_qrdqn'], 14, 2)} "
              f"{_fmt(row['matmul_only_ms_per_step'], 10, 2)} "
              f"{_fmt(row['matmul_only_over_qrdqn_step'], 21, 2)}")
    print("QR-DQN / this: the peer's steps/s over this row's (target: <= 1.5 on the CPU).")
    print("matmul ms: this row's matrix products per step, replayed alone; "
          "matmul / QR-DQN step: that over the peer's whole step.")
    print(f"1-min load average: {load_before:.2f} before, {load_after:.2f} after "
          f"({os.cpu_count()} CPUs, {th.get_num_threads()} torch threads)")
    result = {
        "benchmark": "train_step",
        "config": {**config, "quick": args.quick, "op_count_steps": OP_COUNT_STEPS,
                   "action_space": f"MultiDiscrete({list(NVEC)})",
                   "qrdqn_action_space": f"Discrete({int(np.prod(NVEC))})"},
        "machine": {**machine_info(), "load_average_1min": {"before": load_before, "after": load_after}},
        "rows": rows,
    }
    print()
    write_json(args.out, result)


if __name__ == "__main__":
    main()
