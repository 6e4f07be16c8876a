from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from omniweb.engine.contracts import Pipeline


class VideoConfig(AppConfig):
    name = "video"
    verbose_name = "Streaming video understanding"

    def ready(self) -> None:
        from omniweb.engine.requests import VIDEO_TURN
        from omniweb.engine.runtime import register_pipeline

        register_pipeline(VIDEO_TURN, _video_turn)  # the models load when the engine starts


def _video_turn() -> Pipeline:
    """Imported only when the engine builds it: the perception models' libraries (OpenCV, MediaPipe)
    and the language model's client stay out of a process that runs no engine (a Redis-mode daphne)."""
    from .engine.pipeline import VideoTurnPipeline

    return VideoTurnPipeline()
