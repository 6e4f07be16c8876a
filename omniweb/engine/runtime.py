"""Process-wide engine: the model registry, the one scheduler that owns this process's devices, and
its readiness.

It reads no settings: the wiring (``omniweb.wiring``) gives it its ``EngineConfig`` and, in the
Redis mode, the client of the workers elsewhere (``configure``); this module then only holds the
process's one scheduler and one client.

The scheduler starts at once and the pipelines load behind it, one by one, in a background thread:
a request for a pipeline still loading is refused as ``starting`` (the in-process client first waits
``ENGINE_READY_WAIT_SECONDS`` for it), one whose models failed to load as ``unavailable``, and every
other pipeline serves as soon as it is loaded. ``/healthz`` and the workers' heartbeats read
``engine_status``.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omniweb.base.metrics import LOCAL_WORKER, engine_record, observe_batch, set_local_worker

from .client import EngineClient, LocalEngineClient
from .contracts import Pipeline
from .scheduler import Scheduler

_factories: dict[str, Callable[[], Pipeline]] = {}
logger = logging.getLogger(__name__)
_lock = threading.Lock()
_scheduler: Scheduler | None = None
_client: EngineClient | None = None


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What the engine is started with (seconds, not the settings' milliseconds); the wiring builds
    it from the ``OMNIWEB_ENGINE_*`` settings."""

    workers: int
    max_active: int
    max_queued: int
    max_batch: int
    batch_wait: float
    max_ahead: float
    first_media_budget: float
    first_media_settle: float
    admit_budget: float
    ready_wait: float  # an in-process request waits this long for its pipeline's models to load


_config: EngineConfig | None = None
# The client of an engine that runs in other processes (the Redis mode's workers), made when first
# asked for; None: this process runs the engine itself.
_remote: Callable[[], EngineClient] | None = None


def configure(config: EngineConfig, remote: Callable[[], EngineClient] | None = None) -> None:
    """Called by the wiring when Django starts and when a setting changes; an engine already
    running keeps its config until it is restarted, and a client already made stays."""
    global _config, _remote
    _config, _remote = config, remote


def _configured() -> EngineConfig:
    if _config is None:
        raise RuntimeError("the engine is not configured: omniweb.wiring.configure_core (Django's start) does it")
    return _config


@dataclass
class PipelineLoad:
    """One pipeline's load: ``loading`` → ``ready`` or ``failed`` (with why)."""

    state: str = "loading"
    error: str | None = None
    load_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "error": self.error, "load_seconds": self.load_seconds}


@dataclass
class _Loading:
    """The models of the running scheduler: one per engine start (tests stop and start engines)."""

    pipelines: dict[str, PipelineLoad] = field(default_factory=dict)
    workers: int = 0  # the scheduler's (for the "ready" log line)
    done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


_loading = _Loading()


def register_pipeline(name: str, factory: Callable[[], Pipeline]) -> None:
    """Apps register their pipelines at start-up; models load only when the engine starts."""
    _factories[name] = factory


def start_engine() -> Scheduler:
    """Start this process's scheduler now and load the models behind it; never blocks on them."""
    global _scheduler, _loading
    with _lock:
        if _scheduler is None:
            config = _configured()
            sched = Scheduler(
                {},
                workers=config.workers,
                max_active=config.max_active,
                max_queued=config.max_queued,
                max_batch=config.max_batch,
                batch_wait=config.batch_wait,
                max_ahead=config.max_ahead,
                on_batch=observe_batch,
                first_media_budget=config.first_media_budget,
                first_media_settle=config.first_media_settle,
                admit_budget=config.admit_budget,
            )
            factories = dict(_factories)
            loading = _Loading(pipelines={name: PipelineLoad() for name in factories}, workers=config.workers)
            for name in factories:
                sched.pipeline_loading(name)
            sched.start()
            loading.thread = threading.Thread(
                target=_load, args=(sched, factories, loading), name="engine-load", daemon=True
            )
            _scheduler, _loading = sched, loading
            loading.thread.start()
        return _scheduler


