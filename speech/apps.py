from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from .codec.loops import CodecPipeline
    from .tts.loops import TtsPipeline
    from .tts.model import HibariTalker


class SpeechConfig(AppConfig):
    name = "speech"
    verbose_name = "Streaming speech"

    def ready(self) -> None:
        from omniweb.engine.requests import SPEECH, SPEECH_CODEC
        from omniweb.engine.runtime import register_pipeline
        from omniweb.engine.voice import register_voice

        from .tts.voice import HibariVoice

        # The video and OpenAI endpoints speak with it, by name; its loops speak with the same talker.
        register_voice(HibariVoice(_talker))
        register_pipeline(SPEECH, _tts_pipeline)  # the model loads when the engine starts
        register_pipeline(SPEECH_CODEC, _codec_pipeline)  # codec_tokens output and vocoder="codec"


@functools.cache
def _talker() -> HibariTalker:
    """The process's one talker (its voice is ~110 MB of RSS and ~1 s to load): built by the first pipeline
    the engine loads that speaks, and shared by the others (``talk`` is thread-safe): speech.tts,
    speech.codec and the video.turn pipeline's voice loops. A load that raises is not kept."""
    from .tts.model import HibariTalker

    return HibariTalker()


def _tts_pipeline() -> TtsPipeline:
    from .tts.loops import TtsPipeline

    return TtsPipeline(_talker())


def _codec_pipeline() -> CodecPipeline:
    from .codec.loops import CodecPipeline

    return CodecPipeline(talker=_talker())
