"""hibari's voice as the server's ``Voice`` (``omniweb.engine.voice``): registered by the speech app
so the other endpoints speak with it by name, without importing speech."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings

from omniweb.engine.requests import SpeakingRequest
from omniweb.engine.voice import Capabilities
from speech.tts.text import split_text

from .loops import TalkerLoop, VocoderLoop, validate_voice, vocoder_backend
from .model import HibariTalker, capabilities


class HibariVoice:
    def __init__(self, talker: Callable[[], HibariTalker]) -> None:
        """``talker``: gives the process's one talker (the speech pipelines speak with it too), loading
        it in the engine process that first needs it."""
        self._talker = talker

    def capabilities(self) -> Capabilities:
        return capabilities()

    def sentences(self, text: str) -> list[str]:
        return split_text(text, "sentence")

    def speaking_loops(self) -> Sequence[Any]:
        return (
            TalkerLoop(self._talker(), settings.TALKER_LOOKAHEAD, incremental=True),
            VocoderLoop(settings.VOCODER_CHUNK_FRAMES, settings.VOCODER_FIRST_CHUNK_FRAMES, vocoder_backend()),
        )

    def validate(self, request: SpeakingRequest) -> None:
        validate_voice(request, capabilities().voices)  # read once: capabilities() is cached
