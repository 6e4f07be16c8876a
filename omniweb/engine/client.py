"""The only door from the transport layer into the engine: submit a request, stream its chunks, abort.

Requests (``omniweb.engine.requests``) and chunks (``omniweb.engine.messages``) are frozen
dataclasses of plain values and bytes, never shared state, so the same interface runs over a channel
layer to workers on other machines (``dispatch.ChannelEngineClient``, which serializes them there).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Protocol

from omniweb.base.errors import CAPACITY_MESSAGE, ErrorKind

from .messages import Chunk, End
from .requests import EngineRequest
from .scheduler import AdmissionError, Scheduler, Sink
from .tenants import RESERVATION, with_tenant

logger = logging.getLogger(__name__)
READY_POLL_SECONDS = 0.05  # how often a request waiting for its models looks again
MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a request's bytes in all (frames, audio): the same in both modes
REQUEST_TOO_LARGE = "request too large for the engine: over 64 MiB of frames and audio in one request"


class EngineClient(Protocol):
    def stream(self, request: EngineRequest, request_id: str | None = None) -> AsyncGenerator[Chunk, None]:
        """Yield the request's chunks; the last one is its ``End``. Closing it early abandons the request."""
        ...

    async def abort(self, request_id: str) -> None: ...


def admission_end(exc: AdmissionError) -> End:
    """The ``End`` of a request the scheduler refused (full, starting, failed, not running)."""
    if exc.kind is ErrorKind.CAPACITY:
        retry = None if exc.retry_after is None else round(exc.retry_after, 3)
        return End.failed(ErrorKind.CAPACITY, CAPACITY_MESSAGE, retry_after=retry)
    if exc.kind in (ErrorKind.STARTING, ErrorKind.UNAVAILABLE):
        return End.failed(exc.kind, str(exc))
    return End.failed(exc.kind, "engine unavailable")


class LocalEngineClient:
    """Runs requests on an in-process scheduler (the embedded default)."""

    def __init__(self, scheduler: Scheduler, *, ready_wait: float = 0.0) -> None:
        self._scheduler = scheduler
        self._ready_wait = ready_wait  # seconds a request waits for its pipeline's models to load

    async def _submit(self, rid: str, request: EngineRequest, sink: Sink) -> None:
        """Submit; while the request's models are still loading, wait up to ``ready_wait`` for them
        (polled on the event loop: no thread is held per waiting client), then let it be refused."""
        deadline = asyncio.get_running_loop().time() + self._ready_wait
        while True:
            try:
                self._scheduler.submit(rid, request, sink, reservation=RESERVATION.get())
                return
            except AdmissionError as exc:
                if exc.kind is not ErrorKind.STARTING or asyncio.get_running_loop().time() >= deadline:
                    raise
            await asyncio.sleep(READY_POLL_SECONDS)

    async def stream(self, request: EngineRequest, request_id: str | None = None) -> AsyncGenerator[Chunk, None]:
        rid = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk] = asyncio.Queue()

        def sink(chunk: Chunk) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, chunk)

        if request.byte_size() > MAX_REQUEST_BYTES:  # the Redis mode's limit, enforced here too
            yield End.failed(ErrorKind.CLIENT, REQUEST_TOO_LARGE)
            return
        try:
            await self._submit(rid, with_tenant(request), sink)
        except AdmissionError as exc:
            yield admission_end(exc)
            return
        except ValueError as exc:
            yield End.failed(ErrorKind.CLIENT, str(exc))
            return
        ended = False
        try:
            while True:
                chunk = await queue.get()
                if isinstance(chunk, End):
                    ended = True
                yield chunk
                if ended:
                    return
        finally:
            if not ended:  # the consumer walked away (disconnect, cancel): free the engine now
                self._scheduler.abort(rid)

    async def abort(self, request_id: str) -> None:
        self._scheduler.abort(request_id)
