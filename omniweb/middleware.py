"""Django's header middlewares with their hooks run on the event loop instead of in a thread.

Under ASGI, Django runs each ``MiddlewareMixin`` hook through ``sync_to_async``: two thread hops per
middleware and request, each waiting for the GIL while engine workers run, which put ~6 ms on the
OpenAI speech endpoint's first bytes (bench/openai_audio.py, with and without the middlewares, side
by side). The hooks wrapped here only read the request and set headers (no I/O, no database), so
they are safe to call inline; their behaviour is Django's and django-csp's own, unchanged.
"""

from __future__ import annotations

from typing import Any

from csp.middleware import CSPMiddleware as _CSPMiddleware
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware as _CommonMiddleware
from django.middleware.security import SecurityMiddleware as _SecurityMiddleware


class _InlineHooks:
    """``MiddlewareMixin.__acall__`` without the thread hops (mixed in ahead of the Django class)."""

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
