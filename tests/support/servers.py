"""Servers the tests start: free loopback ports, the app under ``runserver`` or daphne
(``live_server``), and redis-server with two engine workers (``redis_stack``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DAPHNE_ARGS = ["--websocket-max-message-size", "16777216", "--websocket-max-frame-size", "16777216"]


def daphne_args(port: int) -> list[str]:
    """``python <these>``: daphne serving the app on a loopback port, as the production command does."""
    return ["-m", "daphne", *DAPHNE_ARGS, "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]


@contextlib.contextmanager
def live_daphne(*, redis_url: str | None = None, **env: str) -> Iterator[str]:
    """daphne (``daphne_args``) on a free port, as ``live_server`` runs it; yields the base URL."""
    port = free_port()
    with live_server(daphne_args(port), port, redis_url=redis_url, **env) as url:
        yield url


@contextlib.contextmanager
def live_server(args: list[str], port: int, *, redis_url: str | None = None, **env: str) -> Iterator[str]:
    """The app served by ``python <args>`` (runserver or daphne) on a loopback port.

    Yields the base URL (``http://127.0.0.1:<port>``) once /healthz says the engine has loaded:
    daphne drops a WebSocket handshake that waits over 5 s, so no session may race the model load.
    The server's output goes to a file (a pipe nobody reads would block a chatty server). In Redis
    mode only when ``redis_url`` says so (``redis_stack``'s): never the environment's.
    """
    full_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings", "PYTHONUNBUFFERED": "1", **env}
    full_env.pop("OMNIWEB_REDIS_URL", None)
    if redis_url is not None:
        full_env["OMNIWEB_REDIS_URL"] = redis_url
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=2) as resp:
                        if json.loads(resp.read())["ready"]:  # 503 (an HTTPError) while the models load
                            break
                except (OSError, ValueError, KeyError):
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"{' '.join(args)} did not start:\n{log.read().decode(errors='replace')}")
                time.sleep(0.2)
            yield base
        finally:
            stop([proc])


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def redis_stack() -> Iterator[str]:
    """redis-server and two engine workers on loopback; yields the Redis URL."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    env = {**os.environ, "OMNIWEB_REDIS_URL": url, "DJANGO_SETTINGS_MODULE": "omniweb.settings"}
    workers = [
        subprocess.Popen([sys.executable, "manage.py", "runworker", "omniweb-engine"], cwd=ROOT, env=env)
        for _ in range(2)
    ]
    procs = [*workers, server]
    try:
        import redis

        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 60

        def workers_up() -> int:
            """Workers whose heartbeat says their models are loaded (they heartbeat while loading)."""
            try:
                beats = [json.loads(v) for v in client.mget(client.keys("omniweb:worker:*")) if v]
            except redis.ConnectionError:  # the server is still starting
                return 0
            return sum(1 for beat in beats if beat.get("ready"))

        while workers_up() < len(workers):  # both loaded their models
            assert time.monotonic() < deadline, "engine workers did not come up"
            assert all(w.poll() is None for w in workers), "an engine worker exited"
            time.sleep(0.1)
        client.close()
        yield url
    finally:
        stop(procs)
