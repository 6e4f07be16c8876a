"""The pages' JavaScript under TypeScript's checker: every module in static/js starts with
``// @ts-check``, carries JSDoc types, and ``tsc --noEmit -p static/tsconfig.json`` (strict, DOM
types) reports no error, in static/js and in what it imports (static/codec/decoder.js).

tsc is Debian's ``node-typescript`` (installed by ``.ci/run``); without it the check skips.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "static"
CONFIG = STATIC / "tsconfig.json"
PAGES = sorted((STATIC / "js").glob("*.js"))
TSC = shutil.which("tsc")


def test_every_page_module_asks_for_the_check():
    assert PAGES, "no JavaScript in static/js"
    unchecked = [p.name for p in PAGES if not p.read_text().startswith("// @ts-check\n")]
    assert unchecked == [], "modules without // @ts-check on their first line"


def test_the_config_is_strict_and_covers_static_js():
    # tsconfig.json allows comments: drop the whole-line ones before reading it as JSON.
    text = "\n".join(line for line in CONFIG.read_text().splitlines() if not line.lstrip().startswith("//"))
    config = json.loads(text)
    options = config["compilerOptions"]
    assert options["strict"] and options["checkJs"] and options["noEmit"]
    assert "DOM" in options["lib"]
    assert config["include"] == ["js/*.js"]


def test_pages_keep_their_state_in_one_object():
    """No module-level ``let``/``var``: each page's state is one object (named states inside)."""
    loose = {p.name: re.findall(r"^(?:let|var) (\w+)", p.read_text(), re.MULTILINE) for p in PAGES}
    assert {name: names for name, names in loose.items() if names} == {}


@pytest.mark.skipif(TSC is None, reason="tsc is not installed (.ci/run installs node-typescript): JavaScript unchecked")
def test_tsc_finds_no_type_error():
    assert TSC is not None
    done = subprocess.run(
        [TSC, "--noEmit", "--pretty", "false", "-p", str(CONFIG)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"tsc reported:\n{done.stdout}{done.stderr}"
    assert done.stdout == "", done.stdout
