"""Protocol pieces every endpoint shares (pure: no I/O)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from omniweb.errors import ErrorKind


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

    ``kind`` says whose problem it is (see ``omniweb.errors``); ``/metrics`` counts errors by it.
    """
    return {"type": "error", "message": message, "kind": kind.value}
