"""Code health of the project's source outside ``tests/``: no function over :data:`MAX_FUNCTION_LINES` lines.

A function's length is counted from its ``def`` line to its last line (docstring and comments included), as
``ast`` gives them; a nested function counts inside its parent and on its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The project's source packages (everything outside ``tests/`` that ships or runs).
PACKAGES = ("benchmarks", "cuda_ext", "experiments", "foxenv", "foxhunt", "sb3_her_ext", "tuning")
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 700


def _source_files() -> list[Path]:
    """Every ``.py`` file of :data:`PACKAGES`."""
    files = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    return [path for path in files if "__pycache__" not in path.parts]


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of the functions of ``path`` longer than ``limit`` lines."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        found.append((name, lines))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def test_the_walk_sees_the_packages() -> None:
    files = _source_files()
    seen = {path.relative_to(ROOT).parts[0] for path in files}
    assert seen == set(PACKAGES), f"packages with no .py file found: {sorted(set(PACKAGES) - seen)}"
    assert len(files) > 100


def test_long_functions_finds_a_long_one(tmp_path: Path) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(100))
    path = tmp_path / "long.py"
    path.write_text(f"class A:\n    def f(self):\n{body}\n\ndef g():\n    return 1\n")
    assert long_functions(path) == [("A.f", 101)]
    assert long_functions(path, limit=101) == []


def test_no_function_over_100_lines() -> None:
    offenders = []
    for path in _source_files():
        relative = path.relative_to(ROOT).as_posix()
        for name, lines in long_functions(path):
            offenders.append(f"{relative}:{name} ({lines} lines)")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines: {offenders}"


def test_no_module_over_700_lines() -> None:
    offenders = []
    for path in _source_files():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{path.relative_to(ROOT).as_posix()} ({lines} lines)")
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines: {offenders}"
