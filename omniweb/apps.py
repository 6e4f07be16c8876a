from django.apps import AppConfig


class OmniwebConfig(AppConfig):
    name = "omniweb"
    verbose_name = "omniweb runtime"

    def ready(self) -> None:
        from .engine.runtime import register_pipeline
        from .vad_engine import PIPELINE, VadPipeline

        register_pipeline(PIPELINE, VadPipeline)  # Silero VAD loads when the engine starts (workers only)
