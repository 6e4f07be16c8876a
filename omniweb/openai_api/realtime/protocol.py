"""OpenAI's Realtime API, GA protocol: client events, the effective session, server events, items.

Pure data and functions (no sockets, no engine), so every rule is testable on its own. Field names
and shapes are the GA event types of the official ``openai`` SDK (``openai.types.realtime``). What
this server does not support is refused with an ``error`` event naming the field (``param``) and
echoing the client's ``event_id``; the session survives every refusal.

Choices where OpenAI leaves room (also in the README's realtime section):

- ``usage`` carries the conversation core's estimates (``omniweb.conversation.Usage``: OpenAI's
  published rates applied to what was sent and heard; the thinker has no tokenizer); ``usage()``
  only shapes them, and counts words and 12.5 ms frames for a response that never reached the engine.
- ``conversation.item.truncate`` keeps exactly the words whose audio ended by ``audio_end_ms``,
  from the talker's word timings (OpenAI's server cannot place the cut precisely).
- Images come only as data URLs (``data:image/jpeg|png;base64,...``): the server never downloads.
"""

from __future__ import annotations

import base64
import binascii
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from omniweb.conversation.audio import resample_pcm16
from omniweb.conversation.chunks import WordTiming
from omniweb.openai_api.protocol import (
    FRAME_SECONDS,
    TRANSCRIBE_LANGUAGES,
    TRANSCRIBE_MODEL,
    TRANSCRIBE_MODEL_ALIASES,
    is_transcribe_model,
)
from omniweb.protocol import ProtocolError, excerpt, loads

SAMPLE_RATE = 24000  # audio/pcm, both ways: PCM16 LE mono
ENGINE_RATE = 16000  # what the thinker's Whisper and the VAD read
MAX_EVENT_CHARS = 12 * 1024 * 1024  # below daphne's frame limit, so an oversize event is an error, not a close
MAX_APPEND_BYTES = 15 * 1024 * 1024  # decoded PCM per input_audio_buffer.append (OpenAI's 15 MiB)
MAX_INPUT_AUDIO_MS = 120_000  # the input audio buffer and one input_audio content part
MAX_INSTRUCTIONS_CHARS = 20_000
MAX_ITEM_TEXT_CHARS = 20_000
MAX_CLIENT_ID_CHARS = 32  # client-chosen item ids, as OpenAI
MAX_METADATA_ENTRIES = 16
MIN_COMMIT_MS = 100  # OpenAI's minimum committed audio
DEFAULT_MODEL = "gpt-realtime"
DEFAULT_VOICE = "alloy"
IMAGE_DATA_URL_PREFIXES = ("data:image/jpeg;base64,", "data:image/png;base64,", "data:image/jpg;base64,")
# GA client event types this server does not implement (told apart from unknown types).
UNSUPPORTED_EVENTS = frozenset({"output_audio_buffer.clear", "transcription_session.update"})
SUPPORTED_TRANSCRIBE_MODELS = (*TRANSCRIBE_MODEL_ALIASES, TRANSCRIBE_MODEL)


# -- ids and errors ----------------------------------------------------------------------------------
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def new_id(prefix: str) -> str:
    """An id as OpenAI makes them: ``event_``, ``item_``, ``resp_``, ``sess_``, ``conv_`` + 22 base62 chars."""
    n = secrets.randbits(128)
    chars = []
    for _ in range(22):
        n, r = divmod(n, 62)
        chars.append(_B62[r])
    return f"{prefix}_{''.join(chars)}"


class RealtimeError(Exception):
    """A refusal sent as an ``error`` event; ``message`` is safe to send to the client."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        type: str = "invalid_request_error",  # OpenAI's field name
        event_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.event_id = event_id


def error_event(err: RealtimeError, event_id: str | None = None) -> dict[str, Any]:
    """``error`` as ``RealtimeErrorEvent``; ``error.event_id`` is the client event's id."""
    return {
        "type": "error",
        "event_id": new_id("event"),
        "error": {
            "type": err.type,
            "code": err.code,
            "message": err.message,
            "param": err.param,
            "event_id": event_id if event_id is not None else err.event_id,
        },
    }


