"""Server voice-activity detection: when a speaker starts and stops, with OpenAI's ``server_vad`` semantics.

Two parts. ``TurnDetector`` is pure: it turns speech probabilities (one per window) into
``SpeechStarted`` / ``SpeechStopped`` events with hysteresis, so it is testable without a model.
``VoiceActivity`` is the session-side helper: it resamples the client's PCM16 to 16 kHz, sends
whole 32 ms windows to the engine's ``audio.vad`` pipeline (``omniweb.asr.vad_engine``; the model never
loads in the web process) and carries the model's streaming state between calls, so in Redis mode
any worker serves any call.

Times are milliseconds of input audio since the stream began, as OpenAI reports them:
``audio_start_ms`` is where speech was first detected minus ``prefix_padding_ms`` (not before 0);
``audio_end_ms`` is where the stop was decided, i.e. the end of speech plus ``silence_duration_ms``
(rounded up to a whole window), which is also the end of the audio the turn should use.

``SemanticVoiceActivity`` is OpenAI's ``semantic_vad``: the same VAD finds speech and pauses, and
at each pause an end-of-turn model (Smart Turn, the engine's ``audio.turn`` pipeline,
``omniweb.asr.turn_engine``) decides whether the speaker has finished. Finished: the turn stops
``CHECK_MS`` into the pause; not: the turn goes on until the speaker pauses again (checked again)
or the silence reaches the eagerness' maximum wait (OpenAI's 8 / 4 / 2 s for low / medium / high).
Its events and times are ``server_vad``'s; ``audio_end_ms`` is where the stop was decided.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import av

from omniweb.base.errors import EngineError, ErrorKind
from omniweb.engine.client import EngineClient
from omniweb.engine.messages import End, TurnProbabilities, VoiceProbabilities
from omniweb.engine.requests import EndOfTurnRequest, VadRequest
from omniweb.media.pcm import frames_pcm16, pcm16_frame

logger = logging.getLogger(__name__)

SAMPLE_RATES = (16_000, 24_000)  # the video protocol's audio.chunk, the Realtime API's audio/pcm
NEG_THRESHOLD_GAP = 0.15  # Silero's hysteresis: in speech, only probabilities this far below the threshold are silence
MIN_NEG_THRESHOLD = 0.01
# Speech must hold this long (above threshold - 0.15) before it starts a turn: a click, a knock or a
# beep makes one confident window (Chromium's fake microphone beeps reach 0.67), a word makes many.
MIN_SPEECH_MS = 64
# semantic_vad: the end-of-turn model scores the turn ending at the pause's start plus each of these.
# Its score swings by tens of points between ends 32 ms apart (measured on our voice), so one pause
# gets two windows, in one model call, and the turn ends only when both say complete (on 26 paused
# questions in our voice, a third window at 128 ms changed no decision and cost 50 % more).
TURN_TAILS_MS = (0, 64)
# A pause is judged once it has lasted this long: shorter silences fall inside speech (a stop
# consonant's closure, "the quick| brown": 100-150 ms in our voice), and the model, shown the turn
# cut there, called "the quick" complete. pipecat runs Smart Turn after 200 ms of silence too.
MIN_PAUSE_MS = 200
CHECK_MS = max(MIN_PAUSE_MS, *TURN_TAILS_MS)  # the check runs this far into the pause
BYTES_PER_MS = 2 * VadRequest.SAMPLE_RATE // 1000


@dataclass(frozen=True)
class VadParams:
    """OpenAI's ``server_vad`` fields and their defaults."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int  # ms of input audio since the stream began (prefix padding applied)


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int


VadEvent = SpeechStarted | SpeechStopped

Eagerness = Literal["low", "medium", "high", "auto"]


@dataclass(frozen=True)
class TurnEagerness:
    """How sure the end-of-turn model must be, and how long a pause may last before the turn ends
    anyway (OpenAI's documented maximum waits; the thresholds are ours)."""

    threshold: float  # P(complete) at or above which a pause ends the turn
    max_wait_ms: int


