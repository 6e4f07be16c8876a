"""An answer's chunks on its timeline, and the turn's end as the conversation reports it.

The engine's chunks are typed where they are made (``omniweb.engine.messages``); this module adds
what a conversation needs on top. ``ChunkParser`` reads one answer's chunks in order and is stateful
only for its audio timeline: the talker times each sentence's words from its own durations
(``speech.tts.text.align_words``, the same timings the speech endpoint sends), relative to that
sentence; the parser moves them onto the answer's timeline (ms since the answer's first audio
sample) and hands each word out with the audio chunk in which it starts, so a client can cut an
answer to exactly the words it heard. ``TurnEnd`` is the engine's ``End`` plus the turn's usage.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from omniweb.base.errors import ErrorKind
from omniweb.engine.messages import (
    PCM16_BYTES,
    Chunk,
    CodecCodes,
    End,
    PcmAudio,
    SentenceEnd,
    SentenceStart,
    Status,
    TextDelta,
    TextEnd,
    ToolCall,
    Transcript,
    WordTiming,
)

__all__ = [
    "AudioChunk",
    "ChunkParser",
    "CodecCodes",
    "EngineChunk",
    "SentenceEnd",
    "SentenceStart",
    "TextDelta",
    "TextEnd",
    "ToolCall",
    "Transcript",
    "TurnEnd",
    "Usage",
    "WordTiming",
    "parse_chunk",
    "parse_end",
]

OUTPUT_SAMPLE_RATE = 24000  # the talker's PCM16 mono rate


@dataclass(frozen=True)
class AudioChunk:
    """One ``PcmAudio`` placed on the answer's timeline; ``words``: the words that start within it
    (may be empty). A chunk with empty ``pcm`` only carries words the talker timed past its
    sentence's last sample."""

    pcm: bytes
    words: tuple[WordTiming, ...] = ()
    start_ms: float = 0.0  # where ``pcm`` begins on the answer's audio timeline
    sample_rate: int = OUTPUT_SAMPLE_RATE

    @property
    def seconds(self) -> float:
        return len(self.pcm) / PCM16_BYTES / self.sample_rate


@dataclass(frozen=True)
class Usage:
    """Token counts of a turn, counted by ``usage.py``'s one rule (the language model's own text
    counts where one answered; otherwise words and punctuation marks, audio by duration, images by
    32x32-pixel patches)."""

    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    input_image_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0

    @property
    def input_tokens(self) -> int:
        return self.input_text_tokens + self.input_audio_tokens + self.input_image_tokens

    @property
    def output_tokens(self) -> int:
        return self.output_text_tokens + self.output_audio_tokens

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class TurnEnd:
    """The request's last chunk. A failure has a ``kind`` and, from the engine, a client-safe
    ``message`` (None: the adapter says it in its own words). ``text``: the whole answer
    (the turn runner fills it in from the deltas when the engine sent none; after a failure, what
    was streamed); ``usage`` is filled in by the turn runner."""

    status: Status
    kind: ErrorKind | None = None
    message: str | None = None
    text: str | None = None
    transcript: str | None = None
    usage: Usage | None = None
    rng_state: str | None = None  # a speech request's noise generator, where the next request resumes it
    retry_after: float | None = None  # refused at capacity: load shedding's estimate of when a retry may be admitted
    prompt_tokens: int | None = None  # the language model's own counts, when one answered
    completion_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


EngineChunk = (
    Transcript | TextDelta | ToolCall | TextEnd | SentenceStart | AudioChunk | SentenceEnd | CodecCodes | TurnEnd
)


def parse_end(end: End) -> TurnEnd:
    """The engine's ``End`` as the conversation reports it (usage filled in by the turn runner)."""
    return TurnEnd(
        status=end.status,
        kind=None if end.ok else end.error_kind(),
        message=end.message or None,
        text=end.text,
        transcript=end.transcript,
        rng_state=end.rng_state,
        retry_after=end.retry_after,
        prompt_tokens=end.prompt_tokens,
        completion_tokens=end.completion_tokens,
    )


def parse_chunk(chunk: Chunk) -> EngineChunk | None:
    """One engine chunk as a conversation sees it (None: a kind no conversation uses). Word timings
    stay relative to their sentence; ``AudioChunk.start_ms`` is 0 (``ChunkParser`` places both)."""
    if isinstance(chunk, End):
        return parse_end(chunk)
    if isinstance(chunk, PcmAudio):
        return AudioChunk(chunk.pcm, sample_rate=chunk.sample_rate)
    if isinstance(chunk, Transcript | TextDelta | ToolCall | TextEnd | SentenceStart | SentenceEnd | CodecCodes):
        return chunk
    return None


class ChunkParser:
    """One engine request's chunks in order → typed chunks (``feed`` returns zero or more)."""

    def __init__(self) -> None:
        self.audio_ms = 0.0  # the answer's audio so far
        self._words: deque[WordTiming] = deque()  # this sentence's words not yet handed out

    def feed(self, chunk: Chunk) -> list[EngineChunk]:
        return list(self._parse(chunk))

    def _parse(self, raw: Chunk) -> Iterator[EngineChunk]:
        chunk = parse_chunk(raw)
        if isinstance(chunk, SentenceStart):
            offset = self.audio_ms
            self._words.extend(
                WordTiming(w.word, round(offset + w.start_ms), round(offset + w.end_ms)) for w in chunk.words
            )
        elif isinstance(chunk, AudioChunk):
            start = self.audio_ms
            self.audio_ms += chunk.seconds * 1000.0
            chunk = AudioChunk(chunk.pcm, self._words_before(self.audio_ms), start, chunk.sample_rate)
        elif isinstance(chunk, SentenceEnd) and self._words:
            yield AudioChunk(b"", tuple(self._words), self.audio_ms)
            self._words.clear()
        if chunk is not None:
            yield chunk

    def _words_before(self, end_ms: float) -> tuple[WordTiming, ...]:
        out = []
        while self._words and self._words[0].start_ms < end_ms:
            out.append(self._words.popleft())
        return tuple(out)
