"""Protocol pieces every endpoint shares (pure: no I/O)."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

from omniweb.base.errors import ErrorKind


class ProtocolError(Exception):
    """A client mistake; ``message`` is safe to send to the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def describe_validation_error(exc: ValidationError) -> str:
    """Field-level reasons without echoing the (possibly huge) input values back."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in err["loc"]) or "config"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def error(message: str, kind: ErrorKind = ErrorKind.CLIENT) -> dict[str, Any]:
    """The ``error`` message both endpoints send (its text is always safe for the client).

    ``kind`` says whose problem it is (see ``omniweb.base.errors``); ``/metrics`` counts errors by it.
    """
    return {"type": "error", "message": message, "kind": kind.value}


# -- strict JSON both ways, short echoes (issue #11) ----------------------------------------------

MAX_INT_DIGITS = 64  # ints in any field fit in far fewer (seeds are int64: 19 digits)
MAX_ECHO_CHARS = 64  # of a client's own value quoted back in an error


class _Refused(Exception):
    """Raised from inside the JSON parser; becomes the ProtocolError its ``reason`` describes."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _bounded_int(digits: str) -> int:
    if len(digits) > MAX_INT_DIGITS + 1:  # a sign and MAX_INT_DIGITS digits
        raise _Refused(f"integer longer than {MAX_INT_DIGITS} digits")
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused("number out of range")
    return value


def loads(raw: str | bytes, invalid: str = "Invalid JSON") -> Any:
    """Standard JSON only: no NaN/Infinity, no float that overflows, no integer of absurd length.

    Every failure (syntax, nesting, the limits above) is a ``ProtocolError`` whose message starts
    with ``invalid``, never another exception: the caller always has an ``error`` to send.
    """
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_int=_bounded_int, parse_float=_finite_float)
    except _Refused as exc:
        raise ProtocolError(f"{invalid}: {exc.reason}") from None
    except (ValueError, RecursionError):
        raise ProtocolError(invalid) from None


def dumps(payload: Any) -> str:
    """Server → client JSON; ``allow_nan=False`` so a non-finite number can never go out as ``NaN``."""
    return json.dumps(payload, allow_nan=False)


def excerpt(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """A client value as quoted in an error: at most ``limit`` characters, then an ellipsis.

    Strings are quoted as they are, scalars as Python prints them, containers by their type name
    (never rendered whole: a type field may be a 16 MiB list).
    """
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool | int | float):
        text = str(value)
    else:
        text = type(value).__name__
    return text if len(text) <= limit else f"{text[:limit]}…"
