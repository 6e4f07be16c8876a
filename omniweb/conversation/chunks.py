"""Typed engine chunks: the engine's wire dicts become dataclasses here, and nowhere else.

The engine's chunks travel as plain dicts (they cross to Redis workers); a consumer should not
switch on string kinds. ``parse_chunk`` turns one dict into its type (the speech endpoint uses it
as is); ``ChunkParser`` reads one conversation answer's chunks in order and yields these types.
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
    """The talker starts speaking sentence ``index``. ``words``: its word timings relative to the
    sentence's first sample, when the request asked for them (``ChunkParser`` moves them onto the
    answer's timeline and hands them out with the audio chunks)."""

    index: int
    text: str
    words: tuple[WordTiming, ...] = ()


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
    """Sentence ``index`` is spoken; ``words`` as on its ``SentenceStart`` (relative to the sentence)."""

    index: int
    words: tuple[WordTiming, ...] = ()


@dataclass(frozen=True)
class CodecCodes:
    """A speech codec's packet of codes (``output_mode: "codec_tokens"``): int16 rows, one per frame.
    ``last``: the sentence's last packet; ``more``: another sentence follows in the same stream."""

    codes: bytes
    frames: int
    last: bool
    more: bool


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
    rng_state: str | None = None  # a speech request's noise generator, where the next request resumes it

    @property
    def ok(self) -> bool:
        return self.status == "ok"


EngineChunk = Transcript | TextDelta | TextEnd | SentenceStart | AudioChunk | SentenceEnd | CodecCodes | TurnEnd


def parse_end(chunk: Mapping[str, Any]) -> TurnEnd:
    """An engine ``end`` chunk; its text and transcript only when they are strings."""
    status = str(chunk.get("status"))
    text = chunk.get("text")
    transcript = chunk.get("transcript")
    message = chunk.get("message")
    rng_state = chunk.get("rng_state")
    return TurnEnd(
        status=status,
        kind=None if status == "ok" else end_kind(dict(chunk)),
        message=message if isinstance(message, str) and message else None,
        text=text if isinstance(text, str) else None,
        transcript=transcript if isinstance(transcript, str) else None,
        rng_state=rng_state if isinstance(rng_state, str) else None,
    )


def _words(timestamps: Any) -> tuple[WordTiming, ...]:
    return tuple(WordTiming(str(w["word"]), int(w["start_ms"]), int(w["end_ms"])) for w in timestamps or ())


def parse_chunk(chunk: Mapping[str, Any]) -> EngineChunk | None:
    """One engine chunk as its type (None: a kind no endpoint uses). Word timings stay relative to
    their sentence; ``AudioChunk.start_ms`` is 0 (``ChunkParser`` places both on a timeline)."""
    kind = chunk.get("type")
    if kind == "text":
        return TextDelta(str(chunk.get("delta") or ""))
    if kind == "text.end":
        return TextEnd()
    if kind == "transcript":
        return Transcript(str(chunk.get("text") or ""))
    if kind == "sentence.start":
        index = int(chunk.get("sentence_index", 0))
        return SentenceStart(index, str(chunk.get("text") or ""), _words(chunk.get("timestamps")))
    if kind == "audio":
        return AudioChunk(chunk.get("pcm") or b"")
    if kind == "sentence.end":
        return SentenceEnd(int(chunk.get("sentence_index", 0)), _words(chunk.get("timestamps")))
    if kind == "codes":
        codes = chunk.get("codes") or b""
        return CodecCodes(codes, int(chunk.get("frames", 0)), bool(chunk.get("last")), bool(chunk.get("more")))
    if kind == "end":
        return parse_end(chunk)
    return None


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

    def _parse(self, raw: Mapping[str, Any]) -> Iterator[EngineChunk]:
        chunk = parse_chunk(raw)
        if isinstance(chunk, SentenceStart):
            offset = self.audio_ms
            self._words.extend(
                WordTiming(w.word, round(offset + w.start_ms), round(offset + w.end_ms)) for w in chunk.words
            )
        elif isinstance(chunk, AudioChunk):
            start = self.audio_ms
            self.audio_bytes += len(chunk.pcm)
            chunk = AudioChunk(chunk.pcm, self._words_before(self.audio_ms), start)
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
