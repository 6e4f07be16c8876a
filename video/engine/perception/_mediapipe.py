"""Importing MediaPipe's legacy solutions, shared by the faces, hands and pose modules."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

logger = logging.getLogger(__name__)


def solutions() -> Any:
    """``mediapipe.solutions``, imported quietly.

    Its native bindings print one harmless line on import with protobuf 5 or later (a lookup of the
    removed ``MessageFactory.GetPrototype``, which it does not need); anything else it prints is logged.
    """
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        import mediapipe as mp
    for line in printed.getvalue().splitlines():
        if line.strip() and "GetPrototype" not in line:
            logger.warning("mediapipe: %s", line)
    return mp.solutions
