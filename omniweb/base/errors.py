"""Error kinds: what went wrong, chosen where the error arises and carried, never parsed from text.

An engine request's ``End`` (``omniweb.engine.messages``) carries a ``kind`` next to its status
and message, over the in-process client and over Redis dispatch alike; every ``error`` a client
receives carries one too, and ``/metrics`` counts errors by it (``omniweb_errors_total{kind}``). Pure: no I/O.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    CLIENT = "client_error"  # the request or message was wrong: fixing it is the client's job
    CAPACITY = "capacity"  # the server is full: retry shortly
    ENGINE = "engine_failure"  # a model step, or the engine itself, failed
    UPSTREAM = "upstream_failure"  # a server we depend on (the upstream thinker) failed or refused
    WORKER_LOST = "worker_lost"  # the worker serving the request went silent mid-stream
    UNREACHABLE = "engine_unreachable"  # no engine worker could be reached or took the request
    STARTING = "starting"  # the server is still loading the models this request needs: retry shortly
    UNAVAILABLE = "unavailable"  # the models this request needs failed to load: this endpoint cannot serve
    TIMEOUT = "timeout"  # the client was too slow (config, idle)
    STALLED = "stalled"  # the client stopped reading what we send
    AUTH = "auth"  # a refused handshake: credentials
    LIMIT = "limit"  # a refused handshake: too many sessions


# The kinds whose engine messages tell the client to retry shortly (a full server, an engine that
# cannot be reached): an endpoint passes those words on instead of only saying its request failed.
RETRYABLE = frozenset({ErrorKind.CAPACITY, ErrorKind.UNREACHABLE, ErrorKind.STARTING})

CAPACITY_MESSAGE = "server is at capacity; retry shortly"
STARTING_MESSAGE = "server is starting (its models are still loading); retry shortly"


def unavailable_message(pipeline: str) -> str:
    """What a client hears when the models its request needs failed to load on this server."""
    return f"the {pipeline} models failed to load on this server; this endpoint is unavailable"


class EngineError(Exception):
    """An error a step (or the engine) raises with its kind decided on the spot.

    ``str(exc)`` is logged; ``client_message`` (when given) is safe to send to the client.
    """

    def __init__(self, kind: ErrorKind, message: str, *, client_message: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.client_message = client_message


def kind_of(exc: BaseException, default: ErrorKind = ErrorKind.ENGINE) -> ErrorKind:
    """The kind an exception was raised with, or ``default`` for a plain bug."""
    kind = getattr(exc, "kind", None)
    return kind if isinstance(kind, ErrorKind) else default
