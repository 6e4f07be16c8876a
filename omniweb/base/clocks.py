"""Each endpoint's latency clocks: started when a request, utterance or turn starts, they observe
its first output and its end once each, into that endpoint's own histograms (``omniweb.base.metrics``).

One clock per endpoint, never one shared: a Realtime response counted in the video endpoint's
histograms made both wrong (they start at different events and answer different clients).
"""

from __future__ import annotations

import time

from .metrics import AUDIO_SPEECH_FIRST_AUDIO, REALTIME_RESPONSES, TIME_TO_FIRST_AUDIO, VIDEO_TURNS, TurnHistograms


class FirstAudioClock:
    """The speech WebSocket's utterance: started when it starts (``input.done``, or with
    sentence/clause split the first completed piece, spoken before the flush); ``audio_sent``
    observes ``omniweb_time_to_first_audio_seconds{mode}`` once."""

    __slots__ = ("_done", "_started")

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._done = False

    def audio_sent(self, stream: bool) -> None:
        if not self._done:
            self._done = True
            mode = "stream" if stream else "file"
            TIME_TO_FIRST_AUDIO.labels(mode=mode).observe(time.monotonic() - self._started)


class RequestClock:
    """A ``POST /v1/audio/speech`` request: started when the view takes it; ``audio_sent`` observes
    ``omniweb_audio_speech_first_audio_seconds`` once, at its first audio bytes."""

    __slots__ = ("_done", "_started")

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._done = False

    def audio_sent(self) -> None:
        if not self._done:
            self._done = True
            AUDIO_SPEECH_FIRST_AUDIO.observe(time.monotonic() - self._started)


class TurnClock:
    """Started when an answer starts; observes its first text, first audio and duration once each,
    into the histograms of the endpoint it answers on (``video_turn``, ``realtime_response``)."""

    __slots__ = ("_audio", "_histograms", "_started", "_text")

    def __init__(self, histograms: TurnHistograms) -> None:
        self._histograms = histograms
        self._started = time.monotonic()
        self._text = self._audio = False

    def text_sent(self) -> None:
        if not self._text:
            self._text = True
            self._histograms.first_text.observe(time.monotonic() - self._started)

    def audio_sent(self) -> None:
        if not self._audio:
            self._audio = True
            self._histograms.first_audio.observe(time.monotonic() - self._started)

    def ended(self, ok: bool) -> None:
        self._histograms.ended.labels(outcome="ok" if ok else "error").observe(time.monotonic() - self._started)


def video_turn() -> TurnClock:
    """A video turn's clock: ``omniweb_video_*``."""
    return TurnClock(VIDEO_TURNS)


def realtime_response() -> TurnClock:
    """A Realtime response's clock: ``omniweb_realtime_*``."""
    return TurnClock(REALTIME_RESPONSES)
