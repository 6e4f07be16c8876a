"""The composition root: the core's values from the settings, and which engine client serves.

The core reads no settings. ``configure_core`` hands it what they say: the engine's ``EngineConfig``
and, with ``OMNIWEB_REDIS_URL``, the client of the workers on Redis (``ChannelEngineClient`` with
its ``WorkerRoom``) instead of an in-process engine; the process memory budget; the frame decode
pool's threads. ``OmniwebConfig.ready`` calls it when Django starts, and Django's ``setting_changed``
(sent by ``override_settings``, as the tests change settings) calls it again, so a setting changed
at run time reaches the core as it reaches Django. An engine already running keeps the config it
was started with.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from omniweb.base import budget
from omniweb.engine import runtime
from omniweb.engine.client import EngineClient
from omniweb.engine.dispatch import ChannelEngineClient
from omniweb.engine.heartbeats import WorkerRoom
from omniweb.media import decoding


def engine_config() -> runtime.EngineConfig:
    """The ``OMNIWEB_ENGINE_*`` settings, in seconds."""
    return runtime.EngineConfig(
        workers=settings.ENGINE_WORKERS,
        max_active=settings.ENGINE_MAX_ACTIVE,
        max_queued=settings.ENGINE_MAX_QUEUED,
        max_batch=settings.ENGINE_MAX_BATCH,
        batch_wait=settings.ENGINE_BATCH_WAIT_MS / 1000.0,
        max_ahead=settings.ENGINE_MAX_AHEAD_SECONDS,
        first_media_budget=settings.ENGINE_FIRST_AUDIO_BUDGET_MS / 1000.0,
        first_media_settle=settings.ENGINE_FIRST_AUDIO_SETTLE_MS / 1000.0,
        admit_budget=settings.ENGINE_ADMIT_BUDGET_MS / 1000.0,
        ready_wait=settings.ENGINE_READY_WAIT_SECONDS,
    )


def redis_engine_client() -> EngineClient:
    """The Redis mode's client: requests to the workers' channel, shed at this tier when no ready
    worker has room (``ENGINE_ADMIT_BUDGET_MS`` > 0)."""
    from channels.layers import get_channel_layer  # the layer is made on first use, for this loop

    admit_budget = settings.ENGINE_ADMIT_BUDGET_MS / 1000.0
    return ChannelEngineClient(
        get_channel_layer(),
        settings.ENGINE_CHANNEL,
        lease=settings.ENGINE_LEASE_SECONDS,
        accept_timeout=settings.ENGINE_ACCEPT_TIMEOUT,
        redis_url=settings.REDIS_URL,
        room=WorkerRoom(admit_budget) if admit_budget > 0 else None,
    )


def configure_core() -> None:
    """Give the core what the settings say now."""
    runtime.configure(engine_config(), remote=redis_engine_client if settings.REDIS_URL else None)
    budget.configure(settings.PROCESS_BUFFER_BUDGET)
    decoding.configure(settings.VIDEO_DECODE_THREADS)


def reconfigure_core(**kwargs: Any) -> None:
    """``setting_changed``'s receiver (any setting: configuring is cheap, and the core's values are few)."""
    configure_core()
