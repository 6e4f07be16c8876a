"""hibari's voice as the server's ``Voice`` (``omniweb.engine.voice``): registered by the speech app
so the other endpoints speak with it by name, without importing speech."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings

from omniweb.engine.requests import SpeakingRequest
from omniweb.engine.voice import Capabilities
from speech.tts.text import split_text

from .loops import TalkerLoop, VocoderLoop, validate_voice, vocoder_backend
from .model import HibariTalker, capabilities


class HibariVoice:
    def capabilities(self) -> Capabilities:
        return capabilities()

    def sentences(self, text: str) -> list[str]:
        return split_text(text, "sentence")

    def speaking_loops(self) -> Sequence[Any]:
        talker = HibariTalker()  # loads the voice in the engine process that builds the pipeline
        return (
            TalkerLoop(talker, settings.TALKER_LOOKAHEAD, incremental=True),
            VocoderLoop(settings.VOCODER_CHUNK_FRAMES, settings.VOCODER_FIRST_CHUNK_FRAMES, vocoder_backend()),
        )

    def validate(self, request: SpeakingRequest) -> None:
        validate_voice(request, capabilities().voices)  # read once: capabilities() is cached
