from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig
from django.conf import settings
from django.core.signals import setting_changed

if TYPE_CHECKING:
    from .engine.contracts import Pipeline


class OmniwebConfig(AppConfig):
    name = "omniweb"
    verbose_name = "omniweb runtime"

    def ready(self) -> None:
        from .engine.requests import END_OF_TURN, TRANSCRIBE, VAD
        from .engine.runtime import register_pipeline
        from .wiring import configure_core, reconfigure_core

        configure_core()
        setting_changed.connect(reconfigure_core, dispatch_uid="omniweb.wiring")
        # The models load when the engine starts (workers only): Silero VAD, Smart Turn (semantic_vad),
        # Whisper (every transcription). Their modules are imported then too, not in a process that
        # runs no engine (a Redis-mode daphne).
        register_pipeline(VAD, _vad)
        register_pipeline(END_OF_TURN, _end_of_turn)
        register_pipeline(TRANSCRIBE, _transcribe)
        if not settings.DATABASES:
            _drop_database_hooks()


def _vad() -> Pipeline:
    from .asr.vad_engine import VadPipeline

    return VadPipeline()


def _end_of_turn() -> Pipeline:
    from .asr.turn_engine import TurnPipeline

    return TurnPipeline()


def _transcribe() -> Pipeline:
    from .asr.pipeline import TranscribePipeline

    return TranscribePipeline()


def _drop_database_hooks() -> None:
    """Without a database Django's per-request database hooks do nothing, yet under ASGI every
    request runs them through ``sync_to_async`` before its view: a thread hop on the way to the
    OpenAI speech endpoint's first bytes that the WebSocket does not pay (bench/http_stages.py)."""
    from django.core import signals
    from django.db import close_old_connections, reset_queries

    signals.request_started.disconnect(reset_queries)
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
