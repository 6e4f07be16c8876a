"""The engine's input, typed: one request dataclass per kind of work, named by its pipeline.

An adapter builds one of these, the engine client submits it, the scheduler reads the fields it
schedules by (``EngineRequest``'s) and each pipeline's loops read their own. They are the contract
between adapters and pipelines, which is why they live in the core: an adapter asks for speech or a
transcription by building a request, never by importing the pipeline that serves it. Only the Redis
mode turns a request into plain data (``to_wire`` / ``from_wire``), at the channel layer.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

# The pipelines' names: a request is served by the pipeline registered under its ``pipeline``.
SPEECH = "speech.tts"
SPEECH_CODEC = "speech.codec"
VIDEO_TURN = "video.turn"
TRANSCRIBE = "audio.transcribe"
VAD = "audio.vad"
END_OF_TURN = "audio.turn"


class Priority(StrEnum):
    REALTIME = "realtime"  # someone listens as it is made: paced, admitted by its first media's wait
    BATCH = "batch"  # a file nobody hears until it is whole: never paced, runs on spare workers


class Split(StrEnum):
    """How a text is cut into talker steps."""

    SENTENCE = "sentence"
    CLAUSE = "clause"
    NONE = "none"  # the whole text is one step


class FramesScope(StrEnum):
    """What ``max_frames`` caps."""

    SENTENCE = "sentence"
    REQUEST = "request"


class CodecOutput(StrEnum):
    """What the codec pipeline sends: its packets, or the audio it decodes from them."""

    CODES = "codes"
    PCM = "pcm"


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Modality(StrEnum):
    TEXT = "text"
    AUDIO = "audio"


@dataclass(frozen=True, kw_only=True)
class EngineRequest:
    """What the scheduler itself reads; subclasses add what their pipeline's loops read."""

    _kinds: ClassVar[dict[str, type[EngineRequest]]] = {}

    pipeline: str
    priority: Priority = Priority.REALTIME
    admit_budget: float | None = None  # seconds: a conversation's turn, whose speaker already waits
    tenant: str | None = None  # who it belongs to: first media is ordered fairly between tenants
    paced: bool = True  # False: made as fast as it can (one file per flush), whatever its priority
    # CPU seconds its delivery (the adapter's encoder) spends per second of its media, on the cores
    # the engine runs on: part of what its stream costs when load shedding prices it (0: as made).
    delivery: float = 0.0
    # Part of a session already admitted (its voice activity windows, end-of-turn checks, streaming
    # recognition): never refused by load shedding. If it falls behind, the session degrades (a
    # later turn end), it is not cut off.
    admitted: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "priority", _member(Priority, self.priority, "priority")
        )  # "batch" from a config string

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        EngineRequest._kinds[cls.__name__] = cls

    @property
    def batch(self) -> bool:
        return self.priority is Priority.BATCH

    @property
    def own_admit_budget(self) -> float | None:
        """Its own admission budget, or None when the engine's applies."""
        return self.admit_budget if self.admit_budget is not None and self.admit_budget > 0 else None

    def byte_size(self) -> int:
        """The byte strings it carries (frames, audio), in all: what the engine's request limit bounds."""
        return _bytes_in(dataclasses.asdict(self))


def _bytes_in(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, dict):
        return sum(_bytes_in(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_bytes_in(v) for v in value)
    return 0


@dataclass(frozen=True, kw_only=True)
class SpeakingRequest(EngineRequest):
    """The talker's settings, for every pipeline that speaks."""

    voice: str | None = None  # None: the loaded model's default voice
    speed: float = 1.0
    seed: int | None = None  # seeded noise: the same audio bit for bit
    rng_state: str | None = None  # an earlier request's ``End.rng_state``: continue its noise
    timestamps: bool = False  # time each spoken word (``SentenceStart.words``)
    first_chunk_frames: int | None = None  # a sentence's first vocoder chunk; None: the setting
    max_frames: int | None = None  # a cap on acoustic frames, per sentence or per request
    max_frames_scope: FramesScope = FramesScope.SENTENCE
    split: Split = Split.SENTENCE

    def __post_init__(self) -> None:
        super().__post_init__()  # the values may arrive as plain strings (a config, the Redis wire)
        object.__setattr__(self, "max_frames_scope", _member(FramesScope, self.max_frames_scope, "max_frames_scope"))
        object.__setattr__(self, "split", _member(Split, self.split, "split"))


@dataclass(frozen=True, kw_only=True)
class SpeakRequest(SpeakingRequest):
    """Speak ``text`` (``speech.tts``, or ``speech.codec`` for codec packets or codec-decoded PCM)."""

    pipeline: str = SPEECH
    text: str
    codec_output: CodecOutput = CodecOutput.CODES  # speech.codec only

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "codec_output", _member(CodecOutput, self.codec_output, "codec_output"))


