"""Every third-party module the code and the tests import is declared in ``pyproject.toml``.

CI installs into a fresh virtual environment (``.ci/run``), so an undeclared import fails there; this test
names the module and the file on any machine, before CI does. An import inside ``try: ... except
ImportError`` is optional and not checked.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("foxhunt", "foxenv", "sb3_her_ext", "cuda_ext", "tuning")
#: Import name -> distribution, for modules that may not be installed here (bench peers).
KNOWN_DISTRIBUTIONS = {
    "sb3_contrib": "sb3-contrib",
    "torchrl": "torchrl",
    "tensordict": "tensordict",
    "gym_trading_env": "gym-trading-env",
    "yaml": "pyyaml",
    "scipy": "scipy",
    "psycopg": "psycopg",
    "PIL": "pillow",
}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalise(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


def _declared() -> dict[str, set[str]]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    groups = {"dependencies": {_requirement_name(r) for r in project["dependencies"]}}
    for extra, requirements in project["optional-dependencies"].items():
        groups[extra] = {_requirement_name(r) for r in requirements}
    return groups


def _optional(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits in the body of a ``try`` that catches ImportError."""
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.Try) and node in parent.body:
            for handler in parent.handlers:
                caught = handler.type
                names = [caught] if not isinstance(caught, ast.Tuple) else list(caught.elts)
                caught_names = {n.id for n in names if isinstance(n, ast.Name)}
                if caught_names & {"ImportError", "ModuleNotFoundError", "Exception"}:
                    return True
        node = parent
    return False


def _third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            local = (REPO_ROOT / top).exists() or (REPO_ROOT / f"{top}.py").exists()
            local = local or (path.parent / f"{top}.py").exists() or (path.parent / top).is_dir()
            if top in sys.stdlib_module_names or local or top == "__future__" or _optional(node, parents):
                continue
            found.add(top)
    return found


def _distribution(module: str, installed: dict[str, list[str]]) -> str | None:
    if module in installed:
        return _normalise(installed[module][0])
    return KNOWN_DISTRIBUTIONS.get(module)


def _undeclared(folders: list[Path], allowed: set[str]) -> list[str]:
    installed = importlib.metadata.packages_distributions()
    problems = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for module in sorted(_third_party_imports(path)):
                dist = _distribution(module, installed)
                if dist is None or dist not in allowed:
                    where = path.relative_to(REPO_ROOT)
                    problems.append(f"{where}: imports {module!r} (distribution {dist}) not declared")
    return problems


def test_the_packages_and_tests_import_only_declared_dependencies() -> None:
    declared = _declared()
    allowed = declared["dependencies"] | declared["test"]
    folders = [REPO_ROOT / name for name in PACKAGES] + [REPO_ROOT / "tests"]
    assert _undeclared(folders, allowed) == []


def test_the_experiments_and_benchmarks_import_only_declared_dependencies() -> None:
    declared = _declared()
    allowed = declared["dependencies"] | declared["test"] | declared["bench"]
    assert _undeclared([REPO_ROOT / "experiments", REPO_ROOT / "benchmarks"], allowed) == []


def test_an_undeclared_import_is_found(tmp_path: Path) -> None:
    module = REPO_ROOT / "tests" / "_undeclared_probe.py"
    assert not module.exists()
    source = "import json\ntry:\n    import sb3_contrib\nexcept ImportError:\n    pass\nimport scipy\n"
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    assert _third_party_imports(probe) == {"scipy"}
