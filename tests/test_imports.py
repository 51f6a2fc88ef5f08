"""The import graph of the packages: layered, no upward or circular import.

``cuda_ext`` and ``foxenv`` stand alone, ``sb3_her_ext`` knows only ``cuda_ext``, ``foxhunt`` (the app)
knows the libraries, ``tuning`` knows ``foxhunt``; ``foxhunt tune`` imports ``tuning`` inside the command
function only. Read from every import statement of the source (module level or not), and checked at run
time for ``foxhunt``: importing all its modules loads no ``tuning``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = {"cuda_ext", "foxenv", "sb3_her_ext"}
#: package -> the packages it may import (anywhere in its modules)
ALLOWED: dict[str, set[str]] = {
    "cuda_ext": set(),
    "foxenv": set(),
    "sb3_her_ext": {"cuda_ext"},
    "foxhunt": LIBRARIES,
    "tuning": LIBRARIES | {"foxhunt"},
    "experiments": LIBRARIES | {"foxhunt", "tuning"},
    "benchmarks": LIBRARIES | {"foxhunt", "experiments"},
}
#: the imports that break the layers on purpose: (module file, imported package), inside a function only
LAZY_EXCEPTIONS = {("foxhunt/cli.py", "tuning")}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(top-level package, at module level)`` of every import statement of a file."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[0], module_level) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.split(".")[0], module_level))
            visit(child, module_level and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(path.read_text()), True)
    return found


def _graph() -> dict[str, dict[str, list[tuple[str, bool]]]]:
    """package -> imported package -> ``(file, at module level)`` of each import."""
    graph: dict[str, dict[str, list[tuple[str, bool]]]] = {}
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):
            for imported, module_level in _imports(path):
                if imported in ALLOWED and imported != package:
                    where = (str(path.relative_to(ROOT)), module_level)
                    graph.setdefault(package, {}).setdefault(imported, []).append(where)
    return graph


def test_every_import_follows_the_layers() -> None:
    wrong = []
    for package, targets in _graph().items():
        for imported, places in targets.items():
            if imported in ALLOWED[package]:
                continue
            for file, module_level in places:
                if module_level or (file, imported) not in LAZY_EXCEPTIONS:
                    wrong.append(f"{file} imports {imported}" + (" at module level" if module_level else ""))
    assert wrong == []


def test_the_packages_import_each_other_in_no_cycle() -> None:
    """At module level (what importing a package runs), and in the layers allowed."""
    module_level = {package: {imported for imported, places in targets.items() if any(m for _, m in places)}
                    for package, targets in _graph().items()}

    def cyclic(graph: dict[str, set[str]]) -> list[str]:
        def reaches(start: str, goal: str, seen: frozenset[str]) -> bool:
            return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
                       for nxt in graph.get(start, ()))
        return [package for package in graph if reaches(package, package, frozenset())]

    assert cyclic(ALLOWED) == []
    assert cyclic(module_level) == []
    assert cyclic({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c"]  # the check finds one


def test_the_layer_check_sees_a_bad_import(tmp_path: Path) -> None:
    """The checker itself: an upward import at module level and one inside a function are both found."""
    path = tmp_path / "m.py"
    path.write_text("import foxhunt.runs\nfrom tuning import space\n\n\ndef f():\n"
                    "    from foxenv import spec\n")
    assert _imports(path) == [("foxhunt", True), ("tuning", True), ("foxenv", False)]


def test_importing_every_foxhunt_module_loads_no_tuning() -> None:
    script = """
import importlib, pkgutil, sys
import foxhunt
for module in pkgutil.walk_packages(foxhunt.__path__, "foxhunt."):
    importlib.import_module(module.name)
print(",".join(sorted(name for name in sys.modules if name.split(".")[0] == "tuning")))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, check=True)
    assert result.stdout.strip() == ""


def _module_graph(*packages: str) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` it imports at run time, module level or inside a function
    (``if TYPE_CHECKING:`` blocks and a submodule's import of its own parent package aside)."""
    def name_of(path: Path) -> str:
        return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")

    paths = sorted(path for package in packages for path in (ROOT / package).rglob("*.py"))
    modules = {name_of(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = name_of(path)
        targets: set[str] = set()

        def visit(node: ast.AST, targets: set[str] = targets) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                    for alias in child.names:
                        full = f"{child.module}.{alias.name}"
                        targets.add(full if full in modules else child.module)
                elif isinstance(child, ast.Import):
                    targets.update(alias.name for alias in child.names)
                visit(child)

        visit(ast.parse(path.read_text()))
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


@pytest.mark.parametrize("packages", [("foxhunt",), ("sb3_her_ext",), ("foxenv",), ("foxhunt", "tuning")])
def test_no_module_imports_itself_back_even_inside_a_function(packages: tuple[str, ...]) -> None:
    """Within a package, and between ``foxhunt`` and ``tuning`` (``foxhunt.cli`` imports ``tuning.cli`` when
    ``foxhunt tune`` runs; both take the config tree's options from ``foxhunt.options``)."""
    graph = _module_graph(*packages)

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, sorted(graph)) if c]
    assert not cycles, cycles[0]


def test_the_checker_finds_the_circle_between_foxhunt_and_tuning(tmp_path: Path) -> None:
    """The cycle test above can fail: the old ``foxhunt.cli`` <-> ``tuning.cli`` circle is one."""
    graph = _module_graph("foxhunt", "tuning")
    assert "tuning.cli" in graph["foxhunt.cli"] and "foxhunt.cli" not in graph["tuning.cli"]
    assert "foxhunt.options" in graph["tuning.cli"]


#: modules that take seconds to import on a loaded 2-core machine: none before a command runs
HEAVY = ("torch", "numpy", "stable_baselines3", "gymnasium", "optuna", "pandas", "scipy", "matplotlib",
         "foxhunt.evaluation.api", "foxhunt.evaluation.report", "sb3_her_ext", "tuning.study",
         "tuning.objective")


def test_building_the_parser_and_its_answers_import_nothing_heavy() -> None:
    """``foxhunt --help``, ``--version``, ``train --help`` and an argument error answer before torch is
    imported (issue 39.4: they took 7-25 s on a loaded 2-core machine)."""
    script = f"""
import contextlib, io, sys
from foxhunt.cli import build_parser, main
build_parser()
for argv in (["--help"], ["--version"], ["train", "--help"], ["rollout", "--help"], ["evaluate", "--help"],
             ["evalute"], ["evaluate", "x", "--n-envs", "y"], ["tune", "--help"], ["tune", "--n-trials", "x"],
             ["train", "--n-envs", "x"], ["train", "--stepz", "1"], ["train", "--env.market", "x:1"],
             ["watch", "--help"], ["watch", "x", "--book", "y"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exit:
            assert exit.code in (0, 2), (argv, exit.code)
        else:
            raise AssertionError(argv)
print(",".join(sorted(name for name in sys.modules if name.startswith({HEAVY!r}))))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, check=True)
    assert result.stdout.strip() == ""
