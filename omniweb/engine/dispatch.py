"""The engine client over a channel layer: requests to a named worker channel, chunks back.

The consumer side (``ChannelEngineClient``) sends ``engine.submit`` to the worker channel with a
reply channel of its own; whichever ``runworker`` process picks it up answers ``engine.accepted``
with its own address (the owner, where ``engine.abort`` goes), then ``engine.chunk`` messages and,
while it has nothing to send, ``engine.heartbeat`` every second. A reply channel that stays silent
for the lease time means the worker is gone: the stream ends with an error instead of hanging.

Messages stay under the layer's 1 MB limit: audio chunks are split, and large byte strings in a
request (camera frames, buffered microphone audio) travel as short-lived Redis keys that the worker
which claims the request takes (``offload_blobs``). ``ChannelFull`` is answered with a clear error,
never dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
from channels.exceptions import ChannelFull

from omniweb.base.errors import CAPACITY_MESSAGE, ErrorKind
from omniweb.base.tasks import spawn

from .client import MAX_REQUEST_BYTES, REQUEST_TOO_LARGE
from .messages import Chunk, End, from_wire
from .requests import EngineRequest
from .requests import to_wire as request_to_wire
from .tenants import with_tenant

logger = logging.getLogger(__name__)
CLAIM_KEY_PREFIX = "omniweb:claim:"  # a worker sets it (NX) before running a request: exactly one runs it
CLAIM_SECONDS = 600  # longer than any request waits in the channel (its expiry)
_late_aborts: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)

MAX_MESSAGE_BYTES = 1_000_000  # channels_redis' documented limit per message
AUDIO_SPLIT_BYTES = 256 * 1024
HEARTBEAT_SECONDS = 1.0  # a request with nothing to send says "alive" this often
WORKER_BEAT_SECONDS = 0.5  # how often a worker publishes its load (metrics, healthz)
BLOB_MIN_BYTES = 128 * 1024  # byte strings this large travel as Redis keys, not inside the message
BLOB_KEY_PREFIX = "omniweb:blob:"
BLOB_REF = "$omniweb.blob"  # {BLOB_REF: key} stands for the bytes stored under key
BLOB_GRACE_SECONDS = 30.0  # keys outlive the accept timeout by this much, then Redis drops them


def message_size(message: dict[str, Any]) -> int:
    return len(msgpack.packb(message, use_bin_type=True))


def offload_blobs(request: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Replace every byte string of ``BLOB_MIN_BYTES`` or more with a reference to a key under ``prefix``."""
    blobs: dict[str, bytes] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, bytes) and len(value) >= BLOB_MIN_BYTES:
            key = f"{prefix}{len(blobs)}"
            blobs[key] = value
            return {BLOB_REF: key}
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(request), blobs


def blob_keys(request: Any) -> list[str]:
    """The keys a request refers to, in order."""
    if isinstance(request, dict):
        if set(request) == {BLOB_REF}:
            return [request[BLOB_REF]]
        return [key for v in request.values() for key in blob_keys(v)]
    if isinstance(request, list):
        return [key for v in request for key in blob_keys(v)]
    return []


def restore_blobs(request: Any, blobs: dict[str, bytes]) -> Any:
    """Inverse of ``offload_blobs`` given the stored bytes; ``KeyError`` when one is missing."""
    if isinstance(request, dict):
        if set(request) == {BLOB_REF}:
            return blobs[request[BLOB_REF]]
        return {k: restore_blobs(v, blobs) for k, v in request.items()}
    if isinstance(request, list):
        return [restore_blobs(v, blobs) for v in request]
    return request


# What a client hears while Redis (the engine's message broker) is down: nothing it did wrong.
ENGINE_UNREACHABLE = "engine unreachable (its message broker is down); retry shortly"
ENGINE_CONNECTION_LOST = "engine connection lost (its message broker went down); retry shortly"


