"""Prometheus metrics and the engine/worker view shared by ``/metrics`` and ``/healthz``.

Everything lives on one dedicated ``REGISTRY`` (never prometheus_client's global one), rendered by
``/metrics``. Counters and histograms are updated where things happen:

- ``omniweb_sessions_open{endpoint}``: by the WebSocket access middleware (``omniweb.web.auth``) when the
  app accepts a socket, and back down when the connection's app returns, exactly once per socket;
- ``omniweb_time_to_first_audio_seconds{mode}``: by the speech consumer, ``input.done`` → first audio;
- ``omniweb_errors_total{kind}``: every ``error`` message a session consumer sends, by the ``kind``
  it carries (``count_error_message``; kinds in ``omniweb.base.errors``), plus refused handshakes
  (``auth``, ``limit``);
- ``omniweb_video_first_text_seconds`` / ``_first_audio_seconds`` / ``_turn_seconds``: by the video
  consumer (``TurnClock``), from a turn's start to its first text delta, first audio delta, and end;
- ``omniweb_engine_batch_size{kind}``: by the scheduler through ``observe_batch``.

The engine gauges are computed at scrape time (``EngineCollector``): from the in-process scheduler
when it has been started (``worker="local"``) and from the workers' Redis heartbeats
(``omniweb:worker:<id>``) in Redis mode. The in-process engine is never started by a scrape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.conf import settings
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from omniweb.base.errors import ErrorKind

logger = logging.getLogger(__name__)

WORKER_KEY_PREFIX = "omniweb:worker:"  # the engine worker's heartbeat keys (omniweb.engine.worker)
LOCAL_WORKER = "local"  # the ``worker`` label of this process's own (embedded) engine
REDIS_TIMEOUT = 1.0  # seconds for a health check's Redis PING / heartbeat read
ERROR_KINDS = tuple(kind.value for kind in ErrorKind)

REGISTRY = CollectorRegistry()

SESSIONS_OPEN = Gauge(
    "omniweb_sessions_open",
    "WebSocket sessions currently open in this process",
    ["endpoint"],
    registry=REGISTRY,
)
TIME_TO_FIRST_AUDIO = Histogram(
    "omniweb_time_to_first_audio_seconds",
    "Seconds from the start of an utterance (input.done, or its first completed piece when spoken "
    "before the flush) to its first audio (mode=stream: first PCM chunk; mode=file: the first encoded file)",
    ["mode"],
    buckets=(0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
    registry=REGISTRY,
)
ENGINE_BATCH_SIZE = Histogram(
    "omniweb_engine_batch_size",
    "Work units run together in one engine call, by plan kind",
    ["kind"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128),
    registry=REGISTRY,
)
_TURN_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
VIDEO_FIRST_TEXT = Histogram(
    "omniweb_video_first_text_seconds",
    "Seconds from a video turn's start (video.query) to its first response.text.delta",
    buckets=_TURN_BUCKETS,
    registry=REGISTRY,
)
VIDEO_FIRST_AUDIO = Histogram(
    "omniweb_video_first_audio_seconds",
    "Seconds from a video turn's start (video.query) to its first response.audio.delta",
    buckets=_TURN_BUCKETS,
    registry=REGISTRY,
)
VIDEO_TURN = Histogram(
    "omniweb_video_turn_seconds",
    "Seconds from a video turn's start to its end (answered or failed; interrupted turns are not counted)",
    ["outcome"],
    buckets=_TURN_BUCKETS,
    registry=REGISTRY,
)
LLM_TOKENS = Counter(
    "omniweb_llm_tokens",
    "Language model tokens (thinker llm), by kind: prompt (read) or completion (generated)",
    ["kind"],
    registry=REGISTRY,
)
LLM_FIRST_TOKEN = Histogram(
    "omniweb_llm_first_token_seconds",
    "Seconds from a language model request to its first token of text or its first whole function call",
    buckets=_TURN_BUCKETS,
    registry=REGISTRY,
)
LLM_ACTIVE = Gauge(
    "omniweb_llm_answers_active",
    "Language model answers being generated for this process's engine",
    registry=REGISTRY,
)
ERRORS = Counter(
    "omniweb_errors",
    "Errors sent to clients and refused WebSocket handshakes, by kind",
    ["kind"],
    registry=REGISTRY,
)
# Every label value known in advance exists from the start, so rate() works before the first event.
for _kind in ERROR_KINDS:
    ERRORS.labels(kind=_kind)
for _mode in ("stream", "file"):
    TIME_TO_FIRST_AUDIO.labels(mode=_mode)
for _outcome in ("ok", "error"):
    VIDEO_TURN.labels(outcome=_outcome)
for _tokens in ("prompt", "completion"):
    LLM_TOKENS.labels(kind=_tokens)


# -- instrumentation entry points --------------------------------------------------------------------
def observe_batch(kind: str, size: int) -> None:
    """One engine call that ran ``size`` work units of plan kind ``kind`` (thread-safe, cheap)."""
    ENGINE_BATCH_SIZE.labels(kind=kind).observe(size)


def count_error(kind: str) -> None:
    ERRORS.labels(kind=kind).inc()


def count_error_message(payload: dict[str, Any]) -> None:
    """Called for every JSON message a session consumer sends; counts the ``error`` ones by kind."""
    if payload.get("type") == "error":
        kind = payload.get("kind")
        count_error(kind if kind in ERROR_KINDS else ErrorKind.CLIENT.value)


class FirstAudioClock:
    """Started when an utterance starts (``input.done``, or with sentence/clause split the first
    completed piece, spoken before the flush); ``audio_sent`` observes once."""

    __slots__ = ("_done", "_started")

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._done = False

    def audio_sent(self, stream: bool) -> None:
        if not self._done:
            self._done = True
            mode = "stream" if stream else "file"
            TIME_TO_FIRST_AUDIO.labels(mode=mode).observe(time.monotonic() - self._started)


class TurnClock:
    """Started when a video turn starts; observes its first text, first audio and duration once each."""

    __slots__ = ("_audio", "_started", "_text")

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._text = self._audio = False

    def text_sent(self) -> None:
        if not self._text:
            self._text = True
            VIDEO_FIRST_TEXT.observe(time.monotonic() - self._started)

    def audio_sent(self) -> None:
        if not self._audio:
            self._audio = True
            VIDEO_FIRST_AUDIO.observe(time.monotonic() - self._started)

    def ended(self, ok: bool) -> None:
        VIDEO_TURN.labels(outcome="ok" if ok else "error").observe(time.monotonic() - self._started)


# -- the engine: in-process scheduler and Redis heartbeats -------------------------------------------
def layer_backend() -> str:
    return str(settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", ""))


def redis_mode() -> bool:
    """Engine work runs on workers behind channels_redis (else: the embedded, in-process engine)."""
    return layer_backend().startswith("channels_redis.")


# This process's embedded engine as its runtime reports it (``set_local_worker``, called by
# omniweb.engine.runtime when it is imported): metrics never imports the engine it describes.
_local_worker: Callable[[], dict[str, Any] | None] | None = None


def set_local_worker(source: Callable[[], dict[str, Any] | None]) -> None:
    global _local_worker
    _local_worker = source


def local_worker() -> dict[str, Any] | None:
    """This process's scheduler stats if it is running (None when no engine runs here); never starts it."""
    return _local_worker() if _local_worker is not None else None


