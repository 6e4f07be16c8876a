"""The streaming speech protocol: message models, validation, limits and wire formats.

Pure functions and data only (no sockets, no engine), so every rule here is testable on its own.
The wire behaviour follows vllm-omni's streaming speech WebSocket handler.
"""

from __future__ import annotations

import base64
import io
import wave
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import ProtocolError, describe_validation_error, excerpt, loads
from omniweb.base.protocol import error as base_error
from omniweb.engine.requests import Priority, SpeakRequest, Split
from omniweb.engine.voice import Capabilities
from omniweb.media.containers import SOUNDFILE_FORMATS

SAMPLE_RATE = 24000
BYTES_PER_SAMPLE = 2  # 16-bit mono PCM
CHANNELS = 1
MAX_CONFIG_MESSAGE_SIZE = 4 * 1024 * 1024  # room for ref_audio payloads
MAX_OTHER_MESSAGE_SIZE = 128 * 1024
MAX_EMBEDDING_DIM = 8192
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

ResponseFormat = Literal["wav", "pcm", "flac", "mp3", "opus"]


class SessionConfig(BaseModel):
    """``session.config``: sticky for the connection, replaceable between utterances."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    model: str | None = None
    voice: str | None = Field(default=None, validation_alias=AliasChoices("voice", "speaker"))
    task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None
    language: str | None = None
    instructions: str | None = None
    response_format: ResponseFormat = "wav"
    speed: float | None = Field(default=1.0, ge=0.25, le=4.0)
    max_new_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    initial_codec_chunk_frames: int | None = Field(default=None, ge=0, le=INT64_MAX)
    non_streaming_mode: bool | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: list[float] | None = Field(default=None, max_length=MAX_EMBEDDING_DIM)
    stream_audio: bool = False
    word_timestamps: bool = False
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    output_mode: Literal["pcm", "codec_tokens"] = "pcm"
    split_granularity: Literal["sentence", "clause", "none"] = "none"  # the reference: one request per flush
    # omniweb extension: "codec" makes the audio by decoding the codec_tokens stream on the server,
    # so it is sample for sample what a client decoding that stream plays.
    vocoder: Literal["hibari", "codec"] = "hibari"
    # omniweb extension: "batch" for a client that writes a file rather than listening: its audio is
    # made as fast as the engine can (not paced to playback), in the time real-time sessions leave.
    priority: Literal["realtime", "batch"] = "realtime"

    @model_validator(mode="after")
    def _check_combinations(self) -> SessionConfig:
        if self.speaker_embedding is not None and self.ref_audio is not None:
            raise ValueError("'speaker_embedding' and 'ref_audio' are mutually exclusive")
        if self.vocoder == "codec" and self.output_mode == "codec_tokens":
            raise ValueError(
                "vocoder='codec' makes audio on the server; with output_mode='codec_tokens' the client decodes "
                "the codes itself, so omit vocoder"
            )
        if self.stream_audio:
            if self.response_format != "pcm":
                raise ValueError(
                    "WebSocket streaming audio (stream_audio=true) requires response_format='pcm'. "
                    f"Got response_format='{self.response_format}'."
                )
            if self.speed is None:
                self.speed = 1.0
            elif self.speed != 1.0:
                raise ValueError(
                    "WebSocket stream_audio=true currently requires speed=1.0; use stream_audio=false for other speeds."
                )
        return self


def parse_message(raw: str) -> dict[str, Any]:
    """Decode one client text message, enforcing the per-type size limits."""
    if len(raw) > max(MAX_CONFIG_MESSAGE_SIZE, MAX_OTHER_MESSAGE_SIZE):
        raise ProtocolError("WebSocket message too large")
    msg = loads(raw, "Invalid JSON message")  # every parse failure is a ProtocolError
    if not isinstance(msg, dict):
        raise ProtocolError("WebSocket messages must be JSON objects")
    if msg.get("type") == "session.config":
        if len(raw) > MAX_CONFIG_MESSAGE_SIZE:
            raise ProtocolError("session.config message too large")
    elif len(raw) > MAX_OTHER_MESSAGE_SIZE:
        raise ProtocolError("input.text message too large")
    return msg


def build_config(msg: dict[str, Any], caps: Capabilities) -> SessionConfig:
    """Validate a session.config message, then check it against what the model can honour."""
    try:
        config = SessionConfig.model_validate({k: v for k, v in msg.items() if k != "type"})
    except ValidationError as exc:
        raise ProtocolError(f"Invalid session config: {describe_validation_error(exc)}") from None
    check_capabilities(config, caps)
    return config


def check_capabilities(config: SessionConfig, caps: Capabilities) -> None:
    """Refuse fields the voice cannot honour instead of silently ignoring them."""
    if config.model is not None and config.model not in caps.model_names:
        raise ProtocolError(
            f"The model '{excerpt(config.model)}' does not exist; available models: {', '.join(caps.model_names)}"
        )
    if config.voice is not None and config.voice not in caps.voices:
        raise ProtocolError(f"Unknown voice '{excerpt(config.voice)}'; available voices: {', '.join(caps.voices)}")
    if config.language is not None and config.language.strip().lower() not in caps.languages:
        raise ProtocolError(
            f"Unsupported language '{excerpt(config.language)}'; supported: {', '.join(caps.languages)}"
        )
    if config.response_format not in caps.response_formats:
        raise ProtocolError(
            f"response_format '{config.response_format}' is not available on this server; "
            f"supported: {', '.join(caps.response_formats)}"
        )
    if config.task_type not in (None, "CustomVoice"):
        raise ProtocolError(
            f"task_type '{config.task_type}' is not supported by the loaded TTS model; "
            "it speaks with preset voices only (task_type 'CustomVoice' or omitted)"
        )
    unsupported = [
        name
        for name, value in (
            ("instructions", config.instructions),
            ("ref_audio", config.ref_audio),
            ("ref_text", config.ref_text),
            ("speaker_embedding", config.speaker_embedding),
            ("non_streaming_mode", config.non_streaming_mode),
        )
        if value is not None
    ]
    if config.x_vector_only_mode:
        unsupported.append("x_vector_only_mode")
    if unsupported:
        raise ProtocolError(
            f"The loaded TTS model does not support {', '.join(unsupported)}; "
            "omit these fields (voice cloning and style instructions are not available)"
        )


def tts_request(
    text: str, config: SessionConfig, pipeline: str, *, split: str | None = None, delivery: float = 0.0
) -> SpeakRequest:
    """The engine request that speaks ``text`` as ``config`` says (every wire format builds it here).

    ``split``: how the engine cuts the text into talker steps, when it differs from the wire's
    ``split_granularity`` (a flush sent as one sentence is still synthesized sentence by sentence).
    ``delivery``: what the transport's encoder spends per second of its audio (``EngineRequest``).
    """
    return SpeakRequest(
        pipeline=pipeline,
        text=text,
        voice=config.voice,
        speed=config.speed if config.speed is not None else 1.0,  # null: the default, in both engine modes
        seed=config.seed,
        split=Split(split or config.split_granularity),
        timestamps=config.word_timestamps,
        first_chunk_frames=config.initial_codec_chunk_frames,
        max_frames=config.max_new_tokens,
        priority=Priority(config.priority),
        delivery=delivery,
    )


CODEC_UNSUPPORTED = "output_mode='codec_tokens' is not supported by the loaded TTS model."


def flush_precondition_error(config: SessionConfig, codec_ready: bool) -> str | None:
    """Errors the reference handler reports when an utterance is flushed, not at config time.

    ``codec_ready``: the codec (speech/codec) loaded. As in the reference, codec_tokens mode is
    decided first: it streams codes whatever ``response_format``, ``stream_audio`` and
    ``word_timestamps`` say (none of them applies to codes).
    """
    if config.output_mode == "codec_tokens":
        return None if codec_ready else CODEC_UNSUPPORTED
    if config.vocoder == "codec" and not codec_ready:
        return "vocoder='codec' is not available: the codec could not be loaded."
    if config.word_timestamps and not (config.stream_audio and config.response_format == "pcm"):
        return (
            "word_timestamps=true requires stream_audio=true and response_format='pcm' "
            "(timestamps ride the per-sentence PCM audio.chunk stream)."
        )
    return None


# -- server → client messages ---------------------------------------------------------------------
def error(message: str, *, partial_audio: bool = False, kind: ErrorKind = ErrorKind.CLIENT) -> dict[str, Any]:
    payload = base_error(message, kind)
    if partial_audio:
        payload.update(partial_audio=True, action="discard")
    return payload


def audio_start(config: SessionConfig, utterance: int, sentence: int, text: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": "audio.start",
        "utterance_index": utterance,
        "sentence_index": sentence,
        "sentence_text": text,
        "format": config.response_format,
    }
    if config.stream_audio and config.response_format == "pcm":
        payload["sample_rate"] = SAMPLE_RATE
        payload["channels"] = CHANNELS  # as newer upstream clients expect
    if config.word_timestamps:
        payload["word_timestamps"] = True
    return payload


def samples_to_ms(n_bytes: int) -> int:
    return round(n_bytes / BYTES_PER_SAMPLE / SAMPLE_RATE * 1000.0)


def audio_chunk(
    utterance: int,
    sentence: int,
    chunk_id: int,
    pcm: bytes,
    start_byte: int,
    timestamps: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """A JSON ``audio.chunk`` (word-timestamp mode): base64 PCM and its place in the sentence."""
    return {
        "type": "audio.chunk",
        "utterance_index": utterance,
        "sentence_index": sentence,
        "chunk_id": chunk_id,
        "chunk_start_ms": samples_to_ms(start_byte),
        "chunk_end_ms": samples_to_ms(start_byte + len(pcm)),
        "sample_rate": SAMPLE_RATE,
        "channels": CHANNELS,
        "audio_b64": base64.b64encode(pcm).decode("ascii"),
        "timestamps": timestamps,
    }


def audio_done(
    utterance: int, sentence: int, total_bytes: int, *, error: bool = False, cancelled: bool = False
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": "audio.done",
        "utterance_index": utterance,
        "sentence_index": sentence,
        "total_bytes": total_bytes,
        "error": error,
    }
    if cancelled:
        payload["cancelled"] = True
    return payload


def codec_done(
    utterance: int,
    sentence: int,
    total_frames: int,
    seq_last: int,
    *,
    error: bool = False,
    cancelled: bool = False,
) -> dict[str, Any]:
    """End of one sentence's codec stream (``seq_last`` is -1 when no packet was sent)."""
    return {
        "type": "codec.done",
        "utterance_index": utterance,
        "sentence_index": sentence,
        "total_frames": total_frames,
        "seq_last": seq_last,
        "error": error,
        "cancelled": cancelled,
    }


def session_done(utterance: int, total_sentences: int) -> dict[str, Any]:
    return {"type": "session.done", "utterance_index": utterance, "total_sentences": total_sentences}


def input_cancelled(utterance: int) -> dict[str, Any]:
    return {"type": "input.cancelled", "utterance_index": utterance}


# -- audio encodings ------------------------------------------------------------------------------
def encode_audio(pcm: bytes, response_format: str) -> bytes:
    """One sentence's 16-bit PCM as the requested container (non-streaming mode)."""
    if response_format == "pcm":
        return pcm
    if response_format == "wav":
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(BYTES_PER_SAMPLE)
            w.setframerate(SAMPLE_RATE)
            w.writeframes(pcm)
        return buf.getvalue()
    return _encode_compressed(pcm, response_format)


def _encode_compressed(pcm: bytes, response_format: str) -> bytes:
    import numpy as np
    import soundfile

    container, subtype = SOUNDFILE_FORMATS[response_format]
    buf = io.BytesIO()
    samples = np.frombuffer(pcm, dtype="<i2")
    soundfile.write(buf, samples, SAMPLE_RATE, format=container, subtype=subtype)
    return buf.getvalue()
