from django.apps import AppConfig


class OpenAIApiConfig(AppConfig):
    name = "openai_api"
    verbose_name = "OpenAI-compatible audio APIs"

    def ready(self) -> None:
        from omniweb.engine.runtime import register_pipeline

        from .transcribe import PIPELINE, TranscribePipeline

        register_pipeline(PIPELINE, TranscribePipeline)  # Whisper loads when the engine starts
