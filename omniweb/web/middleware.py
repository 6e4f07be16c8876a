"""Django's header middlewares with their hooks run on the event loop instead of in a thread, the
request id every HTTP response carries, and the length of a chunked request body.

Under ASGI, Django runs each ``MiddlewareMixin`` hook through ``sync_to_async``: two thread hops per
middleware and request, each waiting for the GIL while engine workers run, which put ~6 ms on the
OpenAI speech endpoint's first bytes (bench/openai_audio.py, with and without the middlewares, side
by side). The hooks wrapped here only read the request and set headers (no I/O, no database), so
they are safe to call inline; their behaviour is Django's and django-csp's own, unchanged.
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import markcoroutinefunction
from csp.middleware import CSPMiddleware as _CSPMiddleware
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware as _CommonMiddleware
from django.middleware.security import SecurityMiddleware as _SecurityMiddleware

from omniweb.web import logs

REQUEST_ID_HEADER = "X-Request-Id"
_SANE_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII: safe in a header and a log line


class _InlineHooks:
    """``MiddlewareMixin.__acall__`` without the thread hops (mixed in ahead of the Django class)."""

    get_response: Callable[[Any], Awaitable[Any]]  # the Django class's (declared only, for the checker)

    async def __acall__(self, request: Any) -> Any:
        response = self.process_request(request) if hasattr(self, "process_request") else None
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response


class SecurityMiddleware(_InlineHooks, _SecurityMiddleware):
    pass


class CommonMiddleware(_InlineHooks, _CommonMiddleware):
    pass


class XFrameOptionsMiddleware(_InlineHooks, _XFrameOptionsMiddleware):
    pass


class CSPMiddleware(_InlineHooks, _CSPMiddleware):
    pass


class ChunkedBodyMiddleware:
    """A request body sent chunked (``Transfer-Encoding: chunked``, no ``Content-Length``: the openai
    npm SDK's uploads from ``fs.createReadStream``) gets the length it arrived with.

    Django's form parsers read ``Content-Length`` bytes, none without one (``request.POST`` and
    ``FILES`` empty: "'model' is required" for a model that was sent), and its body size check reads
    that header too. daphne hands the app the whole body, spooled, so its length is known here: set
    as ``CONTENT_LENGTH``, the body is parsed, and limited, as a sized one is. Async only.
    """

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Awaitable[Any]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: Any) -> Any:
        if not request.META.get("CONTENT_LENGTH") and (size := _spooled_size(request)):
            request.META["CONTENT_LENGTH"] = str(size)
        return await self.get_response(request)


def _spooled_size(request: Any) -> int:
    """The bytes of an unread ASGI request body (Django's ``ASGIRequest`` keeps the body the server
    delivered as a seekable spooled file in ``_stream``; nothing public exposes its size)."""
    stream = getattr(request, "_stream", None)
    if stream is None or getattr(request, "_read_started", True) or not stream.seekable():
        return 0
    start = stream.tell()
    size = stream.seek(0, io.SEEK_END) - start
    stream.seek(start)
    return size


class RequestIdMiddleware:
    """``X-Request-Id`` on every response, and in the logs of the request (``omniweb.web.logs``).

    A client's own id (up to 128 visible ASCII characters) is echoed, so its logs and ours share
    it; otherwise one is made, as OpenAI's are (``req_`` and 32 hex digits). Clients such as
    LiveKit's OpenAI plugin read it from every response. Async only: no thread hop per request.
    """

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Awaitable[Any]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: Any) -> Any:
        sent = request.headers.get(REQUEST_ID_HEADER, "")
        rid = sent if _SANE_REQUEST_ID.fullmatch(sent) else f"req_{uuid.uuid4().hex}"
        logs.request_id.set(rid)  # not reset: the request's task (and its streamed body) ends with it
        response = await self.get_response(request)
        response[REQUEST_ID_HEADER] = rid
        return response
