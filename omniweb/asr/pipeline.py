"""Speech recognition on the engine's scheduler: every transcription is driven steps.

A ``Recognition`` (one recording) takes three kinds of step, each a ``WorkPlan`` the scheduler
orders, batches across requests and can stop between: ``asr.prepare`` (Silero VAD cuts the
recording into ≤ 30 s windows of speech), then per window ``asr.encode`` (one encoder call for all
the batch's windows of one context length) and ``asr.decode`` (one ``generate`` for all the
batch's encoded windows with the same decoding options). Whoever transcribes (the transcription
API, a video question, the realtime input and its streaming partials) goes through a
``Recognizer``, so their windows batch with each other; no lock is held anywhere: CTranslate2
takes concurrent calls.

The ``audio.transcribe`` pipeline serves ``TranscribeRequest`` (built by the transcription view
and the conversation core's ``segment_texts``): PCM16 LE 16 kHz mono audio, a prompt, a
temperature, words and segment times when asked for, and a ``prefix`` (text the transcript is made
to start with: what streaming already committed, so only the rest is decoded). Chunks: one
``Segment`` per decoded segment, in order (OpenAI's verbose_json segment fields; words only when
asked for), then the scheduler's ``End`` with ``duration`` (seconds of audio) and ``segments``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omniweb.engine.contracts import DONE, Done, ShapeSignature, StepResult, WorkPlan
from omniweb.engine.messages import End
from omniweb.engine.messages import Segment as SegmentChunk
from omniweb.engine.requests import TRANSCRIBE, EngineRequest, TranscribeRequest, expect

from .whisper import (
    MIN_CONTEXT_FRAMES,
    SAMPLE_RATE,
    Options,
    Segment,
    Whisper,
    Window,
    holds_speech,
    pcm16_to_float,
    restore_times,
    shared_whisper,
)

PIPELINE = TRANSCRIBE
LONG_PREPARE_SECONDS = 60.0  # Silero VAD over more audio than this holds a worker for a while


@dataclass
class Recognition:
    """One recording being transcribed: its windows, and the segments decoded so far."""

    audio: np.ndarray
    options: Options
    windows: list[Window] | None = None  # None: not cut into windows yet
    chunks: list[dict[str, int]] = field(default_factory=list)  # its speech, on the recording's timeline
    index: int = 0  # the window being decoded
    segments: list[Segment] = field(default_factory=list)
    done: bool = False

    @property
    def text(self) -> str:
        return " ".join(t for t in (s.text.strip() for s in self.segments) if t)


@dataclass(frozen=True)
class _Decode:
    window: Window
    prompt: list[int]
    options: Options
    chunks: list[dict[str, int]]


class Recognizer:
    """Plans a ``Recognition``'s steps on the shared Whisper and folds their results back in.

    ``plan`` and ``advance`` are cheap (the scheduler's lock is held); the model runs in the plans.
    """

    def __init__(self, whisper: Whisper) -> None:
        self.whisper = whisper

    def start(self, audio: np.ndarray | bytes, options: Options) -> Recognition:
        samples = pcm16_to_float(audio) if isinstance(audio, bytes) else audio
        return Recognition(audio=samples, options=options, done=not holds_speech(samples))

    def plan(self, rec: Recognition, label: str = "asr") -> WorkPlan | Done:
        if rec.done:
            return DONE
        if rec.windows is None:
            return self._prepare_plan(rec, label)
        window = rec.windows[rec.index]
        if window.encoded is None:
            return self._encode_plan(window, label)
        return self._decode_plan(rec, window, label)

    def advance(self, rec: Recognition, result: StepResult) -> list[Segment]:
        """Fold a step's output in; the segments it completed, in order."""
        kind, value = result.output
        if kind == "prepared":
            rec.windows, rec.chunks = value
            rec.done = not rec.windows
            return []
        assert rec.windows is not None
        window = rec.windows[rec.index]
        if kind == "encoded":
            window.encoded = value
            return []
        window.encoded = None  # decoded: its encoder output is no longer needed
        rec.index += 1
        rec.done = rec.index >= len(rec.windows)
        rec.segments += value
        return list(value)

    def run(self, rec: Recognition) -> Recognition:
        """Every step here, one after another (the warm-up, tests and benches; the engine steps it)."""
        while not isinstance(plan := self.plan(rec), Done):
            self.advance(rec, plan.run())
        return rec

    # -- plans -------------------------------------------------------------------------------------
    def _prepare_plan(self, rec: Recognition, label: str) -> WorkPlan:
        audio, whisper = rec.audio, self.whisper
        return WorkPlan(
            kind="asr",
            shape=ShapeSignature("asr.prepare"),
            run=lambda: StepResult(output=("prepared", whisper.split(audio))),
            label=f"{label}.prepare",
            long=audio.size > LONG_PREPARE_SECONDS * SAMPLE_RATE,
        )

    def _encode_plan(self, window: Window, label: str) -> WorkPlan:
        return WorkPlan(
            kind="asr",
            shape=ShapeSignature("asr.encode", (window.frames,)),
            run=lambda: self._encode([window])[0],
            payload=window,
            # On the CPU a batched encode costs more per window than one at a time (measured, 10 s
            # windows: 48 ms alone, 58 ms each in fours, 74 ms in sixteens), while a batched decode
            # costs less (57, 32, 20 ms): the CPU encodes alone and batches decodes; CUDA batches both.
            batch_run=self._encode_batch if self.whisper.device == "cuda" else None,
            label=f"{label}.encode",
            long=window.frames > MIN_CONTEXT_FRAMES,
        )

    def _decode_plan(self, rec: Recognition, window: Window, label: str) -> WorkPlan:
        options = rec.options
        if rec.index > 0 and options.prefix:  # the prefix is where the recording starts
            options = Options(options.timestamps, options.words, options.temperature, options.prompt)
        work = _Decode(window, self.whisper.prompt(options), options, rec.chunks)
        timestamps, temperature = options.batch_key
        return WorkPlan(
            kind="asr",
            shape=ShapeSignature("asr.decode", (window.frames, int(timestamps), round(temperature * 100))),
            run=lambda: self._decode([work])[0],
            payload=work,
            batch_run=self._decode_batch,
            label=f"{label}.decode",
            long=window.frames > MIN_CONTEXT_FRAMES,
        )

    # -- the batched model calls -------------------------------------------------------------------
    def _encode_batch(self, plans: Sequence[WorkPlan]) -> list[StepResult]:
        return self._encode([p.payload for p in plans])

    def _encode(self, windows: Sequence[Window]) -> list[StepResult]:
        whisper = self.whisper
        out = whisper.encode([whisper.features(w) for w in windows])
        return [StepResult(output=("encoded", encoded)) for encoded in out]

    def _decode_batch(self, plans: Sequence[WorkPlan]) -> list[StepResult]:
        return self._decode([p.payload for p in plans])

    def _decode(self, works: Sequence[_Decode]) -> list[StepResult]:
        whisper = self.whisper
        encoded = []
        for w in works:
            assert w.window.encoded is not None
            encoded.append(w.window.encoded)
        decoded = whisper.decode(encoded, [w.prompt for w in works], works[0].options)
        results = []
        for w, d in zip(works, decoded, strict=True):
            segments = whisper.segments(w.window, d, w.options)
            restore_times(segments, w.chunks)
            results.append(StepResult(output=("decoded", segments)))
        return results


def segment_fields(segment: Segment, index: int) -> dict[str, Any]:
    """OpenAI's verbose_json segment."""
    return {
        "id": index,
        "seek": segment.seek,
        "start": round(segment.start, 3),
        "end": round(segment.end, 3),
        "text": segment.text,
        "tokens": [int(t) for t in segment.tokens],
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def word_fields(segment: Segment) -> list[dict[str, Any]]:
    return [
        {"word": w["word"].strip(), "start": round(w["start"], 3), "end": round(w["end"], 3)} for w in segment.words
    ]


@dataclass
class TranscribeState:
    recognition: Recognition
    count: int = 0


class TranscribeLoop:
    name = "transcriber"

    def __init__(self, recognizer: Recognizer) -> None:
        self._recognizer = recognizer

    def init(self, request: TranscribeRequest, slots: dict[str, Any]) -> TranscribeState:
        options = Options(
            timestamps=request.timestamps,
            words=request.words,
            temperature=float(request.temperature),
            prompt=request.prompt or None,
            prefix=request.prefix or None,
        )
        return TranscribeState(self._recognizer.start(request.audio, options))

    def next(self, state: TranscribeState) -> WorkPlan | Done:
        return self._recognizer.plan(state.recognition, "transcriber")

    def advance(self, state: TranscribeState, result: StepResult) -> None:
        for segment in self._recognizer.advance(state.recognition, result):
            words = tuple(word_fields(segment)) if state.recognition.options.words else None
            result.chunks.append(SegmentChunk(segment.text, segment_fields(segment, state.count), words))
            state.count += 1

    def finalize(self, state: TranscribeState) -> dict[str, Any]:
        return {"duration": state.recognition.audio.size / SAMPLE_RATE, "segments": state.count}


class TranscribePipeline:
    """``TranscribeRequest``s on the process's shared Whisper."""

    name = PIPELINE

    def __init__(self) -> None:
        self.loops = (TranscribeLoop(shared_recognizer()),)

    def validate(self, request: EngineRequest) -> None:
        temperature = expect(request, TranscribeRequest).temperature
        if not isinstance(temperature, int | float) or not 0.0 <= temperature <= 1.0:
            raise ValueError("temperature must be a number between 0 and 1")

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End(duration=finals[0]["duration"], segments=finals[0]["segments"])


_recognizer: Recognizer | None = None


def shared_recognizer() -> Recognizer:
    """One recognizer per engine process (its batch functions are what lets plans batch)."""
    global _recognizer
    if _recognizer is None:
        _recognizer = Recognizer(shared_whisper())
    return _recognizer
