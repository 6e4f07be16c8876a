"""Breaking off a streamed HTTP response whose body cannot be completed (ASGI middleware).

Once the status line of a streamed body has gone, the only honest way to report that the rest
will not come is to end the connection without the final chunk, so the client sees a truncated
response instead of a short file that looks whole. ASGI has no message for that: under daphne,
``scope["omniweb.abort_http"]()`` aborts the Twisted transport behind daphne's ``send`` (the same
handle ``omniweb/web/transport.py`` reads); under another server it is absent and the view raises
instead, which such servers answer by closing the connection. (Raising under daphne is not an
option: daphne then tries to start a second response, and its connection reaper stops running.)
"""

from __future__ import annotations

import asyncio
import functools
import math
import uuid
from collections.abc import Callable
from typing import Any

SCOPE_KEY = "omniweb.abort_http"
# An admitted request waits at most this many turns of the event loop for a burst's arrivals to be
# decided before it goes on to Django (each turn reads and answers whatever arrived meanwhile).
SETTLE_TURNS = 64


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


def shed_early(application: Any, routes: dict[str, tuple[str, str]], busy_body: bytes) -> Callable[..., Any]:
    """Refuse a ``POST`` to one of ``routes`` (path → engine pipeline and the endpoint's default
    audio format) before Django, when this process's engine would refuse it anyway (load
    shedding): a burst of hundreds of requests is answered 503 in a fraction of a millisecond each
    instead of a trip through the middleware and the view. The body is not read here, so a
    request's stream is priced as the default format's (its encoder's cost). Anything it does not
    refuse goes on unchanged; the engine still decides at submit, on the format asked for.
    """
    from omniweb.base import metrics
    from omniweb.engine import runtime
    from omniweb.engine.scheduler import AdmissionError
    from omniweb.engine.tenants import RESERVATION, TENANT
    from omniweb.media.containers import encoding_cost
    from omniweb.web import auth

    arrivals = 0  # requests that reached the door (a burst shows as this moving between turns)

    def authorized(scope: dict[str, Any]) -> bool:
        """Only a client the view would serve is refused here: the others hear 401 from it."""
        tokens = auth.api_tokens()
        if not tokens:
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        presented = auth.parse_bearer(header)
        return presented is not None and auth.match_token(presented, tokens) is not None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        nonlocal arrivals
        route = routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        sched = runtime.local_scheduler() if route is not None and scope.get("method") == "POST" else None
        if sched is None or route is None or not authorized(scope):
            return await application(scope, receive, send)
        arrivals += 1
        pipeline, default_format = route
        try:
            reservation = sched.reserve(pipeline, TENANT.get(), delivery=encoding_cost(default_format))
        except AdmissionError as exc:
            return await refuse(send, exc.retry_after or 1.0)
        token = RESERVATION.set(reservation)
        try:
            await settle()
            return await application(scope, receive, send)
        finally:
            RESERVATION.reset(token)
            sched.release(reservation)  # unless the view submitted it (then this does nothing)

    async def settle() -> None:
        """Let a burst's arrivals be decided before an admitted request goes on to Django.

        Turns of the event loop until two pass with no new arrival at the door (a lone request:
        two turns; a request read off its socket in one turn reaches the door in the next): the
        refusals go out while the burst still arrives, not after the admitted requests' parsing,
        submits and first engine steps, which took the same two cores (300 at once: refusals p95
        104-114 ms against a floor of 66-87 ms, when they waited one turn). The admitted requests'
        first audio is due within the budget, seconds; this costs them the tens of milliseconds
        the burst takes to arrive.
        """
        seen, quiet = -1, 0
        for _ in range(SETTLE_TURNS):
            quiet = quiet + 1 if arrivals == seen else 0
            if quiet == 2:
                return
            seen = arrivals
            await asyncio.sleep(0)

    async def refuse(send: Any, retry: float) -> None:
        metrics.count_error("busy")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(busy_body)).encode()),
            (b"retry-after", str(max(1, math.ceil(retry))).encode()),
            (b"cache-control", b"no-store"),
            (b"x-request-id", f"req_{uuid.uuid4().hex}".encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": busy_body})

    return app
