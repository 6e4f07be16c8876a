from django.apps import AppConfig
from django.conf import settings


class OmniwebConfig(AppConfig):
    name = "omniweb"
    verbose_name = "omniweb runtime"

    def ready(self) -> None:
        from .engine.runtime import register_pipeline
        from .vad_engine import PIPELINE, VadPipeline

        register_pipeline(PIPELINE, VadPipeline)  # Silero VAD loads when the engine starts (workers only)
        if not settings.DATABASES:
            _drop_database_hooks()


def _drop_database_hooks() -> None:
    """Without a database Django's per-request database hooks do nothing, yet under ASGI every
    request runs them through ``sync_to_async`` before its view: a thread hop on the way to the
    OpenAI speech endpoint's first bytes that the WebSocket does not pay (bench/http_stages.py)."""
    from django.core import signals
    from django.db import close_old_connections, reset_queries

    signals.request_started.disconnect(reset_queries)
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
