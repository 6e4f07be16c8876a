"""One response's wire: the conversation core's typed turn events → ``response.*`` events, in order.

A ``ResponseStream`` owns what only this wire format knows of a response: its ``Response`` and the
assistant ``Item`` it writes (ids, the one output and content index), the text so far, the word
timings and audio length kept with the item (``conversation.item.truncate`` cuts by them), the usage
it reports, and how it closes whatever ended it. Each step returns the events to send, in order; it
sends nothing, so it runs without a socket in the tests. The consumer places the item in the
conversation (conversation ``auto``), runs the core turn, and keeps the metrics.

The events of a response::

    start()   response.created, response.output_item.added, conversation.item.added (conversation
              "auto"), response.content_part.added
    write()   response.output_text.delta, or response.output_audio_transcript.delta and
              response.output_audio.delta (audio; its transcript is the text)
    finish()  response.output_audio.done (when audio was sent), response.output_audio_transcript.done
              or response.output_text.done, response.content_part.done, response.output_item.done,
              conversation.item.done (while the item is still in the conversation), response.done
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omniweb.base.errors import ErrorKind
from omniweb.conversation import AudioChunk, NoUsableFrames, TextDelta, TurnEnd, TurnEvent

from . import server_events
from .audio import pcm_ms
from .errors import RealtimeError, new_id
from .events import ResponseParams
from .items import Conversation, Item
from .server_events import Response
from .session import Session

# Kinds of a response the engine refused outright (overloaded, still loading, its models broken):
# besides the failed ``response.done``, the client gets an ``error`` event saying so.
REFUSED = frozenset({ErrorKind.CAPACITY, ErrorKind.STARTING, ErrorKind.UNAVAILABLE})

Status = Literal["completed", "cancelled", "failed"]


@dataclass(frozen=True)
class Ending:
    """How a turn's last event ends the response: ``finish(status, details)``; ``refusal``: an
    ``error`` event the client gets first (the engine did not take the turn), of ``kind``."""

    status: Status
    details: dict[str, Any] | None = None
    refusal: RealtimeError | None = None
    kind: ErrorKind | None = None


@dataclass(eq=False)
class ResponseStream:
    """One response, from ``response.created`` to ``response.done``."""

    response: Response
    item: Item  # the assistant item being written
    question: Item | None  # the user item it answers
    conversation: Conversation  # the session's items (the question's, and the item's in conversation "auto")
    text: list[str] = field(default_factory=list)
    closed: bool = False  # finish() has written the closing events

    @classmethod
    def create(cls, params: ResponseParams, session: Session, conversation: Conversation) -> ResponseStream:
        """A response as ``response.create`` asks (``params`` over the session's defaults), answering
        the latest user item that says something (an image alone asks nothing)."""
        modalities = tuple(params.output_modalities or session.output_modalities)
        if "audio" in modalities:
            modalities = ("audio",)  # the audio's transcript is the text
        voice = (params.audio.output.voice if params.audio is not None else None) or session.audio.output.voice
        response = Response(
            id=new_id("resp"),
            conversation_id=conversation.id if params.conversation == "auto" else None,
            modalities=modalities,
            voice=voice,
            metadata=params.metadata,
        )
        kind = "output_audio" if response.audio else "output_text"
        empty = {"type": kind, "transcript": ""} if response.audio else {"type": kind, "text": ""}
        item = Item(id=new_id("item"), role="assistant", content=[empty], status="in_progress")
        question = next((i for i in reversed(conversation.items) if i.role == "user" and (i.text() or i.audio)), None)
        return cls(response=response, item=item, question=question, conversation=conversation)

    @property
    def in_conversation(self) -> bool:
        """Conversation ``auto``: the item joins the conversation (placed by the caller before ``start``)."""
        return self.response.conversation_id is not None

    def start(self) -> list[dict[str, Any]]:
        """The opening events; in conversation ``auto`` the item is already in the conversation."""
        response, item = self.response, self.item
        out = [server_events.response_created(response)]
        response.output = [item]
        out.append(server_events.output_item_added(response, item))
        if self.in_conversation:
            out.append(server_events.item_added(item, self.conversation.previous_of(item)))
        out.append(server_events.content_part_added(response, item))
        return out

    def write(self, event: TurnEvent) -> list[dict[str, Any]]:
        """A piece of the answer (``TextDelta``, ``AudioChunk``) → its delta events; other events
        write nothing (``end`` takes the last one)."""
        response, item = self.response, self.item
        if self.closed:
            return []
        if isinstance(event, TextDelta) and event.delta:
            self.text.append(event.delta)
            if response.audio:
                return [server_events.transcript_delta(response, item, event.delta)]
            return [server_events.text_delta(response, item, event.delta)]
        if isinstance(event, AudioChunk) and response.audio:
            item.words += event.words
            if event.pcm:
                item.audio_ms += pcm_ms(event.pcm)
                return [server_events.audio_delta(response, item, event.pcm)]
        return []

    def end(self, event: TurnEnd | NoUsableFrames) -> Ending:
        """The turn's last event: keeps its whole text and usage, and says how the response ends."""
        if isinstance(event, NoUsableFrames):
            return Ending("failed", server_events.failed("No image could be decoded", "invalid_image"))
        if event.text is not None:
            self.text = [event.text]
        if event.usage is not None:
            u = event.usage
            self.response.usage = server_events.usage(
                input_text=u.input_text_tokens,
                input_audio=u.input_audio_tokens,
                input_images=u.input_image_tokens,
                output_text=u.output_text_tokens,
                output_audio=u.output_audio_tokens,
            )
        if event.ok:
            return Ending("completed")
        if event.status == "cancelled":
            return Ending("cancelled", server_events.cancelled("client_cancelled"))
        message = event.message or "The response failed"
        code = event.kind.value if event.kind is not None else "server_error"
        refusal = RealtimeError(message, code=code, type="server_error") if event.kind in REFUSED else None
        return Ending("failed", server_events.failed(message, code), refusal, event.kind)

    def finish(self, status: Status, details: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The closing events, whatever ended the response (the last is ``response.done``); none
        once closed. Usage not reported by the turn is counted from what was written."""
        if self.closed:
            return []
        self.closed = True
        response, item = self.response, self.item
        text = "".join(self.text)
        item.status = "completed" if status == "completed" else "incomplete"
        out = []
        if response.audio:
            item.content[0] = {"type": "output_audio", "transcript": text}
            if item.audio_ms:
                out.append(server_events.audio_done(response, item))
            out.append(server_events.transcript_done(response, item, text))
        else:
            item.content[0] = {"type": "output_text", "text": text}
            out.append(server_events.text_done(response, item, text))
        out.append(server_events.content_part_done(response, item, text))
        out.append(server_events.output_item_done(response, item))
        if self.in_conversation and self.conversation.find(item.id) is item:  # not deleted meanwhile
            out.append(server_events.item_done(item, self.conversation.previous_of(item)))
        response.status, response.status_details = status, details
        if response.usage is None:
            response.usage = server_events.usage(
                output_text=server_events.text_tokens(text), output_audio=server_events.audio_tokens(item.audio_ms)
            )
        out.append(server_events.response_done(response))
        return out
