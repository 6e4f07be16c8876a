"""The README's configuration table against the settings module, so the two cannot drift apart.

Every ``OMNIWEB_*`` variable that omniweb/settings.py reads must have a row, every row must name a
variable it reads, and a default written as a literal in the table must equal the code's default.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READERS = {"env_str", "env_int", "env_float", "env_bool", "env_list"}


def settings_defaults() -> dict[str, tuple[str, Any]]:
    """OMNIWEB_<NAME> -> (reader, default) for every env_* call; default is None when not a constant."""
    tree = ast.parse((ROOT / "omniweb" / "settings.py").read_text())
    found: dict[str, tuple[str, Any]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in READERS:
            name, default = node.args[0], node.args[1]
            if not isinstance(name, ast.Constant):
                continue  # the readers calling one another
            value = None
            if not any(isinstance(n, ast.Name) for n in ast.walk(default)):
                value = eval(compile(ast.Expression(default), "settings", "eval"))  # constants only
            found[f"OMNIWEB_{name.value}"] = (node.func.id, value)
    return found


def readme_rows() -> dict[str, str]:
    """OMNIWEB_<NAME> -> its default cell, from the README's configuration table."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Configuration") :]
    rows: dict[str, str] = {}
    for line in table.splitlines():
        if not line.startswith("| `OMNIWEB_"):
            if rows and not line.startswith("|"):
                break  # the end of the table
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`(OMNIWEB_[A-Z0-9_]+)`", cells[0])
        defaults = cells[1].split(" / ")
        for i, name in enumerate(names):
            rows[name] = defaults[i] if len(defaults) == len(names) else cells[1]
    return rows


def test_every_setting_has_a_readme_row_and_every_row_a_setting():
    code, doc = set(settings_defaults()), set(readme_rows())
    assert sorted(code - doc) == [], "settings missing from the README's configuration table"
    assert sorted(doc - code) == [], "README rows for variables omniweb/settings.py does not read"


def test_literal_defaults_in_the_readme_match_the_code():
    rows = readme_rows()
    for name, (reader, default) in settings_defaults().items():
        cell = rows[name]
        if default is None or not cell.startswith("`"):
            continue  # computed defaults ("min(2, CPUs)", "random per process") are described in words
        shown = cell.strip("`")
        if reader == "env_bool":
            assert shown == ("1" if default else "0"), (name, cell, default)
        elif reader in ("env_int", "env_float"):
            assert float(shown) == float(default), (name, cell, default)
        else:
            assert shown == default, (name, cell, default)
