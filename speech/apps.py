from django.apps import AppConfig


class SpeechConfig(AppConfig):
    name = "speech"
    verbose_name = "Streaming speech"

    def ready(self) -> None:
        from omniweb.engine.runtime import register_pipeline

        from .tts.loops import PIPELINE, TtsPipeline

        register_pipeline(PIPELINE, TtsPipeline)  # the model loads when the engine starts
