"""ASGI entry point: HTTP through Django, WebSockets through the Channels router."""

from __future__ import annotations

import atexit
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ChannelNameRouter, ProtocolTypeRouter, URLRouter  # noqa: E402  (needs Django)

from omniweb.engine.runtime import get_engine_client, wait_loaded  # noqa: E402
from omniweb.engine.worker import EngineWorkerConsumer  # noqa: E402
from omniweb.media.containers import measure_encoding_costs  # noqa: E402
from omniweb.openai_api.asgi import http_abort, shed_early  # noqa: E402
from omniweb.openai_api.protocol import DEFAULT_RESPONSE_FORMAT, busy  # noqa: E402
from omniweb.routing import websocket_urlpatterns  # noqa: E402
from omniweb.web.auth import EngineTenant, websocket_access  # noqa: E402
from omniweb.web.security import browser_origin_validator, known_paths_only  # noqa: E402
from omniweb.web.transport import send_buffer_probe  # noqa: E402
from speech.tts.loops import PIPELINE as TTS_PIPELINE  # noqa: E402

# Django runs a request's few synchronous parts (the request signals, response.close) on a thread
# of that request's own, started and then joined by another new thread (asgiref's
# ThreadSensitiveContext): two thread starts per request, each holding the event loop until the new
# thread runs, which under load took most of the time a burst of refused requests waited. The
# views are async and keep no state in those parts, so all requests share one long-lived thread;
# Django's own context then finds this one set and starts none.
_DJANGO_SYNC = ThreadPoolExecutor(max_workers=1, thread_name_prefix="django-sync")


def shared_sync_thread(app: Any) -> Any:
    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        async with ThreadSensitiveContext(executor=_DJANGO_SYNC):
            return await app(scope, receive, send)

    return wrapped


# Every connection's engine requests carry its tenant (fair ordering between clients).
application = EngineTenant(
    ProtocolTypeRouter(
        {
            # HTTP through Django; a streamed body that cannot be completed is broken off (omniweb.openai_api.asgi).
            # Speech requests this engine would refuse under load are answered 503 before Django.
            "http": shed_early(
                http_abort(shared_sync_thread(django_asgi_app)),
                {"/v1/audio/speech": (TTS_PIPELINE, DEFAULT_RESPONSE_FORMAT)},
                json.dumps(busy().body()).encode(),
            ),
            # Unknown paths refused first; the Origin check, then API tokens and the per-client session
            # limit (omniweb.web.auth), then routes.
            "websocket": send_buffer_probe(
                known_paths_only(
                    browser_origin_validator(websocket_access(URLRouter(websocket_urlpatterns))), websocket_urlpatterns
                )
            ),
            # Engine requests from daphne processes, served by `manage.py runworker omniweb-engine`.
            "channel": ChannelNameRouter({settings.ENGINE_CHANNEL: EngineWorkerConsumer.as_asgi()}),
        }
    )
)

PRELOAD_JOIN_SECONDS = 120.0

# What each audio format's encoder costs this process (load shedding prices a stream's delivery
# with it), measured now in the background (~50 ms), not by the first request that needs it.
threading.Thread(target=measure_encoding_costs, name="encoding-costs", daemon=True).start()

if settings.ENGINE_PRELOAD:
    # Load the models while the server starts, not on the first visitor's connection: the scheduler
    # starts now and the pipelines load in its background thread (/healthz says when they are ready).
    get_engine_client()
    # A server stopped while the models load waits for the load to end: tearing the process down
    # under the model runtimes' half-built native threads aborts it (exit 134, measured 4 of 4).
    atexit.register(wait_loaded, PRELOAD_JOIN_SECONDS)
