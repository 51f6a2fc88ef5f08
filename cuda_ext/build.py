"""Build and load the cuda_ext CUDA extension (``torch.utils.cpp_extension.load``, cached).

Conventions for kernel authors (every op module of the package follows them):

* **Sources.** The extension is built from every ``cuda_ext/csrc/*.cu`` and ``cuda_ext/csrc/*.cpp``
  (a glob, sorted by name), so a new kernel only needs its files in ``csrc/``. Headers (``*.cuh``,
  ``*.h``) are not compiled on their own but are part of the cache key.
* **Device code** (``.cu``) includes only CUDA headers and the package's own ``.cuh``/``.h`` headers and
  exposes plain C++ launch functions taking raw pointers, sizes and a ``cudaStream_t``; each ``.cu``
  compiles alone with ``nvcc -c -arch=sm_90`` (CI checks this without torch).
* **Bindings** (``*_binding.cpp``) check arguments with ``TORCH_CHECK_VALUE`` (a ``ValueError``)
  naming the argument, take a
  ``c10::cuda::CUDAGuard``, launch on ``at::cuda::getCurrentCUDAStream()`` and register the CUDA
  implementation with ``TORCH_LIBRARY_IMPL(cuda_ext, CUDA, m)``. They define no pybind module; op
  schemas are defined in Python (``cuda_ext._library.define_op``) before the library loads.
* **Flags.** nvcc: ``-gencode arch=compute_90,code=sm_90 -O3`` (never ``--use_fast_math``: it would break
  agreement with the references); host: ``-O3``.
* **Cache.** ``$FOXHUNT_CUDA_EXT_DIR/<key>`` or ``~/.cache/foxhunt/cuda_ext/<key>``, where ``<key>`` hashes
  the sources, the headers, the flags and the torch version; a second start loads the cached library.

Loading is lazy: ``import cuda_ext`` only defines the ops; the first op call on a CUDA tensor (or
:func:`backend`, or :func:`ensure_loaded`) builds, or loads the cached build, once per process.

Usage::

    python -m cuda_ext build      # ahead of time (works without a GPU: compiles and links)
    import cuda_ext               # defines the ops; nothing is built yet
    cuda_ext.backend()            # "cuda" or "reference" (loads the extension first if a GPU is present)
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

EXTENSION_NAME = "foxhunt_cuda_ext"
CSRC_DIR = Path(__file__).resolve().parent / "csrc"
NVCC_FLAGS = ["-gencode", "arch=compute_90,code=sm_90", "-O3"]
HOST_FLAGS = ["-O3"]

_loaded_path: Path | None = None
_load_error: str | None = None
#: whether :func:`load_if_possible` has run (the ops' hot path reads this flag only)
load_attempted = False


def sources() -> list[Path]:
    """Every translation unit of the extension: ``csrc/*.cu`` and ``csrc/*.cpp``, sorted by name.

    :return: absolute paths.
    """
    return sorted([*CSRC_DIR.glob("*.cu"), *CSRC_DIR.glob("*.cpp")])


def _cache_key() -> str:
    digest = hashlib.sha256()
    digest.update(torch.__version__.encode())
    digest.update(" ".join(NVCC_FLAGS + HOST_FLAGS).encode())
    for path in sorted([*sources(), *CSRC_DIR.glob("*.cuh"), *CSRC_DIR.glob("*.h")]):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_directory() -> Path:
    """Where the compiled extension for the current sources and torch version lives.

    :return: ``$FOXHUNT_CUDA_EXT_DIR/<key>`` if that variable is set,
        else ``~/.cache/foxhunt/cuda_ext/<key>``.
    """
    root = os.environ.get("FOXHUNT_CUDA_EXT_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "foxhunt" / "cuda_ext"
    return base / _cache_key()


def find_cuda_home() -> Path | None:
    """Locate the CUDA toolkit: ``CUDA_HOME``/``CUDA_PATH``, ``/usr/local/cuda``, or above ``nvcc``.

    A candidate counts only if it holds ``bin/nvcc`` and ``include/cuda_runtime.h`` (a wrapper script such as
    ``/usr/local/bin/nvcc`` does not make ``/usr/local`` a toolkit).

    :return: the toolkit root, or None if none is found.
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "bin" / "nvcc").exists():
            if (Path(candidate) / "include" / "cuda_runtime.h").exists():
                return Path(candidate)
    return None


def _missing_header_flags(cuda_home: Path) -> list[str]:
    """Host flags that let bindings include ``ATen/cuda/CUDAContext.h`` on a toolkit without cuSPARSE headers.

    Some toolkit installs ship no ``cusparse.h``/``cublas_v2.h``; torch's CUDA wheels bring them in the
    ``nvidia`` pip packages. Those folders are searched *after* the toolkit's (``-idirafter``), so they only
    fill gaps.

    :param cuda_home: the toolkit root.
    :return: extra host compiler flags (empty when the toolkit is complete).
    """
    if (cuda_home / "include" / "cusparse.h").exists():
        return []
    try:
        import nvidia  # the CUDA runtime wheels torch depends on
    except ImportError:
        return []
    flags = []
    for root in nvidia.__path__:
        for header in sorted(Path(root).glob("*/include/cusparse.h")):
            flags += ["-idirafter", str(header.parent)]
    return flags[:2]