EAGERNESS: dict[str, TurnEagerness] = {
    "low": TurnEagerness(threshold=0.85, max_wait_ms=8000),
    "medium": TurnEagerness(threshold=0.7, max_wait_ms=4000),
    "high": TurnEagerness(threshold=0.5, max_wait_ms=2000),
    "auto": TurnEagerness(threshold=0.7, max_wait_ms=4000),  # OpenAI: auto is medium
}


class TurnDetector:
    """Hysteresis over speech probabilities.

    Silent, a window at or above ``threshold`` starts speech once the windows from it on stay at
    or above ``threshold - 0.15`` for ``min_speech_ms`` (the start is that first window's). Speaking, a window below
    ``threshold - 0.15`` (Silero's own hysteresis) starts a silence, one at or above ``threshold``
    ends it, one between leaves it running; the silence becomes a stop on a quiet window once it
    has lasted ``silence_duration_ms``. So a short pause inside a sentence never ends the turn.
    """

    def __init__(self, params: VadParams, min_speech_ms: float = MIN_SPEECH_MS) -> None:
        self.params = params
        self.min_speech_ms = min_speech_ms
        self._neg = max(params.threshold - NEG_THRESHOLD_GAP, MIN_NEG_THRESHOLD)
        self._clock = 0.0  # ms of input audio at the start of the next window
        self.speaking = False
        self._onset: float | None = None  # where speech may have started (not yet long enough)
        self._silence_from: float | None = None

    @property
    def silence_since_ms(self) -> float | None:
        """While speaking: where the silence that may end the turn began (None if the speaker goes on)."""
        return self._silence_from if self.speaking else None

    @property
    def clock_ms(self) -> float:
        """Milliseconds of input audio the detector has seen (or skipped) so far."""
        return self._clock

    def push(self, probs: Sequence[float], window_ms: float) -> list[SpeechStarted | SpeechStopped]:
        """The events the next windows' probabilities produce, in order."""
        events: list[SpeechStarted | SpeechStopped] = []
        for p in probs:
            start, end = self._clock, self._clock + window_ms
            if not self.speaking:
                if self._onset is None and p >= self.params.threshold:
                    self._onset = start
                elif self._onset is not None and p < self._neg:
                    self._onset = None  # too short to be speech
                if self._onset is not None and end - self._onset >= self.min_speech_ms:
                    self.speaking = True
                    self._silence_from = None
                    padded = max(0, round(self._onset - self.params.prefix_padding_ms))
                    self._onset = None
                    events.append(SpeechStarted(audio_start_ms=padded))
            elif p >= self.params.threshold:
                self._silence_from = None
            elif p < self._neg:
                if self._silence_from is None:
                    self._silence_from = start
                if end - self._silence_from >= self.params.silence_duration_ms:
                    self.speaking = False
                    self._silence_from = None
                    events.append(SpeechStopped(audio_end_ms=round(end)))
            self._clock = end
        return events

    def stop(self) -> SpeechStopped:
        """End the speech in progress now (an end-of-turn model decided it has ended)."""
        self.speaking = False
        self._silence_from = None
        return SpeechStopped(audio_end_ms=round(self._clock))

    def reset(self, clock_ms: float | None = None) -> None:
        """Forget any speech in progress (no event); ``clock_ms`` moves the clock (skipped audio)."""
        self.speaking = False
        self._onset = None
        self._silence_from = None
        if clock_ms is not None:
            self._clock = clock_ms


