"""Realtime client secrets: ``POST /v1/realtime/client_secrets`` (``create_client_secret``) makes
them, a session opened with one starts with its configuration.

A client secret (``ek_...``) is what a browser or a phone app is given instead of the API key: it
opens Realtime sessions (a WebSocket on ``/v1/realtime``, a WebRTC call) until it expires, several
of them, each starting with the session configuration it was made with (a realtime or a
transcription session, by ``type``). It is signed, not stored (``omniweb.web.auth``: keyed by the API
token that asked for it, ``SECRET_KEY`` when tokens are off), so every daphne process with that key
accepts it and removing the token revokes it. ``create`` checks the configuration as a
``session.update`` would, so a secret never opens a session the server would refuse.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from omniweb.base.protocol import excerpt
from omniweb.engine.voice import voice
from omniweb.openai_api import protocol
from omniweb.openai_api.protocol import APIError, invalid
from omniweb.openai_api.views import _body, check_access, error_response
from omniweb.web import auth

from .errors import RealtimeError
from .opening import session_from_config, voice_names

DEFAULT_SECONDS = 600  # OpenAI's: ten minutes
MIN_SECONDS, MAX_SECONDS = 10, 7200
FIELDS = ("session", "expires_after")


def create(body: Any, *, api_token: str | None, voices: Mapping[str, str], now: float | None = None) -> dict[str, Any]:
    """The answer to ``POST /v1/realtime/client_secrets`` (``{"value", "expires_at", "session"}``) for
    its JSON ``body``; ``APIError`` (400) naming the field for what cannot be served. ``api_token``:
    the API token that asked (None: tokens are off)."""
    if not isinstance(body, Mapping):
        raise invalid("Expected a JSON object with 'session' and 'expires_after'")
    if unknown := sorted(k for k in body if k not in FIELDS):
        raise invalid(f"Unknown parameter: '{excerpt(str(unknown[0]))}'.", str(unknown[0]), "unknown_parameter")
    seconds = _seconds(body.get("expires_after"))
    config = body.get("session") if body.get("session") is not None else {"type": "realtime"}
    if not isinstance(config, Mapping):
        raise invalid("Invalid value for 'session': expected an object.", "session")
    if config.get("type") not in ("realtime", "transcription"):
        raise invalid(
            "Invalid value for 'session.type': expected 'realtime' or 'transcription'.",
            "session.type",
            "missing_required_parameter" if "type" not in config else "invalid_value",
        )
    language_model = settings.THINKER.strip().lower() == "llm"
    try:
        session = session_from_config(config, voices, language_model=language_model)
    except RealtimeError as err:
        raise invalid(err.message, err.param, err.code or "invalid_value") from None
    expires_at = int(now if now is not None else time.time()) + seconds
    value = auth.sign_client_secret(dict(config), expires_at, api_token)
    if len(value) > auth.MAX_CLIENT_SECRET_CHARS:
        raise invalid(
            f"The session configuration is too large for a client secret (it travels in a header, at most "
            f"{auth.MAX_CLIENT_SECRET_CHARS} characters): send the long parts (instructions, tools) in a "
            "session.update once connected",
            "session",
        )
    return {"value": value, "expires_at": expires_at, "session": session.wire()}


def _seconds(expires_after: Any) -> int:
    if expires_after is None:
        return DEFAULT_SECONDS
    if not isinstance(expires_after, Mapping) or set(expires_after) - {"anchor", "seconds"}:
        raise invalid(
            "Invalid value for 'expires_after': expected {'anchor': 'created_at', 'seconds': N}.", "expires_after"
        )
    if expires_after.get("anchor", "created_at") != "created_at":
        raise invalid(
            "Invalid value for 'expires_after.anchor': only 'created_at' is supported.", "expires_after.anchor"
        )
    seconds = expires_after.get("seconds", DEFAULT_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise invalid(
            f"Invalid value for 'expires_after.seconds': expected an integer from {MIN_SECONDS} to {MAX_SECONDS}.",
            "expires_after.seconds",
        )
    return seconds


def verify_client_secret(value: str) -> dict[str, Any] | None:
    """The session configuration a client secret carries (what ``session_from_config`` opens), or None
    when it is forged, expired or revoked (its API token removed)."""
    config = auth.open_client_secret(value)
    return config if isinstance(config, dict) else None


async def create_client_secret(request: HttpRequest) -> HttpResponse:
    """``POST /v1/realtime/client_secrets``. With ``OMNIWEB_API_TOKENS`` set it takes a real API token,
    never a client secret."""
    try:
        check_access(request, "POST")
        data = protocol.parse_json_body(request.content_type or "", _body(request))
        caps = voice().capabilities()
        body = create(data, api_token=_api_token(request), voices=voice_names(caps.voices, caps.default_voice))
    except APIError as exc:
        return error_response(exc)
    response = JsonResponse(body)
    response["Cache-Control"] = "no-store"
    return response


def _api_token(request: HttpRequest) -> str | None:
    """The configured API token the request presented (None: tokens are off)."""
    tokens = auth.api_tokens()
    presented = auth.parse_bearer(request.headers.get("Authorization", ""))
    return auth.match_token(presented, tokens) if tokens and presented is not None else None
