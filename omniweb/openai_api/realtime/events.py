"""The client events of OpenAI's Realtime API (GA): one message → a typed event, or a refusal.

Each event type is a strict pydantic model in the GA shape of the official ``openai`` SDK
(``openai.types.realtime``); ``parse_event`` refuses oversize, malformed JSON, an unknown type or an
invalid field with a ``RealtimeError`` naming the field and echoing the event's ``event_id``.

Images come only as data URLs (``data:image/jpeg|png;base64,...``): the server never downloads (a
choice where OpenAI leaves room, also in the README's realtime section).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from omniweb.base.protocol import ProtocolError, excerpt, loads

from .errors import RealtimeError, _from_validation
from .session import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_TOOLS,
    AudioFormat,
    Modality,
    Tool,
    ToolChoiceValue,
    _check_modalities,
    _check_voice,
    _ResponseOptions,
    _Strict,
    _unsupported,
    check_tool_name,
)

MAX_EVENT_CHARS = 12 * 1024 * 1024  # below daphne's frame limit, so an oversize event is an error, not a close
MAX_ITEM_TEXT_CHARS = 20_000
MAX_CLIENT_ID_CHARS = 32  # client-chosen item ids, as OpenAI
MAX_METADATA_ENTRIES = 16
MAX_CALL_ID_CHARS = 128  # a function call's id (other providers' ids, relayed by a client, are longer than OpenAI's)
MAX_FUNCTION_OUTPUT_CHARS = 100_000  # a function_call_output's output
# GA client event types this server does not implement (told apart from unknown types).
UNSUPPORTED_EVENTS = frozenset({"transcription_session.update"})
IMAGE_DATA_URL_PREFIXES = ("data:image/jpeg;base64,", "data:image/png;base64,", "data:image/jpg;base64,")


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
            raise ValueError(
                f"'{excerpt(value)}' items are not supported; only 'message', 'function_call' and "
                "'function_call_output' items"
            )
        return value

    @model_validator(mode="after")
    def _content_fits_role(self) -> MessageItem:
        allowed = _ROLE_CONTENT[self.role]
        for part in self.content:
            if part.type not in allowed:
                raise ValueError(f"{self.role} messages take {', '.join(sorted(allowed))} content, not {part.type}")
        return self


class FunctionCallItem(_Strict):
    """A function call (``RealtimeConversationItemFunctionCall``): one the model made, as a client
    replays it. ``arguments``: JSON object text (or empty: no arguments)."""

    id: str | None = Field(default=None, min_length=1, max_length=MAX_CLIENT_ID_CHARS)
    type: Literal["function_call"]
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    call_id: str | None = Field(default=None, min_length=1, max_length=MAX_CALL_ID_CHARS)
    name: str
    arguments: str = Field(max_length=MAX_ITEM_TEXT_CHARS)

    _name = field_validator("name")(check_tool_name)

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        if not value.strip():
            return value
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ValueError('expected the arguments as JSON object text, such as \'{"city": "Paris"}\'')
        return value


class FunctionCallOutputItem(_Strict):
    """A function's output (``RealtimeConversationItemFunctionCallOutput``), answering the
    ``function_call`` item of the same ``call_id``."""

    id: str | None = Field(default=None, min_length=1, max_length=MAX_CLIENT_ID_CHARS)
    type: Literal["function_call_output"]
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    call_id: str = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    output: str = Field(max_length=MAX_FUNCTION_OUTPUT_CHARS)


class ItemCreateEvent(_Event):
    """``conversation.item.create`` with a ``message`` item (``parse_event`` picks the event model
    by the item's type, so a refusal names the item's own fields)."""

    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: MessageItem


class FunctionCallCreateEvent(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: FunctionCallItem


class FunctionCallOutputCreateEvent(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: FunctionCallOutputItem


AnyItemCreateEvent = ItemCreateEvent | FunctionCallCreateEvent | FunctionCallOutputCreateEvent
ITEM_CREATE_EVENTS: dict[str, type[BaseModel]] = {
    "function_call": FunctionCallCreateEvent,
    "function_call_output": FunctionCallOutputCreateEvent,
}


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
    format: AudioFormat | None = None  # None: the session's
    voice: str | None = None

    _voice = field_validator("voice", mode="before")(lambda v, info: None if v is None else _check_voice(v, info))


class ResponseAudio(_Strict):
    output: ResponseAudioOutput = Field(default_factory=ResponseAudioOutput)


class ResponseParams(_ResponseOptions):
    """``response.create``'s ``response``: overrides for this response only (``tools`` replace the
    session's, ``tool_choice`` overrides it; unset, the session's apply)."""

    _inherits: ClassVar[bool] = True

    max_output_tokens: int | Literal["inf"] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceValue | None = None
    parallel_tool_calls: bool | None = None
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


class OutputAudioBufferClearEvent(_Event):
    """WebRTC only: the answer's audio stops now (``output_audio_buffer.cleared``)."""

    type: Literal["output_audio_buffer.clear"]


ClientEvent = (
    SessionUpdateEvent
    | AudioAppendEvent
    | AudioCommitEvent
    | AudioClearEvent
    | ItemCreateEvent
    | FunctionCallCreateEvent
    | FunctionCallOutputCreateEvent
    | ItemDeleteEvent
    | ItemRetrieveEvent
    | ItemTruncateEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
    | OutputAudioBufferClearEvent
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
MEDIA_EVENT_TYPES: dict[str, type[BaseModel]] = {"output_audio_buffer.clear": OutputAudioBufferClearEvent}


def parse_event(
    raw: str | bytes,
    *,
    voices: Mapping[str, str],
    language_model: bool = False,
    media: bool = False,
    max_chars: int = MAX_EVENT_CHARS,
) -> ClientEvent:
    """One client message → a typed event, or ``RealtimeError`` (with the event's ``event_id`` when
    it had one) for oversize, malformed JSON, an unknown type or an invalid field. ``language_model``:
    the server's thinker is one (``response.create`` may then name tools and a token limit);
    ``media``: the session is a WebRTC call (``output_audio_buffer.clear`` is taken)."""
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
    if model is None and media and isinstance(kind, str):
        model = MEDIA_EVENT_TYPES.get(kind)
    if model is None:
        if kind is None:
            raise RealtimeError(
                "Missing required parameter: 'type'.",
                param="type",
                code="missing_required_parameter",
                event_id=event_id,
            )
        if kind in MEDIA_EVENT_TYPES:
            what = "is taken on WebRTC calls only (POST /v1/realtime/calls)"
        elif kind in UNSUPPORTED_EVENTS:
            what = "is not supported by this server"
        else:
            what = "is not a known event type"
        raise RealtimeError(f"'{excerpt(kind)}' {what}", param="type", code="invalid_event_type", event_id=event_id)
    item = msg.get("item")
    item_type = item.get("type") if isinstance(item, dict) else None
    if (
        kind == "conversation.item.create"
        and isinstance(item, dict)
        and isinstance(item_type, str)
        and item_type in ITEM_CREATE_EVENTS
    ):
        if "role" in item or "content" in item:  # a message's fields: the wrong type, more likely than extras
            raise RealtimeError(
                f"Invalid value for 'item.type': '{item_type}' items have no role or content; "
                "a message is of type 'message'",
                param="item.type",
                event_id=event_id,
            )
        model = ITEM_CREATE_EVENTS[item_type]
    try:
        context = {"voices": voices, "language_model": language_model}
        return model.model_validate(msg, context=context)  # type: ignore[return-value]
    except ValidationError as exc:
        err = _from_validation(exc)
        err.event_id = event_id
        raise err from None


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
