"""The server events of OpenAI's Realtime API (GA): a builder for each event this server sends, in the
shapes of the official ``openai`` SDK (``openai.types.realtime``), and the response in flight they carry.

``usage()`` only shapes a response's ``omniweb.conversation.Usage`` as ``RealtimeResponseUsage``:
how tokens are counted is ``omniweb.conversation.usage``'s one rule (docs/protocols/realtime.md,
"Usage").
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from omniweb.conversation import Usage

from .audio import PCM, SAMPLE_RATE
from .errors import new_id
from .items import Item
from .session import AnySession


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


def timeout_triggered(audio_start_ms: int, audio_end_ms: int, item_id: str) -> dict[str, Any]:
    """``server_vad``'s ``idle_timeout_ms`` passed with no speech: the input audio from the end of the
    last answer's playback to now, committed as ``item_id``."""
    kind = "input_audio_buffer.timeout_triggered"
    return event(kind, audio_start_ms=audio_start_ms, audio_end_ms=audio_end_ms, item_id=item_id)


def item_added(item: Item, previous_item_id: str | None) -> dict[str, Any]:
    return event("conversation.item.added", previous_item_id=previous_item_id, item=item.wire())


def item_done(item: Item, previous_item_id: str | None) -> dict[str, Any]:
    return event("conversation.item.done", previous_item_id=previous_item_id, item=item.wire())


def item_deleted(item_id: str) -> dict[str, Any]:
    return event("conversation.item.deleted", item_id=item_id)


def item_retrieved(item: Item, audio_format: str = PCM) -> dict[str, Any]:
    """The item with its input audio, in the session's input format."""
    return event("conversation.item.retrieved", item=item.wire(with_audio=True, audio_format=audio_format))


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


def usage(counts: Usage) -> dict[str, Any]:
    """``RealtimeResponseUsage`` from a response's counts (nothing is cached: ``cached_tokens`` 0)."""
    return {
        "total_tokens": counts.total_tokens,
        "input_tokens": counts.input_tokens,
        "output_tokens": counts.output_tokens,
        "input_token_details": {
            "text_tokens": counts.input_text_tokens,
            "audio_tokens": counts.input_audio_tokens,
            "image_tokens": counts.input_image_tokens,
            "cached_tokens": 0,
        },
        "output_token_details": {"text_tokens": counts.output_text_tokens, "audio_tokens": counts.output_audio_tokens},
    }


@dataclass
class Response:
    """One response in flight: what response.* events carry."""

    id: str
    conversation_id: str | None  # None for conversation "none"
    modalities: tuple[str, ...]
    voice: str
    metadata: dict[str, str] | None = None
    max_output_tokens: int | Literal["inf"] = "inf"
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
            "max_output_tokens": self.max_output_tokens,
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


def _delta(kind: str, response: Response, item: Item, output_index: int, **fields: Any) -> dict[str, Any]:
    return event(kind, response_id=response.id, item_id=item.id, output_index=output_index, content_index=0, **fields)


def text_delta(response: Response, item: Item, delta: str, output_index: int = 0) -> dict[str, Any]:
    return _delta("response.output_text.delta", response, item, output_index, delta=delta)


def text_done(response: Response, item: Item, text: str, output_index: int = 0) -> dict[str, Any]:
    return _delta("response.output_text.done", response, item, output_index, text=text)


def audio_delta(response: Response, item: Item, pcm: bytes, output_index: int = 0) -> dict[str, Any]:
    delta = base64.b64encode(pcm).decode("ascii")
    return _delta("response.output_audio.delta", response, item, output_index, delta=delta)


def audio_done(response: Response, item: Item, output_index: int = 0) -> dict[str, Any]:
    return _delta("response.output_audio.done", response, item, output_index)


def transcript_delta(response: Response, item: Item, delta: str, output_index: int = 0) -> dict[str, Any]:
    return _delta("response.output_audio_transcript.delta", response, item, output_index, delta=delta)


def transcript_done(response: Response, item: Item, transcript: str, output_index: int = 0) -> dict[str, Any]:
    return _delta("response.output_audio_transcript.done", response, item, output_index, transcript=transcript)


def arguments_delta(response: Response, item: Item, delta: str, output_index: int) -> dict[str, Any]:
    """A function call's arguments, streamed (``ResponseFunctionCallArgumentsDeltaEvent``)."""
    return event(
        "response.function_call_arguments.delta",
        response_id=response.id,
        item_id=item.id,
        output_index=output_index,
        call_id=item.call_id,
        delta=delta,
    )


def arguments_done(response: Response, item: Item, output_index: int) -> dict[str, Any]:
    """A function call complete (``ResponseFunctionCallArgumentsDoneEvent``)."""
    return event(
        "response.function_call_arguments.done",
        response_id=response.id,
        item_id=item.id,
        output_index=output_index,
        call_id=item.call_id,
        name=item.name,
        arguments=item.arguments,
    )
