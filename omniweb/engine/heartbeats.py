"""The workers' Redis heartbeats, read: where they are, what each says, and whether one has room.

Each ``runworker`` process publishes its load twice a second under ``omniweb:worker:<id>``
(``omniweb.engine.worker``, an expiring key); ``/healthz`` and ``/metrics`` read every key
(``engine_workers``), and in Redis mode the web tier sheds a request that no ready worker has room
for (``WorkerRoom``, built by the wiring). Redis I/O through channels_redis' own connection
helpers: an adapter, beside the channel-layer client (``dispatch.py``) and the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from django.conf import settings

from omniweb.base.metrics import local_worker

from .dispatch import WORKER_BEAT_SECONDS

logger = logging.getLogger(__name__)

WORKER_KEY_PREFIX = "omniweb:worker:"  # the engine worker's heartbeat keys (omniweb.engine.worker)
REDIS_TIMEOUT = 1.0  # seconds for a health check's Redis PING / heartbeat read


def layer_backend() -> str:
    return str(settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", ""))


def redis_mode() -> bool:
    """Engine work runs on workers behind channels_redis (else: the embedded, in-process engine)."""
    return layer_backend().startswith("channels_redis.")


def _layer_hosts() -> list[dict[str, Any]]:
    from channels_redis.utils import decode_hosts

    config = settings.CHANNEL_LAYERS["default"].get("CONFIG") or {}
    hosts: list[dict[str, Any]] = decode_hosts(config.get("hosts"))  # channels_redis: untyped
    return hosts


def _client(host: dict[str, Any]) -> Any:
    """A redis.asyncio client for one channels_redis host entry, with short socket timeouts."""
    import redis.asyncio as redis
    from channels_redis.utils import create_pool

    host = {**host, "socket_connect_timeout": REDIS_TIMEOUT, "socket_timeout": REDIS_TIMEOUT}
    return redis.Redis(connection_pool=create_pool(host))


def _heartbeat_host() -> dict[str, Any]:
    """Where workers publish heartbeats: ``REDIS_URL`` when set, else the layer's first host."""
    url = getattr(settings, "REDIS_URL", "")
    return {"address": url} if url else _layer_hosts()[0]


async def _ping(host: dict[str, Any]) -> bool:
    client = _client(host)
    try:
        async with asyncio.timeout(REDIS_TIMEOUT):
            return bool(await client.ping())
    except Exception as exc:
        logger.warning("channel layer host unreachable: %s", exc)
        return False
    finally:
        await client.aclose(close_connection_pool=True)


async def layer_status() -> dict[str, Any]:
    """``{"backend", "reachable"}``: the in-memory layer always is; Redis hosts must answer PING."""
    backend = layer_backend()
    if not redis_mode():
        return {"backend": backend, "reachable": True}
    try:
        hosts = _layer_hosts()
    except Exception:
        logger.exception("cannot read the channel layer's hosts")
        return {"backend": backend, "reachable": False}
    results = await asyncio.gather(*(_ping(h) for h in hosts))
    return {"backend": backend, "reachable": bool(results) and all(results)}


def parse_heartbeat(key: str, raw: bytes | str | None, now: float) -> dict[str, Any] | None:
    """One heartbeat value (JSON) with ``age_seconds`` and ``up`` added; None if unreadable."""
    if raw is None:
        return None  # expired between SCAN and MGET
    try:
        beat = json.loads(raw)
    except ValueError:
        logger.warning("ignoring a malformed heartbeat under %s", key)
        return None
    if not isinstance(beat, dict):
        return None
    beat.setdefault("worker", key.removeprefix(WORKER_KEY_PREFIX))
    ts = beat.get("ts")
    age = now - ts if isinstance(ts, int | float) else None
    beat["age_seconds"] = None if age is None else round(age, 3)
    beat["up"] = age is not None and age <= settings.WORKER_STALE_SECONDS
    return beat


async def read_heartbeats() -> list[dict[str, Any]] | None:
    """Every worker's heartbeat (sorted by worker id); None when Redis could not be read."""
    try:
        client = _client(_heartbeat_host())
    except Exception:
        logger.exception("cannot connect to Redis for worker heartbeats")
        return None
    try:
        async with asyncio.timeout(REDIS_TIMEOUT * 2):
            keys = [k async for k in client.scan_iter(match=WORKER_KEY_PREFIX + "*", count=100)]
            values = await client.mget(keys) if keys else []
    except Exception as exc:
        logger.warning("cannot read worker heartbeats: %s", exc)
        return None
    finally:
        await client.aclose(close_connection_pool=True)
    now = time.time()
    beats = []
    for key, raw in zip(keys, values, strict=True):
        name = key.decode() if isinstance(key, bytes) else str(key)
        beat = parse_heartbeat(name, raw, now)
        if beat is not None:
            beats.append(beat)
    return sorted(beats, key=lambda b: str(b["worker"]))


async def engine_workers() -> tuple[list[dict[str, Any]], bool]:
    """The workers seen (in-process engine if started, then Redis heartbeats) and whether Redis read."""
    workers: list[dict[str, Any]] = []
    local = local_worker()
    if local is not None:
        workers.append(local)
    if not redis_mode():
        return workers, True
    beats = await read_heartbeats()
    workers.extend(beats or [])
    return workers, beats is not None


class WorkerRoom:
    """Whether some ready worker has room for a new request, by the load-shedding estimates its
    heartbeat publishes; the heartbeats are read at most once per heartbeat period."""

    def __init__(self, budget: float) -> None:
        self._budget = budget
        self._beats: list[dict[str, Any]] = []
        self._read_at = -1e9

    async def __call__(self, pipeline: str, budget: float | None = None) -> float | None:
        """None when a ready worker would start it within the budget (the request's own, a
        conversation turn's, else the engine's; or no worker says otherwise), else the seconds
        until the least loaded one would."""
        now = time.monotonic()
        if now - self._read_at >= WORKER_BEAT_SECONDS:
            self._read_at = now
            self._beats = [b for b in await read_heartbeats() or [] if b.get("up") and b.get("ready", True)]
        limit = self._budget if budget is None else budget  # own_admit_budget: None or > 0
        waits = [b.get("estimated_wait_seconds", {}).get(pipeline) for b in self._beats]
        estimates = [w for w in waits if isinstance(w, int | float)]
        if not waits or len(estimates) < len(waits) or any(w <= limit for w in estimates):
            return None  # unknown (no estimate yet, an older worker): the workers decide
        return min(estimates) - limit
