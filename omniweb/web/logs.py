"""Log formatting: every time in UTC, whatever the machine's zone, so logs from several hosts line up;
and the HTTP request's id (``X-Request-Id``) on every line logged while that request is served."""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar

# Set by omniweb.web.middleware.RequestIdMiddleware for the request being served. Django runs each
# request in its own task (its body included), so the value never leaks into another request.
request_id: ContextVar[str | None] = ContextVar("omniweb_request_id", default=None)


class UTCFormatter(logging.Formatter):
    """``2026-12-01T09:30:00.123Z``: ISO 8601 in UTC, with the Z that says so.

    ``%(request)s`` in the format is `` [<request id>]`` inside an HTTP request, else empty.
    """

    converter = time.gmtime  # type: ignore[assignment]  # a builtin, never bound to self: mypy reads a method
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"

    def format(self, record: logging.LogRecord) -> str:
        rid = request_id.get()
        record.request = f" [{rid}]" if rid else ""
        return super().format(record)
