"""Fixtures and hooks for the whole suite; the helpers the tests share are in ``tests/support/``.

The WebSocket tests drive the real ASGI application (``omniweb.asgi.application``, so the Origin
check is in the path) with the real models. Every test that opens sockets runs twice, once per
dispatch path: ``local`` (the embedded default: in-process engine) and ``redis`` (channels_redis to
two real ``manage.py runworker omniweb-engine`` processes on a redis-server the fixture starts;
skipped without redis-server). After every test the engine must be idle again (no active, queued
or running work) and no task started by a consumer may be left on the test's event loop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
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

import support.engine as engine_support  # after the environment above
from support.messages import RECEIVE_TIMEOUT, SPEECH_PATH
from support.servers import redis_stack


def pytest_configure(config: pytest.Config) -> None:
    """The in-process engine too: settings were read before this module, but no engine exists yet
    (importing omniweb.asgi during collection preloads one). Set directly, they reach the core
    through the wiring once more (``override_settings`` does that by itself)."""
    from django.conf import settings

    from omniweb.wiring import configure_core

    settings.ENGINE_MAX_AHEAD_SECONDS = 0.0
    settings.ENGINE_READY_WAIT_SECONDS = 120.0
    settings.ENGINE_ADMIT_BUDGET_MS = 0.0
    configure_core()


@pytest.fixture(autouse=True)
def engine_left_idle() -> Iterator[None]:
    """After each test: no active/queued requests and no running steps (abort is asynchronous)."""
    yield
    engine_support.wait_engine_idle()


@pytest.fixture(scope="session", params=["local", "redis"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The dispatch path under test, started once (models loaded) outside any test's time budget."""
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
        engine_support.reset_engine_client()
        engine_support.redis_url = url
        try:
            yield get_engine_client()
        finally:
            engine_support.redis_url = None
            engine_support.reset_engine_client()


@pytest.fixture
async def connect(engine: Any) -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``comm = await connect(headers=..., expect_accept=True)``; every socket is closed after."""
    from omniweb.asgi import application

    if engine_support.redis_url is not None:
        # channels_redis binds its receive lock to an event loop; every test has its own loop.
        engine_support.reset_engine_client()
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
        await engine_support.close_sessions(comms)
    finally:
        if engine_support.redis_url is not None:
            from channels.layers import channel_layers

            layer = channel_layers.backends.get("default")
            if layer is not None:
                await layer.close_pools()  # this test's loop is about to close


@pytest.fixture
def requests_seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Records every engine request the sessions send, in its wire form (the Redis mode's message,
    to compare as data); the real client still serves them."""
    from omniweb.engine import client as engine_client
    from omniweb.engine import dispatch
    from omniweb.engine.requests import to_wire

    seen: list[dict[str, Any]] = []
    for cls in (engine_client.LocalEngineClient, dispatch.ChannelEngineClient):
        real = cls.stream

        def spy(self, request, request_id=None, _real=real):
            seen.append(to_wire(request))
            return _real(self, request, request_id)

        monkeypatch.setattr(cls, "stream", spy)
    return seen


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright (``support.page_frames.launch``: fake camera and microphone)."""
    from playwright.sync_api import sync_playwright
    from support.page_frames import launch

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; an uncaught error in it fails the test (``page.errors`` lists them)."""
    # bypass_csp: the tests' own wait_for_function strings are eval'd in the page, which the pages'
    # CSP (script-src 'self') forbids; test_pages_run_under_their_csp checks the pages with it on.
    context = browser.new_context(viewport={"width": 1100, "height": 900}, bypass_csp=True)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors
    yield pg
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"
