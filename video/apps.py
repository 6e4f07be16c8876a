from django.apps import AppConfig


class VideoConfig(AppConfig):
    name = "video"
    verbose_name = "Streaming video understanding"

    def ready(self) -> None:
        from omniweb.engine.runtime import register_pipeline

        from .engine.pipeline import PIPELINE, VideoTurnPipeline

        register_pipeline(PIPELINE, VideoTurnPipeline)  # the models load when the engine starts
