"""Log formatting: every time in UTC, whatever the machine's zone, so logs from several hosts line up."""

from __future__ import annotations

import logging
import time


class UTCFormatter(logging.Formatter):
    """``2026-12-01T09:30:00.123Z``: ISO 8601 in UTC, with the Z that says so."""

    converter = time.gmtime
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"
