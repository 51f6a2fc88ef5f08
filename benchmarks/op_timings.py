"""Time every hindsight and action-selection op: the CUDA kernel against the pure-PyTorch reference.

Each row: ``op``, ``B``, ``cuda_us`` (GPU time per call: the op captured 10 times in a CUDA graph, replayed,
timed with CUDA events, median of repeats), ``cuda_eager_us`` (the same, called eagerly from Python: includes
dispatch and launch overhead), ``reference_us`` (the reference on the same device, timed like ``cuda_us``, or
eagerly when it cannot be captured), ``ratio`` = ``reference_us / cuda_us`` (> 1: the kernel is faster).
On a CPU only the reference is timed (``time.perf_counter``, median).

Problem size (issue #3): B = 65536 books (``quick``: 1024), obs dim 64, 4 branches of 3 actions, K = 32
IQN quantiles per action for ``quantile_iqr``, S = 256 forward slots, 3 magnitudes; about 5% of books close a
trade per step. Usage::

    python benchmarks/op_timings.py [--device cuda] [--quick] [--per] [--no-reference]
        [--out benchmarks/results/op_timings.json]

With ``--per``, the prioritized-replay ops are timed one by one too (CUDA graph, as in one replay cycle
of ``benchmarks/replay_throughput.py``: capacity 2^20, push 4096 rows of obs dim 64 + 4 branches, B = 256 and
4096): ``per_push``, ``per_tree_rebuild`` of the pushed slots, ``per_sample``, ``per_sample_philox`` (the
kernel draws its uniforms), ``per_update``,
``per_tree_rebuild`` of the sampled indices; and a writer with the tree update after it in one graph: the
rebuild of the listed leaves, or ``per_tree_refresh`` of the subtrees the writer marked. ``--no-reference``
skips timing the references.

``benchmarks/replay_throughput.py`` imports :func:`run`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import cuda_ext
from cuda_ext.reference import hindsight as ref_hindsight
from cuda_ext.reference import select as ref_select

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
from _common import default_out, device_name, time_cpu_us, time_eager_us, time_graph_us, write_json  # noqa: E402

DEFAULT_OUT = default_out("op_timings")
OBS_DIM, N_BRANCHES, N_ACTIONS, N_QUANTILES, N_SLOTS, RING = 64, 4, 3, 32, 256, 512
CLOSE_FRACTION = 0.05


def _cases(n_books: int, device: torch.device) -> dict[str, tuple[Callable, Callable, Callable[[], tuple]]]:
    """op name -> (op handle, reference function, maker of fresh arguments on ``device``)."""
    gen = torch.Generator().manual_seed(0)
    capacity = 4 * n_books

    def on(*tensors: object) -> tuple:
        return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors)

    closed = torch.rand(n_books, generator=gen) < CLOSE_FRACTION
    direction = torch.randint(-1, 2, (n_books,), generator=gen)
    mid = 100 + torch.randn(n_books, generator=gen)
    obs = torch.randn(n_books, OBS_DIM, generator=gen)
    action = torch.randint(0, N_ACTIONS, (n_books, N_BRANCHES), generator=gen)

    def track() -> tuple:
        return on(
            torch.zeros(n_books, RING), torch.zeros(n_books, dtype=torch.int64), mid.clone(),
            direction.clone(), mid + 0.5, torch.zeros(n_books, dtype=torch.int64),
            direction.to(torch.float32), mid - 0.01, mid + 0.01, torch.arange(n_books),
        )

    def inject() -> tuple:
        return on(
            torch.full((n_books,), 5), mid.clone(), direction.clone(), mid + direction * 2.0,
            torch.randint(0, capacity, (n_books,), generator=gen), closed, torch.rand(n_books, generator=gen),
            torch.ones(n_books), obs, obs.clone(), action, torch.randn(capacity, OBS_DIM, generator=gen),
            1.0, 1.0, 0, 0, 1,
        )

    def forward() -> tuple:
        return on(
            torch.ones(N_SLOTS, dtype=torch.bool), 100 + torch.randn(N_SLOTS, generator=gen),
            torch.randint(0, 20, (N_SLOTS,), generator=gen),
            torch.randint(0, 2, (N_SLOTS,), generator=gen) * 2 - 1,
            torch.rand(N_SLOTS, generator=gen), torch.ones(N_SLOTS),
            torch.randint(0, n_books, (N_SLOTS,), generator=gen),
            torch.randn(N_SLOTS, OBS_DIM, generator=gen),
            torch.randint(0, N_ACTIONS, (N_SLOTS, N_BRANCHES), generator=gen),
            torch.zeros(1, dtype=torch.int64),
            torch.tensor([20]), mid, torch.zeros(n_books, dtype=torch.bool), closed, mid + 0.1, direction,
            torch.rand(n_books, generator=gen), torch.ones(n_books), obs, action, 10, 1.0, 1.0, 0,
        )

    def relabel() -> tuple:
        return on(closed, obs, obs.clone(), action, torch.randn(n_books, generator=gen),
                  torch.tensor([0.25, 0.5, 1.0]), 1)

    def select() -> tuple:
        shape = (n_books, N_BRANCHES, N_ACTIONS)
        return on(
            torch.randn(shape, generator=gen), torch.rand(shape, generator=gen),
            torch.rand(shape, generator=gen),
            torch.full((N_BRANCHES,), N_ACTIONS), torch.full((N_BRANCHES,), 0.05),
            torch.tensor([True, False, True, False]), torch.rand(n_books, N_BRANCHES, generator=gen),
            torch.rand(n_books, N_BRANCHES, generator=gen), 0.5, 0.1,
        )

    def iqr() -> tuple:
        return on(torch.randn(n_books, N_BRANCHES, N_ACTIONS, N_QUANTILES, generator=gen))

    ops = torch.ops.cuda_ext  # op and reference take one identical positional tuple, so time the raw ops
    return {
        "hindsight_track": (ops.hindsight_track, ref_hindsight.hindsight_track, track),
        "hindsight_inject": (ops.hindsight_inject, ref_hindsight.hindsight_inject, inject),
        "hindsight_forward": (ops.hindsight_forward, ref_hindsight.hindsight_forward, forward),
        "magnitude_relabel": (ops.magnitude_relabel, ref_hindsight.magnitude_relabel, relabel),
        "branch_select": (ops.branch_select, ref_select.branch_select, select),
        "quantile_iqr": (ops.quantile_iqr, ref_select.quantile_iqr, iqr),
    }


def per_rows(quick: bool = False) -> list[dict]:
    """Time each prioritized-replay op of one replay cycle on the GPU (CUDA graph), for B = 256 and 4096.

    :param quick: capacity 2^16 instead of 2^20.
    :return: one dict per (op, B): ``op``, ``B``, ``device``, ``cuda_us``.
    """
    device = torch.device("cuda")
    capacity, n_push = (1 << 16 if quick else 1 << 20), 4096
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch_size in (256, 4096):
        storage = cuda_ext.ReplayStorage.zeros(capacity, OBS_DIM, N_BRANCHES, device)
        batch = cuda_ext.PushRows(
            obs=torch.randn(n_push, OBS_DIM, generator=gen).to(device),
            next_obs=torch.randn(n_push, OBS_DIM, generator=gen).to(device),
            action=torch.randint(0, N_ACTIONS, (n_push, N_BRANCHES), generator=gen).to(device),
            reward=torch.randn(n_push, generator=gen).to(device),
            done=torch.zeros(n_push, device=device),
            kind=torch.zeros(n_push, dtype=torch.int8, device=device),
            wants=torch.ones(n_push, dtype=torch.bool, device=device),
            priority=torch.zeros(n_push, device=device),
            max_multiplier=torch.ones(n_push, device=device),
        )

        def push(batch: cuda_ext.PushRows = batch, s: cuda_ext.ReplayStorage = storage) -> torch.Tensor:
            return cuda_ext.per_push(s, batch, alpha=0.6)

        tree, head_size, max_priority = storage.tree, storage.head_size, storage.max_priority
        for _ in range(capacity // n_push):  # fill the buffer
            cuda_ext.per_tree_rebuild(tree, push())
        slots = push()
        cuda_ext.per_tree_rebuild(tree, slots)
        uniforms = torch.rand(batch_size, dtype=torch.float64, generator=gen).to(device)
        indices, _ = cuda_ext.per_sample(tree, head_size, uniforms, beta=0.4)
        td_abs = torch.rand(batch_size, generator=gen).to(device)
        rng_state = torch.tensor([7, 0], device=device)  # per_sample_philox's (seed, counter)

        def update(t: torch.Tensor = tree, m: torch.Tensor = max_priority, i: torch.Tensor = indices,
                   td: torch.Tensor = td_abs) -> None:
            cuda_ext.per_update(t, m, i, td, alpha=0.6, eps=1e-6)

        timed = {
            "per_push": push,
            "per_tree_rebuild(push slots)": lambda t=tree, i=slots: cuda_ext.per_tree_rebuild(t, i),
            "per_sample": lambda t=tree, h=head_size, u=uniforms: cuda_ext.per_sample(t, h, u, beta=0.4),
            "per_sample_philox": lambda t=tree, h=head_size, r=rng_state, n=batch_size: (
                cuda_ext.per_sample_philox(t, h, r, batch_size=n, beta=0.4)
            ),
            "per_update": update,
            "per_tree_rebuild(sampled)": lambda t=tree, i=indices: cuda_ext.per_tree_rebuild(t, i),
            # pairs in one graph: a writer, then the tree brought up to date from the list or the marks
            "per_push + per_tree_rebuild(slots)": lambda t=tree: cuda_ext.per_tree_rebuild(t, push()),
            "per_push + per_tree_refresh": lambda t=tree: (push(), cuda_ext.per_tree_refresh(t)),
            "per_update + per_tree_rebuild(sampled)": lambda t=tree, i=indices: (
                update(), cuda_ext.per_tree_rebuild(t, i)
            ),
            "per_update + per_tree_refresh": lambda t=tree: (update(), cuda_ext.per_tree_refresh(t)),
        }
        for name, fn in timed.items():
            rows.append({"op": name, "B": batch_size, "device": "cuda", "cuda_us": time_graph_us(fn)})
        del storage
        torch.cuda.empty_cache()
    return rows


def run(device: str = "cuda", quick: bool = False, reference: bool = True) -> list[dict]:
    """Time every hindsight and selection op at B = 65536 (``quick``: 1024).

    :param device: ``"cuda"`` (kernel and reference) or ``"cpu"`` (reference only).
    :param quick: small problem for a smoke run.
    :param reference: also time the references (on a GPU).
    :return: one dict per op: ``op``, ``B``, ``device``, ``cuda_us``, ``cuda_eager_us``,
        ``reference_us``, ``reference_timing`` (``"graph"``, ``"eager"`` or ``"cpu"``),
        ``ratio`` (reference / CUDA; None on CPU).
    """
    torch_device = torch.device(device)
    if torch_device.type == "cuda" and cuda_ext.backend() != "cuda":
        reason = cuda_ext.build.load_error()
        raise RuntimeError(f"device={device!r} but the CUDA extension is not loaded: {reason}")
    n_books = 1024 if quick else 65536
    rows = []
    for name, (op, reference, make_args) in _cases(n_books, torch_device).items():
        kernel_args, reference_args = make_args(), make_args()
        row: dict = {"op": name, "B": n_books, "device": str(torch_device)}
        if torch_device.type == "cuda":
            row["cuda_us"] = time_graph_us(lambda op=op, a=kernel_args: op(*a))
            row["cuda_eager_us"] = time_eager_us(lambda op=op, a=kernel_args: op(*a))
            if not reference:
                row.update(reference_us=None, reference_timing="skipped", ratio=None)
                rows.append(row)
                continue
            try:
                row["reference_us"] = time_graph_us(lambda f=reference, a=reference_args: f(*a))
                row["reference_timing"] = "graph"
            except RuntimeError:  # not capturable: time it eagerly
                torch.cuda.synchronize()
                row["reference_us"] = time_eager_us(lambda f=reference, a=reference_args: f(*a))
                row["reference_timing"] = "eager"
            row["ratio"] = row["reference_us"] / row["cuda_us"]
        else:
            row.update(cuda_us=None, cuda_eager_us=None, ratio=None, reference_timing="cpu")
            row["reference_us"] = time_cpu_us(lambda f=reference, a=reference_args: f(*a))
        rows.append(row)
    return rows


def _format(value: float | None) -> str:
    return "-" if value is None else f"{value:10.1f}"


def main() -> None:
    """Print the table and write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="B = 1024 instead of 65536")
    parser.add_argument("--per", action="store_true", help="also time the PER ops one by one (GPU only)")
    parser.add_argument("--no-reference", action="store_true", help="do not time the references")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    rows = run(args.device, args.quick, reference=not args.no_reference)
    if args.per and args.device.startswith("cuda"):
        rows += per_rows(args.quick)
    print(f"{'op':20s} {'B':>7s} {'cuda µs':>10s} {'eager µs':>10s} {'ref µs':>10s} {'ratio':>8s}")
    for row in rows:
        ratio = "-" if row.get("ratio") is None else f"{row['ratio']:8.1f}"
        print(f"{row['op']:20s} {row['B']:7d} {_format(row['cuda_us'])} {_format(row.get('cuda_eager_us'))} "
              f"{_format(row.get('reference_us'))} {ratio:>8s}")
    write_json(args.out, {"device": device_name(args.device), "torch": torch.__version__, "quick": args.quick,
                          "rows": rows})


if __name__ == "__main__":
    main()
