"""Replay-buffer throughput: one training-iteration cycle, cuda_ext against its peers, in one run.

A cycle = push 4096 transitions (obs dim 64, 4 action branches), sample B rows, update B priorities
(and rebuild the sum tree where there is one), capacity 2^20, for B = 256 and 4096. Contenders:

* ``cuda_ext``: the cuda_ext PER ops through their typed wrappers (CUDA kernels on a GPU; the references
  on CPU);
* ``cuda_ext (CUDA graph)``: the same cycle captured once and replayed (GPU only), its uniforms drawn inside
  the sampling kernel (``per_sample_philox``: Philox4x32-10 from a ``(seed, counter)`` tensor the kernel
  advances, so every replay draws new numbers);
* ``cuda_ext ops only (CUDA graph)``: that graph without the sampled rows' gather (issue #3's target cycle),
  and ``... torch.rand draws`` the same with ``uniform_`` + ``per_sample`` instead (one more kernel, and
  PyTorch's two per-replay fills of its generator state);
* ``plain PyTorch PER``: priorities in a flat tensor, ``cumsum`` + ``searchsorted`` sampling (this file);
* ``TorchRL PER (CPU tree)``: ``TensorDictPrioritizedReplayBuffer`` with CPU storage and CPU sum tree,
  sampled batches moved to the device (skipped with a note when torchrl is not importable);
* ``SB3 ReplayBuffer (uniform)``: Stable-Baselines3's buffer, add + uniform sample (no priorities).

Timing: warm-up, then ``repeats`` timings of ``inner`` back-to-back cycles (CUDA events on a GPU,
``perf_counter`` on CPU), median per cycle in µs. Ratios are speed-ups over the plain-PyTorch PER
(> 1: faster). If ``benchmarks/op_timings.py`` exists, its ``run(device, quick)`` rows are included.

Usage::

    python benchmarks/replay_throughput.py [--quick] [--device cuda|cpu] [--cuda-ext-only] [--out PATH]

``--cuda-ext-only`` times the plain-PyTorch PER (the ratio's base) and the cuda_ext contenders only, and
no per-op rows (a quick check of the kernels).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import cuda_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
from _common import Timer, capture_graph, default_out, device_name, peer_missing, report  # noqa: E402

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
DEFAULT_OUT = default_out("replay_throughput")


class Batch:
    """One push worth of transitions on a device (fixed contents; the cost measured is the buffer's).

    :param n: transitions per push.
    :param obs_dim: observation width.
    :param n_branches: action branches.
    :param device: where the tensors live.
    :param seed: random seed.
    """

    def __init__(self, n: int, obs_dim: int, n_branches: int, device: torch.device, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(n, obs_dim, generator=generator).to(device)
        self.next_obs = torch.randn(n, obs_dim, generator=generator).to(device)
        self.action = torch.randint(0, 3, (n, n_branches), generator=generator).to(device)
        self.reward = torch.randn(n, generator=generator).to(device)
        self.done = torch.zeros(n, device=device)
        self.kind = torch.zeros(n, dtype=torch.int8, device=device)
        self.wants = torch.ones(n, dtype=torch.bool, device=device)
        self.priority = torch.zeros(n, device=device)
        self.multiplier = torch.ones(n, device=device)
        # built once: the cycle times the push, not the assembly of its arguments
        self.rows = cuda_ext.PushRows(
            obs=self.obs, next_obs=self.next_obs, action=self.action, reward=self.reward, done=self.done,
            kind=self.kind, wants=self.wants, priority=self.priority, max_multiplier=self.multiplier,
        )


class CudaExtPER:
    """The cuda_ext ops driven the way ``sb3_her_ext``'s replay buffer drives them.

    :param capacity: rows.
    :param obs_dim: observation width.
    :param n_branches: action branches.
    :param device: where the buffer lives.
    """

    def __init__(self, capacity: int, obs_dim: int, n_branches: int, device: torch.device) -> None:
        self.storage = cuda_ext.ReplayStorage.zeros(capacity, obs_dim, n_branches, device)
        self.rng_state = torch.tensor([12345, 0], device=device)  # per_sample_philox's (seed, counter)

    def push(self, batch: Batch) -> torch.Tensor:
        """Push a batch; on the CPU also rebuild the tree above its slots (on a GPU the push marks the
        dirty subtrees, and :meth:`cycle` refreshes them before sampling).

        :param batch: the transitions.
        :return: their slots.
        """
        slots = cuda_ext.per_push(self.storage, batch.rows, alpha=ALPHA)
        if not self.storage.tree.is_cuda:
            cuda_ext.per_tree_rebuild(self.storage.tree, slots)
        return slots

    def cycle(
        self,
        batch: Batch,
        uniforms: torch.Tensor,
        td_abs: torch.Tensor,
        gather: bool = True,
        philox: bool = False,
    ) -> tuple:
        """Push, sample (with the row gather a learner needs), update priorities, as the replay buffer does:
        on a GPU one ``per_tree_refresh`` before the sample brings the tree up to date after this push and
        the previous cycle's update (both marked their subtrees); on the CPU ``per_tree_rebuild`` after each.

        :param batch: the transitions to push.
        :param uniforms: ``[B] float64`` draws (refilled in place each cycle).
        :param td_abs: ``[B]`` absolute TD errors.
        :param gather: also gather the sampled rows (off: the ops alone, issue #3's target cycle).
        :param philox: draw the uniforms inside the sampling op (``per_sample_philox``; ``uniforms`` only
            gives the batch size) instead of ``uniforms.uniform_()`` + ``per_sample``.
        :return: the sampled rows (empty without ``gather``) and weights.
        """
        s = self.storage
        self.push(batch)
        if s.tree.is_cuda:
            cuda_ext.per_tree_refresh(s.tree)
        if philox:
            indices, weights = cuda_ext.per_sample_philox(
                s.tree, s.head_size, self.rng_state, batch_size=uniforms.shape[0], beta=BETA
            )
        else:
            uniforms.uniform_()
            indices, weights = cuda_ext.per_sample(s.tree, s.head_size, uniforms, beta=BETA)
        rows: tuple = ()
        if gather:
            rows = (s.obs[indices], s.next_obs[indices], s.action[indices], s.reward[indices])
        cuda_ext.per_update(s.tree, s.max_priority, indices, td_abs, alpha=ALPHA, eps=EPS)
        if not s.tree.is_cuda:
            cuda_ext.per_tree_rebuild(s.tree, indices)
        return rows, weights


class PlainTorchPER:
    """A plain-PyTorch GPU PER: flat priority tensor, ``cumsum`` + ``searchsorted`` sampling, no host sync.

    :param capacity: rows.
    :param obs_dim: observation width.
    :param n_branches: action branches.
    :param device: where the buffer lives.
    """

    def __init__(self, capacity: int, obs_dim: int, n_branches: int, device: torch.device) -> None:
        self.capacity = capacity
        self.obs = torch.zeros(capacity, obs_dim, device=device)
        self.next_obs = torch.zeros(capacity, obs_dim, device=device)
        self.action = torch.zeros(capacity, n_branches, dtype=torch.int64, device=device)
        self.reward = torch.zeros(capacity, device=device)
        self.done = torch.zeros(capacity, device=device)
        self.priority = torch.zeros(capacity, dtype=torch.float64, device=device)  # p ** alpha
        self.max_priority = torch.ones(1, device=device)
        self.head = 0
        self.size = 0

    def push(self, batch: Batch) -> None:
        """Write a batch at the ring head with the running max priority.

        :param batch: the transitions.
        """
        n = batch.obs.shape[0]
        slots = (self.head + torch.arange(n, device=self.obs.device)) % self.capacity
        self.obs[slots] = batch.obs
        self.next_obs[slots] = batch.next_obs
        self.action[slots] = batch.action
        self.reward[slots] = batch.reward
        self.done[slots] = batch.done
        self.priority[slots] = self.max_priority.double() ** ALPHA
        self.head = (self.head + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def cycle(self, batch: Batch, uniforms: torch.Tensor, td_abs: torch.Tensor) -> tuple:
        """Push, stratified sample by ``cumsum`` + ``searchsorted``, update priorities.

        :param batch: the transitions to push.
        :param uniforms: ``[B] float64`` draws (refilled in place each cycle).
        :param td_abs: ``[B]`` absolute TD errors.
        :return: the sampled rows and weights.
        """
        self.push(batch)
        n_samples = uniforms.shape[0]
        uniforms.uniform_()
        cumulative = torch.cumsum(self.priority, 0)
        total = cumulative[-1]
        targets = (torch.arange(n_samples, device=uniforms.device) + uniforms) / n_samples * total
        indices = torch.searchsorted(cumulative, targets, right=True).clamp_(max=self.size - 1)
        weights = (self.size * self.priority[indices] / total) ** -BETA
        weights = (weights / weights.max()).float()
        rows = (self.obs[indices], self.next_obs[indices], self.action[indices], self.reward[indices])
        raw = td_abs + EPS
        self.priority[indices] = raw.double() ** ALPHA
        torch.maximum(self.max_priority, raw.max(), out=self.max_priority)
        return rows, weights


def _torchrl_cycle(
    capacity: int, obs_dim: int, n_branches: int, batch_size: int, device: torch.device
) -> tuple[Callable[[], object] | None, str | None]:
    """A TorchRL prioritized buffer (CPU storage and sum tree) and its cycle, or a note why not.

    :return: ``(cycle_fn, None)`` or ``(None, note)``.
    """
    try:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
    except Exception as error:  # noqa: BLE001  (any import failure means: skip with a note)
        return None, peer_missing("torchrl", error)
    try:
        buffer = TensorDictPrioritizedReplayBuffer(
            alpha=ALPHA, beta=BETA, eps=EPS, storage=LazyTensorStorage(capacity, device="cpu"),
            batch_size=batch_size, priority_key="td_error",
        )  # fmt: skip
    except Exception as error:  # noqa: BLE001  (e.g. its C++ sum tree not built for this torch)
        return None, peer_missing("torchrl", error, verb="usable")
    cpu_batch = Batch(4096, obs_dim, n_branches, torch.device("cpu"))
    data = TensorDict(
        {"obs": cpu_batch.obs, "next_obs": cpu_batch.next_obs, "action": cpu_batch.action,
         "reward": cpu_batch.reward, "done": cpu_batch.done},
        batch_size=[cpu_batch.obs.shape[0]],
    )  # fmt: skip
    td_abs = torch.rand(batch_size, device=device)

    def cycle() -> object:
        buffer.extend(data)
        sample = buffer.sample()
        on_device = sample.to(device)  # the learner trains on the device
        sample.set("td_error", td_abs.cpu())
        buffer.update_tensordict_priority(sample)
        return on_device

    return cycle, None


def _sb3_cycle(
    capacity: int, obs_dim: int, n_branches: int, batch_size: int, device: torch.device
) -> Callable[[], object]:
    """Stable-Baselines3's uniform ``ReplayBuffer`` (numpy storage) and its add + sample cycle.

    :return: the cycle function.
    """
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    n_envs = 4096
    buffer = ReplayBuffer(
        capacity,
        spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32),
        spaces.MultiDiscrete([3] * n_branches),
        device=device,
        n_envs=n_envs,
    )
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((n_envs, obs_dim), dtype=np.float32)
    next_obs = rng.standard_normal((n_envs, obs_dim), dtype=np.float32)
    action = rng.integers(0, 3, (n_envs, n_branches))
    reward = rng.standard_normal(n_envs).astype(np.float32)
    done = np.zeros(n_envs, dtype=np.float32)
    infos = [{} for _ in range(n_envs)]

    def cycle() -> object:
        buffer.add(obs, next_obs, action, reward, done, infos)
        return buffer.sample(batch_size)

    return cycle


def _op_timing_rows(device: torch.device, quick: bool) -> list[dict]:
    path = Path(__file__).resolve().parent / "op_timings.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("op_timings", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.run(str(device), quick))


def _capture_cycle(
    buffer: CudaExtPER,
    batch: Batch,
    uniforms: torch.Tensor,
    td_abs: torch.Tensor,
    gather: bool,
    philox: bool = True,
) -> torch.cuda.CUDAGraph:
    """Capture one cuda_ext cycle in a CUDA graph (after a warm-up on a side stream).

    :param philox: the sampling kernel draws its own uniforms (see :meth:`CudaExtPER.cycle`).
    :return: the graph; ``replay()`` runs one cycle.
    """
    return capture_graph(
        lambda: buffer.cycle(batch, uniforms, td_abs, gather, philox), device=uniforms.device
    )


def _time_contenders(
    timer: Timer, batch: Batch, capacity: int, batch_size: int, device: torch.device, peers: bool = True
) -> dict[str, tuple[float | None, str]]:
    """Time one cycle of every contender at one batch size.

    :param peers: also time TorchRL and SB3 (off: plain-PyTorch PER and cuda_ext only).
    :return: contender name -> (µs per cycle or None if skipped, note).
    """
    obs_dim, n_branches = batch.obs.shape[1], batch.action.shape[1]
    uniforms = torch.zeros(batch_size, dtype=torch.float64, device=device)
    td_abs = torch.rand(batch_size, generator=torch.Generator().manual_seed(1)).to(device)
    results: dict[str, tuple[float | None, str]] = {}

    plain = PlainTorchPER(capacity, obs_dim, n_branches, device)
    results["plain PyTorch PER"] = (timer(lambda: plain.cycle(batch, uniforms, td_abs)), "")

    ours = CudaExtPER(capacity, obs_dim, n_branches, device)
    backend = f"backend {cuda_ext.backend()}"
    results["cuda_ext"] = (timer(lambda: ours.cycle(batch, uniforms, td_abs)), backend)

    if device.type == "cuda":
        graphed = [
            ("cuda_ext (CUDA graph)", True, True, ""),
            ("cuda_ext ops only (CUDA graph)", False, True, "no row gather: issue #3 target"),
            ("... torch.rand draws (CUDA graph)", False, False, "ops only, uniform_ + per_sample"),
        ]
        for name, gather, philox, note in graphed:
            buffer = CudaExtPER(capacity, obs_dim, n_branches, device)
            graph = _capture_cycle(buffer, batch, uniforms, td_abs, gather, philox)
            results[name] = (timer(graph.replay), note)

    if not peers:
        return results
    cycle, note = _torchrl_cycle(capacity, obs_dim, n_branches, batch_size, device)
    results["TorchRL PER (CPU tree)"] = (timer(cycle) if cycle else None, note or "CPU storage + tree")

    results["SB3 ReplayBuffer (uniform)"] = (
        timer(_sb3_cycle(capacity, obs_dim, n_branches, batch_size, device)),
        "numpy storage, no priorities",
    )
    return results


def run(device: torch.device, quick: bool, cuda_ext_only: bool = False) -> dict:
    """Time every contender for every batch size.

    :param device: where the GPU buffers live (``cpu`` runs the references: a smoke test).
    :param quick: small capacity and few repeats.
    :param cuda_ext_only: time only the plain-PyTorch PER and cuda_ext, no op timings.
    :return: the JSON-ready result.
    """
    capacity = 1 << 16 if quick else 1 << 20
    obs_dim, n_branches, n_push = 64, 4, 4096
    batch_sizes = [256, 4096]
    timer = Timer(device, repeats=3 if quick else 30, inner=2 if quick else 20)
    rows: list[dict] = []
    batch = Batch(n_push, obs_dim, n_branches, device)
    for batch_size in batch_sizes:
        results = _time_contenders(timer, batch, capacity, batch_size, device, peers=not cuda_ext_only)
        plain_us = results["plain PyTorch PER"][0]
        for name, (us, note) in results.items():
            rows.append(
                {
                    "contender": name,
                    "batch_size": batch_size,
                    "us_per_cycle": us,
                    "speedup_vs_plain_per": (plain_us / us) if us and plain_us else None,
                    "note": note,
                }
            )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "benchmark": "replay_throughput",
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda_ext_backend": cuda_ext.backend(),
        "config": {
            "capacity": capacity,
            "obs_dim": obs_dim,
            "n_branches": n_branches,
            "push": n_push,
            "batch_sizes": batch_sizes,
            "repeats": timer.repeats,
            "inner": timer.inner,
            "quick": quick,
        },  # fmt: skip
        "rows": rows,
        "op_timings": [] if cuda_ext_only else _op_timing_rows(device, quick),
    }


def print_table(result: dict) -> None:
    """Print the cycle table (and the op timings, if any) to stdout.

    :param result: from :func:`run`.
    """
    config = result["config"]
    print(
        f"replay cycle on {result['device']} ({result['device_name']}), capacity {config['capacity']}, "
        f"push {config['push']} x obs {config['obs_dim']}, {config['n_branches']} branches"
    )
    print(f"{'contender':<32} {'B':>5} {'us/cycle':>10} {'x plain PER':>12}  note")
    for row in result["rows"]:
        us = f"{row['us_per_cycle']:.1f}" if row["us_per_cycle"] is not None else "skipped"
        ratio = f"{row['speedup_vs_plain_per']:.2f}" if row["speedup_vs_plain_per"] else "-"
        print(f"{row['contender']:<32} {row['batch_size']:>5} {us:>10} {ratio:>12}  {row['note']}")
    for row in result["op_timings"]:
        print("op_timings:", json.dumps(row))


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print, write JSON.

    :param argv: command-line arguments.
    :return: exit status.
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="capacity 2^16, few repeats (smoke test)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cuda-ext-only", action="store_true", help="skip TorchRL, SB3 and the op timings")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={args.device!r} but no CUDA device is available")
    report(run(device, args.quick, args.cuda_ext_only), print_table, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