def _param(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _from_validation(exc: ValidationError, prefix: str = "") -> RealtimeError:
    """The first problem of a pydantic error, with the field it names as ``param``."""
    first = exc.errors(include_url=False)[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    # A discriminated union adds the tag to the location: "content[0].input_text.text" → "content[0].text".
    tags = {"input_text", "input_audio", "input_image", "output_text", "output_audio"}
    loc = [p for i, p in enumerate(loc) if not (i and isinstance(loc[i - 1], int) and p in tags)]
    # So does turn_detection's: "turn_detection.semantic_vad.eagerness" → "turn_detection.eagerness".
    loc = [p for i, p in enumerate(loc) if not (i and loc[i - 1] == "turn_detection" and p in _TURN_TYPES)]
    param = _param([*([prefix] if prefix else []), *loc])
    kind = first["type"]
    if kind == "extra_forbidden":
        return RealtimeError(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    if kind == "missing":
        return RealtimeError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    message = str(first["msg"]).removeprefix("Value error, ")
    return RealtimeError(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


# -- the session -------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _unsupported(what: str) -> ValueError:
    return ValueError(f"{what} is not supported by this server")


class AudioFormat(_Strict):
    type: str = "audio/pcm"
    rate: int = SAMPLE_RATE

    @field_validator("type")
    @classmethod
    def _pcm_only(cls, value: str) -> str:
        if value != "audio/pcm":
            raise ValueError(f"'{excerpt(value)}' is not supported; use audio/pcm (PCM16 mono at 24000 Hz)")
        return value

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: int) -> int:
        if value != SAMPLE_RATE:
            raise ValueError(f"{value} Hz is not supported; audio/pcm runs at 24000 Hz")
        return value


class ServerVad(_Strict):
    """``turn_detection`` of type ``server_vad`` with OpenAI's defaults (the type may be omitted)."""

    type: str = "server_vad"
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=10_000)
    silence_duration_ms: int = Field(default=500, ge=32, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value != "server_vad":  # the discriminator sends every unknown type here
            raise ValueError(
                f"'{excerpt(value)}' is not supported; use server_vad or semantic_vad, or null for manual turns"
            )
        return value

    @field_validator("idle_timeout_ms")
    @classmethod
    def _no_idle_timeout(cls, value: int | None) -> None:
        if value is not None:
            raise _unsupported("idle_timeout_ms")
        return None


class SemanticVad(_Strict):
    """``turn_detection`` of type ``semantic_vad``: the end of a turn is decided by an end-of-turn
    model at each pause (``omniweb.vad.SemanticVoiceActivity``), within the eagerness' maximum wait."""

    type: Literal["semantic_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


_TURN_TYPES = ("server_vad", "semantic_vad")


def _turn_detection_type(value: Any) -> str:
    kind = value.get("type", "server_vad") if isinstance(value, dict) else getattr(value, "type", None)
    return "semantic_vad" if kind == "semantic_vad" else "server_vad"


TurnDetection = Annotated[
    Annotated[ServerVad, Tag("server_vad")] | Annotated[SemanticVad, Tag("semantic_vad")],
    Discriminator(_turn_detection_type),
]


class Transcription(_Strict):
    model: str = "whisper-1"
    language: str | None = None
    languages: list[str] | None = Field(default=None, max_length=8)  # gpt-transcribe's form of language
    prompt: str | None = Field(default=None, max_length=2000)

    @field_validator("languages")
    @classmethod
    def _known_languages(cls, value: list[str] | None) -> list[str] | None:
        for language in value or ():
            _english_only(language)
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if not is_transcribe_model(value):
            raise ValueError(
                f"'{excerpt(value)}' is not available; use one of {', '.join(SUPPORTED_TRANSCRIBE_MODELS)}"
            )
        return value

    @field_validator("language")
    @classmethod
    def _known_language(cls, value: str | None) -> str | None:
        if value is not None:
            _english_only(value)
        return value


def _english_only(language: str) -> None:
    if language not in TRANSCRIBE_LANGUAGES:
        raise ValueError(f"'{excerpt(language)}' is not available; the transcriber is English-only ('en')")


def _check_voice(value: Any, info: ValidationInfo) -> str:
    if isinstance(value, dict) and "id" in value:  # the SDK's custom-voice object
        value = value["id"]
    if not isinstance(value, str) or not value:
        raise ValueError("expected a voice name")
    voices = (info.context or {}).get("voices")
    if voices is not None and value not in voices:
        raise ValueError(f"unknown voice '{excerpt(value)}'; available: {', '.join(sorted(voices))}")
    return value


class AudioInput(_Strict):
    format: AudioFormat = Field(default_factory=AudioFormat)
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = Field(default_factory=ServerVad)
    noise_reduction: None = None

    @field_validator("noise_reduction", mode="before")
    @classmethod
    def _no_noise_reduction(cls, value: Any) -> None:
        if value is not None:
            raise _unsupported("noise_reduction")
        return None


class AudioOutput(_Strict):
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str = DEFAULT_VOICE
    speed: float = 1.0

    _voice = field_validator("voice", mode="before")(_check_voice)

    @field_validator("speed")
    @classmethod
    def _normal_speed(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError("only speed 1.0 is supported by the voice")
        return value


class AudioConfig(_Strict):
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


Modality = Literal["text", "audio"]


def _check_modalities(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("expected ['text'] or ['audio']")
    return list(dict.fromkeys(value))


class _SessionBase(_Strict):
    """What both kinds of session share: their wire form, their turn detection (``audio.input``),
    no transcription logprobs."""

    @field_validator("include", check_fields=False)
    @classmethod
    def _no_logprobs(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise _unsupported("include (transcription logprobs)")
        return value or None

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def turn_detection(self) -> ServerVad | SemanticVad | None:
        return self.audio.input.turn_detection  # type: ignore[attr-defined]  (each session's field)

    @property
    def responds(self) -> bool:
        """Whether a turn that turn detection ends is answered (``create_response``)."""
        td = self.turn_detection
        return td is not None and td.create_response


class _ResponseOptions(_Strict):
    """What a session and a response.create share and this server refuses beyond the defaults."""

    max_output_tokens: int | Literal["inf"] | None = "inf"
    tools: list[Any] = Field(default_factory=list)
    tool_choice: Literal["auto", "none"] = "auto"

    @field_validator("max_output_tokens")
    @classmethod
    def _unbounded(cls, value: int | str | None) -> str:
        if value not in ("inf", None):
            raise _unsupported("a token limit")
        return "inf"

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any]) -> list[Any]:
        if value:
            raise _unsupported("tool calling")
        return value


class Session(_ResponseOptions, _SessionBase):
    """The effective session in the GA shape (``RealtimeSessionCreateRequest``): what session.created
    and session.updated carry. ``id``/``object``/``expires_at`` are the server's (a client that echoes a
    session back is not refused for them)."""

    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str = Field(default_factory=lambda: new_id("sess"))
    expires_at: int = 0
    model: str = DEFAULT_MODEL
    output_modalities: list[Modality] = Field(default_factory=lambda: ["audio"])
    instructions: str = Field(default="", max_length=MAX_INSTRUCTIONS_CHARS)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    tracing: None = None  # accepted and ignored: this server has no OpenAI tracing
    truncation: Literal["auto", "disabled"] = "auto"
    include: list[str] | None = None
    prompt: None = None

    _modalities = field_validator("output_modalities")(_check_modalities)

    @field_validator("tracing", mode="before")
    @classmethod
    def _ignore_tracing(cls, value: Any) -> None:
        """OpenAI's ``"auto"``, a tracing configuration object, or null: nothing is traced or kept
        (clients such as openai-agents send ``"auto"`` by default)."""
        if value is not None and value != "auto" and not isinstance(value, dict):
            raise ValueError("expected 'auto', a tracing configuration object or null")
        return None

    @field_validator("prompt", mode="before")
    @classmethod
    def _none_only(cls, value: Any, info: ValidationInfo) -> None:
        if value is not None:
            raise _unsupported(str(info.field_name))
        return None


class TranscriptionAudio(_Strict):
    input: AudioInput = Field(default_factory=lambda: AudioInput(transcription=Transcription()))


class TranscriptionSession(_SessionBase):
    """A transcription session (``/v1/realtime?intent=transcription``, or ``session.type:
    "transcription"``): the input audio is committed by turn detection or by the client and
    transcribed; nothing is answered. What session.created and session.updated carry."""

    type: Literal["transcription"] = "transcription"
    object: Literal["realtime.transcription_session"] = "realtime.transcription_session"
    id: str = Field(default_factory=lambda: new_id("sess"))
    expires_at: int = 0
    audio: TranscriptionAudio = Field(default_factory=TranscriptionAudio)
    include: list[str] | None = None

    @property
    def responds(self) -> bool:
        return False


AnySession = Session | TranscriptionSession
SESSION_TYPES: dict[str, type[Session] | type[TranscriptionSession]] = {
    "realtime": Session,
    "transcription": TranscriptionSession,
}


# Objects a session.update replaces whole (their omitted fields take the defaults), not merges.
_REPLACED = frozenset({("audio", "input", "turn_detection"), ("audio", "input", "transcription")})
_SERVER_FIELDS = ("id", "object", "expires_at")


def _merge(base: dict[str, Any], update: Mapping[str, Any], path: tuple[str, ...] = ()) -> None:
    for key, value in update.items():
        here = (*path, key)
        if isinstance(value, Mapping) and isinstance(base.get(key), dict) and here not in _REPLACED:
            _merge(base[key], value, here)
        else:
            base[key] = value


def new_session(
    voices: Mapping[str, str], default_voice: str = DEFAULT_VOICE, model: str | None = None, intent: str | None = None
) -> AnySession:
    """The session on connect: OpenAI's defaults, with the server's voice when ``alloy`` is mapped
    away; a transcription session for ``intent=transcription`` (whisper-1 transcription on)."""
    if intent == "transcription":
        return TranscriptionSession()
    voice = default_voice if default_voice in voices else min(voices)
    return Session.model_validate(
        {"model": model or DEFAULT_MODEL, "audio": {"output": {"voice": voice}}}, context={"voices": voices}
    )


def update_session(current: AnySession, update: Any, voices: Mapping[str, str]) -> AnySession:
    """``session.update``: the update merged into the effective session, then validated whole.

    A session keeps its type (``realtime`` or ``transcription``, set when it connected). Raises
    ``RealtimeError`` naming the field; the session is then unchanged.
    """
    if not isinstance(update, Mapping):
        raise RealtimeError("Invalid value for 'session': expected an object.", param="session")
    kind = update.get("type", current.type)
    if kind not in SESSION_TYPES:
        raise RealtimeError(
            f"Invalid value for 'session.type': '{excerpt(str(kind))}'; expected 'realtime' or 'transcription'.",
            param="session.type",
        )
    if kind != current.type:
        how = "/v1/realtime?intent=transcription" if kind == "transcription" else "/v1/realtime"
        raise RealtimeError(
            f"Invalid value for 'session.type': this is a {current.type} session and cannot become a "
            f"{kind} session; connect to {how} for one.",
            param="session.type",
        )
    data = current.wire()
    _merge(data, {k: v for k, v in update.items() if k not in _SERVER_FIELDS})
    try:
        return SESSION_TYPES[kind].model_validate(data, context={"voices": voices})
    except ValidationError as exc:
        raise _from_validation(exc, "session") from None


# -- client events -----------------------------------------------------------------------------------
class _Event(_Strict):
    event_id: str | None = Field(default=None, max_length=512)


class SessionUpdateEvent(_Event):
    type: Literal["session.update"]
    session: dict[str, Any]


class AudioAppendEvent(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class AudioCommitEvent(_Event):
    type: Literal["input_audio_buffer.commit"]


class AudioClearEvent(_Event):
    type: Literal["input_audio_buffer.clear"]


class InputText(_Strict):
    type: Literal["input_text"]
    text: str = Field(max_length=MAX_ITEM_TEXT_CHARS)


class InputAudio(_Strict):
    type: Literal["input_audio"]
    audio: str | None = None
    transcript: str | None = Field(default=None, max_length=MAX_ITEM_TEXT_CHARS)


class InputImage(_Strict):
    type: Literal["input_image"]
    image_url: str
    detail: Literal["auto", "low", "high"] = "auto"


class OutputText(_Strict):
    type: Literal["output_text"]
    text: str = Field(max_length=MAX_ITEM_TEXT_CHARS)


class OutputAudio(_Strict):
    type: Literal["output_audio"]
    transcript: str = Field(default="", max_length=MAX_ITEM_TEXT_CHARS)
    audio: None = None

    @field_validator("audio", mode="before")
    @classmethod
    def _no_audio(cls, value: Any) -> None:
        if value is not None:
            raise _unsupported("assistant audio from the client (send its transcript)")
        return None


Content = Annotated[InputText | InputAudio | InputImage | OutputText | OutputAudio, Field(discriminator="type")]
_ROLE_CONTENT = {
    "user": {"input_text", "input_audio", "input_image"},
    "system": {"input_text"},
    "assistant": {"output_text", "output_audio"},
}


class MessageItem(_Strict):
    id: str | None = Field(default=None, min_length=1, max_length=MAX_CLIENT_ID_CHARS)
    type: str = "message"
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"]
    content: list[Content] = Field(min_length=1, max_length=64)

    @field_validator("type")
    @classmethod
    def _messages_only(cls, value: str) -> str:
        if value != "message":
            raise ValueError(f"'{excerpt(value)}' items are not supported; only 'message' items")
        return value

    @model_validator(mode="after")
    def _content_fits_role(self) -> MessageItem:
        allowed = _ROLE_CONTENT[self.role]
        for part in self.content:
            if part.type not in allowed:
                raise ValueError(f"{self.role} messages take {', '.join(sorted(allowed))} content, not {part.type}")
        return self


class ItemCreateEvent(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: MessageItem


class ItemDeleteEvent(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ItemRetrieveEvent(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ItemTruncateEvent(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseAudioOutput(_Strict):
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str | None = None

    _voice = field_validator("voice", mode="before")(lambda v, info: None if v is None else _check_voice(v, info))


class ResponseAudio(_Strict):
    output: ResponseAudioOutput = Field(default_factory=ResponseAudioOutput)


class ResponseParams(_ResponseOptions):
    """``response.create``'s ``response``: overrides for this response only."""

    output_modalities: list[Modality] | None = None
    instructions: str | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    audio: ResponseAudio | None = None
    conversation: Literal["auto", "none"] = "auto"
    metadata: dict[str, str] | None = None
    input: None = None

    @field_validator("output_modalities")
    @classmethod
    def _modalities(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _check_modalities(value)

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and len(value) > MAX_METADATA_ENTRIES:
            raise ValueError(f"at most {MAX_METADATA_ENTRIES} entries")
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _no_input(cls, value: Any) -> None:
        if value is not None:
            raise _unsupported("out-of-band input")
        return None


class ResponseCreateEvent(_Event):
    type: Literal["response.create"]
    response: ResponseParams | None = None


class ResponseCancelEvent(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


ClientEvent = (
    SessionUpdateEvent
    | AudioAppendEvent
    | AudioCommitEvent
    | AudioClearEvent
    | ItemCreateEvent
    | ItemDeleteEvent
    | ItemRetrieveEvent
    | ItemTruncateEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
)
EVENT_TYPES: dict[str, type[BaseModel]] = {
    "session.update": SessionUpdateEvent,
    "input_audio_buffer.append": AudioAppendEvent,
    "input_audio_buffer.commit": AudioCommitEvent,
    "input_audio_buffer.clear": AudioClearEvent,
    "conversation.item.create": ItemCreateEvent,
    "conversation.item.delete": ItemDeleteEvent,
    "conversation.item.retrieve": ItemRetrieveEvent,
    "conversation.item.truncate": ItemTruncateEvent,
    "response.create": ResponseCreateEvent,
    "response.cancel": ResponseCancelEvent,
}


def parse_event(raw: str | bytes, *, voices: Mapping[str, str], max_chars: int = MAX_EVENT_CHARS) -> ClientEvent:
    """One client message → a typed event, or ``RealtimeError`` (with the event's ``event_id`` when
    it had one) for oversize, malformed JSON, an unknown type or an invalid field."""
    if isinstance(raw, bytes):
        raise RealtimeError("Binary messages are not accepted; send JSON text events", code="invalid_event")
    if len(raw) > max_chars:
        raise RealtimeError(
            f"The event is {len(raw)} characters long; the limit is {max_chars}", code="event_too_large"
        )
    try:
        msg = loads(raw, "Invalid JSON")
    except ProtocolError as exc:
        raise RealtimeError(f"{exc.message}: the event could not be parsed", code="invalid_json") from None
    if not isinstance(msg, dict):
        raise RealtimeError("An event must be a JSON object", code="invalid_event")
    event_id = msg.get("event_id") if isinstance(msg.get("event_id"), str) else None
    kind = msg.get("type")
    model = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        if kind is None:
            raise RealtimeError(
                "Missing required parameter: 'type'.",
                param="type",
                code="missing_required_parameter",
                event_id=event_id,
            )
        what = "is not supported by this server" if kind in UNSUPPORTED_EVENTS else "is not a known event type"
        raise RealtimeError(f"'{excerpt(kind)}' {what}", param="type", code="invalid_event_type", event_id=event_id)
    try:
        return model.model_validate(msg, context={"voices": voices})  # type: ignore[return-value]
    except ValidationError as exc:
        err = _from_validation(exc)
        err.event_id = event_id
        raise err from None


# -- audio -------------------------------------------------------------------------------------------
def decode_pcm16(b64: str, *, max_bytes: int = MAX_APPEND_BYTES, param: str = "audio") -> bytes:
    """Strict base64 of PCM16 LE mono: whole samples, at most ``max_bytes`` decoded."""
    if len(b64) > (max_bytes + 2) // 3 * 4:
        raise RealtimeError(f"The audio is larger than {max_bytes} bytes", param=param, code="audio_too_large")
    try:
        pcm = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("Invalid base64 audio", param=param, code="invalid_base64") from None
    if len(pcm) % 2:
        raise RealtimeError("Audio must be whole PCM16 samples (an even number of bytes)", param=param)
    return pcm


def pcm_ms(pcm: bytes | bytearray, rate: int = SAMPLE_RATE) -> int:
    return len(pcm) // 2 * 1000 // rate


def to_engine_rate(pcm24: bytes) -> bytes:
    """PCM16 24 kHz → 16 kHz (polyphase, anti-aliased) for the thinker's Whisper."""
    return resample_pcm16(pcm24, SAMPLE_RATE, ENGINE_RATE)


def image_from_data_url(url: str, *, param: str) -> str:
    """The base64 payload of an image data URL (the frame guards check it after)."""
    for prefix in IMAGE_DATA_URL_PREFIXES:
        if url[: len(prefix)].lower() == prefix:
            return url[len(prefix) :]
    raise RealtimeError(
        "image_url must be a data URL of a JPEG or PNG image (data:image/jpeg;base64,...); "
        "this server does not download images",
        param=param,
    )


# -- the conversation --------------------------------------------------------------------------------
@dataclass(eq=False)
class Item:
    """A conversation item: its GA content parts and what the server keeps beside them."""

    id: str
    role: Literal["user", "assistant", "system"]
    content: list[dict[str, Any]]
    status: str = "completed"
    audio: bytes = b""  # a user's input audio (PCM16 24 kHz), for the thinker and retrieve
    words: list[WordTiming] = field(default_factory=list)  # an assistant's audio: word timings
    audio_ms: int = 0  # an assistant's audio length (after a truncate: what was heard)

    def wire(self, *, with_audio: bool = False) -> dict[str, Any]:
        content = []
        for part in self.content:
            part = dict(part)
            if part["type"] == "input_audio" and with_audio and self.audio:
                part["audio"] = base64.b64encode(self.audio).decode("ascii")
            content.append(part)
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": content,
        }

    def text(self) -> str:
        """What the item says, for the thinker's history (transcripts of audio parts)."""
        pieces = [part.get("text") or part.get("transcript") or "" for part in self.content]
        return " ".join(p.strip() for p in pieces if p and p.strip())


def truncate_transcript(words: Iterable[WordTiming], audio_end_ms: int) -> str:
    """Exactly the words heard by ``audio_end_ms``: those whose audio had ended."""
    return " ".join(w.word for w in words if w.end_ms <= audio_end_ms)


class Conversation:
    """The session's items in order, with OpenAI's placement rules (``previous_item_id``) and a cap;
    the oldest items go first when it is full."""

    def __init__(self, max_items: int = 200) -> None:
        self.id = new_id("conv")
        self.items: list[Item] = []
        self.max_items = max_items

    def find(self, item_id: str) -> Item | None:
        return next((i for i in self.items if i.id == item_id), None)

    def get(self, item_id: str, param: str = "item_id") -> Item:
        item = self.find(item_id)
        if item is None:
            raise RealtimeError(f"Item with item_id '{excerpt(item_id)}' not found", param=param, code="item_not_found")
        return item

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def check_placement(self, item_id: str | None, previous_item_id: str | None) -> None:
        if item_id is not None and self.find(item_id) is not None:
            raise RealtimeError(
                f"Item with id '{excerpt(item_id)}' already exists", param="item.id", code="item_exists"
            )
        if previous_item_id not in (None, "root"):
            self.get(previous_item_id, "previous_item_id")

    def add(self, item: Item, previous_item_id: str | None = None) -> tuple[str | None, list[Item]]:
        """Place ``item`` (after ``previous_item_id``; ``root`` = first; None = last): the id of the
        item before it, and the items dropped to stay under the cap."""
        self.check_placement(item.id, previous_item_id)
        if previous_item_id == "root":
            index = 0
        elif previous_item_id is None:
            index = len(self.items)
        else:
            index = self.items.index(self.get(previous_item_id, "previous_item_id")) + 1
        self.items.insert(index, item)
        previous = self.items[index - 1].id if index else None
        dropped: list[Item] = []
        while len(self.items) > self.max_items:
            dropped.append(self.items.pop(0 if self.items[0] is not item else 1))
        return previous, dropped

    def previous_of(self, item: Item) -> str | None:
        index = self.items.index(item)
        return self.items[index - 1].id if index else None

    def delete(self, item_id: str) -> Item:
        item = self.get(item_id)
        self.items.remove(item)
        return item

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> Item:
        """Cut an assistant's audio at ``audio_end_ms``; its transcript keeps exactly the words heard."""
        item = self.get(item_id)
        if item.role != "assistant":
            raise RealtimeError("Only assistant messages with audio can be truncated", param="item_id")
        if content_index >= len(item.content) or item.content[content_index]["type"] != "output_audio":
            raise RealtimeError(
                f"content_index {content_index} is not an output_audio part of item '{excerpt(item_id)}'",
                param="content_index",
            )
        if audio_end_ms > item.audio_ms:
            raise RealtimeError(
                f"audio_end_ms {audio_end_ms} is beyond the item's audio ({item.audio_ms} ms)",
                param="audio_end_ms",
            )
        item.words = [w for w in item.words if w.end_ms <= audio_end_ms]
        item.audio_ms = audio_end_ms
        item.content[content_index] = {
            "type": "output_audio",
            "transcript": truncate_transcript(item.words, audio_end_ms),
        }
        return item

    def history(self, before: Item | None = None) -> list[dict[str, str]]:
        """user/assistant turns for the thinker, up to ``before`` (excluded); system items are not here."""
        out = []
        for item in self.items:
            if item is before:
                break
            text = item.text()
            if item.role != "system" and text:
                out.append({"role": item.role, "content": text})
        return out

    def system_text(self) -> str:
        return "\n".join(t for i in self.items if i.role == "system" and (t := i.text()))


# -- server events -----------------------------------------------------------------------------------
def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": new_id("event"), **fields}


def session_created(session: AnySession) -> dict[str, Any]:
    return event("session.created", session=session.wire())


def session_updated(session: AnySession) -> dict[str, Any]:
    return event("session.updated", session=session.wire())


def audio_committed(item_id: str, previous_item_id: str | None) -> dict[str, Any]:
    return event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous_item_id)


def audio_cleared() -> dict[str, Any]:
    return event("input_audio_buffer.cleared")


def speech_started(audio_start_ms: int, item_id: str) -> dict[str, Any]:
    return event("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=item_id)


def speech_stopped(audio_end_ms: int, item_id: str) -> dict[str, Any]:
    return event("input_audio_buffer.speech_stopped", audio_end_ms=audio_end_ms, item_id=item_id)


def item_added(item: Item, previous_item_id: str | None) -> dict[str, Any]:
    return event("conversation.item.added", previous_item_id=previous_item_id, item=item.wire())


def item_done(item: Item, previous_item_id: str | None) -> dict[str, Any]:
    return event("conversation.item.done", previous_item_id=previous_item_id, item=item.wire())


def item_deleted(item_id: str) -> dict[str, Any]:
    return event("conversation.item.deleted", item_id=item_id)


def item_retrieved(item: Item) -> dict[str, Any]:
    return event("conversation.item.retrieved", item=item.wire(with_audio=True))


def item_truncated(item_id: str, content_index: int, audio_end_ms: int) -> dict[str, Any]:
    return event("conversation.item.truncated", item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms)


def transcription_completed(item_id: str, transcript: str, audio_ms: int, content_index: int = 0) -> dict[str, Any]:
    return event(
        "conversation.item.input_audio_transcription.completed",
        item_id=item_id,
        content_index=content_index,
        transcript=transcript,
        usage={"type": "duration", "seconds": round(audio_ms / 1000, 3)},
    )


def transcription_delta(item_id: str, delta: str, content_index: int = 0) -> dict[str, Any]:
    return event(
        "conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=content_index, delta=delta
    )


def transcript_deltas(segments: Sequence[str]) -> tuple[str, list[str]]:
    """Whisper's segment texts → the transcript (trimmed) and its deltas, one per segment, which
    join to exactly that transcript."""
    joined = "".join(segments)
    transcript = joined.strip()
    lo = len(joined) - len(joined.lstrip())
    hi = lo + len(transcript)
    deltas, at = [], 0
    for segment in segments:
        piece = joined[max(at, lo) : min(at + len(segment), hi)]
        at += len(segment)
        if piece:
            deltas.append(piece)
    return transcript, deltas


def transcription_failed(item_id: str, message: str, content_index: int = 0) -> dict[str, Any]:
    return event(
        "conversation.item.input_audio_transcription.failed",
        item_id=item_id,
        content_index=content_index,
        error={"type": "server_error", "code": "transcription_failed", "message": message, "param": None},
    )


def text_tokens(text: str) -> int:
    return len(text.split())


def audio_tokens(ms: float) -> int:
    return math.ceil(ms / (FRAME_SECONDS * 1000))


def usage(
    *, input_text: int = 0, input_audio: int = 0, input_images: int = 0, output_text: int = 0, output_audio: int = 0
) -> dict[str, Any]:
    """``RealtimeResponseUsage`` from counts (see the module docstring for what a token is here)."""
    inputs = input_text + input_audio + input_images
    outputs = output_text + output_audio
    return {
        "total_tokens": inputs + outputs,
        "input_tokens": inputs,
        "output_tokens": outputs,
        "input_token_details": {
            "text_tokens": input_text,
            "audio_tokens": input_audio,
            "image_tokens": input_images,
            "cached_tokens": 0,
        },
        "output_token_details": {"text_tokens": output_text, "audio_tokens": output_audio},
    }


@dataclass
class Response:
    """One response in flight: what response.* events carry."""

    id: str
    conversation_id: str | None  # None for conversation "none"
    modalities: tuple[str, ...]
    voice: str
    metadata: dict[str, str] | None = None
    status: str = "in_progress"
    status_details: dict[str, Any] | None = None
    output: list[Item] = field(default_factory=list)
    usage: dict[str, Any] | None = None

    @property
    def audio(self) -> bool:
        return "audio" in self.modalities

    def wire(self) -> dict[str, Any]:
        return {
            "object": "realtime.response",
            "id": self.id,
            "status": self.status,
            "status_details": self.status_details,
            "output": [item.wire() for item in self.output],
            "conversation_id": self.conversation_id,
            "output_modalities": list(self.modalities),
            "max_output_tokens": "inf",
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "voice": self.voice}},
            "usage": self.usage,
            "metadata": self.metadata,
        }


def response_created(response: Response) -> dict[str, Any]:
    return event("response.created", response=response.wire())


def response_done(response: Response) -> dict[str, Any]:
    return event("response.done", response=response.wire())


def cancelled(reason: Literal["client_cancelled", "turn_detected"]) -> dict[str, Any]:
    return {"type": "cancelled", "reason": reason}


def failed(message: str, code: str = "server_error") -> dict[str, Any]:
    return {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}


def _part(response: Response) -> dict[str, Any]:
    return {"type": "audio", "transcript": ""} if response.audio else {"type": "text", "text": ""}


def output_item_added(response: Response, item: Item, output_index: int = 0) -> dict[str, Any]:
    return event("response.output_item.added", response_id=response.id, output_index=output_index, item=item.wire())


def output_item_done(response: Response, item: Item, output_index: int = 0) -> dict[str, Any]:
    return event("response.output_item.done", response_id=response.id, output_index=output_index, item=item.wire())


def content_part_added(response: Response, item: Item, output_index: int = 0, content_index: int = 0) -> dict[str, Any]:
    return event(
        "response.content_part.added",
        response_id=response.id,
        item_id=item.id,
        output_index=output_index,
        content_index=content_index,
        part=_part(response),
    )


def content_part_done(
    response: Response, item: Item, text: str, output_index: int = 0, content_index: int = 0
) -> dict[str, Any]:
    part = {"type": "audio", "transcript": text} if response.audio else {"type": "text", "text": text}
    return event(
        "response.content_part.done",
        response_id=response.id,
        item_id=item.id,
        output_index=output_index,
        content_index=content_index,
        part=part,
    )


def _delta(kind: str, response: Response, item: Item, **fields: Any) -> dict[str, Any]:
    return event(kind, response_id=response.id, item_id=item.id, output_index=0, content_index=0, **fields)


def text_delta(response: Response, item: Item, delta: str) -> dict[str, Any]:
    return _delta("response.output_text.delta", response, item, delta=delta)


def text_done(response: Response, item: Item, text: str) -> dict[str, Any]:
    return _delta("response.output_text.done", response, item, text=text)


def audio_delta(response: Response, item: Item, pcm: bytes) -> dict[str, Any]:
    return _delta("response.output_audio.delta", response, item, delta=base64.b64encode(pcm).decode("ascii"))


def audio_done(response: Response, item: Item) -> dict[str, Any]:
    return _delta("response.output_audio.done", response, item)


def transcript_delta(response: Response, item: Item, delta: str) -> dict[str, Any]:
    return _delta("response.output_audio_transcript.delta", response, item, delta=delta)


def transcript_done(response: Response, item: Item, transcript: str) -> dict[str, Any]:
    return _delta("response.output_audio_transcript.done", response, item, transcript=transcript)
