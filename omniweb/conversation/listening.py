"""Listening: streamed input audio through server voice-activity detection into spoken turns.

``Listener`` joins the session's ``AudioBuffer`` and its ``omniweb.conversation.vad.VoiceActivity`` (the model
runs in the engine, never here; it resamples 24 kHz input to the model's 16 kHz, while the buffer
keeps the client's rate). Each ``feed`` buffers the audio, runs it through the VAD and returns the
VAD's events; after a ``SpeechStopped`` it also hands out the turn's audio as a ``SpeechSegment``
(from the speech start, prefix padding included, to the stop), taken out of the buffer. Between
turns only the last ``prefix_padding_ms`` (and a little) of silence is kept, so a client streaming
its microphone all day holds almost nothing.

``feed_ms`` batches the VAD calls: each call is one engine request, whose fixed cost dominates for
small appends (a Realtime client appending 20 ms at a time); detection waits at most that long more,
and the times it reports are the audio's, unchanged. ``EarlyTranscription`` starts transcribing the
speech at a silence inside it, before the turn is certain (the rest of ``silence_duration_ms`` is
then the transcriber's head start); the speaker going on abandons it, and the turn's
``SpeechSegment.transcript()`` awaits it when it was for the silence that ended the turn. With
``stream_ms`` it also streams: while the person speaks, the speech so far is transcribed every
``stream_ms`` of audio (one at a time, at the engine's batch priority: only with time to spare), and
the words two such hypotheses in a row agree on (LocalAgreement, as streaming Whisper servers do)
are handed out as ``Heard`` events; the early transcription then starts from them (the decoder is
made to begin with them), so at the turn's end only the tail is left to decode.

Without a VAD (``vad=None``: manual turns) ``feed`` only buffers; ``commit`` takes the whole buffer as
a turn and ``clear`` empties it, both starting the detection afresh. Times are OpenAI's: ms of input
audio since the stream began. Audio the VAD never heard (a manual turn's own audio, what a commit
took before the VAD had it) is counted so stream positions stay right.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from omniweb.base.tasks import spawn
from omniweb.conversation.vad import SpeechStarted, SpeechStopped, VoiceActivity

from .audio import AudioBuffer

SLACK_MS = 100  # kept beyond the prefix padding between turns: three VAD windows
# The adapters' ``feed_ms``: each VAD call is one engine request, whose fixed cost dominates for small
# pieces (measured: a session appending 20 ms at a time cost the server 7 % of a core for the VAD
# alone when every whole 32 ms window was its own request). Detection waits at most this long more.
FEED_MS = 96


@dataclass(frozen=True)
class SpeechSegment:
    """A detected turn's audio (PCM16 mono at the buffer's rate); ``heard``: the text its ``Heard``
    events handed out (the early transcript starts with it)."""

    audio: bytes
    audio_start_ms: int
    audio_end_ms: int
    early: asyncio.Task[Sequence[str] | None] | None = field(default=None, repr=False, compare=False)
    heard: str = ""

    async def transcript(self) -> tuple[str, ...] | None:
        """What the early transcription heard in the turn, in the transcriber's pieces (None: none
        was made for it, or it failed)."""
        if self.early is None:
            return None
        (result,) = await asyncio.gather(self.early, return_exceptions=True)
        return None if result is None or isinstance(result, BaseException) else tuple(result)


@dataclass(frozen=True)
class Heard:
    """More of the speech in progress is certain: ``delta`` extends the text heard so far."""

    delta: str


ListenEvent = SpeechStarted | SpeechStopped | SpeechSegment | Heard


class Transcribe(Protocol):
    """PCM16 at the buffer's rate → the transcript in the pieces it was made in (Whisper's
    segments), in order, beginning with ``prefix`` when one is given; None: it failed. ``partial``:
    a hypothesis while the person still speaks (worth doing only with time to spare)."""

    def __call__(
        self, pcm: bytes, /, *, prefix: str | None, partial: bool
    ) -> Coroutine[Any, Any, Sequence[str] | None]: ...


@dataclass(frozen=True)
class EarlyTranscription:
    """Transcribe the speech once a silence inside it has lasted ``after_ms`` (``tail_ms`` of that
    silence included), and with ``stream_ms`` while it is spoken (0: not)."""

    transcribe: Transcribe
    after_ms: int = 200
    tail_ms: int = 100
    stream_ms: int = 0


def agreed(previous: Sequence[str], current: Sequence[str]) -> list[str]:
    """The words two hypotheses in a row begin with alike."""
    out = []
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        out.append(a)
    return out


@dataclass(eq=False)
class _Early:
    silence_ms: float  # where the silence it started at began (the VAD's clock)
    task: asyncio.Task[Sequence[str] | None]


class AudioRefused(Exception):
    """The buffer refused the audio (overflow, process budget); ``message`` is client-safe."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Listener:
    """Server VAD over a session's audio buffer. ``take_segments=False`` (OpenAI's
    ``create_response: false`` on the video endpoint) leaves each spoken turn in the buffer for a
    manual turn to take."""

    def __init__(
        self,
        vad: VoiceActivity | None,
        audio: AudioBuffer,
        *,
        take_segments: bool = True,
        feed_ms: int = 0,
        early: EarlyTranscription | None = None,
    ) -> None:
        self.vad = vad
        self.audio = audio
        self.take_segments = take_segments
        self._feed_bytes = audio.position(feed_ms)
        self._early_config = early
        self._unfed = bytearray()  # buffered, not yet given to the VAD
        self._unheard = 0  # bytes buffered that the VAD never heard
        self._heard = False  # speech since the buffer was last taken: keep all of it
        self._start_ms = 0
        self._early: _Early | None = None
        self._heard_text = ""  # what Heard events gave out for the speech in progress
        self._hypothesis: list[str] = []  # the last partial transcript's words
        self._partial: asyncio.Task[Sequence[str] | None] | None = None
        self._partial_ms = 0.0  # the VAD clock when the last partial was started

    @property
    def speaking(self) -> bool:
        return self.vad is not None and self.vad.speaking

    def _position(self, ms: float) -> int:
        return self.audio.position(ms) + self._unheard

    async def feed(self, pcm: bytes) -> list[ListenEvent]:
        """Buffer and listen; raises ``AudioRefused``, or ``EngineError`` when the VAD call failed."""
        if problem := self.audio.append(pcm):
            raise AudioRefused(problem)
        vad = self.vad
        if vad is None:
            return []
        self._unfed += pcm
        if len(self._unfed) < self._feed_bytes:
            return []
        heard = bytes(self._unfed)
        self._unfed.clear()
        out: list[ListenEvent] = []
        if (more := self._take_partial()) is not None:
            out.append(more)
        for event in await vad.feed(heard):
            out.append(event)
            if isinstance(event, SpeechStarted):
                if not self._heard:  # the silence before the question is not part of it
                    self.audio.drop_before(self._position(event.audio_start_ms))
                    self._start_ms = event.audio_start_ms
                    self._partial_ms = vad.detector.clock_ms
                self._heard = True
                self._drop_early()
            elif self.take_segments:
                audio = self.audio.take_before(self._position(event.audio_end_ms))
                segment = SpeechSegment(
                    audio, self._start_ms, event.audio_end_ms, self._take_early(), heard=self._heard_text
                )
                out.append(segment)
                self._heard = False
                self._drop_stream()
            else:  # the turn stays in the buffer for a manual turn, which transcribes it itself
                self._drop_early()
                self._drop_stream()
        if vad is not self.vad:  # the VAD was replaced meanwhile: its events are the last of it
            return out
        if not vad.speaking and not self._heard:
            self.audio.keep_last(self.audio.position(vad.params.prefix_padding_ms + SLACK_MS))
        self._maybe_transcribe_early(vad)
        self._maybe_stream(vad)
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

    def commit(self) -> bytes:
        """A manual turn: the whole buffer, now out of it; detection starts afresh."""
        pcm = self.audio.take()
        self._restart()
        return pcm

    def clear(self) -> None:
        """Forget the buffered audio; detection starts afresh."""
        self.audio.clear()
        self._restart()

    def listen_with(self, vad: VoiceActivity | None) -> None:
        """Another VAD (new settings) or none from now on: it hears only what comes next."""
        self.vad = vad
        self._unfed.clear()
        self._unheard = self.audio.appended
        self._heard = False
        self._drop_early()
        self._drop_stream()

    def close(self) -> None:
        self._drop_early()
        self._drop_stream()
        self._unfed.clear()

    def _restart(self) -> None:
        self._unheard += len(self._unfed)  # taken before the VAD heard it
        self._unfed.clear()
        self._heard = False
        self._drop_early()
        self._drop_stream()
        if self.vad is not None:
            self.vad.reset()

    # -- early transcription -----------------------------------------------------------------------
    def _maybe_transcribe_early(self, vad: VoiceActivity) -> None:
        """Start transcribing the speech so far once a silence inside it has lasted a moment; drop a
        transcription whose silence ended (the speaker went on)."""
        config = self._early_config
        if config is None:
            return
        detector = vad.detector
        silence = detector.silence_since_ms
        if self._early is not None and self._early.silence_ms != silence:
            self._drop_early()
        if (
            silence is None
            or not self._heard
            or self._early is not None
            or detector.clock_ms - silence < config.after_ms
        ):
            return
        pcm = self.audio.peek(self._position(self._start_ms), self._position(silence + config.tail_ms))
        transcript = config.transcribe(pcm, prefix=self._heard_text or None, partial=False)
        self._early = _Early(silence, spawn(transcript, "early transcription"))

    def _take_early(self) -> asyncio.Task[Sequence[str] | None] | None:
        """The transcription of the turn that just stopped (its silence is the one that ended it)."""
        early, self._early = self._early, None
        return early.task if early is not None else None

    def _drop_early(self) -> None:
        early, self._early = self._early, None
        if early is not None and not early.task.done():
            early.task.cancel()  # the transcriber's engine stream closes, which aborts its request

    # -- streaming -----------------------------------------------------------------------------------
    def _maybe_stream(self, vad: VoiceActivity) -> None:
        """While the person speaks, transcribe the speech so far every ``stream_ms`` of audio, one
        hypothesis at a time (an early transcription, at a silence, does the rest)."""
        config = self._early_config
        clock = vad.detector.clock_ms
        if (
            config is None
            or config.stream_ms <= 0
            or not self._heard
            or self._early is not None
            or self._partial is not None
            or clock - self._partial_ms < config.stream_ms
        ):
            return
        self._partial_ms = clock
        pcm = self.audio.peek(self._position(self._start_ms), self._position(clock))
        self._partial = spawn(config.transcribe(pcm, prefix=None, partial=True), "streaming transcription")

    def _take_partial(self) -> Heard | None:
        """A finished hypothesis: what it and the one before agree on beyond what was handed out."""
        task = self._partial
        if task is None or not task.done():
            return None
        self._partial = None
        pieces = None if task.cancelled() or task.exception() is not None else task.result()
        if pieces is None:
            return None
        words = "".join(pieces).split()
        stable, self._hypothesis = agreed(self._hypothesis, words), words
        given = self._heard_text.split()
        if len(stable) <= len(given) or stable[: len(given)] != given:
            return None
        text = " ".join(stable)
        delta, self._heard_text = text[len(self._heard_text) :], text
        return Heard(delta)

    def _drop_stream(self) -> None:
        partial, self._partial = self._partial, None
        if partial is not None and not partial.done():
            partial.cancel()
        self._heard_text = ""
        self._hypothesis = []
