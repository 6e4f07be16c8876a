"""The Origin check in front of the speech socket: programs (no Origin) and our own pages only."""

from __future__ import annotations

import pytest
from support.messages import session, speak


async def test_no_origin_is_accepted(connect):
    comm = await session(connect)
    t = await speak(comm, "Hello.")
    assert t.errors == [] and len(t.of_type("audio.done")) == 1


@pytest.mark.parametrize(
    "origin",
    [
        b"http://localhost:8000",
        b"http://localhost",
        b"https://localhost",
        b"http://127.0.0.1",
        b"http://127.0.0.1:8000",
        b"http://[::1]:8000",
        b"HTTP://LOCALHOST:8000",
    ],
)
async def test_same_site_origin_is_accepted(connect, origin):
    comm = await connect(headers=[(b"origin", origin)])
    await comm.send_json_to({"type": "session.config"})
    t = await speak(comm, "Hello.")
    assert t.errors == [] and len(t.of_type("audio.done")) == 1


@pytest.mark.parametrize(
    "origin",
    [
        b"https://evil.example",
        b"http://evil.example:8000",
        b"http://localhost.evil.example",
        b"http://127.0.0.1.evil.example",
        b"http://evil.example@localhost.attacker.example",
        b"null",
        b"",
        b"file://",
    ],
)
async def test_foreign_origin_is_rejected(connect, origin):
    await connect(headers=[(b"origin", origin)], expect_accept=False)


async def test_rejected_origin_never_reaches_the_consumer(connect):
    comm = await connect(headers=[(b"origin", b"https://evil.example")], expect_accept=False)
    assert await comm.receive_nothing(timeout=0.1)


async def test_other_paths_are_not_routed(connect):
    from channels.testing import WebsocketCommunicator

    from omniweb.asgi import application

    comm = WebsocketCommunicator(application, "/v1/audio/speech/other")
    connected, _ = await comm.connect(timeout=0.5)  # refused (HTTP 403), no ValueError / HTTP 500
    assert connected is False
