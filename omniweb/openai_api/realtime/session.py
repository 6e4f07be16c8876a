"""The effective session of a Realtime connection (GA shape), its defaults and ``session.update``.

A ``realtime`` session (a conversation) or a ``transcription`` session (``intent=transcription``), as
session.created and session.updated carry it. ``session.update`` merges into it and validates the whole;
what this server does not support is refused naming the field, and the session is then unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

import jsonschema
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from omniweb.base.protocol import excerpt
from omniweb.engine.requests import FunctionTool, ToolChoice
from omniweb.openai_api.protocol import (
    TRANSCRIBE_LANGUAGES,
    TRANSCRIBE_MODEL,
    TRANSCRIBE_MODEL_ALIASES,
    is_transcribe_model,
)

from .audio import FORMATS, G711_RATE, PCM, SAMPLE_RATE
from .errors import RealtimeError, _from_validation, new_id

MAX_INSTRUCTIONS_CHARS = 20_000
DEFAULT_MODEL = "gpt-realtime"
DEFAULT_VOICE = "alloy"
SUPPORTED_TRANSCRIBE_MODELS = (*TRANSCRIBE_MODEL_ALIASES, TRANSCRIBE_MODEL)
# Function tools (OpenAI's limits where it states them: a name, at most 4096 output tokens).
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS = 128
MAX_TOOL_DESCRIPTION_CHARS = 8_000
MAX_TOOL_PARAMETERS_CHARS = 64_000  # the JSON schema's text
MAX_OUTPUT_TOKENS = 4096
MIN_IDLE_TIMEOUT_MS, MAX_IDLE_TIMEOUT_MS = 500, 3_600_000  # server_vad's idle_timeout_ms
# Tools and a token limit need the ``llm`` thinker; whether the server runs one comes in the
# validation context (``language_model``), from the adapter (this module reads no settings).
NEEDS_MODEL = (
    "needs a language model: start the server with OMNIWEB_THINKER=llm "
    "(the default scene thinker answers from image measures and has none)"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _unsupported(what: str) -> ValueError:
    return ValueError(f"{what} is not supported by this server")


class AudioFormat(_Strict):
    """``audio/pcm`` (PCM16 24 kHz, with its ``rate``) or G.711 for telephony, ``audio/pcmu`` /
    ``audio/pcma`` at 8 kHz (no ``rate``, as OpenAI's session shows them)."""

    type: str = PCM
    rate: int | None = Field(default=None, validate_default=True)  # audio/pcm's is 24000 (set when omitted)

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in FORMATS:
            raise ValueError(
                f"'{excerpt(value)}' is not supported; use audio/pcm (PCM16 mono at 24000 Hz), "
                "audio/pcmu or audio/pcma (G.711 at 8000 Hz)"
            )
        return value

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: int | None, info: ValidationInfo) -> int | None:
        kind = info.data.get("type")
        if kind == PCM:
            if value not in (None, SAMPLE_RATE):
                raise ValueError(f"{value} Hz is not supported; audio/pcm runs at 24000 Hz")
            return SAMPLE_RATE
        if value not in (None, G711_RATE):
            raise ValueError(f"{value} Hz is not supported; {kind} runs at 8000 Hz")
        return None

    @model_serializer(mode="wrap")
    def _shown(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ServerVad(_Strict):
    """``turn_detection`` of type ``server_vad`` with OpenAI's defaults (the type may be omitted)."""

    type: str = "server_vad"
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=10_000)
    silence_duration_ms: int = Field(default=500, ge=32, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    # After this long with no speech once the last answer has played, the buffer is committed and
    # answered (``input_audio_buffer.timeout_triggered``); None: never. omniweb's bounds.
    idle_timeout_ms: int | None = Field(default=None, ge=MIN_IDLE_TIMEOUT_MS, le=MAX_IDLE_TIMEOUT_MS)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value != "server_vad":  # the discriminator sends every unknown type here
            raise ValueError(
                f"'{excerpt(value)}' is not supported; use server_vad or semantic_vad, or null for manual turns"
            )
        return value


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


def _audio_only() -> list[Modality]:
    return ["audio"]


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
        return self.audio.input.turn_detection  # type: ignore[attr-defined]  # each session's own field

    @property
    def responds(self) -> bool:
        """Whether a turn that turn detection ends is answered (``create_response``)."""
        td = self.turn_detection
        return td is not None and td.create_response


def _language_model(info: ValidationInfo) -> bool:
    """Whether the server's thinker is a language model (the adapter says so in the context)."""
    return bool((info.context or {}).get("language_model"))


def check_tool_name(value: str) -> str:
    if not TOOL_NAME.fullmatch(value):
        raise ValueError(f"'{excerpt(value)}' is not a valid function name: 1 to 64 letters, digits, '_' or '-'")
    return value


def _tool_type(value: Any) -> Any:
    """A tool's type, before its fields: only function tools."""
    if isinstance(value, Mapping):
        kind = value.get("type", "function")
        if kind == "mcp":
            raise ValueError("MCP tools are not supported by this server")
        if kind != "function":
            raise ValueError(f"'{excerpt(str(kind))}' tools are not supported; only function tools")
    return value


class ToolSpec(_Strict):
    """A function tool (``RealtimeFunctionTool``), echoed as the client declared it."""

    type: Literal["function"] = "function"
    name: str
    description: str | None = Field(default=None, max_length=MAX_TOOL_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None

    _name = field_validator("name")(check_tool_name)

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if len(json.dumps(value)) > MAX_TOOL_PARAMETERS_CHARS:
            raise ValueError(f"the JSON schema is over {MAX_TOOL_PARAMETERS_CHARS} characters")
        if value.get("type", "object") != "object":
            raise ValueError("expected a JSON schema of type 'object' (a function's arguments are an object)")
        try:
            jsonschema.validators.validator_for(value).check_schema(value)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"not a valid JSON schema: {exc.message[:200]}") from None
        return value

    @model_serializer(mode="wrap")
    def _declared(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def engine(self) -> FunctionTool:
        """The tool as the thinker gets it (its schema as JSON text)."""
        if self.parameters is None:
            return FunctionTool(name=self.name, description=self.description or "")
        return FunctionTool(name=self.name, description=self.description or "", parameters=json.dumps(self.parameters))


Tool = Annotated[ToolSpec, BeforeValidator(_tool_type)]
ToolChoiceValue = str | dict[str, str]  # "auto" | "none" | "required" | {"type": "function", "name": ...}
CHOICE_MODES = ("auto", "none", "required")


def check_tool_choice(choice: ToolChoiceValue, tools: Sequence[ToolSpec]) -> None:
    """A tool choice against the tools in effect: a named function must be one of them; ``required``
    needs one. Raises ``ValueError``."""
    names = [t.name for t in tools]
    if isinstance(choice, dict) and choice["name"] not in names:
        among = f"the tools ({', '.join(names)})" if names else "the tools (there are none)"
        raise ValueError(f"function '{excerpt(choice['name'])}' is not among {among}")
    if choice == "required" and not names:
        raise ValueError("'required' needs at least one tool")


def engine_tool_choice(choice: ToolChoiceValue) -> tuple[ToolChoice, str | None]:
    """The thinker's ``ToolChoice`` and, for a named function, its name."""
    if isinstance(choice, dict):
        return ToolChoice.FUNCTION, choice["name"]
    return ToolChoice(choice), None


class _ResponseOptions(_Strict):
    """What a session and a response.create share: tools, tool choice, the token limit.

    With the ``scene`` thinker (no language model) only the defaults are accepted: tools need a
    language model, and so do a token limit and a forced tool choice. ``response.create`` leaves
    them unset (None: the session's apply); a session has OpenAI's defaults.
    """

    _inherits: ClassVar[bool] = False  # None means "the session's" (response.create)

    max_output_tokens: int | Literal["inf"] | None = "inf"
    tools: list[Tool] | None = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceValue | None = "auto"
    parallel_tool_calls: bool | None = None

    @field_validator("max_output_tokens", mode="before")
    @classmethod
    def _token_limit(cls, value: Any, info: ValidationInfo) -> int | str | None:
        if value is None:
            return None if cls._inherits else "inf"
        if value == "inf":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
            raise ValueError(f"expected an integer from 1 to {MAX_OUTPUT_TOKENS} or 'inf'")
        if not _language_model(info):
            raise ValueError(f"a token limit {NEEDS_MODEL}")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_list(cls, value: Any) -> Any:
        if value is None and not cls._inherits:
            return []
        return value

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, value: list[ToolSpec] | None, info: ValidationInfo) -> list[ToolSpec] | None:
        if not value:
            return value
        names = [t.name for t in value]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"function names must be unique; declared more than once: {', '.join(twice)}")
        if not _language_model(info):
            raise ValueError(f"tool calling {NEEDS_MODEL}")
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any, info: ValidationInfo) -> ToolChoiceValue | None:
        if value is None:
            return None if cls._inherits else "auto"
        choice: ToolChoiceValue
        if isinstance(value, str) and value in CHOICE_MODES:
            choice = value
        elif isinstance(value, Mapping) and value.get("type") == "mcp":
            raise ValueError("MCP tools are not supported by this server")
        elif (
            isinstance(value, Mapping)
            and value.get("type") == "function"
            and isinstance(value.get("name"), str)
            and set(value) <= {"type", "name"}
        ):
            choice = {"type": "function", "name": value["name"]}
        else:
            raise ValueError("expected 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")
        if choice not in ("auto", "none") and not _language_model(info):
            raise ValueError(f"tool calling {NEEDS_MODEL}")
        # A session's choice is checked against the tools when a response is created: clients set it
        # before their tools (pipecat's and LiveKit's first session.update carries the choice alone).
        tools = info.data.get("tools")
        if cls._inherits and tools is not None:  # response.create's own tools and choice
            check_tool_choice(choice, tools)
        return choice