class VoiceActivity:
    """One per session: feeds PCM16 mono audio to the engine's "audio.vad" pipeline (the model never
    loads in the web process) and turns the speech probabilities into events with TurnDetector."""

    def __init__(self, engine: EngineClient, params: VadParams, sample_rate: int = 16000) -> None:
        if sample_rate not in SAMPLE_RATES:
            raise ValueError(f"sample_rate must be one of {SAMPLE_RATES}, not {sample_rate}")
        self._engine = engine
        self.params = params
        self.sample_rate = sample_rate
        self.detector = TurnDetector(params)
        self._resampler = _Resampler(sample_rate) if sample_rate != VadRequest.SAMPLE_RATE else None
        self._odd = b""  # a trailing odd byte, completed by the next feed
        self._pending = bytearray()  # 16 kHz PCM16 not yet a whole window
        self._sent = 0  # 16 kHz samples handed to the engine (or skipped by reset)
        self._state: bytes | None = None
        self._epoch = 0  # bumped by reset: a call in flight then is ignored
        self._lock = asyncio.Lock()  # calls run one after another: each needs the previous state

    @property
    def speaking(self) -> bool:
        return self.detector.speaking

    async def feed(self, pcm16: bytes) -> list[SpeechStarted | SpeechStopped]:
        """The events the audio produces; the rest of a partial window waits for the next feed.

        Raises ``EngineError`` (with the engine's kind: capacity, unreachable, …) when the engine
        refuses or fails a call; those windows are skipped (the clock still counts them).
        """
        data = self._odd + pcm16
        self._odd = data[len(data) - len(data) % 2 :]
        data = data[: len(data) - len(self._odd)]
        self._pending += self._resampler.push(data) if self._resampler is not None else data
        events: list[SpeechStarted | SpeechStopped] = []
        async with self._lock:
            while len(self._pending) >= VadRequest.WINDOW_BYTES:
                size = (
                    min(len(self._pending) // VadRequest.WINDOW_BYTES, VadRequest.MAX_WINDOWS) * VadRequest.WINDOW_BYTES
                )
                pcm = bytes(self._pending[:size])
                del self._pending[:size]
                self._sent += size // 2
                epoch = self._epoch
                probs, window_ms, state = await self._run(pcm)
                if epoch != self._epoch:  # reset while the call ran: its windows belong to the old turn
                    continue
                self._state = state
                events += await self._detect(pcm, probs, window_ms, epoch)
        return events

    async def _detect(self, pcm: bytes, probs: Sequence[float], window_ms: float, epoch: int) -> list[VadEvent]:
        """The events of one call's windows (``pcm``: their 16 kHz audio)."""
        return self.detector.push(probs, window_ms)

    def reset(self) -> None:
        """Start afresh (after input_audio_buffer.clear / commit); the clock keeps running."""
        self._sent += len(self._pending) // 2
        self._pending.clear()
        self._state = None
        self._epoch += 1
        self.detector.reset(clock_ms=1000.0 * self._sent / VadRequest.SAMPLE_RATE)

    async def _run(self, pcm: bytes) -> tuple[list[float], float, bytes]:
        probs: list[float] | None = None
        window_ms, state = VadRequest.WINDOW_MS, b""
        async for chunk in self._engine.stream(VadRequest(pcm=pcm, state=self._state)):
            if isinstance(chunk, VoiceProbabilities):
                probs, window_ms, state = list(chunk.probs), chunk.window_ms, chunk.state
            elif isinstance(chunk, End) and not chunk.ok:
                message = chunk.message or "voice activity detection failed"
                raise EngineError(chunk.error_kind(), message, client_message=message)
        if probs is None:
            raise EngineError(ErrorKind.ENGINE, "the engine returned no speech probabilities")
        return probs, window_ms, state


class SemanticVoiceActivity(VoiceActivity):
    """``semantic_vad``: VoiceActivity whose pauses end the turn when the end-of-turn model (the
    engine's "audio.turn" pipeline) says the speaker has finished; see the module docstring."""

    def __init__(self, engine: EngineClient, eagerness: Eagerness = "auto", sample_rate: int = 16000) -> None:
        self.eagerness = EAGERNESS[eagerness]
        super().__init__(engine, VadParams(silence_duration_ms=self.eagerness.max_wait_ms), sample_rate)
        self._recent = bytearray()  # the last ``_keep`` bytes of 16 kHz audio the detector has had
        self._recent_end_ms = 0.0  # where that audio ends on the detector's clock
        self._keep = (EndOfTurnRequest.WINDOW_SECONDS * 1000 + 2 * CHECK_MS) * BYTES_PER_MS
        self._turn_start_ms = 0.0
        self._checked: float | None = None  # the pause already checked (where its silence began)

    def reset(self) -> None:
        super().reset()
        self._recent.clear()
        self._checked = None

    async def _detect(self, pcm: bytes, probs: Sequence[float], window_ms: float, epoch: int) -> list[VadEvent]:
        """Window by window, so that a pause is checked where it is, however the audio was split."""
        detector = self.detector
        self._recent_end_ms = detector.clock_ms + 1000.0 * len(pcm) / 2 / VadRequest.SAMPLE_RATE
        self._recent += pcm
        del self._recent[: max(0, len(self._recent) - self._keep)]
        events: list[VadEvent] = []
        for p in probs:
            for event in detector.push((p,), window_ms):
                if isinstance(event, SpeechStarted):
                    self._turn_start_ms = event.audio_start_ms
                events.append(event)
            silence = detector.silence_since_ms
            if silence is None or silence == self._checked or detector.clock_ms - silence < CHECK_MS:
                continue
            self._checked = silence
            complete = await self._complete(silence)
            if epoch != self._epoch:  # reset while the model ran: this turn is gone
                return []
            if complete and detector.speaking:
                events.append(detector.stop())
        return events

    async def _complete(self, silence_ms: float) -> bool:
        """Whether the speaker has finished at the pause that began at ``silence_ms``. When the model
        cannot run, the pause is taken as not final: the turn then ends at the maximum wait."""
        windows = [self._audio(silence_ms + tail) for tail in TURN_TAILS_MS]
        try:
            probs = await self._score(windows)
        except EngineError as exc:
            logger.warning("end-of-turn model failed (the turn ends at the maximum wait): %s", exc)
            return False
        return min(probs) >= self.eagerness.threshold

    def _audio(self, end_ms: float) -> bytes:
        """The turn's audio up to ``end_ms`` (at most the model's 8 s)."""
        start_ms = max(self._turn_start_ms, end_ms - EndOfTurnRequest.WINDOW_SECONDS * 1000)
        end = len(self._recent) - round(self._recent_end_ms - end_ms) * BYTES_PER_MS
        start = max(0, len(self._recent) - round(self._recent_end_ms - start_ms) * BYTES_PER_MS)
        return bytes(self._recent[start:end])

    async def _score(self, windows: list[bytes]) -> list[float]:
        probs: list[float] | None = None
        async for chunk in self._engine.stream(EndOfTurnRequest(windows=tuple(windows))):
            if isinstance(chunk, TurnProbabilities):
                probs = [float(p) for p in chunk.probs]
            elif isinstance(chunk, End) and not chunk.ok:
                message = chunk.message or "end-of-turn detection failed"
                raise EngineError(chunk.error_kind(), message, client_message=message)
        if probs is None or len(probs) != len(windows):
            raise EngineError(ErrorKind.ENGINE, "the engine returned no end-of-turn probabilities")
        return probs


class _Resampler:
    """A streaming resampler to 16 kHz (FFmpeg's, through PyAV): no clicks at chunk edges."""

    def __init__(self, rate: int) -> None:
        self._rate = rate
        self._av = av.AudioResampler(format="s16", layout="mono", rate=VadRequest.SAMPLE_RATE)

    def push(self, pcm: bytes) -> bytes:
        if not pcm:
            return b""
        return frames_pcm16(self._av.resample(pcm16_frame(pcm, self._rate)))
