"""The engine client over a channel layer: requests to a named worker channel, chunks back.

The consumer side (``ChannelEngineClient``) sends ``engine.submit`` to the worker channel with a
reply channel of its own; whichever ``runworker`` process picks it up answers ``engine.accepted``
with its own address (the owner, where ``engine.abort`` goes), then ``engine.chunk`` messages and,
while it has nothing to send, ``engine.heartbeat`` every second. A reply channel that stays silent
for the lease time means the worker is gone: the stream ends with an error instead of hanging.

Messages stay under the layer's 1 MB limit (audio is split); ``ChannelFull`` is answered with a
clear error, never dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgpack
from channels.exceptions import ChannelFull

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1_000_000  # channels_redis' documented limit per message
AUDIO_SPLIT_BYTES = 256 * 1024
HEARTBEAT_SECONDS = 1.0  # a request with nothing to send says "alive" this often
WORKER_BEAT_SECONDS = 0.5  # how often a worker publishes its load (metrics, healthz)


def message_size(message: dict[str, Any]) -> int:
    return len(msgpack.packb(message, use_bin_type=True))


def split_for_layer(chunk: dict[str, Any], limit: int = AUDIO_SPLIT_BYTES) -> list[dict[str, Any]]:
    """Audio chunks larger than ``limit`` become several consecutive audio chunks."""
    pcm = chunk.get("pcm")
    if chunk.get("type") != "audio" or not isinstance(pcm, bytes) or len(pcm) <= limit:
        return [chunk]
    step = limit - limit % 2  # whole 16-bit samples
    return [{**chunk, "pcm": pcm[i : i + step]} for i in range(0, len(pcm), step)]


def _end(status: str, message: str) -> dict[str, Any]:
    return {"type": "end", "status": status, "message": message}


class ChannelEngineClient:
    """``EngineClient`` over a channel layer (channels_redis): same messages as the local one."""

    def __init__(self, layer: Any, channel: str, *, lease: float, accept_timeout: float) -> None:
        self._layer = layer
        self._channel = channel
        self._lease = lease
        self._accept_timeout = accept_timeout
        self._owners: dict[str, str | None] = {}
        self._abort_requested: set[str] = set()

    async def stream(self, request: dict[str, Any], request_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        rid = request_id or uuid.uuid4().hex
        reply = await self._layer.new_channel()  # same Redis list as the consumer's own channel: one reader serves both
        submit = {
            "type": "engine.submit",
            "request_id": rid,
            "request": request,
            "reply_to": reply,
            "sent_at": time.time(),
            "accept_timeout": self._accept_timeout,
        }
        if message_size(submit) > MAX_MESSAGE_BYTES:
            yield _end("invalid", "request too large for the engine channel")
            return
        self._owners[rid] = None  # from here on an abort is remembered until the owner is known
        ended = False
        try:
            try:
                await self._layer.send(self._channel, submit)
            except ChannelFull:
                ended = True
                yield _end("busy", "server is at capacity; retry shortly")
                return
            except Exception:
                logger.exception("cannot reach the channel layer to submit %s", rid)
                ended = True
                yield _end("error", "engine unreachable")
                return
            timeout = self._accept_timeout
            while True:
                try:
                    msg = await asyncio.wait_for(self._layer.receive(reply), timeout)
                except TimeoutError:
                    lost = self._owners.get(rid) is not None
                    logger.warning("request %s: %s", rid, "worker lost" if lost else "no worker accepted it")
                    ended = True
                    yield _end("error", "engine worker lost" if lost else "no engine worker available")
                    return
                except Exception:
                    logger.exception("channel layer failed while streaming %s", rid)
                    ended = True
                    yield _end("error", "engine connection lost")
                    return
                if msg.get("request_id") != rid:
                    continue
                kind = msg["type"]
                if kind == "engine.accepted":
                    self._owners[rid] = msg["owner"]
                    timeout = self._lease
                    if rid in self._abort_requested:
                        await self._send_abort(rid)
                elif kind == "engine.chunk":
                    chunk = msg["chunk"]
                    if chunk["type"] == "end":
                        ended = True
                    yield chunk
                    if ended:
                        return
        finally:
            if not ended:  # the consumer walked away: free the worker now
                await self.abort(rid)
            self._owners.pop(rid, None)
            self._abort_requested.discard(rid)

    async def abort(self, request_id: str) -> None:
        if request_id not in self._owners:
            return
        self._abort_requested.add(request_id)
        if self._owners[request_id] is not None:
            await self._send_abort(request_id)
        # else: sent as soon as the owner is known (engine.accepted)

    async def _send_abort(self, request_id: str) -> None:
        owner = self._owners.get(request_id)
        if owner is None:
            return
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
