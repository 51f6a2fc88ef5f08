"""What the benchmark scripts share: where results go, timing, op counting, machine info and JSON output.

The scripts run as files (``python benchmarks/NAME.py``) or are loaded by path (the tests), never as a
package: each puts its own folder on ``sys.path`` and imports from ``_common`` by name.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
#: Where a script writes its JSON unless given ``--out`` (git ignores it).
RESULTS_DIR = BENCHMARKS_DIR / "results"


def default_out(name: str) -> Path:
    """The default JSON path of a benchmark.

    :param name: the benchmark's name (its script's stem).
    :return: ``benchmarks/results/<name>.json``.
    """
    return RESULTS_DIR / f"{name}.json"


def peer_missing(package: str, error: BaseException, verb: str = "importable") -> str:
    """The note of a row skipped because a peer package is missing or unusable.

    :param package: the distribution's name (``sb3-contrib``, ``torchrl``, ``gym-trading-env``).
    :param error: what importing or building it raised.
    :param verb: ``"importable"`` (the import failed) or ``"usable"`` (it imported but failed to build).
    :return: the note, with how to install the peers.
    """
    return f"{package} not {verb} ({type(error).__name__}: {error}); pip install -e '.[bench]'"


# --------------------------------------------------------------------------------------------- timing


def synchronizer(device: str | torch.device) -> Callable[[], None]:
    """A function that waits for the work queued on ``device`` (a no-op on the CPU).

    :param device: where the timed work runs.
    :return: ``torch.cuda.synchronize`` for a CUDA device, else a no-op.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def median_event_us(run_once: Callable[[], None], calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the CUDA-event time of ``run_once``, divided by ``calls``.

    :param run_once: runs ``calls`` calls on the current stream.
    :param calls: calls per ``run_once``.
    :param repeats: timed runs.
    :return: µs per call.
    """
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_once()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def capture_graph(
    fn: Callable[[], object], calls: int = 1, warmup: int = 3, device: torch.device | None = None
) -> torch.cuda.CUDAGraph:
    """Capture ``calls`` calls of ``fn`` in one CUDA graph, after ``warmup`` calls on a side stream.

    :param fn: the call (all its inputs static on the GPU).
    :param calls: calls captured.
    :param warmup: uncaptured calls first (lazy allocations, autotuning).
    :param device: the CUDA device (``None``: the current one).
    :return: the graph; ``replay()`` runs the calls.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def time_graph_us(fn: Callable[[], object], calls: int = 10, repeats: int = 20) -> float:
    """GPU time per call of ``fn``: ``calls`` calls captured in one CUDA graph, replayed and timed.

    :param fn: the call to time (all its inputs static on the GPU).
    :param calls: calls per graph.
    :param repeats: timed replays; the median is returned.
    :return: µs per call.
    """
    graph = capture_graph(fn, calls)
    graph.replay()
    torch.cuda.synchronize()
    return median_event_us(graph.replay, calls, repeats)


def time_eager_us(fn: Callable[[], object], calls: int = 10, repeats: int = 20) -> float:
    """Time per call of ``fn`` called eagerly, back to back, measured with CUDA events.

    :param fn: the call to time.
    :param calls: calls per measurement.
    :param repeats: measurements; the median is returned.
    :return: µs per call.
    """
    for _ in range(3):
        fn()
    torch.cuda.synchronize()

    def run_calls() -> None:
        for _ in range(calls):
            fn()

    return median_event_us(run_calls, calls, repeats)


def time_cpu_us(fn: Callable[[], object], repeats: int = 10) -> float:
    """Median wall time of ``fn`` on the CPU, after one untimed call.

    :param fn: the call to time.
    :param repeats: measurements.
    :return: µs per call.
    """
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


class Timer:
    """Median time per call of a zero-argument function, with warm-up.

    :param device: where the work runs (CUDA events on a GPU, ``perf_counter`` otherwise).
    :param repeats: number of timed groups.
    :param inner: calls per timed group.
    """

    def __init__(self, device: torch.device, repeats: int, inner: int) -> None:
        self.device = device
        self.repeats = repeats
        self.inner = inner

    def __call__(self, fn: Callable[[], object]) -> float:
        """Time ``fn``.

        :param fn: one call.
        :return: median µs per call.
        """
        for _ in range(max(3, self.inner // 2)):
            fn()
        samples = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(self.device)
                start.record()
                for _ in range(self.inner):
                    fn()
                end.record()
                torch.cuda.synchronize(self.device)
                samples.append(start.elapsed_time(end) * 1e3 / self.inner)
            else:
                begin = time.perf_counter()
                for _ in range(self.inner):
                    fn()
                samples.append((time.perf_counter() - begin) * 1e6 / self.inner)
        return statistics.median(samples)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active (forward, backward and optimizer alike).

    The count is noise-free, and what predicts a launch-bound GPU step's cost.

    :param counts: ops so far by name (views included).
    :param kernel_count: ops so far that are not views (the ones that may launch a kernel).
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.kernel_count = 0

    @property
    def count(self) -> int:
        """Ops so far, views included."""
        return self.counts.total()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.counts[str(func.overloadpacket.__name__)] += 1
        self.kernel_count += not func.is_view
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------------------- machine info


def processor_name() -> str:
    """The CPU's name (``platform.processor()``, else the architecture where that is empty)."""
    return platform.processor() or platform.machine()


def device_name(device: str | torch.device) -> str:
    """The GPU's name for a CUDA device, else the CPU's.

    :param device: the device the benchmark ran on.
    """
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else processor_name()


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (other load on the machine skews CPU rates), or None."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def machine_info() -> dict[str, Any]:
    """What this run ran on.

    :return: 1-minute load average, platform, processor, CPU count, torch threads and version, GPU name.
    """
    load = load_average()
    return {
        "load_average_1min": load[0] if load is not None else None,
        "platform": platform.platform(),
        "processor": processor_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


# ----------------------------------------------------------------------------------------------- output


def write_json(path: str | Path, result: dict[str, Any]) -> Path:
    """Write a benchmark's result as indented JSON (making its folder) and say where.

    :param path: the file.
    :param result: JSON-ready results.
    :return: the path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def report(
    result: dict[str, Any], print_table: Callable[[dict[str, Any]], None], path: str | Path
) -> dict[str, Any]:
    """Print a benchmark's table of ``result`` and write it as JSON to ``path``.

    :return: ``result``.
    """
    print_table(result)
    write_json(path, result)
    return result
