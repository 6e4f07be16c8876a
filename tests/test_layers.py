"""The layers, enforced: core ← pipelines, protocols ← adapters ← wiring, and the apps apart.

The contracts are import-linter's, in ``pyproject.toml`` (``[tool.importlinter]``); this runs them, checks
that every module of the project is in a layer (a new module cannot escape them), and that no import
cycle exists at module level. docs/architecture.md says what each layer holds and what is still ignored.

Module level means what runs when the module is imported: imports inside functions do not count (they
run later, once every module is loaded), nor do imports under ``if TYPE_CHECKING:`` (they never run).
Both still count for the contracts: a layer crossed inside a function or for a type is still crossed.
No cycle is closed through deferred imports either, between modules or between packages.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
CONFIG = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
PACKAGES = tuple(CONFIG["root_packages"])
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


# Cycles closed only by imports inside functions (each one's modules, sorted); the list only shrinks.
def test_the_import_contracts_are_kept():
    # `lint-imports` in a process of its own: called in the test process (Django and pytest's plugins
    # loaded) it fails before checking anything. --no-cache: nothing written into the repository.
    run = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr  # the report: which import crosses which contract


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _path(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _layer_modules() -> list[str]:
    [contract] = [c for c in CONFIG["contracts"] if c["id"] == "layers"]
    names = []
    for layer in contract["layers"]:
        for name in layer.replace("|", ":").split(":"):
            names.append(name.strip().strip("()"))
    return names


def test_every_module_is_in_exactly_one_layer():
    layers = _layer_modules()
    assert len(layers) == len(set(layers)), "a module is named in two layers"
    graph = _graph()
    unplaced, nested = [], []
    for module in sorted(graph.modules):
        owners = [name for name in layers if module == name or module.startswith(name + ".")]
        if len(owners) > 1:
            nested.append(module)
        # Outside every layer only a package's __init__ that imports nothing (a docstring).
        elif not owners and not (_path(module).name == "__init__.py" and not _imports_anything(_path(module))):
            unplaced.append(module)
    assert nested == [], "modules inside two layers (a layer named inside another)"
    assert unplaced == [], "modules in no layer: add each to its layer in pyproject.toml"


def _imports_anything(path: Path) -> bool:
    return any(
        isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.module != "__future__")
        for node in ast.walk(ast.parse(path.read_text()))
    )


def _runs_at_import(node: ast.If) -> bool:
    test = node.test
    name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
    return name != "TYPE_CHECKING"


def module_level_lines(path: Path) -> set[int]:
    """The lines of the import statements that run when the module is imported."""
    lines: set[int] = set()

    def visit(nodes: list[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            elif isinstance(node, ast.If) and not _runs_at_import(node):
                visit(node.orelse)
            else:
                visit(list(ast.iter_child_nodes(node)))

    visit(ast.parse(path.read_text()).body)
    return lines


def import_edges(graph: grimp.ImportGraph, *, module_level_only: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for importer in graph.modules:
        lines = module_level_lines(_path(importer)) if module_level_only else None
        for imported in graph.find_modules_directly_imported_by(importer):
            details = graph.get_import_details(importer=importer, imported=imported)
            if lines is None or any(d["line_number"] in lines for d in details):
                edges.setdefault(importer, set()).add(imported)
    return edges


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each as its sorted modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for module in sorted(edges):
        if module not in index:
            connect(module)
    return found


def test_no_import_cycle_at_module_level():
    assert cycles(import_edges(_graph(), module_level_only=True)) == set()


def package_edges(module_edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto packages (a module's package: the directory it is in)."""

    def package(module: str) -> str:
        return module if _path(module).name == "__init__.py" else module.rpartition(".")[0]

    edges: dict[str, set[str]] = {}
    for importer, imported in module_edges.items():
        for target in imported:
            if package(importer) != package(target):
                edges.setdefault(package(importer), set()).add(package(target))
    return edges


def test_no_package_cycle_at_module_level():
    """The packages form a DAG: core packages never import the apps, an app's models never its adapters."""
    assert cycles(package_edges(import_edges(_graph(), module_level_only=True))) == set()


def test_no_package_cycle_through_imports_inside_functions():
    found = cycles(package_edges(import_edges(_graph(), module_level_only=False)))
    assert found == set(), "a package cycle (through an import inside a function)"


def test_no_cycle_through_imports_inside_functions():
    found = cycles(import_edges(_graph(), module_level_only=False))
    assert found == set(), "an import cycle (through an import inside a function)"


def test_the_cycle_check_sees_a_cycle_and_skips_what_does_not_run_at_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
        "class K:\n    import d\ndef f():\n    import e\n"
    )
    assert module_level_lines(source) == {1, 2, 6, 8}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}
