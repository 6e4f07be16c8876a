"""Operations endpoints: ``/healthz``, ``/metrics`` and ``POST /v1/ws-token``.

All three are async views (the project serves HTTP through daphne/ASGI). None of them starts the
engine: the in-process scheduler is only reported once something else has started it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from django.contrib.staticfiles import finders
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.module_loading import import_string
from django.views.decorators.http import require_GET, require_POST
from prometheus_client import CONTENT_TYPE_LATEST

from omniweb.base import metrics
from omniweb.engine import heartbeats
from omniweb.media.containers import SAMPLE_RATE as OUTPUT_SAMPLE_RATE  # the voice's PCM, as the page plays it

from . import auth


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    return response


def _thinker() -> dict[str, Any]:
    """Which thinker answers (the configuration; a worker that failed to load it shows in ``engine``)."""
    if settings.THINKER.strip().lower() != "llm":
        return {"kind": settings.THINKER}
    if settings.LLM_URL:
        return {"kind": "llm", "source": "server", "model": settings.LLM_MODEL or None}  # the URL may name internals
    return {
        "kind": "llm",
        "source": "embedded",
        "model": settings.LLM_MODEL or settings.LLM_MODEL_PATH.rsplit("/", 1)[-1],
    }


@require_GET
async def healthz(request: HttpRequest) -> HttpResponse:
    """Readiness: 200 once an engine can serve without a model-load wait (this process's, with its
    models loaded, or a ready worker over Redis), else 503 with what is still loading or broken."""
    from omniweb.engine import runtime

    layer, (workers, _) = await asyncio.gather(heartbeats.layer_status(), heartbeats.engine_workers())
    redis_mode = heartbeats.redis_mode()
    # In Redis mode requests go to the workers over the layer: this process's own engine (if any
    # code started one) does not count.
    serving = [w for w in workers if w["up"] and not (redis_mode and w["worker"] == metrics.LOCAL_WORKER)]
    ready_workers = [w for w in serving if w.get("ready", True)]  # a heartbeat from before readiness: ready
    local = next((w for w in workers if w["worker"] == metrics.LOCAL_WORKER), None)
    engine: dict[str, Any] = {
        "mode": "redis" if redis_mode else "embedded",
        "local_started": local is not None,
        **_readiness(runtime.engine_status() if not redis_mode else None, serving, redis_mode),
        "workers_up": len(serving),
        "workers_ready": len(ready_workers),
        "active": sum(int(w.get("active") or 0) for w in serving),
        "queued": sum(int(w.get("queued") or 0) for w in serving),
        "running_steps": sum(int(w.get("running_steps") or 0) for w in serving),
    }
    ready = bool(layer["reachable"]) and engine["state"] in ("ready", "degraded")
    if ready:
        status = engine["state"]
    elif not layer["reachable"] or (redis_mode and not serving) or engine["state"] == "failed":
        status = "unavailable"
    else:
        status = "starting"
    body = {
        "ok": ready,
        "ready": ready,
        "status": status,
        "channel_layer": layer,
        "workers": workers,
        "engine": engine,
        "thinker": _thinker(),
    }
    response = JsonResponse(body, status=200 if ready else 503)
    # A probe polls this while the models load: not an error for django.request to log each time.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return _no_store(response)


def _readiness(local: dict[str, Any] | None, serving: list[dict[str, Any]], redis_mode: bool) -> dict[str, Any]:
    """The engine's ``state``, ``loading``, ``failed`` and ``pipelines``: this process's engine in
    embedded mode (``idle`` until something starts it), else the best of the live workers'."""
    if not redis_mode:
        if local is None:
            return {"state": "idle", "loading": [], "failed": {}, "pipelines": {}}
        return {key: local[key] for key in ("state", "loading", "failed", "pipelines")}
    rank = {"ready": 2, "loading": 1, "failed": 0}
    pipelines: dict[str, dict[str, Any]] = {}
    for w in serving:
        for name, state in (w.get("pipelines") or {}).items():
            best = pipelines.get(name)
            if best is None or rank.get(state, 0) > rank.get(best["state"], 0):
                pipelines[name] = {"state": state, "error": (w.get("failed") or {}).get(name)}
    loading = [name for name, p in pipelines.items() if p["state"] == "loading"]
    failed = {name: p["error"] for name, p in pipelines.items() if p["state"] == "failed"}
    if not any(w.get("ready", True) for w in serving):
        state = "loading" if serving else "failed"
    else:
        state = "degraded" if failed else "ready"
    return {"state": state, "loading": loading, "failed": failed, "pipelines": pipelines}


@require_GET
async def metrics_view(request: HttpRequest) -> HttpResponse:
    workers, _ = await heartbeats.engine_workers()
    return _no_store(HttpResponse(metrics.render(workers), content_type=CONTENT_TYPE_LATEST))


@require_POST
async def ws_token(request: HttpRequest) -> HttpResponse:
    """Trade an API token (``Authorization: Bearer``) for a short-lived ``?token=`` WebSocket token,
    good on one WebSocket path only (``path``, in the query or form; default the speech stream)."""
    tokens = auth.api_tokens()
    if not tokens:
        return _no_store(JsonResponse({"error": "access control is off (OMNIWEB_API_TOKENS is not set)"}, status=404))
    presented = auth.parse_bearer(request.headers.get("Authorization", ""))
    api_token = auth.match_token(presented, tokens) if presented is not None else None
    if api_token is None:
        metrics.count_error("auth")
        response = JsonResponse({"error": "send a valid API token as 'Authorization: Bearer <token>'"}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="omniweb"'
        return _no_store(response)
    paths = sorted(f"/{route.pattern}" for route in import_string(settings.WEBSOCKET_URLPATTERNS))
    path = request.GET.get("path") or request.POST.get("path") or auth.DEFAULT_TOKEN_PATH
    if path not in paths:  # a token is bound to one endpoint (issue #11)
        return _no_store(JsonResponse({"error": f"path must be one of: {', '.join(paths)}"}, status=400))
    body = {
        "token": auth.sign_ws_token(api_token, path),
        "expires_in": settings.SIGNED_URL_MAX_AGE,
        "query_parameter": auth.SIGNED_TOKEN_PARAM,
        "path": path,
    }
    return _no_store(JsonResponse(body))


# -- Browser pages (issue 6) -----------------------------------------------------------------------


@require_GET
def speech_page(request: HttpRequest) -> HttpResponse:
    """The speech page offers only what this server honours: its voices, formats and modes."""
    from omniweb.engine.voice import voice

    caps = voice().capabilities()
    page = {
        "voices": list(caps.voices),
        "default_voice": caps.default_voice,
        "formats": list(caps.response_formats),
        "sample_rate": OUTPUT_SAMPLE_RATE,
        "max_text_chars": settings.SPEECH_MAX_TEXT_CHARS,
        # The in-browser codec decoder (static/codec/) ships with the codec_tokens mode.
        "codec_decoder": finders.find("codec/decoder.js") is not None,
    }
    return render(request, "speech.html", {"page": page})


@require_GET
def video_page(request: HttpRequest) -> HttpResponse:
    return render(request, "video.html")