def build(verbose: bool = False) -> Path:
    """Compile (or reuse the cached) extension and load it into this process.

    Must run after the op modules have defined the ops (``import cuda_ext`` does that first). A build that
    fails here raises; :func:`load_if_possible` is the forgiving entry point.

    :param verbose: show the compiler commands.
    :return: path of the loaded shared library.
    """
    global _loaded_path, _load_error, load_attempted
    if _loaded_path is not None:
        return _loaded_path
    cuda_home = find_cuda_home()
    if cuda_home is None:
        raise RuntimeError("no CUDA toolkit found (need bin/nvcc and include/cuda_runtime.h; set CUDA_HOME)")
    os.environ["CUDA_HOME"] = str(cuda_home)
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = str(cuda_home)  # read at import time; make sure it is the real toolkit
    host_flags = HOST_FLAGS + _missing_header_flags(cuda_home)
    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    path = cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[str(p) for p in sources()],
        extra_cflags=host_flags,
        extra_cuda_cflags=NVCC_FLAGS,
        extra_include_paths=[str(CSRC_DIR)],
        build_directory=str(directory),
        is_python_module=False,
        verbose=verbose,
    )
    _loaded_path = Path(path)
    _load_error = None
    load_attempted = True
    logger.info("cuda_ext: loaded %s", _loaded_path)
    return _loaded_path


@torch.compiler.disable  # a build under torch.compile runs eagerly, never traced
def load_if_possible() -> bool:
    """Build/load the extension when a GPU is present; otherwise say once that the references run.

    Runs once per process (later calls return the first answer). Set ``FOXHUNT_CUDA_EXT=reference`` to skip
    the extension even with a GPU.

    :return: whether the extension is loaded.
    """
    global _load_error, load_attempted
    load_attempted = True
    if _loaded_path is not None:
        return True
    if _load_error is not None:
        return False  # already tried and said why
    if os.environ.get("FOXHUNT_CUDA_EXT", "").lower() in ("0", "reference", "off"):
        _load_error = "disabled by FOXHUNT_CUDA_EXT"
        logger.warning("cuda_ext: extension disabled by FOXHUNT_CUDA_EXT; ops run the references")
        return False
    if not torch.cuda.is_available():
        _load_error = "no CUDA device"
        logger.warning("cuda_ext: no CUDA device; ops run the pure-PyTorch references")
        return False
    try:
        build()
    except Exception as error:  # noqa: BLE001  (any build failure falls back to the references)
        _load_error = f"{type(error).__name__}: {error}"
        logger.warning("cuda_ext: could not build/load the extension (%s); ops run the references", error)
        return False
    return True


def ensure_loaded() -> None:
    """Attempt the load once (:func:`load_if_possible`); a no-op every later call.

    The op wrappers call it before their first call on a CUDA tensor, so a program that never touches a
    GPU never builds anything.
    """
    if not load_attempted:
        load_if_possible()


def backend() -> str:
    """Which implementation the ops run on CUDA tensors.

    Asking attempts the load first (:func:`ensure_loaded`), so the answer is the one the next CUDA call gets.

    :return: ``"cuda"`` when the extension is loaded and a GPU is present, else ``"reference"``.
    """
    ensure_loaded()
    return "cuda" if _loaded_path is not None and torch.cuda.is_available() else "reference"


def loaded_path() -> Path | None:
    """The loaded shared library, if any.

    :return: its path, or None.
    """
    return _loaded_path


def load_error() -> str | None:
    """Why the extension is not loaded, if it is not.

    :return: a one-line reason, or None.
    """
    return _load_error
