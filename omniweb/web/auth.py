"""Access control for WebSocket routes: API tokens and a per-client session limit (ASGI middleware).

``websocket_access(app)`` sits between the Origin check and the URL router (see ``omniweb.asgi``).
With nothing configured it admits every connection, as before.

**API tokens** (``API_TOKENS``, from ``OMNIWEB_API_TOKENS``). When set, a connection must present
one of them, in any of three ways:

- ``Authorization: Bearer <token>`` (programs);
- the subprotocol list ``Sec-WebSocket-Protocol: omniweb.v1, omniweb.token.<token>`` (browsers,
  which cannot set headers); the server answers ``omniweb.v1`` and never echoes the token;
- the subprotocol ``openai-insecure-api-key.<token>`` (OpenAI's browser Realtime clients, on
  ``/v1/realtime``); like the one above, it never reaches the consumer;
- ``?token=<signed>``: a short-lived token from ``POST /v1/ws-token`` (``omniweb.web.views.ws_token``),
  signed with ``django.core.signing.TimestampSigner`` keyed by the API token that asked for it, valid
  for ``SIGNED_URL_MAX_AGE`` seconds on every process that has that API token configured, and only
  on the WebSocket path it was made for (``path``, default the speech stream); removing the API
  token revokes the signed tokens made from it.

**Client secrets** (``ek_...``, from ``POST /v1/realtime/client_secrets``: OpenAI's short-lived keys
for browsers and phones) are signed the same way, keyed by the API token that asked for one (by
``SECRET_KEY`` when no tokens are configured), and carry their expiry and the session configuration
the sessions they open start with; every process with that key accepts them, none keeps them. An
``ek_`` is presented where an API key goes (``Authorization: Bearer``, or the
``openai-insecure-api-key.`` subprotocol) on ``/v1/realtime`` only; a forged, expired or revoked one
is refused whether or not tokens are configured. The session configuration reaches the consumer as
``scope[CLIENT_SECRET_SCOPE_KEY]``.

Comparisons are constant-time (``hmac.compare_digest``). A refused connection gets its handshake
closed (HTTP 403) before any consumer runs and counts in ``omniweb_errors_total{kind="auth"}``.

**Sessions per client** (``MAX_SESSIONS_PER_CLIENT``; 0 = unlimited). Keyed by ``scope["client"]``'s
address, which daphne takes from ``X-Forwarded-For`` when run with ``--proxy-headers``. Connections
without an address, and loopback connections that carry no forwarding header (this machine itself:
the bench, a local program), are not limited. The count is per daphne process. Over the limit the
handshake is closed and counted in ``omniweb_errors_total{kind="limit"}``.

This middleware also keeps ``omniweb_sessions_open{endpoint}``: up when the app accepts the socket,
down once when the connection's app returns.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.core import signing

from omniweb.base import metrics
from omniweb.engine.tenants import TENANT

from .security import deny_handshake

logger = logging.getLogger(__name__)

PROTOCOL = "omniweb.v1"  # the subprotocol the server answers when a client offers it
TOKEN_PROTOCOL_PREFIX = "omniweb.token."
OPENAI_KEY_PROTOCOL_PREFIX = "openai-insecure-api-key."  # OpenAI's browser SDKs send the key this way
_SECRET_PROTOCOL_PREFIXES = (TOKEN_PROTOCOL_PREFIX, OPENAI_KEY_PROTOCOL_PREFIX)
SIGNED_TOKEN_PARAM = "token"
DEFAULT_TOKEN_PATH = "/v1/audio/speech/stream"  # what POST /v1/ws-token binds a token to by default
_SIGNER_SALT = "omniweb.ws-token"
_FORWARDING_HEADERS = (b"x-forwarded-for", b"forwarded", b"x-real-ip")
CLIENT_SECRET_PREFIX = "ek_"
CLIENT_SECRET_PATH = "/v1/realtime"  # where a client secret opens sessions (WebSocket)
CLIENT_SECRET_SCOPE_KEY = "omniweb.client_secret"  # the session configuration a connection's secret carries
# A client secret travels in a header: with the other headers it must fit daphne's (Twisted's) 16 KiB.
MAX_CLIENT_SECRET_CHARS = 8192
_CLIENT_SECRET_SALT = "omniweb.realtime.client-secret"

_open_per_client: Counter[str] = Counter()  # this process's open connections by client address
_warned_unforwarded_proxy = False


# -- tokens ------------------------------------------------------------------------------------------
def api_tokens() -> list[str]:
    return [t for t in settings.API_TOKENS if t]


def match_token(candidate: str, tokens: Sequence[str]) -> str | None:
    """The configured token equal to ``candidate``, compared in constant time against every one."""
    found = None
    presented = candidate.encode("utf-8", "surrogateescape")
    for token in tokens:
        if hmac.compare_digest(presented, token.encode("utf-8", "surrogateescape")):
            found = token
    return found


def parse_bearer(value: str) -> str | None:
    scheme, _, credentials = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


def _fingerprint(token: str) -> str:
    """Names the API token inside a signed token without revealing it."""
    return hashlib.sha256(f"{_SIGNER_SALT}:{token}".encode()).hexdigest()[:16]


def _signer(token: str) -> signing.TimestampSigner:
    return signing.TimestampSigner(key=token, salt=_SIGNER_SALT)


def sign_ws_token(api_token: str, path: str = DEFAULT_TOKEN_PATH) -> str:
    """A token for ``?token=`` valid for ``SIGNED_URL_MAX_AGE`` seconds on ``path`` only.

    The path is part of what is signed: a token that leaks (a log, a Referer) opens no other
    endpoint. URL-safe but for ``:``.
    """
    return _signer(api_token).sign(f"{_fingerprint(api_token)}@{path}")


def check_signed_token(value: str, tokens: Sequence[str], path: str) -> bool:
    head, sep, _ = value.partition(":")
    fingerprint, at, bound = head.partition("@")
    if not sep or not at or bound != path:
        return False
    for token in tokens:
        if hmac.compare_digest(fingerprint.encode(), _fingerprint(token).encode()):
            try:
                _signer(token).unsign(value, max_age=settings.SIGNED_URL_MAX_AGE)
            except signing.BadSignature:  # includes SignatureExpired
                return False
            return True
    return False


def _client_secret_signer(key: str) -> signing.Signer:
    # "." joins the parts: a client secret must be a valid WebSocket subprotocol token (no ":").
    return signing.Signer(key=key, salt=_CLIENT_SECRET_SALT, sep=".")


def sign_client_secret(data: Any, expires_at: int, api_token: str | None) -> str:
    """A client secret (``ek_...``) carrying ``data`` (JSON) until ``expires_at`` (epoch seconds),
    keyed by ``api_token`` (``SECRET_KEY`` when tokens are off)."""
    key = api_token if api_token is not None else settings.SECRET_KEY
    return CLIENT_SECRET_PREFIX + _client_secret_signer(key).sign_object(
        {"exp": expires_at, "data": data}, compress=True
    )


def open_client_secret(value: str) -> Any | None:
    """The data of a client secret this server signed with a key it still has, before its expiry;
    None for anything else (forged, expired, revoked, not one). Constant-time per key."""
    if not value.startswith(CLIENT_SECRET_PREFIX) or len(value) > MAX_CLIENT_SECRET_CHARS:
        return None
    signed = value.removeprefix(CLIENT_SECRET_PREFIX)
    for key in api_tokens() or [settings.SECRET_KEY]:
        try:
            payload = _client_secret_signer(key).unsign_object(signed)
        except signing.BadSignature:
            continue
        if isinstance(payload, dict) and isinstance(payload.get("exp"), int) and payload["exp"] > time.time():
            return payload.get("data")
        return None
    return None


def presented_client_secret(scope: dict[str, Any], offered: Sequence[str]) -> str | None:
    """An ``ek_`` the connection presents where an API key goes (bearer, OpenAI's subprotocol)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            bearer = parse_bearer(value.decode("latin1"))
            if bearer is not None and bearer.startswith(CLIENT_SECRET_PREFIX):
                return bearer
    for proto in offered:
        key = proto.removeprefix(OPENAI_KEY_PROTOCOL_PREFIX)
        if proto.startswith(OPENAI_KEY_PROTOCOL_PREFIX) and key.startswith(CLIENT_SECRET_PREFIX):
            return key
    return None


def authenticate(scope: dict[str, Any], tokens: Sequence[str]) -> str | None:
    """How the connection proved it holds a token (``bearer``, ``subprotocol``, ``signed-url``), or None."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            bearer = parse_bearer(value.decode("latin1"))
            if bearer is not None and match_token(bearer, tokens) is not None:
                return "bearer"
    offered = [str(p) for p in scope.get("subprotocols") or []]
    if PROTOCOL in offered:  # the server must answer a subprotocol the browser offered: omniweb.v1
        for proto in offered:
            token = proto.removeprefix(TOKEN_PROTOCOL_PREFIX)
            if proto.startswith(TOKEN_PROTOCOL_PREFIX) and match_token(token, tokens) is not None:
                return "subprotocol"
    for proto in offered:
        token = proto.removeprefix(OPENAI_KEY_PROTOCOL_PREFIX)
        if proto.startswith(OPENAI_KEY_PROTOCOL_PREFIX) and match_token(token, tokens) is not None:
            return "subprotocol"
    query = parse_qs(scope.get("query_string", b"").decode("latin1"))
    for value in query.get(SIGNED_TOKEN_PARAM, []):
        if check_signed_token(value, tokens, str(scope.get("path", ""))):
            return "signed-url"
    return None


# -- clients -----------------------------------------------------------------------------------------
def client_key(scope: dict[str, Any]) -> str | None:
    """The address a session limit applies to; None for unlimited (no address, or this machine)."""
    global _warned_unforwarded_proxy
    client = scope.get("client")
    if not client:
        return None
    host = str(client[0])
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        return host
    forwarded = [value for name, value in scope.get("headers", []) if name in _FORWARDING_HEADERS]
    if not forwarded:
        return None
    if any(value.decode("latin-1").split(",")[0].strip() == host for value in forwarded):
        return None  # daphne applied the header (--proxy-headers): the real client is on this machine
    if not _warned_unforwarded_proxy:
        _warned_unforwarded_proxy = True
        logger.warning(
            "WebSocket connections arrive from a local proxy with forwarding headers but daphne "
            "does not read them: run daphne with --proxy-headers, or every client shares one "
            "session limit (OMNIWEB_MAX_SESSIONS_PER_CLIENT)"
        )
    return host


def open_sessions(key: str) -> int:
    return _open_per_client[key]


def claim_session(scope: dict[str, Any]) -> Callable[[], None] | None:
    """Hold one of the client's ``MAX_SESSIONS_PER_CLIENT`` for a long HTTP response (a streamed
    speech body counts as a session): an idempotent release function, or None when the client
    already holds them all."""
    key = client_key(scope)
    limit = settings.MAX_SESSIONS_PER_CLIENT
    if key is None or limit <= 0:
        return lambda: None
    if _open_per_client[key] >= limit:
        return None
    _open_per_client[key] += 1
    held = True

    def release() -> None:
        nonlocal held
        if held:
            held = False
            _open_per_client[key] -= 1
            if _open_per_client[key] <= 0:
                del _open_per_client[key]

    return release


def tenant(scope: dict[str, Any]) -> str | None:
    """Whose engine work a connection's requests are, for the engine's fair ordering (one client's
    burst must not hold another client's first audio behind it): its bearer token, else its address
    (the forwarded one behind a proxy). A token stays out of the engine: only its fingerprint goes."""
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            bearer = parse_bearer(value.decode("latin-1"))
            if bearer is not None:
                return "token:" + _fingerprint(bearer)
    key = client_key(scope)
    if key is not None:
        return key
    client = scope.get("client")
    return str(client[0]) if client else None


class EngineTenant:
    """ASGI middleware: the connection's ``tenant`` for every engine request made while serving it."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] not in ("http", "websocket"):
            return await self.application(scope, receive, send)
        token = TENANT.set(tenant(scope))
        try:
            return await self.application(scope, receive, send)
        finally:
            TENANT.reset(token)


# -- the middleware ----------------------------------------------------------------------------------
class WebsocketAccess:
    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            return await self.application(scope, receive, send)
        offered = [str(p) for p in scope.get("subprotocols") or []]
        # The consumer never sees a token offered as a subprotocol.
        scope = {**scope, "subprotocols": [p for p in offered if not p.startswith(_SECRET_PROTOCOL_PREFIXES)]}
        tokens = api_tokens()
        secret = presented_client_secret(scope, offered)
        if secret is not None:  # a client secret opens a realtime session with its configuration
            config = open_client_secret(secret) if scope.get("path") == CLIENT_SECRET_PATH else None
            if not isinstance(config, dict):
                metrics.count_error("auth")
                logger.info("WebSocket %s refused: the client secret is not valid here", scope.get("path"))
                return await deny_handshake(receive, send)
            scope["omniweb.web.auth"] = "client-secret"
            scope[CLIENT_SECRET_SCOPE_KEY] = config
        elif tokens:
            method = authenticate({**scope, "subprotocols": offered}, tokens)
            if method is None:
                metrics.count_error("auth")
                logger.info("WebSocket %s refused: no valid API token", scope.get("path"))
                return await deny_handshake(receive, send)
            scope["omniweb.web.auth"] = method
        key = client_key(scope)
        limit = settings.MAX_SESSIONS_PER_CLIENT
        if key is not None and limit > 0 and _open_per_client[key] >= limit:
            metrics.count_error("limit")
            logger.info("WebSocket %s refused: %s already has %d sessions open", scope.get("path"), key, limit)
            return await deny_handshake(receive, send)
        if key is not None:
            _open_per_client[key] += 1
        endpoint = str(scope.get("path", ""))
        accepted = False

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal accepted
            if message["type"] == "websocket.accept" and not accepted:
                if message.get("subprotocol") is None and PROTOCOL in offered:
                    message = {**message, "subprotocol": PROTOCOL}
                accepted = True
                metrics.SESSIONS_OPEN.labels(endpoint=endpoint).inc()
            await send(message)

        try:
            return await self.application(scope, receive, send_wrapper)
        finally:
            if accepted:
                metrics.SESSIONS_OPEN.labels(endpoint=endpoint).dec()
            if key is not None:
                _open_per_client[key] -= 1
                if _open_per_client[key] <= 0:
                    del _open_per_client[key]


def websocket_access(application: Any) -> WebsocketAccess:
    return WebsocketAccess(application)
