"""The engine worker: ``manage.py runworker omniweb-engine`` on GPU hosts.

``EngineWorkerConsumer`` takes ``engine.submit`` messages from the named worker channel (Redis
hands each to exactly one listening worker), runs them on this process's scheduler and streams
the chunks to the request's reply channel; ``engine.abort`` arrives on the consumer's own channel,
whose name every accepted request learns from ``engine.accepted``. A background task publishes
this worker's liveness and load to Redis for ``/healthz`` and ``/metrics``. On SIGTERM (or SIGINT)
the worker drains: it stops taking requests, lets running ones finish for a while, then ends the
rest with an error at once, so their sessions need not wait out the lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from typing import Any

from channels.consumer import AsyncConsumer
from channels.exceptions import ChannelFull
from channels.worker import Worker
from django.conf import settings

from omniweb.base.errors import ErrorKind
from omniweb.base.metrics import engine_record, serve_worker_metrics
from omniweb.base.tasks import spawn

from .client import admission_end
from .dispatch import (
    AUDIO_SPLIT_BYTES,
    CLAIM_KEY_PREFIX,
    CLAIM_SECONDS,
    HEARTBEAT_SECONDS,
    WORKER_BEAT_SECONDS,
    blob_keys,
    restore_blobs,
    send_with_retry,
)
from .heartbeats import WORKER_KEY_PREFIX
from .messages import Chunk, End, split_audio, to_wire
from .requests import from_wire as request_from_wire
from .runtime import engine_status, get_scheduler, start_engine
from .scheduler import AdmissionError

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 2.0  # after the drain, how long the last end chunks may take to reach Redis

# Every request's relay task in this process, so a draining worker can wait for the last chunks.
_forwarders: set[asyncio.Task[None]] = set()


def worker_id() -> str:
    return settings.WORKER_ID or f"{socket.gethostname()}-{os.getpid()}"


class EngineWorkerConsumer(AsyncConsumer):  # type: ignore[misc]  # channels ships no types
    """One per worker process; requests run concurrently on the scheduler's threads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.redis: Any = None

    def _redis(self) -> Any:
        if self.redis is None:
            import redis.asyncio as redis

            self.redis = redis.from_url(settings.REDIS_URL)
        return self.redis

    async def take_blobs(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The request with its large byte strings back in place; None when they have expired."""
        keys = blob_keys(request)
        if not keys:
            return request
        async with self._redis().pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.getdel(key)
            values = await pipe.execute()
        if any(v is None for v in values):
            return None
        restored: dict[str, Any] = restore_blobs(request, dict(zip(keys, values, strict=True)))  # a dict as given
        return restored

    async def claim(self, request_id: str) -> bool:
        """Exactly one worker runs a request.

        channels_redis can hand one message on a shared channel to two listeners (its in-flight
        backup queue is restored by whichever listener polls next), so the first worker to set
        the request's claim key in Redis wins and any other copy is dropped.
        """
        claimed = await self._redis().set(CLAIM_KEY_PREFIX + request_id, worker_id(), nx=True, ex=CLAIM_SECONDS)
        return bool(claimed)

    async def engine_submit(self, message: dict[str, Any]) -> None:
        rid, reply = message["request_id"], message["reply_to"]
        if time.time() - message.get("sent_at", 0) > message.get("accept_timeout", 5.0):
            logger.warning("dropping request %s: its client stopped waiting for a worker", rid)
            return
        if not await self.claim(rid):
            logger.info("request %s is already served by another worker", rid)
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk] = asyncio.Queue()

        def sink(chunk: Chunk) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, chunk)

        scheduler = get_scheduler()
        try:
            wire = await self.take_blobs(message["request"])
        except Exception:  # Redis failing under us: the client hears about it, the worker lives on
            logger.exception("request %s: cannot read its data from Redis", rid)
            wire = None
        try:
            if wire is None:  # not the client's fault: the layer between us lost or refused it
                queue.put_nowait(
                    End.failed(
                        ErrorKind.UNREACHABLE, "request data could not be read (expired or Redis unavailable); retry"
                    )
                )
            else:
                scheduler.submit(rid, request_from_wire(wire), sink)
        except AdmissionError as exc:
            queue.put_nowait(admission_end(exc))
        except ValueError as exc:
            queue.put_nowait(End.failed(ErrorKind.CLIENT, str(exc)))
        task = spawn(self._forward(rid, reply, queue), f"engine request {rid} forwarder")
        _forwarders.add(task)  # keep a reference until it is done
        task.add_done_callback(_forwarders.discard)

    async def engine_abort(self, message: dict[str, Any]) -> None:
        get_scheduler().abort(message["request_id"])

    async def _forward(self, rid: str, reply: str, queue: asyncio.Queue[Chunk]) -> None:
        """Accept, then relay chunks (heartbeats in between) until the request's end chunk."""
        patience = settings.ENGINE_SEND_PATIENCE
        try:
            await send_with_retry(
                self.channel_layer,
                reply,
                {"type": "engine.accepted", "request_id": rid, "owner": self.channel_name, "worker": worker_id()},
                patience,
            )
            last_sent = time.monotonic()
            while True:
                try:
                    chunk: Chunk | None = await asyncio.wait_for(queue.get(), HEARTBEAT_SECONDS)
                except TimeoutError:
                    chunk = None
                if time.monotonic() - last_sent > settings.ENGINE_LEASE_SECONDS:
                    # This worker was silent past the lease (paused, starved): the web process has
                    # already ended the stream, so nobody wants the rest of this request.
                    logger.warning("request %s: silent past the lease; its client has given up, aborting", rid)
                    break
                if chunk is None:
                    await send_with_retry(
                        self.channel_layer, reply, {"type": "engine.heartbeat", "request_id": rid}, patience
                    )
                    last_sent = time.monotonic()
                    continue
                for part in split_audio(chunk, AUDIO_SPLIT_BYTES):
                    message = {"type": "engine.chunk", "request_id": rid, "chunk": to_wire(part)}
                    await send_with_retry(self.channel_layer, reply, message, patience)
                last_sent = time.monotonic()
                if isinstance(chunk, End):
                    return
        except ChannelFull:
            logger.error("request %s: reply channel full for %.1f s; aborting it", rid, patience)
        except Exception:
            logger.exception("request %s: cannot deliver to its client; aborting it", rid)
        get_scheduler().abort(rid)  # nothing left to deliver to: free the engine


class EngineWorker(Worker):  # type: ignore[misc]  # channels ships no types
    """channels' Worker that outlives channel-layer outages and publishes its heartbeat."""

    async def handle(self) -> None:
        if settings.WORKER_METRICS_PORT:
            # Workers serve no HTTP; their own engine metrics (batch sizes) get a port of their own.
            serve_worker_metrics(settings.WORKER_METRICS_PORT)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        heartbeat = asyncio.ensure_future(publish_heartbeat())
        stop_wait: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())  # waited on with others
        listeners: list[asyncio.Future[None]] = []
        try:
            # Requests wait in Redis for a worker whose models are loaded: this one takes none before.
            loaded = asyncio.ensure_future(asyncio.to_thread(get_scheduler))
            await asyncio.wait([stop_wait, loaded], return_when=asyncio.FIRST_COMPLETED)
            if not stopping.is_set():
                logger.info("models loaded: taking requests from %s", ", ".join(self.channels))
                listeners = [asyncio.ensure_future(self.listener(channel)) for channel in self.channels]
                await asyncio.wait([stop_wait, *listeners], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            for task in listeners:  # no new requests: Redis keeps them for the other workers
                task.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
            if stopping.is_set():
                logger.info("stopping: draining for up to %.1f s", settings.WORKER_DRAIN_SECONDS)
                await drain(settings.WORKER_DRAIN_SECONDS)
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        for task in listeners:  # a listener that failed on its own is still an error
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def listener(self, channel: str) -> None:
        delay = 0.1
        while True:
            try:
                message = await self.channel_layer.receive(channel)
            except Exception:  # Redis restarting: keep trying, new requests work once it is back
                logger.warning("channel layer receive failed; retrying in %.1f s", delay, exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.1
            if not message.get("type"):
                logger.error("dropping a message with no type on %s", channel)
                continue
            scope = {"type": "channel", "channel": channel}
            queue = self.get_or_create_application_instance(channel, scope)
            await queue.put(message)


async def drain(seconds: float) -> None:
    """Let running requests finish for ``seconds``, then end the rest with an error, and deliver."""
    scheduler = start_engine()  # never waits for models still loading (a worker stopped during its load)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats = scheduler.stats()
        if not stats.active and not stats.queued:
            break
        await asyncio.sleep(0.05)
    # Whatever is left ends with an error chunk now, not after the lease (stop joins the threads).
    await asyncio.to_thread(scheduler.stop)
    if _forwarders:
        await asyncio.wait(set(_forwarders), timeout=FLUSH_SECONDS)


async def publish_heartbeat() -> None:
    """Twice a second: ``omniweb:worker:<id>`` = this worker's load, expiring if the worker dies.

    A worker that stops on purpose deletes its key, so /healthz stops counting it at once.
    """
    import redis.asyncio as redis

    client = redis.from_url(settings.REDIS_URL)
    key = WORKER_KEY_PREFIX + worker_id()
    ttl = max(2, int(settings.ENGINE_LEASE_SECONDS) + 2)
    scheduler = start_engine()  # while the models load too: the web tier sees a worker not yet ready
    try:
        while True:
            value = engine_record(worker_id(), scheduler, engine_status())
            try:
                await client.set(key, json.dumps(value), ex=ttl)
            except Exception:
                logger.warning("heartbeat to Redis failed", exc_info=True)
            await asyncio.sleep(WORKER_BEAT_SECONDS)
    finally:
        try:
            await client.delete(key)
        except Exception:
            logger.warning("could not remove the heartbeat key %s", key, exc_info=True)
        await client.aclose()
