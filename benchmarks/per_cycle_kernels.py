"""Per-kernel GPU time of one prioritized-replay cycle captured in a CUDA graph (torch.profiler).

The cycle is ``benchmarks/replay_throughput.py``'s "cuda_ext ops only (CUDA graph)" one: push 4096 rows of
obs dim 64 and 4 branches, bring the tree up to date, sample B (the sampling kernel draws its own uniforms:
``per_sample_philox``), update B priorities; capacity 2^20; B = 256 and 4096; with ``--torch-draws`` also the
same cycle drawing its uniforms with ``uniform_`` before ``per_sample``, whose two ``FillFunctor<long>``
kernels are PyTorch's per-replay update of the graph's RNG seed and offset. For each: the mean graph replay
time over 1000 replays (CUDA events), then every kernel's mean time and launches per cycle over 200 profiled
replays. With programmatic dependent launch on (``FOXHUNT_CUDA_PDL`` unset) a kernel's time includes its
wait for the kernel before it; run with ``FOXHUNT_CUDA_PDL=0`` for each kernel's own time.

Usage::

    python benchmarks/per_cycle_kernels.py [--torch-draws] [--out benchmarks/results/per_cycle_kernels.json]

Needs a CUDA device. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py, replay_throughput.py beside it
from _common import default_out, device_name, median_event_us, write_json  # noqa: E402
from replay_throughput import Batch, CudaExtPER, _capture_cycle  # noqa: E402

RESULTS = default_out("per_cycle_kernels")
PROFILED_REPLAYS = 200


def profile_cycle(batch_size: int, device: torch.device, philox: bool = True) -> dict:
    """Time one graphed cycle and profile its kernels.

    :param batch_size: B, rows sampled and updated per cycle.
    :param device: a CUDA device.
    :param philox: the sampling kernel draws the uniforms (else ``uniform_`` + ``per_sample``).
    :return: ``{"B", "draws", "us_per_cycle", "kernels": [{"kernel", "us_per_cycle", "launches_per_cycle"}]}``
        (``draws``: which way the uniforms were drawn).
    """
    batch = Batch(4096, 64, 4, device)
    buffer = CudaExtPER(1 << 20, 64, 4, device)
    uniforms = torch.zeros(batch_size, dtype=torch.float64, device=device)
    td_abs = torch.rand(batch_size, device=device)
    graph = _capture_cycle(buffer, batch, uniforms, td_abs, False, philox)
    for _ in range(50):
        graph.replay()
    torch.cuda.synchronize(device)

    def replays() -> None:
        for _ in range(1000):
            graph.replay()

    us_per_cycle = median_event_us(replays, calls=1000, repeats=1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_REPLAYS):
            graph.replay()
        torch.cuda.synchronize(device)
    kernels = [
        {"kernel": event.key, "us_per_cycle": event.device_time_total / PROFILED_REPLAYS,
         "launches_per_cycle": event.count / PROFILED_REPLAYS}
        for event in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
        if event.device_time_total > 0
    ]
    draws = "per_sample_philox" if philox else "torch uniform_"
    return {"B": batch_size, "draws": draws, "us_per_cycle": us_per_cycle, "kernels": kernels}


def main() -> None:
    """Profile B = 256 and 4096, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS), help=f"JSON file (default: {RESULTS})")
    parser.add_argument(
        "--torch-draws", action="store_true", help="also the cycle with torch's uniform_ draws"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("per_cycle_kernels.py needs a CUDA device")
    device = torch.device("cuda")
    variants = [True, False] if args.torch_draws else [True]
    rows = [profile_cycle(batch_size, device, philox) for philox in variants for batch_size in (256, 4096)]
    for row in rows:
        print(f"B={row['B']} ({row['draws']}): {row['us_per_cycle']:.1f} us per graphed cycle")
        for kernel in row["kernels"]:
            us, launches = kernel["us_per_cycle"], kernel["launches_per_cycle"]
            print(f"  {us:7.2f} us  {launches:4.1f}x  {kernel['kernel'][:100]}")
    result = {"benchmark": "per_cycle_kernels", "device_name": device_name(device),
              "torch": torch.__version__, "pdl": os.environ.get("FOXHUNT_CUDA_PDL", "1") != "0", "rows": rows}
    write_json(args.out, result)


if __name__ == "__main__":
    main()