class Session(_ResponseOptions, _SessionBase):
    """The effective session in the GA shape (``RealtimeSessionCreateRequest``): what session.created
    and session.updated carry. ``id``/``object``/``expires_at`` are the server's (a client that echoes a
    session back is not refused for them)."""

    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str = Field(default_factory=lambda: new_id("sess"))
    expires_at: int = 0
    model: str = DEFAULT_MODEL
    output_modalities: list[Modality] = Field(default_factory=_audio_only)
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

    def wire(self) -> dict[str, Any]:
        """``parallel_tool_calls`` only where the client set it (OpenAI's session object carries it
        for its reasoning models)."""
        data = super().wire()
        if data.get("parallel_tool_calls") is None:
            del data["parallel_tool_calls"]
        return data


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
_REPLACED = frozenset(
    {
        ("audio", "input", "turn_detection"),
        ("audio", "input", "transcription"),
        ("audio", "input", "format"),  # another format's fields are not this one's
        ("audio", "output", "format"),
    }
)
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


def update_session(
    current: AnySession, update: Any, voices: Mapping[str, str], *, language_model: bool = False
) -> AnySession:
    """``session.update``: the update merged into the effective session, then validated whole.

    A session keeps its type (``realtime`` or ``transcription``, set when it connected).
    ``language_model``: the server's thinker is one (tools and a token limit are accepted). Raises
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
        return SESSION_TYPES[kind].model_validate(data, context={"voices": voices, "language_model": language_model})
    except ValidationError as exc:
        raise _from_validation(exc, "session") from None