@dataclass(frozen=True, kw_only=True)
class FrameIn:
    """A camera frame a turn looks at (encoded image bytes)."""

    data: bytes
    frame_id: str | None = None
    pts_ms: float | None = None


@dataclass(frozen=True, kw_only=True)
class FunctionTool:
    """A function the language model may call: its JSON Schema travels as JSON text (plain data
    across the Redis boundary, and the exact text the client declared)."""

    name: str
    description: str = ""
    parameters: str = "{}"


@dataclass(frozen=True, kw_only=True)
class FunctionCall:
    """A call the model made: ``arguments`` is JSON text that fits the function's schema."""

    call_id: str
    name: str
    arguments: str


class ToolChoice(StrEnum):
    AUTO = "auto"  # the model decides (where its chat template supports tools)
    NONE = "none"  # the model answers in words
    REQUIRED = "required"  # the model calls one of the tools
    FUNCTION = "function"  # the model calls ``AnswerRequest.tool_name``


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    """One message of the conversation so far: a user's or assistant's words, an assistant's
    function calls (``calls``), or a function's output (role ``tool``, answering ``call_id``)."""

    role: Role
    content: str = ""
    calls: tuple[FunctionCall, ...] = ()
    call_id: str | None = None

    def __post_init__(self) -> None:
        if self.role not in set(Role):
            raise ValueError("history roles must be user, assistant or tool")
        object.__setattr__(self, "role", Role(self.role))