def _load(sched: Scheduler, factories: dict[str, Callable[[], Pipeline]], loading: _Loading) -> None:
    """Build each pipeline in registration order (the codec reuses the speech talker built before
    it); one that raises is reported and refused, and the others load and serve regardless."""
    started = time.monotonic()
    try:
        for name, factory in factories.items():
            t0 = time.monotonic()
            status = loading.pipelines[name]
            try:
                pipeline = factory()
            except Exception as exc:
                logger.exception("pipeline %s failed to load: its endpoints are unavailable, the others serve", name)
                status.error = f"{type(exc).__name__}: {exc}"
                status.state = "failed"
                sched.pipeline_failed(name)
                continue
            status.load_seconds = round(time.monotonic() - t0, 3)
            sched.add_pipeline(name, pipeline)
            status.state = "ready"
        _freeze_heap()
        ready = [name for name, s in loading.pipelines.items() if s.state == "ready"]
        failed = [name for name, s in loading.pipelines.items() if s.state == "failed"]
        # Logged before ``done`` is set: whoever waited for readiness finds the line already written.
        logger.info(
            "ready: models loaded in %.1f s (%s)%s; the engine serves requests on %d workers",
            time.monotonic() - started,
            ", ".join(ready) or "none",
            f"; failed to load: {', '.join(failed)}" if failed else "",
            loading.workers,
        )
    finally:
        loading.done.set()


def _freeze_heap() -> None:
    """Take what is alive once the models are loaded out of the garbage collector's reach.

    The models' Python objects (the G2P lexicon's tables above all) live as long as the process,
    and every full collection walked them all: ~110 ms with every thread stopped, which under a
    burst of 300 requests held back the refusals' writes and the admitted requests' first audio
    (``bench/overload.py``: refusals 230 → 98 ms p95). ``gc.freeze`` moves them to the permanent
    generation, so full collections walk only what was allocated since; they are still reference
    counted and freed as usual.
    """
    t0 = time.monotonic()
    gc.collect()
    gc.freeze()
    logger.debug("froze %d objects in %.0f ms", gc.get_freeze_count(), (time.monotonic() - t0) * 1000)


def get_scheduler() -> Scheduler:
    """The scheduler once every pipeline has loaded or failed (blocks while the models load)."""
    sched = start_engine()
    _loading.done.wait()
    return sched


def wait_loaded(timeout: float | None = None) -> bool:
    """Block until the running engine's loading is over; False on timeout (True with no engine)."""
    return _scheduler is None or _loading.done.wait(timeout)


def engine_status() -> dict[str, Any] | None:
    """This process's engine readiness, or None when no engine was started here.

    ``state``: ``loading`` until every pipeline is loaded or failed, then ``ready`` (all loaded),
    ``degraded`` (some failed, the others serve) or ``failed`` (none loaded).
    """
    if _scheduler is None:
        return None
    pipelines = {name: s.as_dict() for name, s in _loading.pipelines.items()}
    loading = [name for name, s in pipelines.items() if s["state"] == "loading"]
    failed = {name: s["error"] for name, s in pipelines.items() if s["state"] == "failed"}
    if loading:
        state = "loading"
    elif failed:
        state = "failed" if len(failed) == len(pipelines) else "degraded"
    else:
        state = "ready"
    return {
        "state": state,
        "ready": state in ("ready", "degraded"),
        "loading": loading,
        "failed": failed,
        "pipelines": pipelines,
    }


def get_engine_client() -> EngineClient:
    """The client the consumers use: the in-process scheduler, or the workers' (``configure``'s
    ``remote``). Never waits for the models: the in-process engine starts loading them if nothing has yet."""
    global _client
    if _client is None:
        remote = _remote
        if remote is not None:
            _client = remote()
        else:
            _client = LocalEngineClient(start_engine(), ready_wait=_configured().ready_wait)
    return _client


def local_scheduler() -> Scheduler | None:
    """This process's scheduler when it serves requests (embedded mode, started), else None."""
    return None if _remote is not None else _scheduler


def loaded_engine_client() -> EngineClient | None:
    """The client once ``get_engine_client`` has made it, else None: lets an async caller skip the
    thread hop that the first call may need (it costs up to a GIL switch interval)."""
    return _client


def shutdown() -> None:
    """Stop the workers (tests use this to prove nothing is left running)."""
    global _scheduler, _client
    with _lock:
        if _scheduler is not None:
            _scheduler.stop()
        _scheduler = None
        _client = None


def _local_worker() -> dict[str, Any] | None:
    """This process's scheduler as /metrics and /healthz report it (None: no engine started here)."""
    sched = _scheduler
    if sched is None:
        return None
    return {**engine_record(LOCAL_WORKER, sched, engine_status()), "age_seconds": 0.0, "up": True}


set_local_worker(_local_worker)
