"""Ids and refusals of OpenAI's Realtime API (GA): ids as OpenAI makes them, ``RealtimeError``, the ``error`` event.

What this server does not support is refused with an ``error`` event naming the field (``param``) and
echoing the client's ``event_id``; the session survives every refusal. A pydantic validation error (of a
client event or of ``session.update``) becomes the refusal of its first problem, naming its field.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def new_id(prefix: str) -> str:
    """An id as OpenAI makes them: ``event_``, ``item_``, ``resp_``, ``sess_``, ``conv_`` + 22 base62 chars."""
    n = secrets.randbits(128)
    chars = []
    for _ in range(22):
        n, r = divmod(n, 62)
        chars.append(_B62[r])
    return f"{prefix}_{''.join(chars)}"


class RealtimeError(Exception):
    """A refusal sent as an ``error`` event; ``message`` is safe to send to the client."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        type: str = "invalid_request_error",  # OpenAI's field name
        event_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.event_id = event_id


def error_event(err: RealtimeError, event_id: str | None = None) -> dict[str, Any]:
    """``error`` as ``RealtimeErrorEvent``; ``error.event_id`` is the client event's id."""
    return {
        "type": "error",
        "event_id": new_id("event"),
        "error": {
            "type": err.type,
            "code": err.code,
            "message": err.message,
            "param": err.param,
            "event_id": event_id if event_id is not None else err.event_id,
        },
    }


# The tags of turn_detection's union (``session.TurnDetection``), which it adds to a location.
_TURN_TYPES = ("server_vad", "semantic_vad")


def _param(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _from_validation(exc: ValidationError, prefix: str = "") -> RealtimeError:
    """The first problem of a pydantic error, with the field it names as ``param``."""
    first = exc.errors(include_url=False)[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    # A discriminated union adds the tag to the location: "content[0].input_text.text" → "content[0].text".
    tags = {"input_text", "input_audio", "input_image", "output_text", "output_audio"}
    loc = [p for i, p in enumerate(loc) if not (i and isinstance(loc[i - 1], int) and p in tags)]
    # So does turn_detection's: "turn_detection.semantic_vad.eagerness" → "turn_detection.eagerness".
    loc = [p for i, p in enumerate(loc) if not (i and loc[i - 1] == "turn_detection" and p in _TURN_TYPES)]
    param = _param([*([prefix] if prefix else []), *loc])
    kind = first["type"]
    if kind == "extra_forbidden":
        return RealtimeError(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    if kind == "missing":
        return RealtimeError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    message = str(first["msg"]).removeprefix("Value error, ")
    return RealtimeError(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")
