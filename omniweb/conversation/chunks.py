"""Typed engine chunks: the engine's wire dicts become dataclasses here, and nowhere else.

The engine's chunks travel as plain dicts (they cross to Redis workers); a consumer should not
switch on string kinds. ``ChunkParser`` reads one request's chunks in order and yields these types.
It is stateful only for the answer's audio timeline: the talker times each sentence's words from its
own durations (``speech.text.align_words``, the same timings the speech endpoint sends), relative
to that sentence; the parser moves them onto the answer's timeline (ms since the answer's first
audio sample) and hands each word out with the audio chunk in which it starts, so a client can cut
an answer to exactly the words it heard.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from omniweb.errors import ErrorKind, end_kind

OUTPUT_SAMPLE_RATE = 24000  # the talker's PCM16 mono rate
BYTES_PER_MS = OUTPUT_SAMPLE_RATE * 2 // 1000  # 48


@dataclass(frozen=True)
class WordTiming:
    """One spoken word, in ms since the start of the answer's audio."""

    word: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class Transcript:
    """What the input audio said (only when the question came from audio; before any text)."""

    text: str


@dataclass(frozen=True)
class TextDelta:
    delta: str


@dataclass(frozen=True)
class TextEnd:
    """The answer's text is complete (its audio may still follow)."""


@dataclass(frozen=True)
class SentenceStart:
    """The talker starts speaking sentence ``index`` (its words come with the audio chunks)."""

    index: int
    text: str


@dataclass(frozen=True)
class AudioChunk:
    """PCM16 24 kHz mono; ``words``: the words that start within this chunk (may be empty).

    A chunk with empty ``pcm`` only carries words the talker timed past its sentence's last sample.
    """

    pcm: bytes
    words: tuple[WordTiming, ...] = ()
    start_ms: float = 0.0  # where ``pcm`` begins on the answer's audio timeline


@dataclass(frozen=True)
class SentenceEnd:
    index: int


@dataclass(frozen=True)
class Usage:
    """Token counts of a turn. omniweb's thinkers report none, so these are estimates from what was
    sent and heard, at OpenAI's published rates: text one token per word or punctuation mark, input
    audio one per 100 ms, output audio one per 50 ms, images one per 32x32-pixel patch (at most 1536)."""

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
    """The request's last chunk. ``status`` is ``"ok"``, ``"cancelled"`` or a failure (``"error"``,
    ``"busy"``, ``"invalid"``, ``"unavailable"``); a failure has a ``kind`` and, from the engine, a
    client-safe ``message`` (None: the adapter says it in its own words). ``text``: the whole answer
    (the turn runner fills it in from the deltas when the engine sent none; after a failure, what
    was streamed); ``usage`` is filled in by the turn runner."""

    status: str
    kind: ErrorKind | None = None
    message: str | None = None
    text: str | None = None
    transcript: str | None = None
    usage: Usage | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


EngineChunk = Transcript | TextDelta | TextEnd | SentenceStart | AudioChunk | SentenceEnd | TurnEnd


def parse_end(chunk: Mapping[str, Any]) -> TurnEnd:
    """An engine ``end`` chunk; its text and transcript only when they are strings."""
    status = str(chunk.get("status"))
    text = chunk.get("text")
    transcript = chunk.get("transcript")
    message = chunk.get("message")
    return TurnEnd(
        status=status,
        kind=None if status == "ok" else end_kind(dict(chunk)),
        message=message if isinstance(message, str) and message else None,
        text=text if isinstance(text, str) else None,
        transcript=transcript if isinstance(transcript, str) else None,
    )


class ChunkParser:
    """One engine request's chunks in order → typed chunks (``feed`` returns zero or more)."""

    def __init__(self) -> None:
        self.audio_bytes = 0  # PCM of the answer so far
        self._words: deque[WordTiming] = deque()  # this sentence's words not yet handed out

    @property
    def audio_ms(self) -> float:
        return self.audio_bytes / BYTES_PER_MS

    def feed(self, chunk: Mapping[str, Any]) -> list[EngineChunk]:
        return list(self._parse(chunk))

    def _parse(self, chunk: Mapping[str, Any]) -> Iterator[EngineChunk]:
        kind = chunk.get("type")
        if kind == "text":
            yield TextDelta(str(chunk.get("delta") or ""))
        elif kind == "text.end":
            yield TextEnd()
        elif kind == "transcript":
            yield Transcript(str(chunk.get("text") or ""))
        elif kind == "sentence.start":
            offset = self.audio_ms
            self._words.extend(
                WordTiming(str(w["word"]), round(offset + w["start_ms"]), round(offset + w["end_ms"]))
                for w in chunk.get("timestamps") or ()
            )
            yield SentenceStart(int(chunk.get("sentence_index", 0)), str(chunk.get("text") or ""))
        elif kind == "audio":
            pcm = chunk.get("pcm") or b""
            start = self.audio_ms
            self.audio_bytes += len(pcm)
            yield AudioChunk(pcm, self._words_before(self.audio_ms), start)
        elif kind == "sentence.end":
            if self._words:
                yield AudioChunk(b"", tuple(self._words), self.audio_ms)
                self._words.clear()
            yield SentenceEnd(int(chunk.get("sentence_index", 0)))
        elif kind == "end":
            yield parse_end(chunk)
        # other kinds (a codec's packets) are not part of a conversation's answer

    def _words_before(self, end_ms: float) -> tuple[WordTiming, ...]:
        out = []
        while self._words and self._words[0].start_ms < end_ms:
            out.append(self._words.popleft())
        return tuple(out)