class ChannelEngineClient:
    """``EngineClient`` over a channel layer (channels_redis): same messages as the local one."""

    def __init__(
        self,
        layer: Any,
        channel: str,
        *,
        lease: float,
        accept_timeout: float,
        redis_url: str | None = None,
        room: Callable[[str, float | None], Awaitable[float | None]] | None = None,
    ) -> None:
        self._layer = layer
        # Load shedding at the web tier: ``room(pipeline, admit_budget)`` is None while some ready
        # worker has room for a new request (by the estimates in the workers' heartbeats), else
        # seconds to wait before a retry; then the request is refused here, without a trip to the workers.
        self._room = room
        self._redis_url = redis_url  # where large byte strings go; None: requests must fit one message
        self._channel = channel
        self._lease = lease
        self._accept_timeout = accept_timeout
        self._owners: dict[str, str | None] = {}
        self._abort_requested: set[str] = set()

    async def stream(self, request: EngineRequest, request_id: str | None = None) -> AsyncGenerator[Chunk, None]:
        rid = request_id or uuid.uuid4().hex
        if request.byte_size() > MAX_REQUEST_BYTES:  # as LocalEngineClient: one limit, both modes
            yield End.failed(ErrorKind.CLIENT, REQUEST_TOO_LARGE)
            return
        if self._room is not None and not request.batch and not request.admitted:
            retry = await self._room(request.pipeline, request.own_admit_budget)
            if retry is not None:
                yield End.failed(ErrorKind.CAPACITY, CAPACITY_MESSAGE, retry_after=round(retry, 3))
                return
        blobs: dict[str, bytes] = {}
        wire = request_to_wire(with_tenant(request))
        if self._redis_url:
            wire, blobs = offload_blobs(wire, f"{BLOB_KEY_PREFIX}{rid}:")
        reply = await self._layer.new_channel()  # same Redis list as the consumer's own channel: one reader serves both
        submit = {
            "type": "engine.submit",
            "request_id": rid,
            "request": wire,
            "reply_to": reply,
            "sent_at": time.time(),
            "accept_timeout": self._accept_timeout,
        }
        if message_size(submit) > MAX_MESSAGE_BYTES:
            yield End.failed(ErrorKind.CLIENT, "request too large for the engine channel")
            return
        self._owners[rid] = None  # from here on an abort is remembered until the owner is known
        ended = False
        try:
            try:
                if blobs:
                    await self._store(blobs)
                await self._layer.send(self._channel, submit)
            except ChannelFull:
                ended = True
                yield End.failed(ErrorKind.CAPACITY, CAPACITY_MESSAGE)
                return
            except Exception:
                logger.exception("cannot reach the channel layer to submit %s", rid)
                ended = True
                yield End.failed(ErrorKind.UNREACHABLE, ENGINE_UNREACHABLE)  # nothing started: retryable
                return
            timeout = self._accept_timeout
            while True:
                try:
                    msg = await asyncio.wait_for(self._layer.receive(reply), timeout)
                except TimeoutError:
                    lost = self._owners.get(rid) is not None
                    logger.warning("request %s: %s", rid, "worker lost" if lost else "no worker accepted it")
                    # ``ended`` stays False: the finally block still sends the abort, so a worker that
                    # was only paused stops this request when it resumes instead of generating on.
                    yield (
                        End.failed(ErrorKind.WORKER_LOST, "engine worker lost")
                        if lost
                        else End.failed(ErrorKind.UNREACHABLE, "no engine worker available")
                    )
                    return
                except Exception:
                    logger.exception("channel layer failed while streaming %s", rid)
                    yield End.failed(ErrorKind.UNREACHABLE, ENGINE_CONNECTION_LOST)  # the abort below is best effort
                    return
                if msg.get("request_id") != rid:
                    continue
                kind = msg["type"]
                if kind == "engine.accepted":
                    self._owners[rid] = msg["owner"]
                    timeout = self._lease
                    if rid in self._abort_requested:
                        await self._send_abort(rid, msg["owner"])
                elif kind == "engine.chunk":
                    chunk = from_wire(msg["chunk"])
                    if isinstance(chunk, End):
                        ended = True
                    yield chunk
                    if ended:
                        return
        finally:
            if not ended:  # the consumer walked away: free the worker now
                if rid in self._owners and self._owners[rid] is None:
                    # No worker has accepted it yet, and the accept would come to a channel nobody
                    # reads any more: listen for it a little longer, then abort.
                    task = spawn(self._abort_when_accepted(rid, reply), f"late abort of {rid}")
                    _late_aborts.add(task)
                    task.add_done_callback(_late_aborts.discard)
                else:
                    await self.abort(rid)
            self._owners.pop(rid, None)
            self._abort_requested.discard(rid)

    async def _abort_when_accepted(self, rid: str, reply: str) -> None:
        """Abort a request abandoned before any worker accepted it. Claimed here first, no worker
        runs it; else the worker that claimed it accepts within moments and is told to stop. Past
        the accept timeout no worker starts it (a worker drops a request its client stopped waiting for)."""
        if self._redis_url:
            try:
                async with self._redis() as client:
                    if await client.set(CLAIM_KEY_PREFIX + rid, "abandoned", nx=True, ex=CLAIM_SECONDS):
                        return
            except Exception:
                logger.warning("could not claim abandoned request %s", rid, exc_info=True)
        try:
            async with asyncio.timeout(self._accept_timeout):
                while True:
                    msg = await self._layer.receive(reply)
                    if msg.get("request_id") != rid:
                        continue
                    if msg["type"] == "engine.accepted":
                        await self._send_abort(rid, msg["owner"])
                        return
                    if msg["type"] == "engine.chunk" and msg["chunk"]["type"] == "end":
                        return
        except TimeoutError:
            return
        except Exception:  # the layer failed: the worker's lease ends the request
            logger.warning("could not abort %s after its accept", rid, exc_info=True)

    async def _store(self, blobs: dict[str, bytes]) -> None:
        """Write the request's large byte strings; they expire unless a worker takes them first."""
        async with self._redis() as client, client.pipeline(transaction=False) as pipe:
            for key, data in blobs.items():
                pipe.set(key, data, px=int((self._accept_timeout + BLOB_GRACE_SECONDS) * 1000))
            await pipe.execute()

    @contextlib.asynccontextmanager
    async def _redis(self) -> AsyncIterator[Any]:
        """A Redis client for one call: a connection pool is bound to one event loop."""
        import redis.asyncio as redis

        assert self._redis_url is not None  # called only when the byte strings go to Redis (a URL is set)
        client = redis.from_url(self._redis_url)
        try:
            yield client
        finally:
            await client.aclose()

    async def abort(self, request_id: str) -> None:
        if request_id not in self._owners:
            return
        self._abort_requested.add(request_id)
        if (owner := self._owners[request_id]) is not None:
            await self._send_abort(request_id, owner)
        # else: sent as soon as the owner is known (engine.accepted)

    async def _send_abort(self, request_id: str, owner: str) -> None:
        try:
            async with asyncio.timeout(2):
                await self._layer.send(owner, {"type": "engine.abort", "request_id": request_id})
        except Exception:  # the worker may be gone; its lease ends the stream either way
            logger.warning("could not deliver abort for %s to %s", request_id, owner, exc_info=True)


async def send_with_retry(layer: Any, channel: str, message: dict[str, Any], patience: float) -> None:
    """Send, waiting out a full channel for up to ``patience`` seconds before giving up."""
    deadline = time.monotonic() + patience
    delay = 0.01
    while True:
        try:
            await layer.send(channel, message)
            return
        except ChannelFull:
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
