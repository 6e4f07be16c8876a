"""Who an engine request belongs to: the scheduler orders first media fairly between tenants.

The ASGI layer sets ``TENANT`` per connection (``omniweb.auth.EngineTenant``); the engine clients
copy it into each request they submit, in both engine modes. Pure: no Django, no Channels.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

# None: every request stands alone (tests, internal callers).
TENANT: ContextVar[str | None] = ContextVar("omniweb_engine_tenant", default=None)


def with_tenant(request: dict[str, Any]) -> dict[str, Any]:
    """The request with this context's tenant, unless it names one (or there is none)."""
    tenant = TENANT.get()
    if tenant is None or "tenant" in request:
        return request
    return {**request, "tenant": tenant}
