"""Breaking off a streamed HTTP response whose body cannot be completed (ASGI middleware).

Once the status line of a streamed body has gone, the only honest way to report that the rest
will not come is to end the connection without the final chunk, so the client sees a truncated
response instead of a short file that looks whole. ASGI has no message for that: under daphne,
``scope["omniweb.abort_http"]()`` aborts the Twisted transport behind daphne's ``send`` (the same
handle ``omniweb/transport.py`` reads); under another server it is absent and the view raises
instead, which such servers answer by closing the connection. (Raising under daphne is not an
option: daphne then tries to start a second response, and its connection reaper stops running.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

SCOPE_KEY = "omniweb.abort_http"


def _abort(send: Any) -> Callable[[], None] | None:
    protocol = send.args[0] if isinstance(send, functools.partial) and send.args else None
    transport = getattr(protocol, "transport", None)
    abort = getattr(transport, "abortConnection", None)
    return abort if callable(abort) else None


def http_abort(application: Any) -> Callable[..., Any]:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "http":
            abort = _abort(send)
            if abort is not None:
                scope = {**scope, SCOPE_KEY: abort}
        return await application(scope, receive, send)

    return app
