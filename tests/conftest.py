"""Shared fixtures for the streaming speech WebSocket tests (``tests/test_speech_*.py``).

The tests drive the real ASGI application (``omniweb.asgi.application``, so the Origin check is in
the path) with the real hibari voice. Every test that opens sockets runs twice, once per dispatch
path: ``local`` (the embedded default: in-process engine) and ``redis`` (channels_redis to two real
``manage.py runworker omniweb-engine`` processes on a redis-server the fixture starts). After every
test the engine must be idle again (no active, queued or running work) and no task started by a
consumer may be left on the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

# Unpaced engines for the suite (here and in every server or worker a test starts): pacing keeps a
# stream at most 30 s ahead of real-time playback, which would make long-flush tests take minutes.
# Pacing itself is tested on purpose-built schedulers (test_engine_scheduler, test_engine_tts).
os.environ["OMNIWEB_ENGINE_MAX_AHEAD_SECONDS"] = "0"
# A test that restarts the engine (a fresh runtime) must not see "starting" because the models
# load slowly on a busy CI box: its requests wait for them. The readiness tests set their own wait.
os.environ["OMNIWEB_ENGINE_READY_WAIT_SECONDS"] = "120"
# No load shedding either: on a busy CI box the estimated first-audio wait of a test's burst of
# sessions can pass the 2 s budget. Shedding is tested on schedulers built for it (test_speech_admission).
os.environ["OMNIWEB_ENGINE_ADMIT_BUDGET_MS"] = "0"

SPEECH_PATH = "/v1/audio/speech/stream"
RECEIVE_TIMEOUT = 20.0  # generous: a slow CI box still answers a short flush in well under a second
IDLE_POLL_SECONDS = 2.0


# -- message collection ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Closed:
    """The server closed the socket (``websocket.close``)."""

    code: int | None


Message = dict[str, Any] | bytes | Closed


@dataclass
class Transcript:
    """What the server sent, in order: JSON messages as dicts, binary frames as bytes."""

    events: list[Message] = field(default_factory=list)

    @property
    def json(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict)]

    @property
    def binary(self) -> list[bytes]:
        return [e for e in self.events if isinstance(e, bytes)]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.json if e.get("type") == kind]

    @property
    def types(self) -> list[str]:
        """One label per event: the JSON ``type``, ``"<binary>"`` or ``"<close>"``."""
        out = []
        for e in self.events:
            if isinstance(e, dict):
                out.append(e.get("type", "?"))
            elif isinstance(e, bytes):
                out.append("<binary>")
            else:
                out.append("<close>")
        return out

    @property
    def errors(self) -> list[str]:
        return [e["message"] for e in self.of_type("error")]

    @property
    def closed(self) -> bool:
        return any(isinstance(e, Closed) for e in self.events)

    def sentences(self) -> list[Sentence]:
        """Group the events between each audio.start and its audio.done."""
        out: list[Sentence] = []
        current: Sentence | None = None
        for e in self.events:
            if isinstance(e, dict) and e.get("type") == "audio.start":
                assert current is None, f"audio.start inside an open sentence: {e}"
                current = Sentence(start=e)
            elif isinstance(e, dict) and e.get("type") == "audio.done":
                assert current is not None, f"audio.done without audio.start: {e}"
                current.done = e
                out.append(current)
                current = None
            elif current is not None:
                current.events.append(e)
        assert current is None, "a sentence was left open"
        return out


@dataclass
class Sentence:
    start: dict[str, Any]
    events: list[Message] = field(default_factory=list)
    done: dict[str, Any] | None = None

    @property
    def binary(self) -> list[bytes]:
        return [e for e in self.events if isinstance(e, bytes)]

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict) and e.get("type") == "audio.chunk"]

    @property
    def audio(self) -> bytes:
        return b"".join(self.binary)


async def receive(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> Message:
    """The next thing the server sent: a JSON dict, binary bytes, or ``Closed``."""
    out = await comm.receive_output(timeout)
    if out["type"] == "websocket.close":
        return Closed(out.get("code"))
    assert out["type"] == "websocket.send", out
    if out.get("text") is not None:
        return json.loads(out["text"])
    return out["bytes"]


async def receive_until(
    comm: WebsocketCommunicator,
    stop: Callable[[Message], bool],
    timeout: float = RECEIVE_TIMEOUT,
) -> Transcript:
    """Collect messages up to and including the first one for which ``stop`` is true (or a close)."""
    transcript = Transcript()
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        assert remaining > 0, f"timed out; got {transcript.types}"
        msg = await receive(comm, remaining)
        transcript.events.append(msg)
        if isinstance(msg, Closed) or stop(msg):
            return transcript


def is_type(kind: str) -> Callable[[Message], bool]:
    return lambda m: isinstance(m, dict) and m.get("type") == kind


async def receive_until_done(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> Transcript:
    """Collect one utterance's messages up to and including its ``session.done``."""
    transcript = await receive_until(comm, is_type("session.done"), timeout)
    assert not transcript.closed, f"socket closed before session.done: {transcript.types} {transcript.errors}"
    return transcript


