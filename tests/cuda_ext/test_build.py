"""Packaging of cuda_ext: every kernel source compiles with plain nvcc, the extension builds, links and
loads, the cache key and backend report behave, and the package imports cleanly without a GPU.

In CI (``CI`` set) a missing nvcc fails the compile tests; elsewhere they skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cuda_ext
from cuda_ext import build as build_module

REPO_ROOT = Path(__file__).resolve().parents[2]


def _nvcc() -> str:
    cuda_home = build_module.find_cuda_home()
    if cuda_home is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but no CUDA toolkit (nvcc + headers) was found: the kernels must compile")
        pytest.skip("no CUDA toolkit (nvcc) here")
    return str(cuda_home / "bin" / "nvcc")


def test_sources_are_every_cu_and_cpp_in_csrc() -> None:
    csrc = REPO_ROOT / "cuda_ext" / "csrc"
    expected = sorted([*csrc.glob("*.cu"), *csrc.glob("*.cpp")])
    assert build_module.sources() == expected
    names = [p.name for p in build_module.sources()]
    assert "per.cu" in names and "per_binding.cpp" in names


def test_build_directory_honours_env_and_hashes_sources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FOXHUNT_CUDA_EXT_DIR", str(tmp_path))
    directory = build_module.build_directory()
    assert directory.parent == tmp_path
    assert len(directory.name) == 16
    monkeypatch.setattr(build_module.torch, "__version__", "0.0.0-other")
    assert build_module.build_directory() != directory  # a different torch gets its own build


def test_nvcc_flags_are_sm90_o3_and_never_fast_math() -> None:
    assert build_module.NVCC_FLAGS == ["-gencode", "arch=compute_90,code=sm_90", "-O3"]
    assert not any("fast_math" in flag or "fast-math" in flag for flag in build_module.NVCC_FLAGS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_import_without_cuda_says_so_once_and_uses_references() -> None:
    assert cuda_ext.backend() == "reference"
    script = "import cuda_ext; cuda_ext.build.load_if_possible(); print(cuda_ext.backend())"
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "reference"
    assert result.stderr.count("ops run the") == 1


def _run_python(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=True
    )


def test_import_builds_nothing_and_cpu_calls_never_load() -> None:
    script = (
        "import torch, cuda_ext\n"
        "from cuda_ext import build\n"
        "print(build.load_attempted)\n"
        "tree = cuda_ext.new_tree(4); tree[4:] = 1.0\n"
        "cuda_ext.per_tree_rebuild(tree, torch.arange(4))\n"  # a CPU call: the reference, no load
        "torch.ops.cuda_ext.per_tree_refresh(tree)\n"
        "print(build.load_attempted, tree[1].item())\n"
    )
    result = _run_python(script)
    assert result.stdout.split() == ["False", "False", "4.0"]
    assert "ops run the" not in result.stderr


def test_first_call_that_loads_the_kernels_is_dispatched_again_to_them() -> None:
    # CPU stands in for CUDA: the "load" registers a CPU kernel, as the extension registers CUDA ones
    script = (
        "import torch, cuda_ext\n"
        "from cuda_ext import _library, build\n"
        "loads = []\n"
        "def load():\n"
        "    build.load_attempted = True\n"
        "    loads.append(torch.library.Library('cuda_ext', 'IMPL', 'CPU'))\n"
        "    loads[-1].impl('lazy_probe', lambda x: x * 0 + 7)\n"
        "    return True\n"
        "build.load_if_possible = load\n"
        "_library._first_call_on_cuda = lambda args: not build.load_attempted\n"
        "op = _library.define_op('lazy_probe(Tensor x) -> Tensor', lambda x: x * 2, torch.empty_like)\n"
        "x = torch.ones(2)\n"
        "print(op(x).tolist(), op(x).tolist(), len(loads))\n"
    )
    assert _run_python(script).stdout.strip() == "[7.0, 7.0] [7.0, 7.0] 1"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("through", ["wrapper", "torch.ops"])
def test_first_cuda_call_loads_the_extension_and_runs_the_kernel(through: str) -> None:
    call = {
        "wrapper": "cuda_ext.per_tree_rebuild(tree, torch.arange(4, device='cuda'))",
        "torch.ops": "torch.ops.cuda_ext.per_tree_rebuild(tree, torch.arange(4, device='cuda'))",
    }[through]
    script = (
        "import torch, cuda_ext\n"
        "from cuda_ext import build\n"
        "assert not build.load_attempted\n"
        "tree = cuda_ext.new_tree(4, 'cuda'); tree[4:] = 1.0\n"
        f"{call}\n"
        "has = torch._C._dispatch_has_kernel_for_dispatch_key('cuda_ext::per_tree_rebuild', 'CUDA')\n"
        "print(build.load_attempted, has, build.loaded_path() is not None, tree[1].item())\n"
        "print(cuda_ext.backend())\n"
    )
    result = _run_python(script)
    assert result.stdout.split() == ["True", "True", "True", "4.0", "cuda"]


@pytest.mark.slow
def test_every_cu_compiles_alone_with_plain_nvcc(tmp_path: Path) -> None:
    nvcc = _nvcc()
    kernels = sorted((REPO_ROOT / "cuda_ext" / "csrc").glob("*.cu"))
    assert kernels, "no .cu sources"
    for source in kernels:
        command = [nvcc, "-c", "-arch=sm_90", "-Xptxas", "-v", str(source)]
        result = subprocess.run(
            [*command, "-o", str(tmp_path / f"{source.stem}.o")],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"{source.name}:\n{result.stderr[-4000:]}"
        assert (tmp_path / f"{source.stem}.o").stat().st_size > 0


#: A host program over select.cu's compile-time sorting network (the one quantile_iqr's kernels apply): for
#: N = 2 .. 64, every comparator joins two wires lo < hi < N, and applying the list to random rows (a third of
#: them full of ties) leaves them exactly as std::sort does. Prints "ok N comparators" per N.
_SORT_NETWORK_CHECK = r"""
#include <algorithm>
#include <cstdio>
#include <random>
#include "select.cu"
using namespace cuda_ext::action_select;
template <int N> bool check(std::mt19937& rng) {
  const auto& net = kPairwiseNetwork<N>;
  for (int trial = 0; trial < 5000; ++trial) {
    float v[N], s[N];
    for (int i = 0; i < N; ++i) {
      const unsigned r = rng();
      v[i] = s[i] = trial % 3 == 0 ? static_cast<float>(r % 4) : static_cast<float>(r % 100000) / 7.0f;
    }
    for (int k = 0; k < PairwiseNetwork<N>::kSize; ++k) {
      const int lo = net.comparators[k].lo, hi = net.comparators[k].hi;
      if (!(0 <= lo && lo < hi && hi < N)) return false;
      const float a = v[lo], b = v[hi];
      v[lo] = std::min(a, b);
      v[hi] = std::max(a, b);
    }
    std::sort(s, s + N);
    if (!std::equal(v, v + N, s)) return false;
  }
  std::printf("ok %d %d\n", N, PairwiseNetwork<N>::kSize);
  return true;
}
int main() {
  std::mt19937 rng(0);
  const bool ok = check<2>(rng) && check<4>(rng) && check<8>(rng) && check<16>(rng) && check<32>(rng) &&
                  check<64>(rng);
  return ok ? 0 : 1;
}
"""


@pytest.mark.slow
def test_quantile_iqr_sorting_network_sorts(tmp_path: Path) -> None:
    nvcc = _nvcc()
    source = tmp_path / "network_check.cu"
    source.write_text(_SORT_NETWORK_CHECK)
    binary = tmp_path / "network_check"
    csrc = REPO_ROOT / "cuda_ext" / "csrc"
    compiled = subprocess.run(
        [nvcc, "-std=c++17", "-arch=sm_90", f"-I{csrc}", str(source), "-o", str(binary)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # Batcher's count for N = 32 and 64 (the pairwise network has the same), and every N checked
    assert result.stdout.split("\n")[:-1] == [
        "ok 2 1", "ok 4 5", "ok 8 19", "ok 16 63", "ok 32 191", "ok 64 543",
    ]  # fmt: skip


@pytest.mark.slow
def test_python_m_cuda_ext_build_compiles_links_and_loads() -> None:
    _nvcc()
    result = subprocess.run(
        [sys.executable, "-m", "cuda_ext", "build"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "built and loaded" in result.stdout
    check = (
        "import torch, cuda_ext\n"
        "from cuda_ext.build import build\n"
        "path = build()\n"  # cached now: loads without compiling
        "ops = ['per_push', 'per_tree_rebuild', 'per_sample', 'per_sample_philox', 'per_update']\n"
        "has = torch._C._dispatch_has_kernel_for_dispatch_key\n"
        "print(all(has('cuda_ext::' + op, 'CUDA') for op in ops))\n"
        "tree = cuda_ext.ops_per.new_tree(4); tree[4:] = 1.0\n"
        "torch.ops.cuda_ext.per_tree_rebuild(tree, torch.arange(4))\n"  # CPU tensors: the reference runs
        "print(tree[1].item())\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", check], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    assert loaded.stdout.split() == ["True", "4.0"]


@pytest.mark.slow
def test_replay_benchmark_quick_smoke_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    result = subprocess.run(
        [sys.executable, "benchmarks/replay_throughput.py", "--quick", "--device", "cpu", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "us/cycle" in result.stdout
    report = json.loads(out.read_text())
    assert report["config"]["batch_sizes"] == [256, 4096]
    timed = {(row["contender"], row["batch_size"]): row for row in report["rows"]}
    for batch_size in (256, 4096):
        for contender in ("cuda_ext", "plain PyTorch PER", "SB3 ReplayBuffer (uniform)"):
            assert timed[(contender, batch_size)]["us_per_cycle"] > 0
        assert timed[("plain PyTorch PER", batch_size)]["speedup_vs_plain_per"] == 1.0
        assert (("TorchRL PER (CPU tree)", batch_size)) in timed  # timed, or skipped with a note
