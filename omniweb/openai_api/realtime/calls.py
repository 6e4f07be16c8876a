"""``POST /v1/realtime/calls`` and ``POST /v1/realtime/calls/{call_id}/hangup``: Realtime sessions
over WebRTC (the call itself: ``webrtc``), and ``GET /realtime/``, the page that holds one.

The offer comes as a raw ``application/sdp`` body, or as OpenAI's multipart form: an ``sdp`` part
and a ``session`` part (the session's configuration as JSON; the official SDK's
``client.realtime.calls.create`` sends it so, with ``Accept: application/sdp``). The answer is
``201 Created``, the SDP answer as ``application/sdp``, ``Location: /v1/realtime/calls/{call_id}``.
Refusals are OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

Access is as for ``/v1/realtime``: with ``OMNIWEB_API_TOKENS`` set, ``Authorization: Bearer`` with one
of them; or, whether tokens are set or not, a client secret (``ek_...`` from
``POST /v1/realtime/client_secrets``) as the Bearer token, whose session configuration the call
starts with (the ``session`` part, if any, over it); an expired or forged one is refused (401). A
call counts as a session of its client (``OMNIWEB_MAX_SESSIONS_PER_CLIENT``) and in
``omniweb_sessions_open{endpoint="/v1/realtime/calls"}`` while it lasts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from omniweb.base import metrics
from omniweb.engine.runtime import get_engine_client
from omniweb.engine.voice import voice
from omniweb.openai_api import protocol
from omniweb.openai_api.protocol import APIError
from omniweb.openai_api.realtime.client_secrets import verify_client_secret
from omniweb.openai_api.views import check_access, error_response
from omniweb.web import auth

from .errors import RealtimeError
from .opening import session_from_config, session_from_query, voice_names
from .session import AnySession, update_session
from .webrtc import CALLS, ENDPOINT, Call, OfferError

logger = logging.getLogger(__name__)

MAX_OFFER_BYTES = 256 * 1024  # an SDP offer is a few KB; the form's session part rides along


async def create_call(request: HttpRequest) -> HttpResponse:
    """Answer an SDP offer: the call starts, its session configured by the ``session`` part."""
    try:
        secret = _access(request)
        offer, update = _offer(request)
        caps = voice().capabilities()
        voices = voice_names(caps.voices, caps.default_voice)
        config = _config(request, voices, secret, update)
    except APIError as exc:
        return error_response(exc)
    engine = await asyncio.to_thread(get_engine_client)  # first use may load the models
    release = auth.claim_session(request.scope)
    if release is None:
        return error_response(APIError(429, "Too many sessions open from this client", code="too_many_sessions"))
    metrics.SESSIONS_OPEN.labels(endpoint=ENDPOINT).inc()

    def ended() -> None:
        release()
        metrics.SESSIONS_OPEN.labels(endpoint=ENDPOINT).dec()

    call = Call(engine, config, voices, ended)
    try:
        answer = await call.answer(offer)
    except OfferError as exc:
        await call.close()
        return error_response(protocol.invalid(str(exc), "sdp", "invalid_offer"))
    except BaseException:
        await call.close()
        raise
    logger.info("call %s answered (%s)", call.id, config.type)
    response = HttpResponse(answer, status=201, content_type="application/sdp")
    response["Location"] = f"{ENDPOINT}/{call.id}"
    response["Cache-Control"] = "no-store"
    return response


async def hangup(request: HttpRequest, call_id: str) -> HttpResponse:
    """End a call of this process."""
    try:
        _access(request)
        call = CALLS.get(call_id)
        if call is None:
            raise APIError(404, f"No call '{call_id[:64]}' is in progress here", param="call_id", code="call_not_found")
    except APIError as exc:
        return error_response(exc)
    await call.close()
    return HttpResponse(status=200)


def _access(request: HttpRequest) -> dict[str, Any] | None:
    """The method, then the caller's key: a client secret (its session configuration is returned),
    else an API token as for every endpoint (None)."""
    presented = auth.parse_bearer(request.headers.get("Authorization", ""))
    if request.method == "POST" and presented is not None and presented.startswith(auth.CLIENT_SECRET_PREFIX):
        config = verify_client_secret(presented)
        if config is None:
            raise APIError(
                401, "The client secret is expired, forged or revoked: ask for a new one", code="invalid_api_key"
            )
        return config
    check_access(request, "POST")
    return None


def _offer(request: HttpRequest) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the ``session`` configuration sent with it (None: none)."""
    if int(request.META.get("CONTENT_LENGTH") or 0) > MAX_OFFER_BYTES:
        raise APIError(413, f"The offer is larger than {MAX_OFFER_BYTES} bytes", code="request_too_large")
    kind = (request.content_type or "").lower()
    if kind == "application/sdp":
        sdp, session = _text(request.body, "sdp"), None
    elif kind == "multipart/form-data":
        part = _part(request, "sdp")
        if part is None:
            raise protocol.invalid("'sdp' is required", "sdp", "missing_required_parameter")
        session_text = _part(request, "session")
        sdp, session = part, _session_part(session_text) if session_text is not None else None
    else:
        raise protocol.invalid(
            f"Unsupported content type '{request.content_type or '(none)'}'; send the SDP offer as "
            "application/sdp, or as multipart/form-data with 'sdp' and 'session' parts",
            code="unsupported_content_type",
        )
    if not sdp.lstrip().startswith("v=0"):
        raise protocol.invalid("'sdp' is not an SDP offer (it starts with v=0)", "sdp", "invalid_offer")
    return sdp, session


def _part(request: HttpRequest, name: str) -> str | None:
    """A form part's text, sent as a field or as a file (None: not sent)."""
    if name in request.POST:
        return str(request.POST[name])
    upload = request.FILES.get(name)
    return _text(upload.read(), name) if upload is not None else None


def _text(data: bytes, param: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise protocol.invalid(f"'{param}' is not UTF-8 text", param) from None


def _session_part(text: str) -> dict[str, Any]:
    try:
        session = json.loads(text)
    except ValueError:
        raise protocol.invalid("'session' is not JSON", "session") from None
    if not isinstance(session, dict):
        raise protocol.invalid("'session' must be a JSON object", "session")
    return session


def _config(
    request: HttpRequest, voices: dict[str, str], secret: dict[str, Any] | None, update: dict[str, Any] | None
) -> AnySession:
    """The call's session: the client secret's, else the query's (``?model=``, ``?intent=``) or the
    ``session`` part's type; the part's configuration over it."""
    language_model = settings.THINKER.strip().lower() == "llm"
    try:
        if secret is not None:
            config = session_from_config(secret, voices, language_model=language_model)
        else:
            query = request.META.get("QUERY_STRING", "").encode("latin1")
            if update is not None and update.get("type") == "transcription":
                query += b"&intent=transcription"
            config = session_from_query(query, voices)
        return config if update is None else update_session(config, update, voices, language_model=language_model)
    except RealtimeError as err:
        raise APIError(400, err.message, param=err.param, code=err.code) from None


@require_GET
def realtime_page(request: HttpRequest) -> HttpResponse:
    """A call in the browser: microphone and camera in, the answer playing."""
    return render(request, "realtime.html")
