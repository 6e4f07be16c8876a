from django.apps import AppConfig
from django.conf import settings


class OmniwebConfig(AppConfig):
    name = "omniweb"
    verbose_name = "omniweb runtime"

    def ready(self) -> None:
        from .asr import pipeline as asr
        from .asr import turn_engine, vad_engine
        from .engine.runtime import register_pipeline

        # The models load when the engine starts (workers only): Silero VAD, Smart Turn (semantic_vad),
        # Whisper (every transcription).
        register_pipeline(vad_engine.PIPELINE, vad_engine.VadPipeline)
        register_pipeline(turn_engine.PIPELINE, turn_engine.TurnPipeline)
        register_pipeline(asr.PIPELINE, asr.TranscribePipeline)
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
