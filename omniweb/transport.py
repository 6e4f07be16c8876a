"""How many bytes a WebSocket has queued for a client that is not reading.

daphne applies no backpressure: a send is appended to the Twisted transport's write buffer
whether or not the client reads, so a stalled client would make the server buffer without bound.
This middleware gives the consumer a probe, ``scope["omniweb.send_buffer"]()``, that returns the
transport's buffered bytes so a session can cap what it has queued. daphne hands the ASGI app
``partial(server.handle_reply, protocol)`` as ``send``; the probe reads the protocol's transport
(Twisted's ``FileDescriptor`` buffer). Under another server, or if daphne changes, the probe
returns ``None`` and sessions run uncapped, as they would anyway.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

SCOPE_KEY = "omniweb.send_buffer"


def _buffered(transport: Any) -> int | None:
    try:
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    except (AttributeError, TypeError):
        return None


def _probe(send: Any) -> Callable[[], int | None]:
    protocol = send.args[0] if isinstance(send, functools.partial) and send.args else None
    transport = getattr(protocol, "transport", None)
    if transport is None or _buffered(transport) is None:
        return lambda: None
    return lambda: _buffered(transport)


def send_buffer_probe(application: Any) -> Callable[..., Any]:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            scope = {**scope, SCOPE_KEY: _probe(send)}
        return await application(scope, receive, send)

    return app


def client_stalled(scope: dict[str, Any], limit: int) -> bool:
    """True when the socket's transport holds more than ``limit`` unsent bytes (never under other servers)."""
    probe = scope.get(SCOPE_KEY)
    queued = probe() if probe is not None else None
    return queued is not None and queued > limit
