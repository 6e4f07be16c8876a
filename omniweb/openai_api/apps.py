from django.apps import AppConfig


class OpenAIApiConfig(AppConfig):
    name = "omniweb.openai_api"
    label = "openai_api"
    verbose_name = "OpenAI-compatible audio APIs"

    def ready(self) -> None:
        import omniweb.media.containers  # noqa: F401  (loads FFmpeg now, not on the first request: ~0.15 s)