async def receive_json(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> dict[str, Any]:
    msg = await receive(comm, timeout)
    assert isinstance(msg, dict), f"expected a JSON message, got {msg!r:.200}"
    return msg


async def expect_error(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> str:
    msg = await receive_json(comm, timeout)
    assert msg["type"] == "error", msg
    return msg["message"]


async def expect_close(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> Closed:
    msg = await receive(comm, timeout)
    assert isinstance(msg, Closed), f"expected the socket to close, got {msg!r:.200}"
    return msg


async def expect_silence(comm: WebsocketCommunicator, seconds: float = 0.2) -> None:
    """Nothing more arrives (and the socket stays open) for ``seconds``."""
    assert await comm.receive_nothing(timeout=seconds, interval=0.01)


async def speak(comm: WebsocketCommunicator, text: str | list[str], timeout: float = RECEIVE_TIMEOUT) -> Transcript:
    """Send the text (one or several input.text messages), flush, and collect through session.done."""
    for part in [text] if isinstance(text, str) else text:
        await comm.send_json_to({"type": "input.text", "text": part})
    await comm.send_json_to({"type": "input.done"})
    return await receive_until_done(comm, timeout)


# -- engine and session fixtures -------------------------------------------------------------------


ROOT = Path(__file__).resolve().parent.parent
_redis_url: str | None = None  # set while the redis dispatch path is under test


def _workers_busy(url: str) -> tuple[bool, Any]:
    """Load reported by the workers' heartbeat keys (refreshed twice a second)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        beats = [json.loads(v) for v in client.mget(client.keys("omniweb:worker:*")) if v]
    finally:
        client.close()
    busy = any(b["active"] or b["queued"] or b["running_steps"] for b in beats)
    return busy, beats


def _engine_busy() -> tuple[bool, Any]:
    from omniweb.engine import runtime

    if _redis_url is not None:
        return _workers_busy(_redis_url)
    sched = runtime._scheduler
    if sched is None:  # never started in this process (e.g. the pure-function tests): nothing to check
        return False, None
    stats = sched.stats()
    return bool(stats.active or stats.queued or stats.running_steps), stats


def wait_engine_idle(seconds: float = IDLE_POLL_SECONDS) -> Any:
    """Poll the engine (in-process, or the workers' heartbeats) until idle; fail with its stats."""
    if _redis_url is not None:
        seconds += HEARTBEAT_LAG
    deadline = time.monotonic() + seconds
    while True:
        busy, stats = _engine_busy()
        if not busy:
            return stats
        assert time.monotonic() < deadline, f"engine still has work {seconds}s after the test: {stats}"
        time.sleep(0.02)


def pytest_configure(config: pytest.Config) -> None:
    """The in-process engine too: settings were read before this module, but no engine exists yet
    (importing omniweb.asgi during collection preloads one)."""
    from django.conf import settings

    settings.ENGINE_MAX_AHEAD_SECONDS = 0.0
    settings.ENGINE_READY_WAIT_SECONDS = 120.0
    settings.ENGINE_ADMIT_BUDGET_MS = 0.0


@pytest.fixture(autouse=True)
def engine_left_idle() -> Iterator[None]:
    """After each test: no active/queued requests and no running steps (abort is asynchronous)."""
    yield
    wait_engine_idle()


HEARTBEAT_LAG = 0.6  # a worker's heartbeat key may be this old


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DAPHNE_ARGS = ["--websocket-max-message-size", "16777216", "--websocket-max-frame-size", "16777216"]


@contextlib.contextmanager
def live_server(args: list[str], port: int, **env: str) -> Iterator[str]:
    """The app served by ``python <args>`` (runserver or daphne) on a loopback port.

    Yields the base URL (``http://127.0.0.1:<port>``) once /healthz says the engine has loaded:
    daphne drops a WebSocket handshake that waits over 5 s, so no session may race the model load.
    The server's output goes to a file (a pipe nobody reads would block a chatty server).
    """
    full_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings", "PYTHONUNBUFFERED": "1", **env}
    full_env.pop("OMNIWEB_REDIS_URL", None)
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
            _stop([proc])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
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
        _stop(procs)


def _reset_engine_client() -> None:
    from channels.layers import channel_layers

    from omniweb.engine import runtime

    runtime._client = None
    channel_layers.backends.clear()


@pytest.fixture(scope="session", params=["local", "redis"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The dispatch path under test, started once (models loaded) outside any test's time budget."""
    global _redis_url
    from django.test import override_settings

    from omniweb.engine.runtime import get_engine_client, get_scheduler

    if request.param == "local":
        get_engine_client()
        yield get_scheduler()
        return
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(redis_stack())
        layers = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [url]}}}
        stack.enter_context(override_settings(REDIS_URL=url, CHANNEL_LAYERS=layers))
        _reset_engine_client()
        _redis_url = url
        try:
            yield get_engine_client()
        finally:
            _redis_url = None
            _reset_engine_client()


def _consumer_tasks() -> list[asyncio.Task[Any]]:
    """Tasks on this loop still running code from the app (consumers, engine client, channels)."""
    stray = []
    for task in asyncio.all_tasks():
        if task is asyncio.current_task() or task.done():
            continue
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None) or getattr(coro, "ag_code", None)
        filename = code.co_filename if code is not None else repr(coro)
        if any(part in filename for part in ("/speech/", "/video/", "/omniweb/", "/channels/", "/asgiref/")) or (
            "aclose" in repr(coro)
        ):
            stray.append(task)
    return stray


@pytest.fixture
async def connect(engine: Any) -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``comm = await connect(headers=..., expect_accept=True)``; every socket is closed after."""
    from omniweb.asgi import application

    if _redis_url is not None:
        # channels_redis binds its receive lock to an event loop; every test has its own loop.
        _reset_engine_client()
    comms: list[WebsocketCommunicator] = []

    async def factory(
        path: str = SPEECH_PATH,
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        expect_accept: bool = True,
    ) -> WebsocketCommunicator:
        comm = WebsocketCommunicator(application, path, headers=headers or [])
        comms.append(comm)
        connected, _ = await comm.connect(timeout=RECEIVE_TIMEOUT)
        assert connected is expect_accept, f"connect returned {connected}, expected {expect_accept}"
        return comm

    yield factory
    try:
        await _close_sessions(comms)
    finally:
        if _redis_url is not None:
            from channels.layers import channel_layers

            layer = channel_layers.backends.get("default")
            if layer is not None:
                await layer.close_pools()  # this test's loop is about to close


async def _close_sessions(comms: list[WebsocketCommunicator]) -> None:
    """Disconnect every socket; then no consumer task may be left and no consumer may have raised."""
    for comm in comms:
        if not comm.future.done():
            await comm.disconnect(timeout=5)
    if any(comm.future.cancelled() for comm in comms):
        # A receive timed out and the communicator cancelled the app (the test has failed already):
        # the consumer never saw a disconnect, so its tasks are cleaned up here instead of reported.
        stray = _consumer_tasks()
        for task in stray:
            task.cancel()
        await asyncio.gather(*stray, return_exceptions=True)
        return
    # Cancelled tasks and async generators finalise on later loop iterations: poll briefly.
    deadline = time.monotonic() + IDLE_POLL_SECONDS
    while (stray := _consumer_tasks()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not stray, f"tasks left running after the sessions closed: {stray}"
    for comm in comms:  # an exception inside a consumer must not pass silently
        if comm.future.done() and not comm.future.cancelled():
            comm.future.result()


async def configure(comm: WebsocketCommunicator, **fields: Any) -> None:
    """Send a session.config that must be accepted (the server answers a valid config with nothing)."""
    await comm.send_json_to({"type": "session.config", **fields})


async def session(connect: Callable[..., Any], **fields: Any) -> WebsocketCommunicator:
    """A connected socket with a session.config already sent."""
    comm = await connect()
    await configure(comm, **fields)
    return comm


def hibari_network_outputs(sentences: list[str]) -> list[tuple[Any, ...]]:
    """hibari's real network outputs (lh, th, ln, lr, phi, f0) for each sentence's first segment."""
    import numpy as np
    from hibari import Hibari

    t = Hibari()
    res = []
    for text in sentences:
        ids = np.asarray([t.ids(t.phonemize(text)[0])], np.int64)
        out = t.sess.run(None, {"ids": ids, "speed": np.asarray([1.0], np.float32)})
        res.append(tuple(o[0] for o in out[:6]))
    return res
