"""``runworker`` with omniweb's resilient engine worker (its models load before it takes requests)."""

from __future__ import annotations

from typing import Any

from channels.management.commands.runworker import Command as ChannelsRunworker
from django.conf import settings
from django.core.management.base import CommandError

from omniweb.engine.runtime import start_engine
from omniweb.engine.worker import EngineWorker


class Command(ChannelsRunworker):
    worker_class = EngineWorker

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.REDIS_URL:
            raise CommandError("runworker needs OMNIWEB_REDIS_URL: workers and daphne meet on Redis")
        if settings.ENGINE_CHANNEL in options["channels"]:
            # Load the models now, not on the first request; the worker publishes its heartbeat
            # (not ready yet) meanwhile and listens for requests once they are loaded.
            start_engine()
        super().handle(*args, **options)
