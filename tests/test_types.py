"""The types, checked: mypy over the three packages with the project's configuration.

The configuration is ``[tool.mypy]`` in ``pyproject.toml``: every package checked, the core
(``omniweb.engine``, ``omniweb.conversation``) and the language model (``omniweb.llm``) strictly,
the untyped third-party libraries named. This runs mypy in the test process (its API), incrementally:
the cache is mypy's default ``.mypy_cache`` at the repository root (git ignores it), so a run after a
small change rechecks only what it touches (about a second; from no cache, about 20 s). The failure
message is mypy's report.
"""

from __future__ import annotations

import gc
import sys
import tomllib
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
STRICT = ["omniweb.engine.*", "omniweb.conversation.*", "omniweb.llm.*"]
# What ``--strict`` turns on, less the one global flag (warn_redundant_casts, set for all).
STRICT_FLAGS = {
    "disallow_any_generics": True,
    "disallow_subclassing_any": True,
    "disallow_untyped_calls": True,
    "disallow_untyped_defs": True,
    "disallow_incomplete_defs": True,
    "check_untyped_defs": True,
    "disallow_untyped_decorators": True,
    "warn_unused_ignores": True,
    "warn_return_any": True,
    "implicit_reexport": False,
    "strict_equality": True,
    "extra_checks": True,
}


def test_every_package_is_checked_and_the_core_strictly():
    assert sorted(CONFIG["files"]) == ["omniweb", "speech", "video"]
    strict = [o for o in CONFIG["overrides"] if set(STRICT) & set(o["module"])]
    assert [sorted(o["module"]) for o in strict] == [sorted(STRICT)], "one strict section, for exactly these"
    assert {k: v for k, v in strict[0].items() if k != "module"} == STRICT_FLAGS
    # ``strict = true`` in an override turns strict mode on for every module: never use it there.
    assert all("strict" not in o for o in CONFIG["overrides"])


def test_mypy_finds_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the configuration's paths, and the cache, are the repository's
    # What mypy changes in the process it runs in, put back for the tests after this one.
    monkeypatch.setenv("MYPY_CONFIG_FILE_DIR", str(ROOT))
    threshold, limit = gc.get_threshold(), sys.getrecursionlimit()
    try:
        stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    finally:
        gc.set_threshold(*threshold)
        sys.setrecursionlimit(limit)
    assert status == 0, stdout + stderr  # mypy's report: each error with its file, line and code