def engine_record(worker: str, sched: Any, status: dict[str, Any] | None) -> dict[str, Any]:
    """``worker_record`` of a running scheduler, with its readiness (``runtime.engine_status``)."""
    return worker_record(
        worker,
        sched.stats(),
        ready=bool(status and status["ready"]),
        failed=status["failed"] if status else {},
        waits=sched.estimated_waits(),
        slowdown=sched.slowdown,
        paces=sched.start_paces(),
        throughputs=sched.throughputs(),
    )


def worker_record(
    worker: str,
    stats: Any,
    *,
    ready: bool = True,
    failed: dict[str, str] | None = None,
    waits: dict[str, float] | None = None,
    slowdown: float = 1.0,
    paces: dict[str, float] | None = None,
    throughputs: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One engine's load as /healthz and /metrics read it; also what workers publish to Redis.

    ``ready``: every pipeline has loaded or failed and one serves; ``pipelines``: each one's state;
    ``estimated_wait_seconds``: per pipeline, how long a new request would wait for its first media
    (``slowdown``: how much longer first media took than estimated, lately; the estimates include it);
    ``start_pace_seconds``: per pipeline, the seconds between request starts a saturated engine is
    estimated to manage (what each request already waiting adds to a new one's wait);
    ``media_throughput``: per pipeline, the media seconds per second it delivered with every worker
    busy with it (its measured capacity; absent until it has been).
    """
    return {
        "worker": worker,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "ready": ready,
        "pipelines": dict(stats.pipelines),
        "failed": dict(failed or {}),
        "estimated_wait_seconds": dict(waits or {}),
        "slowdown": round(slowdown, 3),
        "start_pace_seconds": dict(paces or {}),
        "media_throughput": dict(throughputs or {}),
        "active": stats.active,
        "queued": stats.queued,
        "running_steps": stats.running_steps,
        "steps_total": stats.steps_total,
        "batches_total": stats.batches_total,
        "ts": time.time(),
    }


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


class EngineCollector:
    """Engine gauges per worker, computed at scrape time from ``workers`` (see ``render``)."""

    def __init__(self) -> None:
        self.workers: list[dict[str, Any]] = []

    def describe(self) -> Iterable[Metric]:
        return []  # label values are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        workers = self.workers
        if not any(w["worker"] == LOCAL_WORKER for w in workers):
            local = local_worker()  # a scrape of REGISTRY outside ``render`` still sees this process
            workers = [local, *workers] if local is not None else workers
        gauges = [
            ("omniweb_engine_requests_active", "Requests being stepped by the engine", "active"),
            ("omniweb_engine_requests_queued", "Requests admitted and waiting for a slot", "queued"),
            ("omniweb_engine_running_steps", "Work units executing right now", "running_steps"),
        ]
        for name, doc, field in gauges:
            family = GaugeMetricFamily(name, doc, labels=["worker"])
            for w in workers:
                if isinstance(w.get(field), int | float):
                    family.add_metric([str(w["worker"])], w[field])
            yield family
        counters = [
            ("omniweb_engine_steps", "Work units run since the worker started", "steps_total"),
            ("omniweb_engine_batches", "Engine calls that ran more than one work unit", "batches_total"),
        ]
        for name, doc, field in counters:
            counter = CounterMetricFamily(name, doc, labels=["worker"])
            for w in workers:
                if isinstance(w.get(field), int | float):
                    counter.add_metric([str(w["worker"])], w[field])
            yield counter
        ready = GaugeMetricFamily("omniweb_engine_ready", "1 once the worker's models have loaded", labels=["worker"])
        wait_doc = "Estimated seconds until a new request's first media (load shedding refuses past the budget)"
        waits = GaugeMetricFamily("omniweb_engine_estimated_wait_seconds", wait_doc, labels=["worker", "pipeline"])
        for w in workers:
            ready.add_metric([str(w["worker"])], 1.0 if w.get("ready", True) else 0.0)
            for pipeline, wait in (w.get("estimated_wait_seconds") or {}).items():
                if isinstance(wait, int | float):
                    waits.add_metric([str(w["worker"]), str(pipeline)], wait)
        yield ready
        yield waits
        up_doc = "1 if the worker's heartbeat is fresh (worker=local: this process's engine, when started)"
        up = GaugeMetricFamily("omniweb_worker_up", up_doc, labels=["worker"])
        for w in workers:
            up.add_metric([str(w["worker"])], 1.0 if w.get("up") else 0.0)
        yield up


ENGINE = EngineCollector()
REGISTRY.register(ENGINE)


def render(workers: list[dict[str, Any]]) -> bytes:
    """The exposition text with the engine gauges for ``workers`` (synchronous: no interleaving)."""
    ENGINE.workers = workers
    try:
        return generate_latest(REGISTRY)
    finally:
        ENGINE.workers = []


def serve_worker_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Expose ``REGISTRY`` on its own HTTP port (for ``runworker`` processes, which serve no HTTP)."""
    from prometheus_client import start_http_server

    start_http_server(port, addr, registry=REGISTRY)
