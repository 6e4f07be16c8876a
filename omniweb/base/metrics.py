"""Prometheus instruments and the engine/worker records that ``/metrics`` and ``/healthz`` read.

Everything lives on one dedicated ``REGISTRY`` (never prometheus_client's global one), rendered by
``/metrics``; this module is pure prometheus_client (no Django, no I/O). Counters and histograms
are updated where things happen:

- ``omniweb_sessions_open{endpoint}``: by the WebSocket access middleware (``omniweb.web.auth``) when the
  app accepts a socket, and back down when the connection's app returns, exactly once per socket;
- ``omniweb_errors_total{kind}``: every ``error`` message a session consumer sends, by the ``kind``
  it carries (``count_error_message``; kinds in ``omniweb.base.errors``), plus refused handshakes
  (``auth``, ``limit``);
- each endpoint's latencies, in histograms of its own, by its clock (``omniweb.base.clocks``):
  ``omniweb_time_to_first_audio_seconds{mode}`` (speech WebSocket), ``omniweb_audio_speech_first_audio_seconds``
  (``POST /v1/audio/speech``), ``omniweb_video_*`` (video turns), ``omniweb_realtime_*`` (Realtime responses);
- ``omniweb_engine_batch_size{kind}``: by the scheduler through ``observe_batch``;
- ``omniweb_llm_*``: by the language model thinker (``omniweb.llm.chat``).

The engine gauges are computed at scrape time (``EngineCollector``) from worker records: this
process's scheduler when it has been started (``worker="local"``, reported by the runtime through
``set_local_worker``) and the workers' Redis heartbeats, which the adapter that reads them
(``omniweb.engine.heartbeats``) passes to ``render``. The in-process engine is never started by a scrape.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from omniweb.base.errors import ErrorKind

LOCAL_WORKER = "local"  # the ``worker`` label of this process's own (embedded) engine
ERROR_KINDS = tuple(kind.value for kind in ErrorKind)

REGISTRY = CollectorRegistry()

SESSIONS_OPEN = Gauge(
    "omniweb_sessions_open",
    "WebSocket sessions currently open in this process",
    ["endpoint"],
    registry=REGISTRY,
)
_FIRST_AUDIO_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
TIME_TO_FIRST_AUDIO = Histogram(
    "omniweb_time_to_first_audio_seconds",
    "Speech WebSocket: seconds from the start of an utterance (input.done, or its first completed piece "
    "when spoken before the flush) to its first audio (mode=stream: first PCM chunk; mode=file: the first "
    "encoded file)",
    ["mode"],
    buckets=_FIRST_AUDIO_BUCKETS,
    registry=REGISTRY,
)
AUDIO_SPEECH_FIRST_AUDIO = Histogram(
    "omniweb_audio_speech_first_audio_seconds",
    "POST /v1/audio/speech: seconds from the request's arrival at the view to its first audio bytes sent",
    buckets=_FIRST_AUDIO_BUCKETS,
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


@dataclass(frozen=True)
class TurnHistograms:
    """One endpoint's answer latencies: start → first text, start → first audio, start → end (``outcome``)."""

    first_text: Histogram
    first_audio: Histogram
    ended: Histogram


def _histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
    return Histogram(name, doc, labels, buckets=_TURN_BUCKETS, registry=REGISTRY)


_NOT_COUNTED = "(outcome ok or error; interrupted and cancelled ones are not counted)"
VIDEO_TURNS = TurnHistograms(
    first_text=_histogram(
        "omniweb_video_first_text_seconds",
        "Seconds from a video turn's start (video.query) to its first response.text.delta",
    ),
    first_audio=_histogram(
        "omniweb_video_first_audio_seconds",
        "Seconds from a video turn's start (video.query) to its first response.audio.delta",
    ),
    ended=_histogram(
        "omniweb_video_turn_seconds", f"Seconds from a video turn's start to its end {_NOT_COUNTED}", ("outcome",)
    ),
)
REALTIME_RESPONSES = TurnHistograms(
    first_text=_histogram(
        "omniweb_realtime_first_text_seconds",
        "Seconds from a Realtime response's start to its first text "
        "(response.output_text.delta, or response.output_audio_transcript.delta for a spoken answer)",
    ),
    first_audio=_histogram(
        "omniweb_realtime_first_audio_seconds",
        "Seconds from a Realtime response's start to its first response.output_audio.delta",
    ),
    ended=_histogram(
        "omniweb_realtime_response_seconds",
        f"Seconds from a Realtime response's start to its response.done {_NOT_COUNTED}",
        ("outcome",),
    ),
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
    VIDEO_TURNS.ended.labels(outcome=_outcome)
    REALTIME_RESPONSES.ended.labels(outcome=_outcome)
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


# -- the engine's records: this process's scheduler and the workers' heartbeats --------------------
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
        costs={name: {"first": round(c.first, 4), "stream": round(c.stream, 4)} for name, c in sched.costs().items()},
    )


def worker_record(
    worker: str,
    stats: Any,
    *,
    ready: bool = True,
    failed: dict[str, str] | None = None,
    waits: dict[str, float] | None = None,
    costs: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """One engine's load as /healthz and /metrics read it; also what workers publish to Redis.

    ``ready``: every pipeline has loaded or failed and one serves; ``pipelines``: each one's state;
    ``estimated_wait_seconds``: per pipeline, how long a new request would wait for its first media
    behind the work queued ahead of it (0: nothing is, it starts now);
    ``admission_costs``: per pipeline, the worker seconds the estimates price a request at, measured
    when it loaded and on every request since: ``first`` (until its first media) and ``stream`` (per
    second of its media).
    """
    return {
        "worker": worker,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "ready": ready,
        "pipelines": dict(stats.pipelines),
        "failed": dict(failed or {}),
        "estimated_wait_seconds": dict(waits or {}),
        "admission_costs": dict(costs or {}),
        "active": stats.active,
        "queued": stats.queued,
        "running_steps": stats.running_steps,
        "steps_total": stats.steps_total,
        "batches_total": stats.batches_total,
        "ts": time.time(),
    }


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
