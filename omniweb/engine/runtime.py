"""Process-wide engine: the model registry and the one scheduler that owns this process's devices."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings

from omniweb.metrics import observe_batch

from .client import EngineClient, LocalEngineClient
from .contracts import Pipeline
from .scheduler import Scheduler

_factories: dict[str, Callable[[], Pipeline]] = {}
logger = logging.getLogger(__name__)
_lock = threading.Lock()
_scheduler: Scheduler | None = None
_client: EngineClient | None = None


def register_pipeline(name: str, factory: Callable[[], Pipeline]) -> None:
    """Apps register their pipelines at start-up; models load only when the engine starts."""
    _factories[name] = factory


def get_scheduler() -> Scheduler:
    global _scheduler
    with _lock:
        if _scheduler is None:
            started = time.monotonic()
            pipelines = {name: factory() for name, factory in _factories.items()}
            sched = Scheduler(
                pipelines,
                workers=settings.ENGINE_WORKERS,
                max_active=settings.ENGINE_MAX_ACTIVE,
                max_queued=settings.ENGINE_MAX_QUEUED,
                max_batch=settings.ENGINE_MAX_BATCH,
                batch_wait=settings.ENGINE_BATCH_WAIT_MS / 1000.0,
                max_ahead=settings.ENGINE_MAX_AHEAD_SECONDS,
                on_batch=observe_batch,
                first_media_budget=settings.ENGINE_FIRST_AUDIO_BUDGET_MS / 1000.0,
                first_media_settle=settings.ENGINE_FIRST_AUDIO_SETTLE_MS / 1000.0,
            )
            sched.start()
            _scheduler = sched
            logger.info(
                "ready: models loaded in %.1f s (%s); the engine serves requests on %d workers",
                time.monotonic() - started,
                ", ".join(pipelines),
                settings.ENGINE_WORKERS,
            )
        return _scheduler


def get_engine_client() -> EngineClient:
    """The client the consumers use: the in-process scheduler, or workers over Redis."""
    global _client
    if _client is None:
        if settings.REDIS_URL:
            from channels.layers import get_channel_layer

            from .dispatch import ChannelEngineClient

            _client = ChannelEngineClient(
                get_channel_layer(),
                settings.ENGINE_CHANNEL,
                lease=settings.ENGINE_LEASE_SECONDS,
                accept_timeout=settings.ENGINE_ACCEPT_TIMEOUT,
                redis_url=settings.REDIS_URL,
            )
        else:
            _client = LocalEngineClient(get_scheduler())
    return _client


def loaded_engine_client() -> EngineClient | None:
    """The client once ``get_engine_client`` has made it, else None: lets an async caller skip the
    thread hop that the first, model-loading call needs (it costs up to a GIL switch interval)."""
    return _client


def shutdown() -> None:
    """Stop the workers (tests use this to prove nothing is left running)."""
    global _scheduler, _client
    with _lock:
        if _scheduler is not None:
            _scheduler.stop()
        _scheduler = None
        _client = None
