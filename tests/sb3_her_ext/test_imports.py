"""sb3_her_ext is a generic SB3 library: importing every module loads neither foxenv nor foxhunt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sb3_her_ext_imports_no_env_or_application_package():
    script = """
import pkgutil, importlib, sys
import sb3_her_ext
for module in pkgutil.walk_packages(sb3_her_ext.__path__, "sb3_her_ext."):
    importlib.import_module(module.name)
bad = sorted(name for name in sys.modules if name.split(".")[0] in {"foxenv", "foxhunt"})
print(",".join(bad))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.strip() == ""


def test_sb3_her_ext_holds_no_trading_vocabulary():
    """The trading names live in foxenv.spec and foxhunt.presets, not in the algorithm library."""
    words = ("direction", "magnitude", "urgency", "limit_maker", "LimitMaker")
    offenders = []
    for path in sorted((ROOT / "sb3_her_ext").glob("*.py")):
        if path.name in ("hindsight.py", "replay.py"):
            continue  # hindsight relabels trades: its branch roles are named arguments (HindsightConfig)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(f'"{word}"' in code or f"'{word}'" in code for word in words):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []
