"""The streaming video protocol (``/v1/video/chat/stream``): config, validation, limits, messages.

Pure functions and data only (no sockets, no engine). The wire behaviour follows vllm-omni's
streaming video WebSocket handler; where this module differs, the docstring of the function says so.
"""

from __future__ import annotations

import base64
import binascii
import io
import wave
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from omniweb.base.protocol import ProtocolError, describe_validation_error, excerpt, loads
from omniweb.base.protocol import error as error  # the endpoint's error message is the shared one
from omniweb.engine.voice import Capabilities
from omniweb.media.frames import DEFAULT_FRAME_FILTER_THRESHOLD

MAX_FRAME_SIZE = 10 * 1024 * 1024  # characters of a frame's base64 ``data``
MAX_AUDIO_BUFFER_BYTES = 4 * 1024 * 1024  # PCM16 16 kHz mono held between queries (~131 s)
MAX_QUEUED_MESSAGES = 200  # received but not yet processed; beyond it the session ends
MAX_QUEUED_BYTES = 64 * 1024 * 1024  # the same bound in bytes (a few max-size frames)
INPUT_SAMPLE_RATE = 16000
OUTPUT_SAMPLE_RATE = 24000
MODALITIES = ("text", "audio")
DEFAULT_WINDOW_SECONDS = 2.0  # sampling_strategy "latest_seconds" without window_seconds
# The audio events' names: seed 002's, or OpenAI's GA names that newer upstream clients expect.
AUDIO_EVENTS = {
    "seed": ("response.audio.delta", "response.audio.done"),
    "ga": ("response.output_audio.delta", "response.output_audio.done"),
}


class ServerVad(BaseModel):
    """``turn_detection``: OpenAI's ``server_vad`` fields and defaults (ours: an opt-in extension).

    With it, streamed ``audio.chunk``s go through voice-activity detection: the server says when
    speech starts and stops, answers each spoken turn (``create_response``) and stops an answer
    when the speaker talks over it (``interrupt_response``)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["server_vad"]
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=32, le=10000)  # at least one 32 ms VAD window
    create_response: bool = True
    interrupt_response: bool = True


class SemanticVad(BaseModel):
    """``turn_detection`` of OpenAI's type ``semantic_vad``: the same VAD finds speech and pauses, and
    an end-of-turn model decides at each pause whether the speaker has finished (within the
    eagerness' maximum wait: 8 / 4 / 2 s for low / medium / high; auto is medium)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


class VideoSessionConfig(BaseModel):
    """``session.config``, the first message; legacy names are accepted when the new one is absent."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    model: str | None = None
    modalities: list[str] = Field(default_factory=lambda: list(MODALITIES))
    num_frames: int = Field(default=4, ge=1, le=128, validation_alias=AliasChoices("num_frames", "num_sample_frames"))
    max_frames: int = Field(default=50, ge=1, le=256)
    system_prompt: str | None = None
    use_audio_in_video: bool = True
    sampling_params_list: list[dict[str, Any]] | None = None
    enable_frame_filter: bool = Field(default=True, validation_alias=AliasChoices("enable_frame_filter", "evs_enabled"))
    frame_filter_threshold: float = Field(
        default=DEFAULT_FRAME_FILTER_THRESHOLD,
        ge=0.0,
        le=1.0,
        validation_alias=AliasChoices("frame_filter_threshold", "evs_threshold"),
    )
    voice: str | None = None  # ours: the spoken answer's voice (default: the server's)
    # Newer upstream's fields: audio event names, per-session history length, frame sampling.
    event_names: Literal["seed", "ga"] = "seed"
    max_history_turns: int | None = Field(default=None, ge=1)  # the server's setting caps it
    sampling_strategy: Literal["uniform", "latest_frames", "latest_seconds"] = "uniform"
    window_seconds: float | None = Field(default=None, gt=0.0, le=3600.0)  # for "latest_seconds"
    # ours: absent or null, turns only by video.query
    turn_detection: Annotated[ServerVad | SemanticVad, Field(discriminator="type")] | None = None

    @field_validator("modalities")
    @classmethod
    def _known_modalities(cls, value: list[str]) -> list[str]:
        unknown = [m for m in value if m not in MODALITIES]
        if unknown or not value:
            raise ValueError(f"modalities must be a non-empty subset of {list(MODALITIES)}")
        return list(dict.fromkeys(value))


def parse_config(raw: str, caps: Capabilities) -> VideoSessionConfig:
    """The first message: it must be a valid ``session.config`` (any failure ends the session)."""
    msg = loads(raw, "Invalid JSON in session.config")
    if not isinstance(msg, dict) or msg.get("type") != "session.config":
        got = excerpt(msg.get("type")) if isinstance(msg, dict) else type(msg).__name__
        raise ProtocolError(f"Expected session.config, got: {got}")
    try:
        config = VideoSessionConfig.model_validate({k: v for k, v in msg.items() if k != "type"})
    except ValidationError as exc:
        raise ProtocolError(f"Invalid session config: {describe_validation_error(exc)}") from None
    if config.voice is not None and config.voice not in caps.voices:
        available = ", ".join(caps.voices)
        raise ProtocolError(f"Invalid session config: unknown voice '{excerpt(config.voice)}'; available: {available}")
    return config


def parse_message(raw: str) -> dict[str, Any]:
    """Any later message: a JSON object whose type is not reserved for the server's own events."""
    msg = loads(raw, "Invalid JSON")
    if not isinstance(msg, dict):
        raise ProtocolError("Messages must be JSON objects")
    msg_type = msg.get("type", "")
    if isinstance(msg_type, str) and msg_type.startswith("_internal."):
        raise ProtocolError(f"Unknown type: {excerpt(msg_type)}")
    return msg


def decode_audio(data: Any) -> bytes:
    """base64 PCM16 from ``audio.chunk``/``audio_data``, strictly (the seed skips bad audio silently)."""
    if not isinstance(data, str):
        raise ProtocolError("Invalid audio data: expected a base64 string")
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("Invalid audio data") from None


MAX_TIMESTAMP_MS = 2**53  # the largest integer a JavaScript number holds exactly (~285,000 years)
TIMESTAMP_FIELDS = ("pts_ms", "source_pts_ms", "capture_ts_ms")


def check_frame_timestamps(msg: dict[str, Any]) -> None:
    """Refuse a frame whose timestamps are numbers no clock gives (they are echoed in acks)."""
    for name in TIMESTAMP_FIELDS:
        value = msg.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and not abs(value) <= MAX_TIMESTAMP_MS:
            raise ProtocolError(f"Invalid {name}: must be a finite number of milliseconds within ±2^53")


def frame_metadata(msg: dict[str, Any], received_ms: float) -> dict[str, Any]:
    """What the session remembers of a frame for its ack and ``video.frames.consumed``."""
    return {
        "frame_id": msg.get("frame_id"),
        "pts_ms": msg.get("pts_ms"),
        "source_pts_ms": msg.get("source_pts_ms"),
        "quality_profile": msg.get("quality_profile"),
        "capture_ts_ms": msg.get("capture_ts_ms"),
        "receiver_received_ts_ms": received_ms,
    }


def number_or_none(value: Any) -> int | float | None:
    """Client timestamps travel to the engine only as numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


# -- server → client messages ---------------------------------------------------------------------
def frame_ack(
    msg: dict[str, Any],
    *,
    accepted: bool,
    buffered_frames: int,
    received_ms: float,
    reason: str | None = None,
    dropped_frame_id: str | None = None,
) -> dict[str, Any] | None:
    """``video.frame.ack``, only for frames that carry a non-empty string ``frame_id``."""
    frame_id = msg.get("frame_id")
    if not isinstance(frame_id, str) or not frame_id:
        return None
    ack: dict[str, Any] = {
        "type": "video.frame.ack",
        "frame_id": frame_id,
        "pts_ms": msg.get("pts_ms"),
        "capture_ts_ms": msg.get("capture_ts_ms"),
        "accepted": accepted,
        "buffered_frames": buffered_frames,
        "server_receive_ts_ms": received_ms,
    }
    if reason is not None:
        ack["reason"] = reason
    if dropped_frame_id is not None:
        ack["dropped_frame_id"] = dropped_frame_id
    return ack


def frames_consumed(
    request_id: str, selected: list[dict[str, Any]], *, model_selected_ms: float, decoded_ready_ms: float
) -> dict[str, Any]:
    """``video.frames.consumed``: the frames the thinker was given, with their metadata."""
    return {
        "type": "video.frames.consumed",
        "request_id": request_id,
        "model_selected_ts_ms": model_selected_ms,
        "frame_ids": [m["frame_id"] for m in selected if isinstance(m.get("frame_id"), str)],
        "frames": [
            {
                "frame_id": m.get("frame_id"),
                "pts_ms": m.get("pts_ms"),
                "source_pts_ms": m.get("source_pts_ms"),
                "quality_profile": m.get("quality_profile"),
                "receiver_received_ts_ms": m.get("receiver_received_ts_ms"),
                "decoded_ready_ts_ms": decoded_ready_ms,
            }
            for m in selected
        ],
        "latest_pts_ms": selected[-1].get("pts_ms") if selected else None,
    }


def input_transcript(text: str) -> dict[str, Any]:
    """Ours: what was heard, when the question came from audio (sent before ``response.start``)."""
    return {"type": "input.transcript", "text": text}


def response_start() -> dict[str, Any]:
    return {"type": "response.start"}


def text_delta(delta: str) -> dict[str, Any]:
    return {"type": "response.text.delta", "delta": delta}


def text_done(text: str) -> dict[str, Any]:
    return {"type": "response.text.done", "text": text}


def audio_delta(pcm: bytes, event_names: str = "seed") -> dict[str, Any]:
    return {"type": AUDIO_EVENTS[event_names][0], "data": pcm_to_wav_b64(pcm), "format": "wav"}


def audio_done(event_names: str = "seed") -> dict[str, Any]:
    return {"type": AUDIO_EVENTS[event_names][1]}


def speech_started(audio_start_ms: int) -> dict[str, Any]:
    """With ``turn_detection``: speech began at ``audio_start_ms`` of the streamed audio (OpenAI's name)."""
    return {"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_start_ms}


def speech_stopped(audio_end_ms: int) -> dict[str, Any]:
    return {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_end_ms}


def session_done() -> dict[str, Any]:
    return {"type": "session.done"}


def pong() -> dict[str, Any]:
    return {"type": "pong"}


def pcm_to_wav_b64(pcm: bytes, sample_rate: int = OUTPUT_SAMPLE_RATE) -> str:
    """One self-contained WAV (16-bit mono) per audio delta, base64, as the seed sends them."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm)
    return base64.b64encode(buf.getvalue()).decode("ascii")
