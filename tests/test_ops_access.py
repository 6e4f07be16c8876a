"""Access control on the WebSocket routes: API tokens (three ways to present one) and the
per-client session limit, through the real ASGI application (Origin check in front)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import pytest
from channels.testing import WebsocketCommunicator
from django.core import signing
from django.test import AsyncClient
from support.messages import RECEIVE_TIMEOUT, SPEECH_PATH, speak

from omniweb.base import metrics
from omniweb.web import auth

TOKEN = "tok-1_Zp8rQ2vX9wL4mN7bC3dF6gH0jK5s"
OTHER = "tok-2_aB3cD4eF5gH6iJ7kL8mN9oP0qR1sT2"
BEARER = [(b"authorization", b"Bearer " + TOKEN.encode())]


def errors(kind: str) -> float:
    return metrics.REGISTRY.get_sample_value("omniweb_errors_total", {"kind": kind}) or 0.0


@pytest.fixture
def tokens(settings) -> None:
    settings.API_TOKENS = [TOKEN, OTHER]


@pytest.fixture(autouse=True)
def no_client_counts_left() -> Any:
    """Every connection the middleware counted is counted down again when it ends."""
    yield
    assert dict(auth._open_per_client) == {}


Opener = Callable[..., Any]


@pytest.fixture
async def ws(engine: Any) -> AsyncIterator[Opener]:
    """``comm, ok, detail = await ws(path, headers=, subprotocols=, client=)``; all closed after.

    ``detail`` is the accepted subprotocol when ``ok``, else the close code.
    """
    from omniweb.asgi import application

    comms: list[WebsocketCommunicator] = []

    async def open_socket(
        path: str = SPEECH_PATH,
        *,
        headers: list[tuple[bytes, bytes]] | None = None,
        subprotocols: list[str] | None = None,
        client: tuple[str, int] | None = None,
    ) -> tuple[WebsocketCommunicator, bool, Any]:
        comm = WebsocketCommunicator(application, path, headers=headers or [], subprotocols=subprotocols)
        if client is not None:
            comm.scope["client"] = list(client)  # as daphne sets it (from X-Forwarded-For with --proxy-headers)
        comms.append(comm)
        ok, detail = await comm.connect(timeout=RECEIVE_TIMEOUT)
        return comm, ok, detail

    yield open_socket
    for comm in comms:
        if not comm.future.done():
            await comm.disconnect(timeout=5)


async def served(comm: WebsocketCommunicator) -> None:
    """The socket is a working speech session."""
    await comm.send_json_to({"type": "session.config"})
    t = await speak(comm, "Hello.")
    assert t.errors == [] and len(t.of_type("audio.done")) == 1


async def ws_token(api_token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {api_token}"} if api_token else {}
    return await AsyncClient().post("/v1/ws-token", headers=headers)


def signed_long_ago(api_token: str, seconds: float) -> str:
    """A signed URL token as ``POST /v1/ws-token`` made it ``seconds`` ago."""

    class Backdated(signing.TimestampSigner):
        def timestamp(self) -> str:
            return signing.b62_encode(int(time.time() - seconds))

    return Backdated(key=api_token, salt=auth._SIGNER_SALT).sign(f"{auth._fingerprint(api_token)}@{SPEECH_PATH}")


# -- open by default ---------------------------------------------------------------------------------
async def test_without_tokens_the_socket_stays_open(ws):
    comm, ok, subprotocol = await ws()
    assert ok and subprotocol is None
    await served(comm)


async def test_offered_protocol_is_answered_even_without_tokens(ws):
    comm, ok, subprotocol = await ws(subprotocols=["omniweb.v1"])
    assert ok and subprotocol == "omniweb.v1"
    await served(comm)


# -- API tokens --------------------------------------------------------------------------------------
async def test_no_token_is_refused_before_the_consumer_runs(ws, tokens):
    before = errors("auth")
    comm, ok, _ = await ws()
    assert not ok
    assert await comm.receive_nothing(timeout=0.1)
    assert errors("auth") == before + 1


@pytest.mark.parametrize(
    "value",
    [b"Bearer wrong", b"Bearer " + TOKEN.encode() + b"x", b"Bearer " + TOKEN[:-1].encode(), b"Basic " + TOKEN.encode()],
)
async def test_wrong_bearer_is_refused(ws, tokens, value):
    _, ok, _ = await ws(headers=[(b"authorization", value)])
    assert not ok


async def test_bearer_token_is_accepted(ws, tokens):
    comm, ok, subprotocol = await ws(headers=BEARER)
    assert ok and subprotocol is None
    await served(comm)
    _, ok, _ = await ws(headers=[(b"authorization", b"bearer " + OTHER.encode())])  # any configured token
    assert ok


async def test_subprotocol_token_is_accepted_and_never_echoed(ws, tokens):
    comm, ok, subprotocol = await ws(subprotocols=["omniweb.v1", f"omniweb.token.{TOKEN}"])
    assert ok and subprotocol == "omniweb.v1"
    await served(comm)


@pytest.mark.parametrize(
    "subprotocols",
    [
        [f"omniweb.token.{TOKEN}"],  # the server could not answer a protocol the browser offered
        ["omniweb.v1", "omniweb.token.wrong"],
        ["omniweb.v1", f"omniweb.token.{TOKEN}x"],
        ["omniweb.v1"],
    ],
)
async def test_bad_subprotocol_token_is_refused(ws, tokens, subprotocols):
    _, ok, _ = await ws(subprotocols=subprotocols)
    assert not ok


async def test_signed_url_token_is_accepted(ws, tokens):
    response = await ws_token(TOKEN)
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    body = json.loads(response.content)
    assert body["expires_in"] == 300 and body["query_parameter"] == "token"
    assert TOKEN not in body["token"]
    comm, ok, _ = await ws(f"{SPEECH_PATH}?token={quote(body['token'])}")
    assert ok
    await served(comm)
    _, ok, _ = await ws(f"{SPEECH_PATH}?token={quote(signed_long_ago(OTHER, 200))}")
    assert ok


async def test_expired_forged_and_revoked_signed_tokens_are_refused(ws, tokens, settings):
    expired = signed_long_ago(TOKEN, 301)
    fresh = json.loads((await ws_token(TOKEN)).content)["token"]
    fingerprint, stamp, signature = fresh.split(":")
    forged_signature = f"{fingerprint}:{stamp}:{'A' if signature[0] != 'A' else 'B'}{signature[1:]}"
    forged_key = signing.TimestampSigner(key="not-a-token", salt=auth._SIGNER_SALT).sign(fingerprint)
    for value in (expired, forged_signature, forged_key, fingerprint, "", TOKEN):
        _, ok, _ = await ws(f"{SPEECH_PATH}?token={quote(value)}")
        assert not ok, value
    # A signed token is not an API token.
    _, ok, _ = await ws(headers=[(b"authorization", f"Bearer {fresh}".encode())])
    assert not ok
    # Removing an API token revokes the signed tokens made from it.
    settings.API_TOKENS = [OTHER]
    _, ok, _ = await ws(f"{SPEECH_PATH}?token={quote(fresh)}")
    assert not ok


async def test_ws_token_endpoint_needs_a_valid_api_token(tokens):
    before = errors("auth")
    for api_token in (None, "wrong"):
        response = await ws_token(api_token)
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert "token" not in json.loads(response.content)
    assert errors("auth") == before + 2
    assert (await AsyncClient().get("/v1/ws-token", headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 405


async def test_ws_token_endpoint_is_off_without_tokens():
    assert (await ws_token(TOKEN)).status_code == 404


async def test_origin_check_still_comes_first(ws, tokens):
    before = errors("auth")
    _, ok, _ = await ws(headers=[*BEARER, (b"origin", b"https://evil.example")])
    assert not ok
    assert errors("auth") == before  # refused by the Origin check, not counted as an auth failure
    _, ok, _ = await ws(headers=[*BEARER, (b"origin", b"http://localhost:8000")])
    assert ok


async def test_the_app_never_sees_a_token_subprotocol(settings):
    settings.API_TOKENS = [TOKEN]
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await receive()
        await send({"type": "websocket.accept"})

    comm = WebsocketCommunicator(
        auth.websocket_access(app), "/x", subprotocols=["omniweb.v1", f"omniweb.token.{TOKEN}"]
    )
    assert await comm.connect() == (True, "omniweb.v1")
    await comm.wait()
    [scope] = seen
    assert scope["subprotocols"] == ["omniweb.v1"] and scope["omniweb.web.auth"] == "subprotocol"
    assert TOKEN not in repr(scope)


# -- sessions per client -----------------------------------------------------------------------------
async def test_per_client_limit(ws, settings):
    settings.MAX_SESSIONS_PER_CLIENT = 2
    before = errors("limit")
    first, ok1, _ = await ws(client=("203.0.113.7", 50001))
    _, ok2, _ = await ws(client=("203.0.113.7", 50002))
    assert ok1 and ok2
    _, ok3, _ = await ws(client=("203.0.113.7", 50003))
    assert not ok3
    assert errors("limit") == before + 1
    other, ok, _ = await ws(client=("198.51.100.9", 50004))  # another client is not affected
    assert ok
    await served(other)
    assert auth.open_sessions("203.0.113.7") == 2
    await first.disconnect(timeout=5)  # a slot is free again once a session ends
    assert auth.open_sessions("203.0.113.7") == 1
    again, ok, _ = await ws(client=("203.0.113.7", 50005))
    assert ok
    await served(again)


async def test_limit_applies_after_authentication(ws, tokens, settings):
    settings.MAX_SESSIONS_PER_CLIENT = 1
    _, ok, _ = await ws(client=("203.0.113.7", 50001))  # refused for its missing token: holds no slot
    assert not ok
    _, ok, _ = await ws(headers=BEARER, client=("203.0.113.7", 50002))
    assert ok
    _, ok, _ = await ws(headers=BEARER, client=("203.0.113.7", 50003))
    assert not ok


async def test_loopback_is_not_limited_unless_forwarded(ws, settings):
    settings.MAX_SESSIONS_PER_CLIENT = 1
    for port in (50001, 50002):  # this machine itself (the bench, local programs)
        _, ok, _ = await ws(client=("127.0.0.1", port))
        assert ok
    _, ok, _ = await ws(client=("::1", 50003))
    assert ok
    # A local proxy that daphne does not take the client address from: all its clients share a limit.
    forwarded = [(b"x-forwarded-for", b"203.0.113.7")]
    _, ok, _ = await ws(headers=forwarded, client=("127.0.0.1", 50004))
    assert ok
    _, ok, _ = await ws(headers=forwarded, client=("127.0.0.1", 50005))
    assert not ok


async def test_zero_means_unlimited(ws, settings):
    settings.MAX_SESSIONS_PER_CLIENT = 0
    for port in range(3):
        _, ok, _ = await ws(client=("203.0.113.7", 50000 + port))
        assert ok


async def test_signed_tokens_are_bound_to_the_path_they_were_made_for(ws, tokens):
    """A leaked ?token= (a log line, a Referer) opens no other endpoint (issue #11)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    speech = json.loads((await ws_token(TOKEN)).content)
    assert speech["path"] == SPEECH_PATH
    video = json.loads((await AsyncClient().post("/v1/ws-token?path=/v1/video/chat/stream", headers=headers)).content)
    _, ok, _ = await ws(f"/v1/video/chat/stream?token={quote(speech['token'])}")
    assert not ok
    _, ok, _ = await ws(f"{SPEECH_PATH}?token={quote(video['token'])}")
    assert not ok
    _, ok, _ = await ws(f"/v1/video/chat/stream?token={quote(video['token'])}")
    assert ok
    bad = await AsyncClient().post("/v1/ws-token?path=/admin", headers=headers)
    assert bad.status_code == 400 and "path must be one of" in json.loads(bad.content)["error"]
