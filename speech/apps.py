from typing import Any

from django.apps import AppConfig


class SpeechConfig(AppConfig):
    name = "speech"
    verbose_name = "Streaming speech"

    def ready(self) -> None:
        from omniweb.engine.runtime import register_pipeline
        from omniweb.engine.voice import register_voice

        from .codec.loops import CODEC_PIPELINE, CodecPipeline
        from .tts.loops import PIPELINE, TtsPipeline
        from .tts.voice import HibariVoice

        register_voice(HibariVoice())  # the video and OpenAI endpoints speak with it, by name

        built: dict[str, Any] = {}

        def tts_pipeline() -> TtsPipeline:
            built["talker"] = (pipeline := TtsPipeline()).talker
            return pipeline

        def codec_pipeline() -> CodecPipeline:
            # The engine builds pipelines in registration order, so the codec pipeline speaks with
            # the same talker: one copy of the voice per process, not two (~130 MB, ~1 s of start-up).
            return CodecPipeline(talker=built.pop("talker", None))

        register_pipeline(PIPELINE, tts_pipeline)  # the model loads when the engine starts
        register_pipeline(CODEC_PIPELINE, codec_pipeline)  # codec_tokens output and vocoder="codec"
