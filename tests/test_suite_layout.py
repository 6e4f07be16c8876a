"""The test suite's own layout: helpers shared between tests live in ``tests/support/``.

No test module imports another test module, and ``conftest.py`` (fixtures and hooks, loaded by
pytest) is never imported as a library: what a test needs from elsewhere comes from ``support``.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (imports inside functions count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def forbidden(module: str) -> bool:
    last = module.removeprefix("tests.")
    return last == "conftest" or last.split(".")[0].startswith("test_")


def test_no_test_module_imports_another_or_conftest():
    files = [*TESTS.glob("test_*.py"), TESTS / "conftest.py", *(TESTS / "support").glob("*.py")]
    bad = {f.name: sorted(m for m in imported_modules(f) if forbidden(m)) for f in files}
    assert {name: mods for name, mods in bad.items() if mods} == {}


def test_the_helpers_are_in_support_not_beside_the_tests():
    helpers = [p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py"]
    assert helpers == [], "shared test helpers belong in tests/support/"
