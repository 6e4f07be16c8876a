"""Origin check for WebSocket routes.

Browsers always send ``Origin``; a page on another site must not open sessions with a visitor's
browser (cross-site WebSocket hijacking), so a present Origin must match ALLOWED_HOSTS. Programs
(API clients, the ``speak`` command, other services) send none and are admitted, which Channels'
stock ``AllowedHostsOriginValidator`` would refuse.
"""

from __future__ import annotations

from typing import Any

from channels.security.websocket import OriginValidator
from django.conf import settings


class BrowserOriginValidator(OriginValidator):
    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        return self.validate_origin(parsed_origin)


def browser_origin_validator(application: Any) -> BrowserOriginValidator:
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(application, allowed)
