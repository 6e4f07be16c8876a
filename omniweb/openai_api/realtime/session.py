"""The effective session of a Realtime connection (GA shape), its defaults and ``session.update``.

A ``realtime`` session (a conversation) or a ``transcription`` session (``intent=transcription``), as
session.created and session.updated carry it. ``session.update`` merges into it and validates the whole;
what this server does not support is refused naming the field, and the session is then unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
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
)

from omniweb.base.protocol import excerpt
from omniweb.openai_api.protocol import (
    TRANSCRIBE_LANGUAGES,
    TRANSCRIBE_MODEL,
    TRANSCRIBE_MODEL_ALIASES,
    is_transcribe_model,
)

from .audio import SAMPLE_RATE
from .errors import RealtimeError, _from_validation, new_id

MAX_INSTRUCTIONS_CHARS = 20_000
DEFAULT_MODEL = "gpt-realtime"
DEFAULT_VOICE = "alloy"
SUPPORTED_TRANSCRIBE_MODELS = (*TRANSCRIBE_MODEL_ALIASES, TRANSCRIBE_MODEL)


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
    model at each pause (``omniweb.conversation.vad.SemanticVoiceActivity``), within the eagerness' maximum wait."""

    type: Literal["semantic_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


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
