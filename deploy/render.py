#!/usr/bin/env python3
"""Render a deploy template: replace every ``${NAME}`` placeholder, refuse to leave any unset.

Only upper-case placeholders in braces (``${HTTPS_PORT}``) are template variables; nginx's own
variables (``$host``, ``$http_upgrade``) are lower case and pass through untouched, which plain
``envsubst`` without a variable list would not do (it would blank them).

Values come from, highest precedence first: ``--set NAME=VALUE``, the environment, ``--env-file``
files (``NAME=value`` lines, ``#`` comments, optional quotes: the same files systemd reads).

``*_UPSTREAMS`` values may be a list of addresses (``127.0.0.1:8001 127.0.0.1:8002`` or
comma-separated); they become one ``server ADDRESS;`` directive each. A value that already contains
a ``;`` is used as written (``server 127.0.0.1:8001 max_fails=2; server ...;``).

    python deploy/render.py deploy/nginx/omniweb.conf.template --env-file deploy/nginx/nginx.env.example
    python deploy/render.py deploy/nginx/omniweb.conf.template --list      # the placeholders it needs

Standard library only, so operators and tests render the templates the same way.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")


class MissingVariables(KeyError):
    """Some placeholders have no value."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(set(names))
        super().__init__(", ".join(self.names))

    def __str__(self) -> str:
        return "no value for " + ", ".join(self.names)


def placeholders(text: str) -> list[str]:
    """The placeholder names in ``text``, sorted, each once."""
    return sorted(set(PLACEHOLDER.findall(text)))


def upstream_servers(value: str) -> str:
    """``a:1 b:2`` or ``a:1,b:2`` → ``server a:1; server b:2;`` (values with ``;`` are kept)."""
    if ";" in value:
        return value.strip()
    addresses = [a for a in re.split(r"[\s,]+", value) if a]
    if not addresses:
        raise ValueError("an *_UPSTREAMS value lists no address")
    return " ".join(f"server {address};" for address in addresses)


def render(text: str, values: Mapping[str, str]) -> str:
    """Substitute every ``${NAME}``; raise ``MissingVariables`` naming all that have no value."""
    missing = [name for name in placeholders(text) if name not in values]
    if missing:
        raise MissingVariables(missing)

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        v = values[name]
        if "\n" in v or "\r" in v:
            raise ValueError(f"{name}: a value may not contain a line break")
        return upstream_servers(v) if name.endswith("_UPSTREAMS") else v

    return PLACEHOLDER.sub(value, text)


def read_env_file(path: str | Path) -> dict[str, str]:
    """``NAME=value`` lines (systemd EnvironmentFile style); blank lines and ``#`` comments skipped."""
    out: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"{path}:{number}: expected NAME=value, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[name] = value
    return out


def collect_values(env_files: Iterable[str | Path], sets: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for path in env_files:
        values.update(read_env_file(path))
    values.update(environ)
    for item in sets:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        values[name] = value
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("template", type=Path)
    parser.add_argument("-o", "--output", type=Path, help="write here (default: standard output)")
    parser.add_argument("--env-file", action="append", default=[], help="NAME=value file (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a value (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the template's placeholders and exit")
    args = parser.parse_args(argv)

    text = args.template.read_text()
    if args.list:
        print("\n".join(placeholders(text)))
        return 0
    try:
        out = render(text, collect_values(args.env_file, args.set, os.environ))
    except (MissingVariables, ValueError, OSError) as exc:
        print(f"render.py: {args.template}: {exc}", file=sys.stderr)
        return 2
    if args.output:
        args.output.write_text(out)
    else:
        sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
