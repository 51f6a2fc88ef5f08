"""Command line of cuda_ext: ``python -m cuda_ext build`` (build ahead of time) and ``... info``."""

from __future__ import annotations

import argparse
import sys

import torch

import cuda_ext
from cuda_ext.build import build, build_directory, load_error, loaded_path, sources


def main(argv: list[str] | None = None) -> int:
    """Run the ``build`` or ``info`` command.

    :param argv: arguments (default: ``sys.argv[1:]``).
    :return: the process exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m cuda_ext", description=__doc__)
    parser.add_argument(
        "command", choices=["build", "info"], help="build: compile, link and load the extension; info: status"
    )
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands")
    args = parser.parse_args(argv)
    if args.command == "build":
        path = build(verbose=args.verbose)
        print(f"built and loaded {path}")
    backend = cuda_ext.backend()  # attempts the load first (lazy), so the lines below report its outcome
    print(f"sources: {' '.join(p.name for p in sources())}")
    print(f"build directory: {build_directory()}")
    print(f"loaded: {loaded_path()}  (reason if not: {load_error()})")
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    print(f"backend: {backend}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
