"""docs/configuration.md's tables against the settings module, so the two cannot drift apart.

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


def documented_rows() -> dict[str, str]:
    """OMNIWEB_<NAME> -> its default cell, from every table row of docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("| `OMNIWEB_"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`(OMNIWEB_[A-Z0-9_]+)`", cells[0])
        defaults = cells[1].split(" / ")
        for i, name in enumerate(names):
            assert name not in rows, f"{name} has two rows in docs/configuration.md"
            rows[name] = defaults[i] if len(defaults) == len(names) else cells[1]
    return rows


def settings_names_in_source() -> set[str]:
    """Every OMNIWEB_<NAME> that omniweb/settings.py spells out, however it reads it."""
    source = (ROOT / "omniweb" / "settings.py").read_text()
    return {f"OMNIWEB_{name}" for name in re.findall(r"""env_[a-z]+\(\s*["']([A-Z0-9_]+)["']""", source)}


def test_every_setting_has_a_row_and_every_row_a_setting():
    code, doc = set(settings_defaults()), set(documented_rows())
    assert code, "no env_* reads found in omniweb/settings.py"
    assert settings_names_in_source() <= code, "settings read in a way settings_defaults() does not parse"
    assert sorted(code - doc) == [], "settings missing from docs/configuration.md"
    assert sorted(doc - code) == [], "docs/configuration.md rows for variables omniweb/settings.py does not read"


def test_literal_defaults_in_the_docs_match_the_code():
    rows = documented_rows()
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


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (lower case, punctuation dropped, spaces to -)."""
    found = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_readme_is_short_and_names_nothing_outside_the_repository():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md over 200 lines: move the detail into docs/"
    assert "../" not in text, "README.md points outside the repository (a clone has only this tree)"
    for marker in ("<!-- run-command -->\n```sh\n", "<!-- test-command -->\n```sh\n"):
        assert marker in text, f"{marker!r}: .ci/run and the tests read the set-up commands from it"


def test_relative_links_in_the_docs_resolve():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists() or not dest.is_relative_to(ROOT):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
            elif anchor and dest.is_file() and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
