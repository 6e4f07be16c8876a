"""The voice is loaded once per process: the speech pipelines and the voice loops the video turn
borrows by name (``omniweb.engine.voice``) all speak with one talker, built by whichever loads first.
A second copy cost ~110 MB of RSS in every engine process (issue 36)."""

from __future__ import annotations

from typing import Any

import pytest

from omniweb.engine.voice import voice
from speech import apps
from speech.tts import model


def test_the_speech_pipelines_and_the_borrowed_voice_loops_share_one_talker(monkeypatch: pytest.MonkeyPatch):
    built: list[Any] = []
    load = model.HibariTalker.__init__

    def counted(self: model.HibariTalker) -> None:
        built.append(self)
        load(self)

    monkeypatch.setattr(model.HibariTalker, "__init__", counted)
    apps._talker.cache_clear()  # as in a fresh process (an engine already running keeps its own)
    try:
        tts = apps._tts_pipeline()
        codec = apps._codec_pipeline()
        loops = voice().speaking_loops()  # what the video.turn pipeline speaks with
    finally:
        apps._talker.cache_clear()
    assert [loop.name for loop in loops] == ["talker", "vocoder"]
    assert len(built) == 1 and tts.talker is codec.talker is built[0]
