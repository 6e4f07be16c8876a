"""ASGI entry point: HTTP through Django, WebSockets through the Channels router."""

from __future__ import annotations

import atexit
import json
import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ChannelNameRouter, ProtocolTypeRouter, URLRouter  # noqa: E402  (needs Django)

from omniweb.auth import EngineTenant, websocket_access  # noqa: E402
from omniweb.engine.runtime import get_engine_client, wait_loaded  # noqa: E402
from omniweb.engine.worker import EngineWorkerConsumer  # noqa: E402
from omniweb.openai_api.asgi import http_abort, shed_early  # noqa: E402
from omniweb.openai_api.protocol import busy  # noqa: E402
from omniweb.routing import websocket_urlpatterns  # noqa: E402
from omniweb.security import browser_origin_validator, known_paths_only  # noqa: E402
from omniweb.transport import send_buffer_probe  # noqa: E402
from speech.tts.loops import PIPELINE as TTS_PIPELINE  # noqa: E402

# Every connection's engine requests carry its tenant (fair ordering between clients).
application = EngineTenant(
    ProtocolTypeRouter(
        {
            # HTTP through Django; a streamed body that cannot be completed is broken off (omniweb.openai_api.asgi).
            # Speech requests this engine would refuse under load are answered 503 before Django.
            "http": shed_early(
                http_abort(django_asgi_app), {"/v1/audio/speech": TTS_PIPELINE}, json.dumps(busy().body()).encode()
            ),
            # Unknown paths refused first; the Origin check, then API tokens and the per-client session
            # limit (omniweb.auth), then routes.
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

if settings.ENGINE_PRELOAD:
    # Load the models while the server starts, not on the first visitor's connection: the scheduler
    # starts now and the pipelines load in its background thread (/healthz says when they are ready).
    get_engine_client()
    # A server stopped while the models load waits for the load to end: tearing the process down
    # under the model runtimes' half-built native threads aborts it (exit 134, measured 4 of 4).
    atexit.register(wait_loaded, PRELOAD_JOIN_SECONDS)
