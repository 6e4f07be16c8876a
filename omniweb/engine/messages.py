"""The engine's output, typed: the chunks a request's loops emit and the one ``End`` that closes it.

A loop returns these dataclasses in ``StepResult.chunks``; the scheduler adds the ``End``; the
engine client hands them to the adapter unchanged. Only the Redis mode turns them into plain
messages (``to_wire`` / ``from_wire``, at the channel layer and nowhere else), so an adapter never
switches on a string kind or reads a status as text.

Hand-written rather than pydantic: a chunk is built for every 40 ms of audio on the scheduler's
threads, and the Redis boundary only needs field names, word tuples and two enums restored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, ClassVar

from omniweb.base.errors import ErrorKind

PCM16_BYTES = 2  # every engine audio chunk is 16-bit little-endian mono


class Status(StrEnum):
    """How a request ended. Each failure also has an ``ErrorKind``; the status is the coarse word
    older clients of the engine read (one per kind, ``status_of``)."""

    OK = "ok"
    CANCELLED = "cancelled"
    ERROR = "error"
    BUSY = "busy"
    INVALID = "invalid"
    UNAVAILABLE = "unavailable"


_STATUS = {
    ErrorKind.CAPACITY: Status.BUSY,
    ErrorKind.CLIENT: Status.INVALID,
    ErrorKind.UNREACHABLE: Status.UNAVAILABLE,
    ErrorKind.STARTING: Status.UNAVAILABLE,
    ErrorKind.UNAVAILABLE: Status.UNAVAILABLE,
}


def status_of(kind: ErrorKind) -> Status:
    return _STATUS.get(kind, Status.ERROR)


@dataclass(frozen=True, slots=True)
class WordTiming:
    """One spoken word, in ms (relative to its sentence as the talker emits it)."""

    word: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Transcript:
    """What the request's input audio said (a turn whose question was spoken)."""

    TYPE: ClassVar[str] = "transcript"
    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    TYPE: ClassVar[str] = "text"
    delta: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The language model called a function; ``arguments`` is whole JSON text that fits the
    function's schema (a call is only sent complete and checked, never half of one)."""

    TYPE: ClassVar[str] = "call"
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class TextEnd:
    """The answer's text is complete (its audio may still follow)."""

    TYPE: ClassVar[str] = "text.end"


@dataclass(frozen=True, slots=True)
class SentenceStart:
    """The talker starts speaking sentence ``index``; ``words`` relative to its first sample (empty
    when the request did not ask for timings)."""

    TYPE: ClassVar[str] = "sentence.start"
    index: int
    text: str
    words: tuple[WordTiming, ...] = ()


@dataclass(frozen=True, slots=True)
class PcmAudio:
    """16-bit little-endian mono PCM of sentence ``sentence``, at ``sample_rate`` Hz."""

    TYPE: ClassVar[str] = "audio"
    pcm: bytes
    sample_rate: int
    sentence: int = 0

    @property
    def seconds(self) -> float:
        return len(self.pcm) / PCM16_BYTES / self.sample_rate


@dataclass(frozen=True, slots=True)
class SentenceEnd:
    """Sentence ``index`` is spoken; ``words`` as on its ``SentenceStart``."""

    TYPE: ClassVar[str] = "sentence.end"
    index: int
    words: tuple[WordTiming, ...] = ()


@dataclass(frozen=True, slots=True)
class CodecCodes:
    """A speech codec's packet of sentence ``index``: int16 rows, one per frame. ``last``: the
    sentence's last packet; ``more``: another sentence follows in the same stream."""

    TYPE: ClassVar[str] = "codes"
    codes: bytes
    frames: int
    last: bool
    more: bool
    index: int = 0


@dataclass(frozen=True, slots=True)
class Segment:
    """One decoded stretch of speech, in OpenAI's ``verbose_json`` segment fields (``fields``, as the
    transcription API sends them) and, when asked for, its words (``{"word", "start", "end"}``)."""

    TYPE: ClassVar[str] = "segment"
    text: str
    fields: dict[str, Any]
    words: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True, slots=True)
class VoiceProbabilities:
    """Silero's speech probability per ``window_ms`` window, in order, and the model's state after
    them (the session hands it back with its next windows)."""

    TYPE: ClassVar[str] = "vad"
    probs: tuple[float, ...]
    window_ms: float
    state: bytes