@dataclass(frozen=True, kw_only=True)
class AnswerRequest(SpeakingRequest):
    """A conversation's turn (``video.turn``): thinker → talker → vocoder. The question is ``question``
    or, when empty (or with ``transcribe``), what ``audio`` (PCM16 16 kHz mono) says."""

    pipeline: str = VIDEO_TURN
    question: str = ""
    audio: bytes = b""
    frames: tuple[FrameIn, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    system_prompt: str | None = None
    modalities: tuple[Modality, ...] = (Modality.TEXT, Modality.AUDIO)
    model: str | None = None
    transcribe: bool = False
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = ToolChoice.AUTO
    tool_name: str | None = None  # tool_choice FUNCTION: the function to call
    parallel_tool_calls: bool = True
    max_tokens: int | None = None  # the answer's length cap in model tokens (None: the thinker's)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "tool_choice", _member(ToolChoice, self.tool_choice, "tool_choice"))
        if not set(self.modalities) <= set(Modality):
            raise ValueError(f"modalities must be a subset of {[m.value for m in Modality]}")
        object.__setattr__(self, "modalities", tuple(Modality(m) for m in self.modalities))


@dataclass(frozen=True, kw_only=True)
class TranscribeRequest(EngineRequest):
    """Transcribe ``audio`` (PCM16 16 kHz mono) with Whisper."""

    pipeline: str = TRANSCRIBE
    audio: bytes
    prompt: str | None = None
    temperature: float = 0.0
    words: bool = False
    timestamps: bool = True  # segment times (the transcription API); questions need only text
    prefix: str | None = None  # text the transcript is made to start with: what streaming committed


@dataclass(frozen=True, kw_only=True)
class VadRequest(EngineRequest):
    """Silero's speech probabilities for ``pcm`` (PCM16 16 kHz, whole windows); ``state``: the model's
    state after the session's previous windows (None starts a stream). The shape constants are the
    contract the session VAD (omniweb.conversation.vad) builds requests by and the pipeline refuses others by."""

    SAMPLE_RATE: ClassVar[int] = 16_000
    WINDOW_SAMPLES: ClassVar[int] = 512  # Silero's window at 16 kHz
    WINDOW_MS: ClassVar[float] = 1000.0 * WINDOW_SAMPLES / SAMPLE_RATE  # 32.0
    WINDOW_BYTES: ClassVar[int] = 2 * WINDOW_SAMPLES
    MAX_WINDOWS: ClassVar[int] = 1024  # one request's audio at most (~33 s): a session splits longer feeds

    pipeline: str = VAD
    admitted: bool = True  # a listening session's next windows
    pcm: bytes
    state: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class EndOfTurnRequest(EngineRequest):
    """Smart Turn's end-of-turn probability for each window (PCM16 16 kHz mono, each <= 8 s)."""

    SAMPLE_RATE: ClassVar[int] = 16_000
    WINDOW_SECONDS: ClassVar[int] = 8  # the model sees exactly this much audio (the end of the turn)
    MAX_WINDOWS: ClassVar[int] = 8  # per request: a session asks for a few windows per pause

    pipeline: str = END_OF_TURN
    admitted: bool = True  # a listening session's end-of-turn check
    windows: tuple[bytes, ...] = field(default=())


RequestT = TypeVar("RequestT", bound=EngineRequest)
LoadedT = TypeVar("LoadedT")  # a dataclass, built by _load from plain data


def expect(request: EngineRequest, kind: type[RequestT]) -> RequestT:
    """``request`` as the type its pipeline serves, or the ``ValueError`` the scheduler refuses it with."""
    if not isinstance(request, kind):
        raise ValueError(f"the {request.pipeline} pipeline serves {kind.__name__}, not {type(request).__name__}")
    return request


def to_wire(request: EngineRequest) -> dict[str, Any]:
    """A request as msgpack-able plain data (its class under ``kind``)."""
    values = dataclasses.asdict(request)
    return {"kind": type(request).__name__, **{k: _plain(v) for k, v in values.items()}}


def _plain(value: Any) -> Any:
    """Enums as their values and tuples as lists: the shapes msgpack and the blob offloading walk."""
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def from_wire(message: dict[str, Any]) -> EngineRequest:
    """``to_wire``'s inverse, each field checked against its annotation: a ``ValueError`` for data
    that is no known request or has a field of the wrong type."""
    values = dict(message)
    cls = EngineRequest._kinds.get(str(values.pop("kind", "")))
    if cls is None:
        raise ValueError(f"not an engine request: {message.get('kind')!r}")
    return _load(cls, values)


EnumT = TypeVar("EnumT", bound=StrEnum)


def _member(enum: type[EnumT], value: Any, name: str) -> EnumT:
    """``value`` as a member of ``enum`` (it may arrive as a plain string), or a ``ValueError`` naming the field."""
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(m.value for m in enum)}, not {value!r}") from None


def _load(cls: type[LoadedT], values: Any) -> LoadedT:
    """A dataclass from plain data, nested dataclasses, enums and tuples restored by the annotations."""
    if not isinstance(values, dict):
        raise ValueError(f"{cls.__name__} must be an object, not {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    loaded = {}
    for name, value in values.items():
        hint = hints.get(name)
        if hint is None or name.startswith("_"):
            raise ValueError(f"{cls.__name__} has no field {name!r}")
        value = _restore(value, hint)
        if not _fits(value, hint):
            raise ValueError(f"{cls.__name__}.{name} must be {_describe(hint)}, not {type(value).__name__}")
        loaded[name] = value
    try:
        return cls(**loaded)
    except TypeError as exc:
        raise ValueError(f"malformed {cls.__name__}: {exc}") from exc


def _restore(value: Any, hint: Any) -> Any:
    if typing.get_origin(hint) is tuple and isinstance(value, list | tuple):
        item = typing.get_args(hint)[0]
        return tuple(_restore(v, item) for v in value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _load(hint, value)
    if isinstance(hint, type) and issubclass(hint, StrEnum) and isinstance(value, str):
        try:
            return hint(value)
        except ValueError:
            return value  # refused by the dataclass, which says which values it takes
    return value


def _fits(value: Any, hint: Any) -> bool:
    """Whether plain data read off the wire has the annotated type (the Redis boundary's check)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return isinstance(value, tuple) and all(_fits(v, item) for v in value)
    if hint is Any:
        return True
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return isinstance(value, str)  # its dataclass converts it, or refuses it by name
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    return str(hint) if typing.get_args(hint) else getattr(hint, "__name__", str(hint))
