"""Origin check for WebSocket routes.

Browsers always send ``Origin``; a page on another site must not open sessions with a visitor's
browser (cross-site WebSocket hijacking), so a present Origin must match ALLOWED_HOSTS. Programs
(API clients, the ``speak`` command, other services) send none and are admitted, which Channels'
stock ``AllowedHostsOriginValidator`` would refuse.

A refused handshake is closed by ``deny_handshake``, a bare ASGI reply: Channels' own
``WebsocketDenier`` is a consumer, which would subscribe to the channel layer (a Redis receive per
refused connection in Redis mode) just to say no.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from channels.security.websocket import OriginValidator
from django.conf import settings


async def deny_handshake(receive: Any, send: Any) -> None:
    """Close the WebSocket handshake: daphne answers HTTP 403 and no consumer runs."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close"})


class BrowserOriginValidator(OriginValidator):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("You cannot use OriginValidator on a non-WebSocket connection")
        parsed_origin = None
        for name, value in scope.get("headers", []):  # as OriginValidator.__call__ reads it
            if name == b"origin":
                parsed_origin = urlparse(value.decode("latin1"))  # latin1 decodes any bytes
        if self.valid_origin(parsed_origin):
            return await self.application(scope, receive, send)
        return await deny_handshake(receive, send)

    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        return self.validate_origin(parsed_origin)


def browser_origin_validator(application: Any) -> BrowserOriginValidator:
    """Origins from ``ALLOWED_ORIGINS`` when the deployment names them (scheme, host and port all
    compared: a page on another port of the same host is another site), else ALLOWED_HOSTS' hosts."""
    allowed = list(settings.ALLOWED_ORIGINS) or list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(application, allowed)


def known_paths_only(application: Any, routes: list[Any]) -> Callable[..., Any]:
    """Refuse a handshake on a path no route serves before anything else runs.

    Channels' URLRouter raises ``ValueError`` for such a path, which daphne answers with HTTP 500
    and a traceback in the log per attempt; here it is the plain refusal (HTTP 403) and daphne's
    one access-log line.
    """

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            path = scope.get("path", "")
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if not any(route.pattern.match(path.lstrip("/")) for route in routes):
                return await deny_handshake(receive, send)
        return await application(scope, receive, send)

    return app
