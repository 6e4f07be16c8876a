"""One response's wire: the conversation core's typed turn events → ``response.*`` events, in order.

A ``ResponseStream`` owns what only this wire format knows of a response: its ``Response`` and the
output items it writes (the assistant message: ids, its output and content index, the text so far,
the word timings and audio length kept with the item, which ``conversation.item.truncate`` cuts by;
the function calls), the usage it reports (``tally``: what its thinker was given and what was
sent, by ``omniweb.conversation.usage``'s rule, so a response cut short counts what went out), its
audio in the output format (``encoder``: PCM16 24 kHz as it is, G.711 encoded at 8 kHz), and how it
closes whatever ended it. Each step returns
the events to send, in order; it sends nothing, so it runs without a socket in the tests. The
consumer runs the core turn and keeps the metrics; in conversation ``auto`` the output items join
the conversation (the consumer places the eager message item, ``place`` the others).

The events of a response::

    start()   response.created; without tools in effect also the message item's opening:
              response.output_item.added, conversation.item.added (conversation "auto"),
              response.content_part.added
    write()   response.output_text.delta, or response.output_audio_transcript.delta and
              response.output_audio.delta (audio; its transcript is the text). With tools in
              effect the message item opens (as above) at its first delta: a response that only
              calls functions has none. A ``ToolCall``: a function_call output item, whole at once:
              response.output_item.added, conversation.item.added, response.function_call_arguments
              .delta and .done, response.output_item.done, conversation.item.done
    finish()  the message item's closing: response.output_audio.done (when audio was sent; G.711's
              last samples in one more delta before it),
              response.output_audio_transcript.done or response.output_text.done,
              response.content_part.done, response.output_item.done, conversation.item.done (while
              the item is still in the conversation); then response.done (every output item)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from omniweb.base.errors import ErrorKind
from omniweb.conversation import (
    AudioChunk,
    FramesSelected,
    NoUsableFrames,
    TextDelta,
    ToolCall,
    Transcript,
    TurnEnd,
    TurnEvent,
)
from omniweb.conversation.usage import Tally

from . import server_events
from .audio import OutputEncoder, pcm_ms
from .errors import RealtimeError, new_id
from .events import ResponseParams
from .items import Conversation, Item
from .server_events import Response
from .session import Session, ToolChoiceValue, ToolSpec, check_tool_choice

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


@dataclass(frozen=True)
class Tools:
    """The tools in effect for one response (``response.create``'s over the session's)."""

    tools: tuple[ToolSpec, ...] = ()
    choice: ToolChoiceValue = "auto"
    parallel: bool | None = None

    @property
    def offered(self) -> bool:
        """The model may call a function: the message item is then made at its first delta."""
        return bool(self.tools) and self.choice != "none"

    @classmethod
    def of(cls, params: ResponseParams, session: Session) -> Tools:
        """``response.create``'s tools replace the session's, its tool choice overrides the session's;
        a tool choice that names a function not among them is refused."""
        tools = tuple(params.tools if params.tools is not None else session.tools or ())
        choice = params.tool_choice if params.tool_choice is not None else session.tool_choice or "auto"
        try:
            check_tool_choice(choice, tools)
        except ValueError as exc:
            param = "response.tool_choice"
            raise RealtimeError(f"Invalid value for '{param}': {exc}", param=param) from None
        parallel = params.parallel_tool_calls if params.parallel_tool_calls is not None else session.parallel_tool_calls
        return cls(tools, choice, parallel)


@dataclass(eq=False)
class ResponseStream:
    """One response, from ``response.created`` to ``response.done``."""

    response: Response
    item: Item | None  # the assistant message being written (None: not yet, with tools in effect)
    question: Item | None  # the user item it answers
    conversation: Conversation  # the session's items (the question's, and the item's in conversation "auto")
    tools: Tools = field(default_factory=Tools)
    # Places an output item made during the response in the conversation (conversation "auto");
    # None: ``conversation.add``.
    place: Callable[[Item], None] | None = None
    # The answer's audio in the output format (G.711 is encoded here, at the edge).
    encoder: OutputEncoder = field(default_factory=OutputEncoder)
    text: list[str] = field(default_factory=list)
    # What the turn gave its thinker and what of the answer was sent: the usage of a response that
    # ends before its turn does (cancelled), counted by the same rule as the turn's own.
    tally: Tally = field(default_factory=Tally)
    closed: bool = False  # finish() has written the closing events

    @classmethod
    def create(cls, params: ResponseParams, session: Session, conversation: Conversation) -> ResponseStream:
        """A response as ``response.create`` asks (``params`` over the session's defaults), answering
        the latest user item that says something (an image alone asks nothing). Without tools in
        effect its message item is made now (placed by the caller before ``start``); with them, at
        the first delta. Raises ``RealtimeError`` for a tool choice the tools do not allow."""
        modalities = tuple(params.output_modalities or session.output_modalities)
        if "audio" in modalities:
            modalities = ("audio",)  # the audio's transcript is the text
        voice = (params.audio.output.voice if params.audio is not None else None) or session.audio.output.voice
        fmt = (params.audio.output.format if params.audio is not None else None) or session.audio.output.format
        tools = Tools.of(params, session)
        limit = params.max_output_tokens if params.max_output_tokens is not None else session.max_output_tokens
        response = Response(
            id=new_id("resp"),
            conversation_id=conversation.id if params.conversation == "auto" else None,
            modalities=modalities,
            voice=voice,
            metadata=params.metadata,
            max_output_tokens=limit or "inf",
        )
        question = next((i for i in reversed(conversation.items) if i.role == "user" and (i.text() or i.audio)), None)
        item = None if tools.offered else cls._message(response)
        return cls(
            response=response,
            item=item,
            question=question,
            conversation=conversation,
            tools=tools,
            encoder=OutputEncoder(fmt.type),
        )

    @staticmethod
    def _message(response: Response) -> Item:
        kind = "output_audio" if response.audio else "output_text"
        empty = {"type": kind, "transcript": ""} if response.audio else {"type": kind, "text": ""}
        return Item(id=new_id("item"), role="assistant", content=[empty], status="in_progress", response_id=response.id)

    @property
    def in_conversation(self) -> bool:
        """Conversation ``auto``: the items join the conversation (the eager message item placed by
        the caller before ``start``)."""
        return self.response.conversation_id is not None

    def start(self) -> list[dict[str, Any]]:
        """The opening events; in conversation ``auto`` an eager message item is already in the conversation."""
        out = [server_events.response_created(self.response)]
        if self.item is not None:
            out += self._open(self.item)
        return out

    def _open(self, item: Item) -> list[dict[str, Any]]:
        """The message item's opening events (it joins the response's output)."""
        response = self.response
        response.output.append(item)
        index = response.output.index(item)
        out = [server_events.output_item_added(response, item, index)]
        if self.in_conversation:
            out.append(server_events.item_added(item, self.conversation.previous_of(item)))
        out.append(server_events.content_part_added(response, item, index))
        return out

    def _add(self, item: Item) -> None:
        """An output item made during the response joins the conversation (conversation ``auto``)."""
        if self.in_conversation:
            if self.place is not None:
                self.place(item)
            else:
                self.conversation.add(item)

    def _message_item(self) -> tuple[Item, list[dict[str, Any]]]:
        """The message item, and its opening events when it is made now (lazily, with tools)."""
        if self.item is not None:
            return self.item, []
        self.item = item = self._message(self.response)
        self._add(item)
        return item, self._open(item)

    def write(self, event: TurnEvent) -> list[dict[str, Any]]:
        """A piece of the answer (``TextDelta``, ``AudioChunk``) → its delta events, a ``ToolCall`` →
        its function_call item's events; ``FramesSelected`` and ``Transcript`` are only counted (what
        the thinker was given, what it heard); other events write nothing (``end`` takes the last one)."""
        response = self.response
        if self.closed:
            return []
        if isinstance(event, FramesSelected):
            self.tally.given = event.given
            return []
        if isinstance(event, Transcript):
            self.tally.add(event)
            return []
        if isinstance(event, ToolCall):
            self.tally.add(event)
            return self._call(event)
        if isinstance(event, TextDelta) and event.delta:
            item, out = self._message_item()
            index = response.output.index(item)
            self.text.append(event.delta)
            self.tally.add(event)
            if response.audio:
                return [*out, server_events.transcript_delta(response, item, event.delta, index)]
            return [*out, server_events.text_delta(response, item, event.delta, index)]
        if isinstance(event, AudioChunk) and response.audio and (event.pcm or event.words):
            item, out = self._message_item()
            item.words += event.words
            if event.pcm:
                item.audio_ms += pcm_ms(event.pcm)
                self.tally.add(event)
                if audio := self.encoder.encode(event.pcm):
                    out.append(server_events.audio_delta(response, item, audio, response.output.index(item)))
            return out
        return []

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        """A function call, whole (the thinker sends it checked and complete): its output item opens,
        its arguments come as one delta, and it is done."""
        response = self.response
        item = Item.function_call(
            new_id("item"), call.call_id, call.name, "", status="in_progress", response_id=response.id
        )
        response.output.append(item)
        index = len(response.output) - 1
        self._add(item)
        out = [server_events.output_item_added(response, item, index)]
        if self.in_conversation:
            out.append(server_events.item_added(item, self.conversation.previous_of(item)))
        item.arguments = call.arguments
        out.append(server_events.arguments_delta(response, item, call.arguments, index))
        out.append(server_events.arguments_done(response, item, index))
        item.status = "completed"
        out.append(server_events.output_item_done(response, item, index))
        if self.in_conversation and self.conversation.find(item.id) is item:
            out.append(server_events.item_done(item, self.conversation.previous_of(item)))
        return out

    def end(self, event: TurnEnd | NoUsableFrames) -> Ending:
        """The turn's last event: keeps its whole text and usage, and says how the response ends."""
        if isinstance(event, NoUsableFrames):
            return Ending("failed", server_events.failed("No image could be decoded", "invalid_image"))
        if event.text is not None:
            self.text = [event.text]
        # The turn's own count (all it yielded was written), else what was written of it.
        counts = event.usage if event.usage is not None else self.tally.usage(event)
        self.response.usage = server_events.usage(counts)
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
        once closed. A response its turn did not end (cancelled) counts what was given and sent."""
        if self.closed:
            return []
        self.closed = True
        response, item = self.response, self.item
        text = "".join(self.text)
        out: list[dict[str, Any]] = []
        if item is None and text:  # words the turn ended with, none streamed: the message opens now
            item, out = self._message_item()
        if item is not None:
            out += self._close(item, status, text)
        response.status, response.status_details = status, details
        if response.usage is None:
            response.usage = server_events.usage(self.tally.usage())
        out.append(server_events.response_done(response))
        return out

    def _close(self, item: Item, status: Status, text: str) -> list[dict[str, Any]]:
        """The message item's closing events."""
        response = self.response
        index = response.output.index(item)
        item.status = "completed" if status == "completed" else "incomplete"
        out = []
        if response.audio:
            item.content[0] = {"type": "output_audio", "transcript": text}
            if status == "completed" and item.audio_ms and (tail := self.encoder.flush()):  # the resampler's last
                out.append(server_events.audio_delta(response, item, tail, index))
            if item.audio_ms:
                out.append(server_events.audio_done(response, item, index))
            out.append(server_events.transcript_done(response, item, text, index))
        else:
            item.content[0] = {"type": "output_text", "text": text}
            out.append(server_events.text_done(response, item, text, index))
        out.append(server_events.content_part_done(response, item, text, index))
        out.append(server_events.output_item_done(response, item, index))
        if self.in_conversation and self.conversation.find(item.id) is item:  # not deleted meanwhile
            out.append(server_events.item_done(item, self.conversation.previous_of(item)))
        return out
