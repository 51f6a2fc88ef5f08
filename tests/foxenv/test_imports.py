"""foxenv stands alone: importing every module loads none of the other packages and draws nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_foxenv_imports_none_of_the_other_packages():
    script = """
import pkgutil, importlib, sys
import foxenv
for module in pkgutil.walk_packages(foxenv.__path__, "foxenv."):
    importlib.import_module(module.name)
others = {"foxhunt", "sb3_her_ext", "cuda_ext", "stable_baselines3", "matplotlib"}
bad = sorted(name for name in sys.modules if name.split(".")[0] in others)
print(",".join(bad))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.strip() == ""
