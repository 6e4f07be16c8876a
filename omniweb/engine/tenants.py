"""What the ASGI layer knows of a request before the engine sees it, carried in context variables.

``TENANT``: who an engine request belongs to (the scheduler orders first media fairly between
tenants); set per connection by ``omniweb.web.auth.EngineTenant``, copied into each request by the
engine clients in both engine modes. ``RESERVATION``: the place a front door (load shedding before
Django, ``omniweb.openai_api.asgi.shed_early``) took in the in-process scheduler for this request.
Pure: no Django, no Channels.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import replace

from .requests import EngineRequest

# None: every request stands alone (tests, internal callers).
TENANT: ContextVar[str | None] = ContextVar("omniweb_engine_tenant", default=None)
RESERVATION: ContextVar[int | None] = ContextVar("omniweb_engine_reservation", default=None)


def with_tenant(request: EngineRequest) -> EngineRequest:
    """The request with this context's tenant, unless it names one (or there is none)."""
    tenant = TENANT.get()
    if tenant is None or request.tenant is not None:
        return request
    return replace(request, tenant=tenant)
