"""Listening: streamed input audio through server voice-activity detection into spoken turns.

``Listener`` joins the session's ``AudioBuffer`` and its ``omniweb.vad.VoiceActivity`` (the model
runs in the engine, never here). Each ``feed`` buffers the audio, runs it through the VAD and
returns the VAD's events; after a ``SpeechStopped`` it also hands out the turn's audio as a
``SpeechSegment`` (from the speech start, prefix padding included, to the stop), taken out of the
buffer. Between turns only the last ``prefix_padding_ms`` (and a little) of silence is kept, so a
client streaming its microphone all day holds almost nothing.

Times are OpenAI's: ms of input audio since the stream began. Audio the VAD never heard (a manual
turn's own audio) is counted with ``append_unheard`` so stream positions stay right.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniweb.vad import SpeechStarted, SpeechStopped, VoiceActivity

from .audio import AudioBuffer

SLACK_MS = 64  # kept beyond the prefix padding between turns: two VAD windows


@dataclass(frozen=True)
class SpeechSegment:
    """A detected turn's audio (PCM16 mono at the buffer's rate)."""

    audio: bytes
    audio_start_ms: int
    audio_end_ms: int


ListenEvent = SpeechStarted | SpeechStopped | SpeechSegment


class AudioRefused(Exception):
    """The buffer refused the audio (overflow, process budget); ``message`` is client-safe."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Listener:
    """Server VAD over a session's audio buffer. ``take_segments=False`` (OpenAI's
    ``create_response: false``) leaves each spoken turn in the buffer for a manual turn to take."""

    def __init__(self, vad: VoiceActivity, audio: AudioBuffer, *, take_segments: bool = True) -> None:
        self.vad = vad
        self.audio = audio
        self.take_segments = take_segments
        self._unheard = 0  # bytes buffered that the VAD never heard
        self._heard = False  # speech since the buffer was last taken: keep all of it
        self._start_ms = 0

    @property
    def speaking(self) -> bool:
        return self.vad.speaking

    def _position(self, ms: int) -> int:
        return self.audio.position(ms) + self._unheard

    async def feed(self, pcm: bytes) -> list[ListenEvent]:
        """Buffer and listen; raises ``AudioRefused``, or ``EngineError`` when the VAD call failed."""
        if problem := self.audio.append(pcm):
            raise AudioRefused(problem)
        out: list[ListenEvent] = []
        for event in await self.vad.feed(pcm):
            out.append(event)
            if isinstance(event, SpeechStarted):
                if not self._heard:  # the silence before the question is not part of it
                    self.audio.drop_before(self._position(event.audio_start_ms))
                    self._start_ms = event.audio_start_ms
                self._heard = True
            elif self.take_segments:
                audio = self.audio.take_before(self._position(event.audio_end_ms))
                out.append(SpeechSegment(audio, self._start_ms, event.audio_end_ms))
                self._heard = False
        if not self.vad.speaking and not self._heard:
            self.audio.keep_last(self.audio.position(self.vad.params.prefix_padding_ms + SLACK_MS))
        return out

    def append_unheard(self, pcm: bytes) -> str | None:
        """Buffer audio that bypasses the VAD; a client-safe problem when refused."""
        problem = self.audio.append(pcm)
        if problem is None:
            self._unheard += len(pcm)
        return problem

    def taken(self) -> None:
        """A manual turn took the whole buffer: what was heard so far is answered."""
        self._heard = False
