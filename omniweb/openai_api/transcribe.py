"""The ``audio.transcribe`` pipeline: Whisper on the engine runtime, one segment per step.

Request (built by the transcription view; plain JSON values and bytes, so it also travels to
workers)::

    {"pipeline": "audio.transcribe", "audio": bytes (PCM16 LE 16 kHz mono), "prompt": str | None,
     "temperature": float, "words": bool}

Chunks: one ``{"type": "segment", "segment": {...}, "words": [...]}`` per decoded segment, in
order (OpenAI's verbose_json segment fields; words only when asked for), then the scheduler's
``end`` with ``duration`` (seconds of audio). faster-whisper decodes lazily, 30 s windows, so a
long recording never holds a worker for its whole length and an abort takes effect between two
segments.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from omniweb.engine.contracts import DONE, Done, ShapeSignature, StepResult, Waiting, WorkPlan
from video.asr import SAMPLE_RATE, SILENCE_RMS, Transcriber, pcm16_to_float, shared_transcriber

PIPELINE = "audio.transcribe"
SEGMENT_SECONDS = 30.0  # Whisper's window: the most audio one step decodes


@dataclass
class TranscribeState:
    audio: np.ndarray
    prompt: str | None
    temperature: float
    words: bool
    segments: Iterator[Any] | None = None
    started: bool = False
    done: bool = False
    count: int = 0


def _segment_fields(segment: Any, index: int) -> dict[str, Any]:
    return {
        "id": index,
        "seek": int(segment.seek),
        "start": round(float(segment.start), 3),
        "end": round(float(segment.end), 3),
        "text": segment.text,
        "tokens": [int(t) for t in segment.tokens],
        "temperature": float(segment.temperature or 0.0),
        "avg_logprob": float(segment.avg_logprob),
        "compression_ratio": float(segment.compression_ratio),
        "no_speech_prob": float(segment.no_speech_prob),
    }


def _word_fields(segment: Any) -> list[dict[str, Any]]:
    return [
        {"word": w.word.strip(), "start": round(float(w.start), 3), "end": round(float(w.end), 3)}
        for w in segment.words or []
    ]


class TranscribeLoop:
    name = "transcriber"

    def __init__(self, transcriber: Transcriber) -> None:
        self._transcriber = transcriber

    def init(self, request: dict[str, Any], slots: dict[str, Any]) -> TranscribeState:
        audio = pcm16_to_float(request["audio"])
        state = TranscribeState(
            audio=audio,
            prompt=request.get("prompt"),
            temperature=float(request.get("temperature") or 0.0),
            words=bool(request.get("words")),
        )
        # Silence or a blip holds no speech: Whisper would invent words, so nothing is decoded.
        if audio.size < SAMPLE_RATE // 10 or float(np.sqrt(np.mean(audio**2))) < SILENCE_RMS:
            state.done = True
        return state

    def next(self, state: TranscribeState) -> WorkPlan | Done | Waiting:
        if state.done:
            return DONE
        transcriber = self._transcriber
        segments = state.segments
        index = state.count

        def run() -> StepResult:
            it = segments
            if it is None:  # the first step computes the features; every step decodes one segment
                it, _info = transcriber.segments(
                    state.audio, prompt=state.prompt, temperature=state.temperature, word_timestamps=state.words
                )
            segment = next(it, None)
            if segment is None:
                return StepResult(output=(it, True))
            chunk = {"type": "segment", "segment": _segment_fields(segment, index)}
            if state.words:
                chunk["words"] = _word_fields(segment)
            return StepResult(output=(it, False), chunks=[chunk])

        return WorkPlan(
            kind="asr",
            shape=ShapeSignature("asr.transcribe"),
            run=run,
            label="transcriber.segment",
            long=True,  # one 30 s window of Whisper: a playing stream keeps a worker
        )

    def advance(self, state: TranscribeState, result: StepResult) -> None:
        state.segments, state.done = result.output
        if not state.done:
            state.count += 1

    def finalize(self, state: TranscribeState) -> dict[str, Any]:
        return {"duration": state.audio.size / SAMPLE_RATE, "segments": state.count}


class TranscribePipeline:
    """``{"pipeline": "audio.transcribe", ...}``: the process's shared Whisper model."""

    name = PIPELINE

    def __init__(self) -> None:
        self.loops = (TranscribeLoop(shared_transcriber()),)

    def validate(self, request: dict[str, Any]) -> None:
        if not isinstance(request.get("audio"), bytes):
            raise ValueError("audio must be PCM16 bytes")
        prompt = request.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError("prompt must be a string")
        temperature = request.get("temperature", 0.0)
        if not isinstance(temperature, int | float) or not 0.0 <= temperature <= 1.0:
            raise ValueError("temperature must be a number between 0 and 1")

    def finish(self, finals: list[dict[str, Any]]) -> dict[str, Any]:
        return finals[0]