@dataclass(frozen=True, slots=True)
class TurnProbabilities:
    """Per window, the probability that the speaker has finished their turn at its end."""

    TYPE: ClassVar[str] = "turn"
    probs: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class End:
    """A request's last chunk. A failure has a ``kind`` and a client-safe ``message``; what a
    successful request reports is in the fields its pipeline fills (the rest stay None)."""

    TYPE: ClassVar[str] = "end"
    status: Status = Status.OK
    kind: ErrorKind | None = None
    message: str | None = None
    retry_after: float | None = None  # load shedding's estimate of when a retry may be admitted
    text: str | None = None  # a turn: the whole answer (after a failure, what was streamed)
    transcript: str | None = None  # a turn whose question was spoken
    rng_state: str | None = None  # speech: the noise generator, where the next request resumes it
    sentences: int | None = None  # speech: sentences spoken
    duration: float | None = None  # a transcription: seconds of audio heard
    segments: int | None = None  # a transcription: segments decoded
    prompt_tokens: int | None = None  # a turn answered by a language model: its own token counts
    completion_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @classmethod
    def failed(cls, kind: ErrorKind, message: str, **result: Any) -> End:
        """A request that did not succeed, its status the one ``kind`` maps to."""
        return cls(status=status_of(kind), kind=kind, message=message, **result)

    def error_kind(self) -> ErrorKind:
        """The failure's kind (an ``End`` with none, from an older worker, by its status)."""
        if self.kind is not None:
            return self.kind
        by_status = {
            Status.BUSY: ErrorKind.CAPACITY,
            Status.INVALID: ErrorKind.CLIENT,
            Status.UNAVAILABLE: ErrorKind.UNREACHABLE,
        }
        return by_status.get(self.status, ErrorKind.ENGINE)


CANCELLED = End(status=Status.CANCELLED)

Chunk = (
    Transcript
    | TextDelta
    | ToolCall
    | TextEnd
    | SentenceStart
    | PcmAudio
    | SentenceEnd
    | CodecCodes
    | Segment
    | VoiceProbabilities
    | TurnProbabilities
    | End
)

_TYPES: dict[str, type[Chunk]] = {
    cls.TYPE: cls
    for cls in (
        Transcript,
        TextDelta,
        ToolCall,
        TextEnd,
        SentenceStart,
        PcmAudio,
        SentenceEnd,
        CodecCodes,
        Segment,
        VoiceProbabilities,
        TurnProbabilities,
        End,
    )
}


def _plain(value: Any) -> Any:
    if isinstance(value, WordTiming):
        return [value.word, value.start_ms, value.end_ms]
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def to_wire(chunk: Chunk) -> dict[str, Any]:
    """A chunk as msgpack-able plain data (the Redis mode's ``engine.chunk``); None fields left out."""
    out: dict[str, Any] = {"type": chunk.TYPE}
    for f in fields(chunk):
        value = getattr(chunk, f.name)
        if value is not None:
            out[f.name] = _plain(value)
    return out


def from_wire(message: dict[str, Any]) -> Chunk:
    """``to_wire``'s inverse; a ``ValueError`` for a message that is no chunk."""
    cls = _TYPES.get(str(message.get("type")))
    if cls is None:
        raise ValueError(f"not an engine chunk: {message.get('type')!r}")
    values = {k: v for k, v in message.items() if k != "type"}
    if "words" in values and cls in (SentenceStart, SentenceEnd):
        values["words"] = tuple(WordTiming(str(w), int(s), int(e)) for w, s, e in values["words"])
    elif "words" in values:
        values["words"] = tuple(values["words"])
    if "probs" in values:
        values["probs"] = tuple(values["probs"])
    if cls is End:
        values["status"] = Status(values.get("status", Status.OK))
        if "kind" in values:
            values["kind"] = ErrorKind(values["kind"])
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"malformed {cls.TYPE} chunk: {exc}") from exc


def split_audio(chunk: Chunk, limit: int) -> list[Chunk]:
    """A ``PcmAudio`` over ``limit`` bytes as consecutive smaller ones (whole samples); others as is."""
    if not isinstance(chunk, PcmAudio) or len(chunk.pcm) <= limit:
        return [chunk]
    step = max(PCM16_BYTES, limit - limit % PCM16_BYTES)
    return [replace(chunk, pcm=chunk.pcm[i : i + step]) for i in range(0, len(chunk.pcm), step)]
