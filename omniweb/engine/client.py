"""The only door from the transport layer into the engine: submit a request, stream its chunks, abort.

Requests and chunks are plain messages (dicts of JSON values and bytes), never shared objects, so
the same interface can later run over a channel layer to workers on other machines.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from omniweb.errors import CAPACITY_MESSAGE, ErrorKind, engine_end

from .dispatch import MAX_REQUEST_BYTES, REQUEST_TOO_LARGE, request_bytes
from .scheduler import AdmissionError, Scheduler

logger = logging.getLogger(__name__)


class EngineClient(Protocol):
    def stream(self, request: dict[str, Any], request_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield the request's chunks; the last one has ``type == "end"`` and a ``status``."""
        ...

    async def abort(self, request_id: str) -> None: ...


def admission_end(exc: AdmissionError) -> dict[str, Any]:
    """The ``end`` chunk of a request the scheduler refused (full, or not running)."""
    if exc.kind is ErrorKind.CAPACITY:
        return engine_end(ErrorKind.CAPACITY, CAPACITY_MESSAGE)
    return engine_end(exc.kind, "engine unavailable")


class LocalEngineClient:
    """Runs requests on an in-process scheduler (the embedded default)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def stream(self, request: dict[str, Any], request_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        rid = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def sink(chunk: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, chunk)

        if request_bytes(request) > MAX_REQUEST_BYTES:  # the Redis mode's limit, enforced here too
            yield engine_end(ErrorKind.CLIENT, REQUEST_TOO_LARGE)
            return
        try:
            self._scheduler.submit(rid, request, sink)
        except AdmissionError as exc:
            yield admission_end(exc)
            return
        except ValueError as exc:
            yield engine_end(ErrorKind.CLIENT, str(exc))
            return
        ended = False
        try:
            while True:
                chunk = await queue.get()
                if chunk["type"] == "end":
                    ended = True
                yield chunk
                if ended:
                    return
        finally:
            if not ended:  # the consumer walked away (disconnect, cancel): free the engine now
                self._scheduler.abort(rid)

    async def abort(self, request_id: str) -> None:
        self._scheduler.abort(request_id)
